package proxy

import (
	"context"
	"encoding/binary"
	"fmt"

	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/metrics"
	"github.com/dedupproxy/dedupproxy/protocol"
)

// ackDropShim is a TCP hop between clients and one proxy node listener. It
// lets Produce requests through and lets the proxy answer; the response to
// the dropAt-th Produce (acks != 0) is dropped and the client's connection
// cut: the acknowledgement lost on the way back.
type ackDropShim struct {
	ln       net.Listener
	target   atomic.Value // string
	dropAt   int64
	produces atomic.Int64
	dropped  atomic.Int64
	wg       sync.WaitGroup
}

func newAckDropShim(t *testing.T, dropAt int64) *ackDropShim {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &ackDropShim{ln: ln, dropAt: dropAt}
	s.wg.Add(1)
	go s.accept()
	t.Cleanup(func() { ln.Close(); s.wg.Wait() })
	return s
}

func (s *ackDropShim) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go s.relay(c)
	}
}

func (s *ackDropShim) relay(client net.Conn) {
	defer s.wg.Done()
	defer client.Close()
	up, err := net.DialTimeout("tcp", s.target.Load().(string), 5*time.Second)
	if err != nil {
		return
	}
	defer up.Close()
	var mu sync.Mutex
	produce := map[int32]bool{} // correlation id -> Produce with a response
	go func() {
		defer up.Close()
		var buf []byte
		for {
			body, nbuf, err := protocol.ReadFrame(client, buf, 64<<20, protocol.RequestMinSize)
			if err != nil {
				return
			}
			buf = nbuf
			if h, err := protocol.ParseRequestHeader(body); err == nil && h.APIKey == int16(kmsg.Produce) {
				if acks, _ := protocol.ProduceAcks(body, h); acks != 0 {
					mu.Lock()
					produce[h.CorrelationID] = true
					mu.Unlock()
				}
			}
			if _, err := up.Write(buf[:4+len(body)]); err != nil {
				return
			}
		}
	}()
	var buf []byte
	for {
		body, nbuf, err := protocol.ReadFrame(up, buf, 64<<20, protocol.ResponseMinSize)
		if err != nil {
			return
		}
		buf = nbuf
		corr := int32(binary.BigEndian.Uint32(body))
		mu.Lock()
		isProduce := produce[corr]
		delete(produce, corr)
		mu.Unlock()
		if isProduce && s.produces.Add(1) == s.dropAt {
			s.dropped.Add(1)
			return // drop the acknowledgement and cut the connection
		}
		if _, err := client.Write(buf[:4+len(body)]); err != nil {
			return
		}
	}
}

// batchLog records every idempotent batch that reaches kfake.
type batchLog struct {
	mu      sync.Mutex
	batches map[string]int // "pid/partition/seq" -> times seen
}

func logBatches(c *kfake.Cluster) *batchLog {
	bl := &batchLog{batches: map[string]int{}}
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		bl.mu.Lock()
		defer bl.mu.Unlock()
		for _, t := range req.(*kmsg.ProduceRequest).Topics {
			for _, p := range t.Partitions {
				var h protocol.BatchHeader
				if _, err := protocol.ReadBatch(p.Records, &h); err == nil {
					bl.batches[fmt.Sprintf("%d/%d/%d", h.ProducerID, p.Partition, h.BaseSequence)]++
				}
			}
		}
		return nil, nil, false
	})
	return bl
}

func (bl *batchLog) repeats() (distinct, repeated int) {
	bl.mu.Lock()
	defer bl.mu.Unlock()
	for _, n := range bl.batches {
		distinct++
		if n > 1 {
			repeated++
		}
	}
	return
}

// lostAckSetup starts a 1-broker cluster, a proxy whose broker listener is
// advertised at a shim that drops the dropAt-th Produce acknowledgement.
func lostAckSetup(t *testing.T, topic string, partitions int32, dropAt int64, mods ...func(*Config)) (*kfake.Cluster, *testProxy, *ackDropShim, *batchLog) {
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic))
	bl := logBatches(c)
	shim := newAckDropShim(t, dropAt)
	p := startProxy(t, c, func(cfg *Config) {
		cfg.Nodes = map[int32]NodeConfig{0: {Advertise: shim.ln.Addr().String()}}
		for _, mod := range mods {
			mod(cfg)
		}
	})
	target, ok := p.nodes.ListenAddr(0)
	if !ok {
		t.Fatal("no listener for node 0")
	}
	shim.target.Store(target)
	return c, p, shim, bl
}

