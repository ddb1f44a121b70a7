package proxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dedupproxy/dedupproxy/relay"
)

// TestLargeProducesWithinBudget: franz-go producers whose requests each
// take most of the budget, or more, write every record once through the
// proxy, byte for byte; the budget is all given back once they are done.
// With holes (both legs plain TCP, on Linux) the records of their batches
// go socket to socket (holes.go); without, through pooled buffers.
func TestLargeProducesWithinBudget(t *testing.T) {
	for _, holes := range []bool{relay.HolesSupported, false} {
		t.Run(fmt.Sprintf("holes=%v", holes), func(t *testing.T) { testLargeProducesWithinBudget(t, holes) })
		if !relay.HolesSupported {
			break
		}
	}
}

func testLargeProducesWithinBudget(t *testing.T, holes bool) {
	const topic, producers, perProducer, size = "large", 3, 12, 300 << 10
	c := newCluster(t, kfake.SeedTopics(3, topic))
	p := startProxyWith(t, c, func(cfg *Config) { cfg.RequestMemory, cfg.ProduceSplice = 1<<20, &holes }, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	for i := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl, err := kgo.NewClient(kgo.SeedBrokers(p.addr()), kgo.DefaultProduceTopic(topic),
				kgo.ProducerLinger(20*time.Millisecond), kgo.ProducerBatchMaxBytes(1_000_000),
				kgo.ProducerBatchCompression(kgo.NoCompression()))
			if err != nil {
				errs <- err
				return
			}
			defer cl.Close()
			recs := make([]*kgo.Record, perProducer)
			for j := range recs {
				v := bytes.Repeat([]byte{byte(i)}, size)
				binary.BigEndian.PutUint32(v, uint32(j))
				recs[j] = &kgo.Record{Value: v}
			}
			errs <- cl.ProduceSync(ctx, recs...).FirstErr()
		}()
	}
	wg.Wait()
	for range producers {
		if err := <-errs; err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	seen := make(map[[2]uint32]bool)
	for polls := 0; len(seen) < producers*perProducer && polls < 1000; polls++ {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of %d: %v", len(seen), producers*perProducer, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			key := [2]uint32{uint32(r.Value[size-1]), binary.BigEndian.Uint32(r.Value)}
			if len(r.Value) != size || !bytes.Equal(r.Value[4:], bytes.Repeat(r.Value[size-1:], size-4)) || seen[key] {
				t.Fatalf("record %v: %d bytes, seen before %v", key, len(r.Value), seen[key])
			}
			seen[key] = true
		})
	}
	if len(seen) != producers*perProducer {
		t.Fatalf("consumed %d of %d", len(seen), producers*perProducer)
	}
	pool := p.requestPool()
	waitFor(t, 10*time.Second, "the budget to be given back", func() bool {
		return pool.Held() == 0
	})
	spliced := testutil.ToFloat64(p.Metrics.ProduceSpliced)
	if holes {
		// Every record but the few bytes each read took along with a
		// batch header (the reader's buffer) went through a pipe.
		if total := float64(producers * perProducer * size); spliced < total/2 {
			t.Fatalf("%.0f of %.0f record bytes spliced", spliced, total)
		}
		waitFor(t, 10*time.Second, "the pipes to be given back", func() bool { return p.pipes.InUse() == 0 })
		return
	}
	if spliced != 0 {
		t.Fatalf("%.0f bytes spliced with a leg that cannot", spliced)
	}
	if got := pool.BufferSize(); got < size {
		t.Fatalf("the buffers of the last requests are %d bytes: the records did not take the large path", got)
	}
}
