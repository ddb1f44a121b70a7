package proxy

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/decide"
	"github.com/dedupproxy/dedupproxy/internal/testskip"
	"github.com/dedupproxy/dedupproxy/metrics"
)

// TestRetryAcrossRestart: a batch is appended through one proxy, which
// then stops (a deploy, a crash); the client retries through a new proxy
// that has never seen it. The new proxy reads the partition's tail on the
// first Produce and answers the retry with the original offset: for a
// legacy producer, which Kafka would write again, and for an idempotent
// one, whose retry the broker would answer itself.
func TestRetryAcrossRestart(t *testing.T) {
	t.Parallel()
	const topic = "restart"
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(2, topic))
	pc := countProduce(c)
	// Legacy batches are remembered from the log for the window after
	// their timestamp.
	legacy := recordBatchAt(t, -1, -1, -1, 3, "charge account 7", time.Now().UnixMilli())
	idem := recordBatchAt(t, 4711, 0, 0, 2, "charge account 8", time.Now().UnixMilli())

	first := startProxy(t, c, nil)
	raw := dialRaw(t, first.addr())
	raw.learnTopics(topic)
	if r := onlyPartition(t, raw.roundTrip(produceParts(topic, -1, part{0, legacy}))); r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("legacy original: %+v", r)
	}
	if r := onlyPartition(t, raw.roundTrip(produceParts(topic, -1, part{1, idem}))); r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("idempotent original: %+v", r)
	}
	raw.conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := first.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	second := startProxy(t, c, nil)
	before := pc.requests.Load()
	retry := dialRaw(t, second.addr()) // a client with cached metadata: no Metadata first
	if r := onlyPartition(t, retry.roundTrip(produceParts(topic, -1, part{0, legacy}))); r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("legacy retry across the restart: %+v, want the original's offset 0", r)
	}
	if r := onlyPartition(t, retry.roundTrip(produceParts(topic, -1, part{1, idem}))); r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("idempotent retry across the restart: %+v", r)
	}
	if n := pc.requests.Load() - before; n != 0 {
		t.Fatalf("%d produce requests reached the broker after the restart, want 0 (both answered from the log)", n)
	}
	if n := testutil.ToFloat64(second.Metrics.Warmups[metrics.WarmOK]); n != 2 {
		t.Fatalf("warm-ups ok %v, want 2 (one per partition)", n)
	}
	// The same records again on the connection that now has the
	// acknowledgement are new data.
	if r := onlyPartition(t, retry.roundTrip(produceParts(topic, -1, part{0, legacy}))); r.ErrorCode != 0 || r.BaseOffset != 3 {
		t.Fatalf("new data after the answered retry: %+v, want offset 3", r)
	}
}

// TestWarmFailureDecidesWithout: when the tail cannot be read (here a
// SASL cluster and no credentials for the proxy), batches are decided as
// before and the failure is counted.
func TestWarmFailureDecidesWithout(t *testing.T) {
	t.Parallel()
	const topic = "nowarm"
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic), kfake.EnableSASL(), kfake.Superuser("PLAIN", "admin", "secret"))
	p := startProxy(t, c, func(cfg *Config) { cfg.Dedup.Warm.Timeout = 2 * time.Second })
	raw := dialRaw(t, p.addr())
	hs := kmsg.NewPtrSASLHandshakeRequest()
	hs.SetVersion(1)
	hs.Mechanism = "PLAIN"
	raw.roundTrip(hs)
	a := kmsg.NewPtrSASLAuthenticateRequest()
	a.SetVersion(1)
	a.SASLAuthBytes = []byte("\x00admin\x00secret")
	if r := raw.roundTrip(a).(*kmsg.SASLAuthenticateResponse); r.ErrorCode != 0 {
		t.Fatalf("authenticate: %d", r.ErrorCode)
	}
	raw.learnTopics(topic)
	b := recordBatch(t, 5, 0, 0, 1, "x")
	for i := 0; i < 2; i++ {
		if r := onlyPartition(t, raw.roundTrip(produceParts(topic, -1, part{0, b}))); r.ErrorCode != 0 || r.BaseOffset != 0 {
			t.Fatalf("send %d: %+v", i, r)
		}
	}
	if n := testutil.ToFloat64(p.Metrics.Warmups[metrics.WarmFailed]); n != 1 {
		t.Fatalf("failed warm-ups %v, want 1", n)
	}
	if n := testutil.ToFloat64(p.Metrics.Batches[metrics.OutDuplicate]); n != 1 {
		t.Fatalf("duplicates %v: the retry was not decided", n)
	}
}

