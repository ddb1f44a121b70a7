package proxy

import (
	"bytes"
	"context"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/internal/testskip"
	"github.com/dedupproxy/dedupproxy/metrics"
	"github.com/dedupproxy/dedupproxy/relay"
)

// Socket tests of produce_splice (holes.go): the records of large
// idempotent batches stay in pipes, and every path that needs them reads
// them back first.

func requireHoles(t *testing.T) {
	t.Helper()
	if !relay.HolesSupported {
		testskip.Skip(t, "splice(2) is Linux-only")
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
	p := startProxy(t, c, func(cfg *Config) { cfg.ProduceSplice = ptrTo(true) })
	raw := dialRaw(t, p.addr())
	raw.learnTopics(topic)
	v0, v1 := strings.Repeat("r", 40<<10), strings.Repeat("s", 30<<10)
	b0 := recordBatch(t, 21, 0, 0, 3, v0)
	b1 := recordBatch(t, 21, 0, 0, 2, v1)

	if r := onlyPartition(t, raw.roundTrip(produceParts(topic, -1, part{0, b0}))); r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("original: %+v", r)
	}
	if s := testutil.ToFloat64(p.Metrics.ProduceSpliced); s < relay.MinHole || s > float64(len(b0)) {
		t.Fatalf("%.0f bytes spliced of a %d-byte batch", s, len(b0))
	}
	if r := onlyPartition(t, raw.roundTrip(produceParts(topic, -1, part{0, b0}))); r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("retry: %+v", r)
	}
	if n := pc.requests.Load(); n != 1 {
		t.Fatalf("broker saw %d requests, want the original only", n)
	}
	if n := testutil.ToFloat64(p.Metrics.DupAnswered[metrics.DupByProxy]); n != 1 {
		t.Fatalf("retries answered by the proxy: %v, want 1", n)
	}
	if rb := testutil.ToFloat64(p.Metrics.ProduceReadBack); rb < relay.MinHole {
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
	waitFor(t, 10*time.Second, "the pipes to be given back", func() bool { return p.pipes.InUse() == 0 })
}

