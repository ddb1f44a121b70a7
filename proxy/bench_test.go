package proxy

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkProduceRelay measures what relaying through the proxy costs a
// franz-go producer against kfake, direct and through the proxy in the same
// run (machines here are noisy, so compare the pair, not absolute numbers):
//
//   - roundtrip: one 1 KiB record per ProduceSync, acks=all; reports p50 and
//     p99 latency in µs.
//   - batched: 100 records of 1 KiB per ProduceSync; reports MB/s via SetBytes.
func BenchmarkProduceRelay(b *testing.B) {
	const topic = "bench"
	c := newCluster(b, kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	p := startProxy(b, c, nil)
	value := make([]byte, 1024)
	for _, target := range []struct{ name, addr string }{{"direct", c.ListenAddrs()[0]}, {"proxy", p.addr()}} {
		cl, err := kgo.NewClient(kgo.SeedBrokers(target.addr), kgo.DefaultProduceTopic(topic),
			kgo.ProducerLinger(0), kgo.ProducerBatchCompression(kgo.NoCompression()))
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: value}).FirstErr(); err != nil { // warm up metadata
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("roundtrip/%s", target.name), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(value)))
			lat := make([]time.Duration, 0, 1<<16)
			for b.Loop() {
				start := time.Now()
				if err := cl.ProduceSync(ctx, &kgo.Record{Value: value}).FirstErr(); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
		b.Run(fmt.Sprintf("batched/%s", target.name), func(b *testing.B) {
			b.ReportAllocs()
			const perOp = 100
			b.SetBytes(perOp * int64(len(value)))
			recs := make([]*kgo.Record, perOp)
			for b.Loop() {
				for i := range recs {
					recs[i] = &kgo.Record{Value: value}
				}
				if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
					b.Fatal(err)
				}
			}
		})
		cl.Close()
	}
}