// produceCutConn loses the broker's answer to a connection's first request
// when that request is a Produce: the broker appended the batch, the proxy
// never learns it (the upstream connection broke).
type produceCutConn struct {
	net.Conn
	once  *sync.Once
	first bool        // readLoop's
	cut   atomic.Bool // set by readLoop, read by responseLoop
}

func (c *produceCutConn) Write(p []byte) (int, error) {
	if !c.first {
		c.first = true
		if len(p) >= 6 && p[4] == 0 && p[5] == 0 { // api key 0: Produce
			c.once.Do(func() { c.cut.Store(true) })
		}
	}
	return c.Conn.Write(p)
}

func (c *produceCutConn) Read(p []byte) (int, error) {
	if c.cut.Load() {
		c.Conn.Read(p) // the answer arrives, and is lost
		c.Conn.Close()
		return 0, io.ErrUnexpectedEOF
	}
	return c.Conn.Read(p)
}

// TestUnknownOutcomeResolvedFromLog: a legacy batch is appended but the
// proxy's connection to the broker breaks before the answer arrives, so
// its fate is unknown to the proxy. The client's retry makes the proxy
// read the partition's tail again: the batch is there, and the retry is
// answered with its offset instead of being written twice.
func TestUnknownOutcomeResolvedFromLog(t *testing.T) {
	t.Parallel()
	const topic = "unknown"
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	pc := countProduce(c)
	var cutOnce sync.Once
	// Only the first session whose first request is a Produce gets a cut
	// connection; the proxy's own connections (probe, warm-up) start
	// with other requests.
	p := startProxyWith(t, c, nil, func(s *Server) {
		var d net.Dialer
		s.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return conn, err
			}
			return &produceCutConn{Conn: conn, once: &cutOnce}, nil
		}
	})
	b := recordBatchAt(t, -1, -1, -1, 2, "charge account 9", time.Now().UnixMilli())
	req := produceParts(topic, -1, part{0, b})
	first := dialRaw(t, p.addr())
	first.send(req)
	if _, err := readFrame(first.conn); err == nil {
		t.Fatal("the first attempt was answered; want its connection closed")
	}
	waitFor(t, 10*time.Second, "the broken connection to be cleaned up", func() bool {
		return testutil.ToFloat64(p.Metrics.ClientConnections) == 0
	})
	if pc.requests.Load() != 1 {
		t.Fatalf("%d produce requests reached the broker, want 1", pc.requests.Load())
	}
	r := onlyPartition(t, dialRaw(t, p.addr()).roundTrip(req))
	if r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("retry after the unknown outcome: %+v, want the original's offset 0", r)
	}
	if pc.requests.Load() != 1 {
		t.Fatalf("%d produce requests reached the broker, want 1 (the retry answered from the log)", pc.requests.Load())
	}
}