// consumeDirect reads every record of topic straight from kfake and checks
// that each value 0..n-1 is there exactly once and in order per partition.
func consumeDirect(t *testing.T, c *kfake.Cluster, topic string, n int) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seen := make([]int, n)
	last := map[int32]int{}
	got := 0
	for polls := 0; got < n && polls < 1000 && ctx.Err() == nil; polls++ {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			v, _ := strconv.Atoi(string(r.Value))
			seen[v]++
			if prev, ok := last[r.Partition]; ok && v <= prev {
				t.Errorf("partition %d: %d after %d", r.Partition, v, prev)
			}
			last[r.Partition] = v
			got++
		})
	}
	// Anything extra (a duplicate) would have arrived in the same polls.
	for v, k := range seen {
		if k != 1 {
			t.Fatalf("record %d stored %d times (%d records read)", v, k, got)
		}
	}
}

// TestLostAckFranzGo: franz-go's idempotent producer loses an
// acknowledgement, reconnects and retries; the proxy answers the retry
// itself, and the topic holds every record exactly once, in order.
func TestLostAckFranzGo(t *testing.T) {
	t.Parallel()
	testLostAckFranzGo(t, "lostack-kgo", false)
}

// TestLostAckFranzGoSpliced is TestLostAckFranzGo with produce_splice and
// 2 KB uncompressed records: the batches' records are in pipes, and the
// retry is answered from them read back (holes.go).
func TestLostAckFranzGoSpliced(t *testing.T) {
	requireHoles(t)
	t.Parallel()
	testLostAckFranzGo(t, "lostack-kgo-spliced", true)
}