// TestProduceSpliceBatchLargerThanPipe: a batch that outgrows its pipe is
// spliced as far as the pipe takes and read for the rest, and arrives whole.
func TestProduceSpliceBatchLargerThanPipe(t *testing.T) {
	requireHoles(t)
	t.Parallel()
	const topic = "holes-big"
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic),
		kfake.BrokerConfigs(map[string]string{"message.max.bytes": "16777216"}))
	p := startProxy(t, c, func(cfg *Config) { cfg.ProduceSplice = ptrTo(true) })
	raw := dialRaw(t, p.addr())
	raw.learnTopics(topic)
	v := strings.Repeat("big", 1<<20) // 3 MiB per record, 6 MiB of records
	b := recordBatch(t, 22, 0, 0, 2, v)
	if r := onlyPartition(t, raw.roundTrip(produceParts(topic, -1, part{0, b}))); r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("produce: %+v", r)
	}
	if s := testutil.ToFloat64(p.Metrics.ProduceSpliced); s < relay.MinHole || s >= float64(len(b)-batchHeaderLen) {
		t.Fatalf("%.0f of %d record bytes spliced: want the pipe's share, not all", s, len(b)-batchHeaderLen)
	}
	checkValues(t, partitionValues(t, c, topic, 0, 2), 2, v)
	waitFor(t, 10*time.Second, "the pipes to be given back", func() bool { return p.pipes.InUse() == 0 })
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
	p := startProxy(t, c, func(cfg *Config) { cfg.ProduceSplice = ptrTo(true) })
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
	waitFor(t, 10*time.Second, "the hole to be spliced", func() bool { return p.pipes.InUse() > 0 })
	conn.Close()
	waitFor(t, 10*time.Second, "the pipe and the budget to be given back", func() bool {
		pool := p.requestPool()
		return p.pipes.InUse() == 0 && pool.Held() == 0
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

// TestProduceSpliceByteExact sends requests of random shapes (seeded):
// versions 7 to 12, several partitions, idempotent batches on both sides of
// the hole threshold, legacy batches, written in random pieces so that
// holes start wherever the buffered reader stopped. The broker must receive
// every partition's records byte for byte, and a resent request must be
// answered by the proxy without reaching it.
func TestProduceSpliceByteExact(t *testing.T) {
	requireHoles(t)
	t.Parallel()
	const topic, partitions, requests = "holes-exact", 8, 24
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic))
	var mu sync.Mutex
	got := map[int32][][]byte{} // records the broker received, per partition
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		mu.Lock()
		defer mu.Unlock()
		for _, tp := range req.(*kmsg.ProduceRequest).Topics {
			for _, pp := range tp.Partitions {
				got[pp.Partition] = append(got[pp.Partition], bytes.Clone(pp.Records))
			}
		}
		return nil, nil, false
	})
	p := startProxy(t, c, func(cfg *Config) { cfg.ProduceSplice = ptrTo(true) })
	raw := dialRaw(t, p.addr())
	raw.learnTopics(topic)
	rng := rand.New(rand.NewPCG(13, 1))
	want := map[int32][][]byte{}
	resent := 0
	for i := range requests {
		req := kmsg.NewPtrProduceRequest()
		req.SetVersion(int16(7 + rng.IntN(6)))
		req.Acks, req.TimeoutMillis = -1, 5000
		rt := kmsg.NewProduceRequestTopic()
		rt.Topic = topic
		idempotent := false
		for _, part := range rng.Perm(partitions)[:1+rng.IntN(partitions)] {
			pid := int64(1000 + i*partitions + part) // a new producer: always accepted
			size := []int{1 << 10, relay.MinHole - 100, relay.MinHole + 100, 70 << 10, 300 << 10}[rng.IntN(5)]
			if rng.IntN(5) == 0 {
				pid = -1
			}
			idempotent = idempotent || pid >= 0
			value := make([]byte, size)
			for j := range value {
				value[j] = byte(rng.Uint32())
			}
			rp := kmsg.NewProduceRequestTopicPartition()
			rp.Partition = int32(part)
			rp.Records = recordBatch(t, pid, 0, 0, 1+rng.IntN(3), string(value))
			rt.Partitions = append(rt.Partitions, rp)
			want[int32(part)] = append(want[int32(part)], rp.Records)
		}
		req.Topics = append(req.Topics, rt)
		raw.corr++
		frame := kmsg.NewRequestFormatter(kmsg.FormatterClientID("raw")).AppendRequest(nil, req, raw.corr)
		for len(frame) > 0 {
			n := min(len(frame), 1+rng.IntN(100<<10))
			if _, err := raw.conn.Write(frame[:n]); err != nil {
				t.Fatal(err)
			}
			frame = frame[n:]
		}
		resp := raw.recv(req, raw.corr).(*kmsg.ProduceResponse)
		for _, pr := range resp.Topics[0].Partitions {
			if pr.ErrorCode != 0 {
				t.Fatalf("request %d (v%d), partition %d: error %d", i, req.Version, pr.Partition, pr.ErrorCode)
			}
		}
		if i%6 == 5 && idempotent { // the same request again: a retry the proxy answers
			before, brokerBefore := testutil.ToFloat64(p.Metrics.DupAnswered[metrics.DupByProxy]), testutil.ToFloat64(p.Metrics.DupAnswered[metrics.DupByBroker])
			raw.roundTrip(req)
			resent++
			after, brokerAfter := testutil.ToFloat64(p.Metrics.DupAnswered[metrics.DupByProxy]), testutil.ToFloat64(p.Metrics.DupAnswered[metrics.DupByBroker])
			if after == before {
				t.Fatalf("request %d (%d partitions) resent: no retry answered by the proxy (by the broker: %v)", i, len(rt.Partitions), brokerAfter-brokerBefore)
			}
		}
	}
	if resent == 0 {
		t.Fatal("no request was resent")
	}
	mu.Lock()
	defer mu.Unlock()
	for part, batches := range want {
		// Legacy resends reach the broker when the proxy cannot answer
		// them from memory; only idempotent batches are compared in full.
		if len(got[part]) < len(batches) {
			t.Fatalf("partition %d: broker received %d batches, want at least %d", part, len(got[part]), len(batches))
		}
		k := 0
		for _, b := range batches {
			for k < len(got[part]) && !bytes.Equal(got[part][k], b) {
				k++
			}
			if k == len(got[part]) {
				t.Fatalf("partition %d: a batch of %d bytes did not reach the broker as sent", part, len(b))
			}
			k++
		}
	}
	if s := testutil.ToFloat64(p.Metrics.ProduceSpliced); s == 0 {
		t.Fatal("nothing spliced")
	}
	waitFor(t, 10*time.Second, "the pipes to be given back", func() bool { return p.pipes.InUse() == 0 })
}

// ptrTo returns a pointer to v, for Config's optional settings.
func ptrTo[T any](v T) *T { return &v }