// TestProducerIDFlood: 300,000 distinct producer ids, one batch each,
// against a table capped at 50,000 entries, through a broker that keeps
// nothing (so the heap is the proxy's): the table stays at its cap,
// evictions are counted, the heap grows by no more than the cap allows, and
// a healthy producer keeps being deduplicated.
func TestProducerIDFlood(t *testing.T) {
	const topic, partitions, maxEntries = "flood", 100, 50_000
	total := 300_000
	if raceEnabled {
		total = 60_000 // same shape, a fifth of the batches: the race detector is slow
	}
	fb := newSinkBroker(t, topic, partitions)
	p := startProxyWith(t, nil, func(cfg *Config) {
		cfg.Upstream = []string{fb.addr()}
		cfg.Dedup.MaxEntries = maxEntries
	}, nil)
	raw := dialRaw(t, p.addr())
	raw.learnTopics(topic)
	// One warm-up per partition happens on first touch: take it out of the
	// measurement.
	var parts []part
	for i := 0; i < partitions; i++ {
		parts = append(parts, part{int32(i), recordBatch(t, int64(i+1), 0, 0, 1, "warm")})
	}
	raw.roundTrip(produceParts(topic, -1, parts...))
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for pid := 0; pid < total; pid += partitions {
		parts = parts[:0]
		for i := 0; i < partitions; i++ {
			parts = append(parts, part{int32(i), recordBatch(t, int64(1_000_000+pid+i), 0, 0, 1, "f")})
		}
		for _, r := range raw.roundTrip(produceParts(topic, -1, parts...)).(*kmsg.ProduceResponse).Topics[0].Partitions {
			if r.ErrorCode != 0 {
				t.Fatalf("pid block %d: %+v", pid, r)
			}
		}
	}
	tbl := p.table
	if n := tbl.Len(); n > maxEntries+64 {
		t.Fatalf("table holds %d entries, cap %d", n, maxEntries)
	}
	if ev := tbl.Evictions(); ev < uint64(total-maxEntries-64) {
		t.Fatalf("%d evictions counted, want at least %d", ev, total-maxEntries-64)
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	grew := int64(after.HeapInuse) - int64(before.HeapInuse)
	// The table's slabs at the cap (about 150 B per entry, seqstate
	// BenchmarkTableMemory; up to twice that while a shard's slab is being
	// compacted), plus 16 MiB for buffers, pools and the test's own
	// garbage.
	limit := int64(maxEntries*300 + 16<<20)
	t.Logf("%d producer ids: table %d entries, %d evictions; heap +%.1f MiB (bound %.1f MiB)",
		total, tbl.Len(), tbl.Evictions(), float64(grew)/(1<<20), float64(limit)/(1<<20))
	if grew > limit {
		t.Fatalf("heap grew %.1f MiB, bound %.1f MiB from the cap", float64(grew)/(1<<20), float64(limit)/(1<<20))
	}
	// A healthy producer is still deduplicated.
	b := recordBatch(t, 42, 0, 0, 1, "healthy")
	first := onlyPartition(t, raw.roundTrip(produceParts(topic, -1, part{0, b})))
	dup := onlyPartition(t, raw.roundTrip(produceParts(topic, -1, part{0, b})))
	if first.ErrorCode != 0 || dup.ErrorCode != 0 || dup.BaseOffset != first.BaseOffset {
		t.Fatalf("healthy producer: %+v then %+v", first, dup)
	}
}

// BenchmarkWarmPartition measures one partition's warm-up (Metadata,
// ListOffsets, Fetch of the tail, the core applying every batch) against
// kfake, for
// a partition holding about 1 MiB and 4 MiB of recent 1 KiB legacy
// records in 16-record batches: time per partition and bytes read.
func BenchmarkWarmPartition(b *testing.B) {
	for _, mib := range []int{1, 4} {
		b.Run(fmt.Sprintf("tail=%dMiB", mib), func(b *testing.B) {
			const topic = "warmbench"
			c := newCluster(b, kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
			p := startProxy(b, c, nil)
			raw := dialRaw(b, c.ListenAddrs()[0])
			value := strings.Repeat("v", 1000)
			now := time.Now().UnixMilli()
			for i := 0; i < mib*1024/16; i++ {
				raw.roundTrip(produceParts(topic, -1, part{0, recordBatchAt(b, -1, -1, -1, 16, fmt.Sprintf("%d %s", i, value), now)}))
			}
			id, _ := p.table.LookupTopic([]byte(topic))
			var bytes int
			b.ReportAllocs()
			for b.Loop() {
				records, _, err := p.readTail(context.Background(), topic, 0)
				if err != nil {
					b.Fatal(err)
				}
				p.step(&decide.Event{Kind: decide.EvTailRead, Tail: decide.TailKey{Topic: id}, Records: records}, time.Now(), nil)
				bytes = len(records)
			}
			b.ReportMetric(float64(bytes), "bytes/op")
		})
	}
}

// TestTimedOutLegacyAppendOffsetFromLog: a legacy append answered
// REQUEST_TIMED_OUT (Kafka appended it; the response has no offset) is
// not written again on retry, and the retry learns the real offset from
// the log instead of getting -1.
func TestTimedOutLegacyAppendOffsetFromLog(t *testing.T) {
	t.Parallel()
	const topic = "timedoutlegacy"
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	pc := countProduce(c)
	p := startProxy(t, c, nil)
	first := dialRaw(t, p.addr())
	first.learnTopics(topic)
	onlyPartition(t, first.roundTrip(produceParts(topic, -1, part{0, recordBatchAt(t, -1, -1, -1, 2, "before", time.Now().UnixMilli())})))
	b := recordBatchAt(t, -1, -1, -1, 3, "charge", time.Now().UnixMilli())
	c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.RequestTimedOut, Count: 1})
	if r := onlyPartition(t, first.roundTrip(produceParts(topic, -1, part{0, b}))); r.ErrorCode != kerr.RequestTimedOut.Code {
		t.Fatalf("faulted append: %+v", r)
	}
	first.conn.Close()
	sent := pc.requests.Load()
	r := onlyPartition(t, dialRaw(t, p.addr()).roundTrip(produceParts(topic, -1, part{0, b})))
	// The first batch took offsets 0-1, the timed-out one was appended at 2.
	if r.ErrorCode != 0 || r.BaseOffset != 2 || pc.requests.Load() != sent {
		t.Fatalf("retry of a timed-out append: %+v, forwarded=%v; want offset 2 from the log", r, pc.requests.Load() != sent)
	}
}