func testLostAckFranzGo(t *testing.T, topic string, spliced bool) {
	const n = 3000
	format := "%d"
	opts := []kgo.Opt{kgo.DefaultProduceTopic(topic),
		kgo.MetadataMinAge(100 * time.Millisecond), kgo.ProducerLinger(5 * time.Millisecond),
		kgo.RecordPartitioner(kgo.RoundRobinPartitioner())}
	var mods []func(*Config)
	if spliced {
		format = "%02000d" // parsed back by consumeDirect
		opts = append(opts, kgo.ProducerBatchCompression(kgo.NoCompression()))
		mods = append(mods, func(cfg *Config) { cfg.ProduceSplice = ptrTo(true) })
	}
	c, p, shim, bl := lostAckSetup(t, topic, 3, 3, mods...)
	cl, err := kgo.NewClient(append(opts, kgo.SeedBrokers(p.addr()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for chunk := 0; chunk < n; chunk += 300 {
		recs := make([]*kgo.Record, 300)
		for i := range recs {
			recs[i] = &kgo.Record{Value: []byte(fmt.Sprintf(format, chunk+i))}
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
	if shim.dropped.Load() != 1 {
		t.Fatalf("the shim dropped %d acknowledgements, want 1", shim.dropped.Load())
	}
	consumeDirect(t, c, topic, n)
	dups := testutil.ToFloat64(p.Metrics.Batches[metrics.OutDuplicate]) + testutil.ToFloat64(p.Metrics.Batches[metrics.OutInFlight])
	distinct, repeated := bl.repeats()
	t.Logf("batches reaching kfake: %d distinct, %d repeated; retries answered by the proxy: %v", distinct, repeated, dups)
	if repeated != 0 {
		t.Errorf("%d batches reached the broker more than once: the broker, not the proxy, absorbed the retry", repeated)
	}
	if dups < 1 {
		t.Errorf("the proxy answered no retry")
	}
	if moved := testutil.ToFloat64(p.Metrics.ProduceSpliced); spliced && moved == 0 {
		t.Errorf("no record bytes spliced")
	} else if spliced {
		t.Logf("record bytes spliced %.0f, read back %.0f", moved, testutil.ToFloat64(p.Metrics.ProduceReadBack))
	}
}

// TestLostAckSarama: the same with sarama's idempotent producer.
func TestLostAckSarama(t *testing.T) {
	t.Parallel()
	const topic, n = "lostack-sarama", 1000
	c, p, shim, bl := lostAckSetup(t, topic, 1, 3)
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_8_0_0
	cfg.Producer.Idempotent = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Return.Successes = true
	cfg.Producer.Retry.Backoff = 50 * time.Millisecond
	cfg.Producer.Retry.Max = 10
	cfg.Producer.Flush.Messages = 50
	cfg.Producer.Flush.MaxMessages = 50 // at least 20 requests, so the 3rd acknowledgement exists to drop
	cfg.Net.MaxOpenRequests = 1
	cfg.Metadata.Retry.Backoff = 50 * time.Millisecond
	prod, err := sarama.NewAsyncProducer([]string{p.addr()}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.After(60 * time.Second)
	go func() {
		for i := 0; i < n; i++ {
			prod.Input() <- &sarama.ProducerMessage{Topic: topic, Value: sarama.StringEncoder(strconv.Itoa(i))}
		}
	}()
	for ok := 0; ok < n; {
		select {
		case <-prod.Successes():
			ok++
		case err := <-prod.Errors():
			t.Fatalf("sarama: %v", err)
		case <-deadline:
			t.Fatalf("only %d of %d acknowledged", ok, n)
		}
	}
	if err := prod.Close(); err != nil {
		t.Fatal(err)
	}
	if shim.dropped.Load() != 1 {
		t.Fatalf("the shim dropped %d acknowledgements, want 1", shim.dropped.Load())
	}
	consumeDirect(t, c, topic, n)
	distinct, repeated := bl.repeats()
	dups := testutil.ToFloat64(p.Metrics.Batches[metrics.OutDuplicate]) + testutil.ToFloat64(p.Metrics.Batches[metrics.OutInFlight])
	t.Logf("batches reaching kfake: %d distinct, %d repeated; retries answered by the proxy: %v", distinct, repeated, dups)
	if repeated != 0 || dups < 1 {
		t.Errorf("repeated at the broker %d, answered by the proxy %v", repeated, dups)
	}
}

// TestIdempotentSlowBrokerRetriesStayHere: the broker takes longer than
// franz-go's request timeout for the first Produce requests, so the client
// gives up on each, reconnects and retries while its original is still in
// the broker, again and again. Every retry is held for its original and
// answered with its outcome: no batch reaches the broker twice (the broker
// would absorb it, but the proxy knew the original).
func TestIdempotentSlowBrokerRetriesStayHere(t *testing.T) {
	t.Parallel()
	const topic, n, slow = "slow-idem", 12, 3
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(2, topic))
	bl := logBatches(c)
	var held atomic.Int64
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if held.Add(1) <= slow {
			// The broker's own slowness is the fault under test.
			c.SleepControl(func() { time.Sleep(1500 * time.Millisecond) })
		}
		return nil, nil, false
	})
	p := startProxy(t, c, nil)
	cl, err := kgo.NewClient(kgo.SeedBrokers(p.addr()), kgo.DefaultProduceTopic(topic),
		kgo.ProduceRequestTimeout(200*time.Millisecond), kgo.RequestTimeoutOverhead(300*time.Millisecond),
		kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond }),
		kgo.RecordPartitioner(kgo.RoundRobinPartitioner()), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range n {
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte(strconv.Itoa(i))}).FirstErr(); err != nil {
			t.Fatalf("produce %d: %v", i, err)
		}
	}
	consumeDirect(t, c, topic, n)
	distinct, repeated := bl.repeats()
	waited := testutil.ToFloat64(p.Metrics.Batches[metrics.OutInFlight])
	answered := testutil.ToFloat64(p.Metrics.Batches[metrics.OutDuplicate])
	t.Logf("batches reaching kfake: %d distinct, %d repeated; retries held for their original %v, answered as duplicates %v", distinct, repeated, waited, answered)
	if held.Load() < slow {
		t.Fatalf("the broker held %d requests, want %d", held.Load(), slow)
	}
	if repeated != 0 {
		t.Errorf("%d batches reached the broker more than once", repeated)
	}
	if waited+answered < 1 {
		t.Errorf("no retry was held or answered by the proxy: the client never retried")
	}
}
