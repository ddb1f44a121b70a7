package proxy

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Socket tests of produce_splice (holes.go): the records of large
// idempotent batches stay in pipes, and every path that needs them reads
// them back first.

func requireHoles(t *testing.T) {
	t.Helper()
	if !holesSupported {
		t.Skip("splice(2) is Linux-only")
	}
}

// partitionValues reads every record value of one partition from the
// cluster directly.
func partitionValues(t *testing.T, c *kfake.Cluster, topic string, partition int32, want int) [][]byte {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {partition: kgo.NewOffset().AtStart()}}),
		kgo.FetchMaxBytes(16<<20), kgo.FetchMaxPartitionBytes(16<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var got [][]byte
	for polls := 0; len(got) < want && polls < 100; polls++ {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("partition %d: %d of %d records: %v", partition, len(got), want, ctx.Err())
		}
		fs.EachRecord(func(r *kgo.Record) { got = append(got, r.Value) })
	}
	return got
}

func checkValues(t *testing.T, got [][]byte, n int, value string) {
	t.Helper()
	if len(got) != n {
		t.Fatalf("%d records, want %d", len(got), n)
	}
	for i, v := range got {
		if !bytes.Equal(v, []byte(value)) {
			t.Fatalf("record %d: %d bytes differ from the %d sent", i, len(v), len(value))
		}
	}
}

// TestProduceSpliceRetries: a large idempotent batch goes through a pipe; its
// retry is answered by the proxy from the records read back (CRC checked);
// a request holding a retry and a new batch is rebuilt without the retry.
// The broker sees each batch once, byte for byte.
func TestProduceSpliceRetries(t *testing.T) {
	requireHoles(t)
	t.Parallel()
	const topic = "holes"
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(2, topic))
	pc := countProduce(c)
	p := startProxy(t, c, func(cfg *Config) { cfg.ProduceSplice = true })
	raw := dialRaw(t, p.addr())
	raw.learnTopics(topic)
	v0, v1 := strings.Repeat("r", 40<<10), strings.Repeat("s", 30<<10)
	b0 := recordBatch(t, 21, 0, 0, 3, v0)
	b1 := recordBatch(t, 21, 0, 0, 2, v1)

	if r := onlyPartition(t, raw.roundTrip(produceParts(topic, -1, part{0, b0}))); r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("original: %+v", r)
	}
	if s := testutil.ToFloat64(p.Metrics.produceSpliced); s < minHole || s > float64(len(b0)) {
		t.Fatalf("%.0f bytes spliced of a %d-byte batch", s, len(b0))
	}
	if r := onlyPartition(t, raw.roundTrip(produceParts(topic, -1, part{0, b0}))); r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("retry: %+v", r)
	}
	if n := pc.requests.Load(); n != 1 {
		t.Fatalf("broker saw %d requests, want the original only", n)
	}
	if n := testutil.ToFloat64(p.Metrics.dupAnswered[dupByProxy]); n != 1 {
		t.Fatalf("retries answered by the proxy: %v, want 1", n)
	}
	if rb := testutil.ToFloat64(p.Metrics.produceReadBack); rb < minHole {
		t.Fatalf("%.0f bytes read back to answer the retry", rb)
	}

	resp := raw.roundTrip(produceParts(topic, -1, part{0, b0}, part{1, b1})).(*kmsg.ProduceResponse)
	if ps := resp.Topics[0].Partitions; len(ps) != 2 || ps[0].ErrorCode != 0 || ps[0].BaseOffset != 0 || ps[1].ErrorCode != 0 || ps[1].BaseOffset != 0 {
		t.Fatalf("retry and new batch: %+v", resp.Topics[0].Partitions)
	}
	if n, parts := pc.requests.Load(), pc.partitions.Load(); n != 2 || parts != 2 {
		t.Fatalf("broker saw %d requests of %d partitions, want 2 of 2 (the retry left out)", n, parts)
	}
	checkValues(t, partitionValues(t, c, topic, 0, 3), 3, v0)
	checkValues(t, partitionValues(t, c, topic, 1, 2), 2, v1)
	waitFor(t, 10*time.Second, "the pipes to be given back", func() bool { return pipesInUse() == 0 })
}

// TestProduceSpliceBatchLargerThanPipe: a batch that outgrows its pipe is
// spliced as far as the pipe takes and read for the rest, and arrives whole.
func TestProduceSpliceBatchLargerThanPipe(t *testing.T) {
	requireHoles(t)
	t.Parallel()
	const topic = "holes-big"
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic),
		kfake.BrokerConfigs(map[string]string{"message.max.bytes": "16777216"}))
	p := startProxy(t, c, func(cfg *Config) { cfg.ProduceSplice = true })
	raw := dialRaw(t, p.addr())
	raw.learnTopics(topic)
	v := strings.Repeat("big", 1<<20) // 3 MiB per record, 6 MiB of records
	b := recordBatch(t, 22, 0, 0, 2, v)
	if r := onlyPartition(t, raw.roundTrip(produceParts(topic, -1, part{0, b}))); r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("produce: %+v", r)
	}
	if s := testutil.ToFloat64(p.Metrics.produceSpliced); s < minHole || s >= float64(len(b)-batchHeaderLen) {
		t.Fatalf("%.0f of %d record bytes spliced: want the pipe's share, not all", s, len(b)-batchHeaderLen)
	}
	checkValues(t, partitionValues(t, c, topic, 0, 2), 2, v)
	waitFor(t, 10*time.Second, "the pipes to be given back", func() bool { return pipesInUse() == 0 })
}

// batchHeaderLen is a v2 record batch's header.
const batchHeaderLen = 61

// TestProduceSpliceClientGone: a client that leaves halfway through a hole
// costs a log line; its pipe and budget are given back, and the proxy
// serves the next client.
func TestProduceSpliceClientGone(t *testing.T) {
	requireHoles(t)
	t.Parallel()
	const topic = "holes-gone"
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	p := startProxy(t, c, func(cfg *Config) { cfg.ProduceSplice = true })
	raw := dialRaw(t, p.addr())
	raw.learnTopics(topic)
	v := strings.Repeat("g", 200<<10)
	req := produceParts(topic, -1, part{0, recordBatch(t, 23, 0, 0, 1, v)})
	frame := kmsg.NewRequestFormatter(kmsg.FormatterClientID("gone")).AppendRequest(nil, req, 1)

	conn, err := net.Dial("tcp", raw.conn.RemoteAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(frame[:len(frame)/2]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the hole to be spliced", func() bool { return pipesInUse() > 0 })
	conn.Close()
	waitFor(t, 10*time.Second, "the pipe and the budget to be given back", func() bool {
		pool := p.requestPool()
		pool.mu.Lock()
		defer pool.mu.Unlock()
		return pipesInUse() == 0 && pool.held == 0
	})
	if !strings.Contains(p.logs.String(), "truncated frame") {
		t.Fatalf("no log line for the truncated request:\n%s", p.logs.String())
	}
	b := recordBatch(t, 23, 0, 0, 1, v)
	if r := onlyPartition(t, raw.roundTrip(produceParts(topic, -1, part{0, b}))); r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("produce after: %+v", r)
	}
	checkValues(t, partitionValues(t, c, topic, 0, 1), 1, v)
}