var soak = flag.Duration("soak", 0, "run TestSoak for this long (opt-in; e.g. -soak 10m)")

// TestSoak (opt-in with -soak) drives steady idempotent and legacy traffic,
// with retries, through the proxy to a broker that keeps nothing, and
// checks every 5 seconds that the heap and the goroutine count stay flat:
// after a warm-up third of the run, neither may exceed its level then by
// more than a fixed margin.
func TestSoak(t *testing.T) {
	if *soak <= 0 {
		testskip.Skip(t, "opt-in: go test ./proxy -run TestSoak -soak 10m")
	}
	const topic, partitions = "soak", 12
	fb := newSinkBroker(t, topic, partitions)
	p := startProxyWith(t, nil, func(cfg *Config) {
		cfg.Upstream = []string{fb.addr()}
		cfg.Dedup.MaxEntries = 20_000
		cfg.Dedup.Legacy.MaxRecords = 20_000
	}, nil)
	deadline := time.Now().Add(*soak)
	var wg sync.WaitGroup
	var sent atomic.Int64
	var failed atomic.Pointer[error]
	fail := func(err error) { failed.CompareAndSwap(nil, &err) }
	// The batches are built before the run: the workers only send.
	var idem [7][50][]byte
	var legacy [20][]byte
	for pid := range idem {
		for i := range idem[pid] {
			idem[pid][i] = recordBatch(t, int64(pid), 0, int32(i), 1, "idem")
		}
	}
	for i := range legacy {
		legacy[i] = recordBatchAt(t, -1, -1, -1, 2, fmt.Sprintf("legacy %d", i), time.Now().Add(*soak).UnixMilli())
	}
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := 0; time.Now().Before(deadline) && failed.Load() == nil; round++ {
				// A new connection every round: sessions come and go.
				conn, err := net.DialTimeout("tcp", p.addr(), 5*time.Second)
				if err != nil {
					fail(err)
					return
				}
				conn.SetDeadline(time.Now().Add(time.Minute))
				for i := 0; i < 50 && time.Now().Before(deadline); i++ {
					var parts []part
					for q := int32(0); q < partitions; q++ {
						parts = append(parts, part{q, idem[(round+w)%7][i]}) // producers come back: duplicates and continuations
					}
					parts = append(parts, part{0, legacy[i%20]})
					frame := kmsg.NewRequestFormatter().AppendRequest(nil, produceParts(topic, -1, parts...), int32(i))
					if _, err := conn.Write(frame); err != nil {
						fail(err)
						break
					}
					if _, err := readFrame(conn); err != nil {
						fail(err)
						break
					}
					sent.Add(int64(len(parts)))
				}
				conn.Close()
			}
		}()
	}
	sample := func() (heap uint64, goroutines int) {
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse, runtime.NumGoroutine()
	}
	var baseHeap uint64
	var baseG int
	warmUntil := time.Now().Add(*soak / 3)
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for i := 0; time.Now().Before(deadline) && i < 100_000; i++ {
		<-tick.C
		heap, g := sample()
		if baseHeap == 0 && time.Now().After(warmUntil) {
			baseHeap, baseG = heap, g
			continue
		}
		if baseHeap != 0 && (heap > baseHeap+32<<20 || g > baseG+50) {
			t.Fatalf("after %d batches: heap %d MiB (was %d), goroutines %d (were %d)", sent.Load(), heap>>20, baseHeap>>20, g, baseG)
		}
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		t.Fatalf("a soak client failed: %v", *err)
	}
	heap, g := sample()
	t.Logf("%d batches in %v: heap %d MiB (baseline %d), goroutines %d (baseline %d)", sent.Load(), *soak, heap>>20, baseHeap>>20, g, baseG)
}
