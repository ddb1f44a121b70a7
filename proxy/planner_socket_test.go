package proxy

import (
	"context"
	"errors"
	"io"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/clock"
	"github.com/dedupproxy/dedupproxy/decide"
	"github.com/dedupproxy/dedupproxy/metrics"
)

// Socket tests of the planner's rules: real loopback connections, a kfake
// broker, crafted requests so that each case is exact.

// produceV is produceParts at Produce version v, naming the topic by id
// from v13.
func produceV(v int16, topic string, id [16]byte, acks int16, timeoutMs int32, parts ...part) *kmsg.ProduceRequest {
	req := produceParts(topic, acks, parts...)
	req.SetVersion(v)
	req.TimeoutMillis = timeoutMs
	req.Topics[0].TopicID = id
	return req
}

func metadataTopicID(t *testing.T, md *kmsg.MetadataResponse, topic string) [16]byte {
	t.Helper()
	for _, tp := range md.Topics {
		if tp.Topic != nil && *tp.Topic == topic {
			return tp.TopicID
		}
	}
	t.Fatalf("topic %s not in metadata", topic)
	return [16]byte{}
}

// TestMixedProduceVersionsOnePartition: during a rolling upgrade a producer's
// requests to one partition alternate between Produce v12 (topic by name)
// and v13 (topic by ID). They share one table key, so every in-sequence
// batch is accepted and a retry in the other version is still a duplicate.
func TestMixedProduceVersionsOnePartition(t *testing.T) {
	t.Parallel()
	const topic = "upgrade"
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	pc := countProduce(c)
	p := startProxy(t, c, nil)
	raw := dialRaw(t, p.addr())
	id := metadataTopicID(t, raw.learnTopics(topic), topic)
	batches := [][]byte{recordBatch(t, 8, 0, 0, 2, "a"), recordBatch(t, 8, 0, 2, 2, "b"), recordBatch(t, 8, 0, 4, 2, "c")}
	for i, v := range []int16{12, 13, 12} {
		r := onlyPartition(t, raw.roundTrip(produceV(v, topic, id, -1, 5000, part{0, batches[i]})))
		if r.ErrorCode != 0 || r.BaseOffset != int64(2*i) {
			t.Fatalf("v%d batch %d: %+v", v, i, r)
		}
	}
	before := pc.requests.Load()
	r := onlyPartition(t, raw.roundTrip(produceV(13, topic, id, -1, 5000, part{0, batches[2]})))
	if r.ErrorCode != 0 || r.BaseOffset != 4 || pc.requests.Load() != before {
		t.Fatalf("v13 retry of a v12 batch: %+v (forwarded=%v)", r, pc.requests.Load() != before)
	}
	if n := testutil.ToFloat64(p.Metrics.Batches[metrics.OutOutOfOrder]); n != 0 {
		t.Fatalf("%v batches counted out of order", n)
	}
}

// TestTwoProxiesOneProducer: two proxies in front of one cluster, and one
// producer whose requests alternate between them. Each proxy's table misses
// the other's batches, so it sees gaps; the broker accepts them, and so must
// the proxy: it counts the gap and forwards.
func TestTwoProxiesOneProducer(t *testing.T) {
	t.Parallel()
	const topic = "twoproxies"
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	a, b := startProxy(t, c, nil), startProxy(t, c, nil)
	ra, rb := dialRaw(t, a.addr()), dialRaw(t, b.addr())
	ra.learnTopics(topic)
	rb.learnTopics(topic)
	conns := []*rawConn{ra, rb, ra, rb, ra}
	var last []byte
	for i, rc := range conns {
		last = recordBatch(t, 21, 0, int32(i), 1, "x")
		r := onlyPartition(t, rc.roundTrip(produceParts(topic, -1, part{0, last})))
		if r.ErrorCode != 0 || r.BaseOffset != int64(i) {
			t.Fatalf("batch %d via proxy %d: %+v", i, i%2, r)
		}
	}
	// A saw 0 then 2: a gap, forwarded; the broker accepted it, so A
	// forgot what it had and took 4 as a producer it does not know.
	if n := testutil.ToFloat64(a.Metrics.Batches[metrics.OutOutOfOrder]); n != 1 {
		t.Fatalf("proxy A counted %v gaps, want 1", n)
	}
	// Proxy A accepted the broker's word; a retry of its last batch is
	// still answered from its table.
	if r := onlyPartition(t, ra.roundTrip(produceParts(topic, -1, part{0, last}))); r.ErrorCode != 0 || r.BaseOffset != 4 {
		t.Fatalf("retry via A: %+v", r)
	}
}

// TestAcksOneDuplicateForwarded: a retry of an acks=1 append goes to the
// broker, which decides (an unclean leader election may have lost it).
func TestAcksOneDuplicateForwarded(t *testing.T) {
	t.Parallel()
	const topic = "acks1"
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	pc := countProduce(c)
	p := startProxy(t, c, nil)
	raw := dialRaw(t, p.addr())
	raw.learnTopics(topic)
	b := recordBatch(t, 12, 0, 0, 3, "a")
	for i := 0; i < 2; i++ {
		if r := onlyPartition(t, raw.roundTrip(produceParts(topic, 1, part{0, b}))); r.ErrorCode != 0 || r.BaseOffset != 0 {
			t.Fatalf("send %d: %+v", i, r)
		}
	}
	if pc.requests.Load() != 2 {
		t.Fatalf("broker saw %d requests, want both (the retry forwarded)", pc.requests.Load())
	}
	if n := testutil.ToFloat64(p.Metrics.Batches[metrics.OutDuplicate]); n != 1 {
		t.Fatalf("duplicates counted %v, want 1", n)
	}
}

// TestInFlightRaceWithTimedOutCommit: the original's append ends in
// REQUEST_TIMED_OUT (committed without an offset) while its retry waits for
// it. The retry, decided afresh, must not be answered success with offset
// -1: it is forwarded and the broker answers.
func TestInFlightRaceWithTimedOutCommit(t *testing.T) {
	const topic = "race"
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	entered, release, n := holdFirstProduce(c)
	c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.RequestTimedOut, Count: 1})
	p := startProxy(t, c, nil)
	b := recordBatch(t, 66, 0, 0, 2, "v")
	orig, retry := dialRaw(t, p.addr()), dialRaw(t, p.addr())
	orig.learnTopics(topic)
	req := produceParts(topic, -1, part{0, b})
	oc := orig.send(req)
	<-entered
	rc := retry.send(req)
	waitFor(t, 10*time.Second, "the retry to wait for its original", func() bool { return p.waitingRequests() == 1 })
	close(release)
	if r := onlyPartition(t, orig.recv(req, oc)); r.ErrorCode != kerr.RequestTimedOut.Code {
		t.Fatalf("original: %+v, want REQUEST_TIMED_OUT", r)
	}
	r := onlyPartition(t, retry.recv(req, rc))
	if r.ErrorCode != 0 || r.BaseOffset < 0 {
		t.Fatalf("retry: %+v, want the broker's success with a real offset", r)
	}
	if n.Load() != 2 {
		t.Fatalf("%d produce requests reached the broker, want 2 (the retry forwarded)", n.Load())
	}
}

// TestInFlightWaitDeadline: a retry waits for its in-flight original at
// most its own timeout_ms plus a second, on the proxy's clock, then gets
// REQUEST_TIMED_OUT (retriable); the original still completes. The test
// drives the clock: the retry's timeout is a minute, which the wait would
// take of real time were it not the proxy's clock it waited on.
func TestInFlightWaitDeadline(t *testing.T) {
	t.Parallel()
	const topic = "deadline"
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	entered, release, _ := holdFirstProduce(c)
	clk := clock.NewManual(time.Now())
	p := startProxyWith(t, c, nil, func(s *Server) { s.Clock = clk })
	b := recordBatch(t, 67, 0, 0, 2, "v")
	orig, retry := dialRaw(t, p.addr()), dialRaw(t, p.addr())
	orig.learnTopics(topic)
	oc := orig.send(produceParts(topic, -1, part{0, b}))
	<-entered
	req := produceV(9, topic, [16]byte{}, -1, 60_000, part{0, b})
	rc := retry.send(req)
	waitFor(t, 10*time.Second, "the retry to wait for its original", func() bool {
		return testutil.ToFloat64(p.Metrics.Waiting) == 1
	})
	clk.Advance(time.Minute) // its timeout: the second after it is still the original's
	if n := testutil.ToFloat64(p.Metrics.WaitTimeouts); n != 0 {
		t.Fatalf("gave up %v times within the timeout", n)
	}
	clk.Advance(time.Second)
	if r := onlyPartition(t, retry.recv(req, rc)); r.ErrorCode != kerr.RequestTimedOut.Code {
		t.Fatalf("retry past its deadline: %+v", r)
	}
	if n := testutil.ToFloat64(p.Metrics.WaitTimeouts); n != 1 {
		t.Fatalf("wait timeouts %v", n)
	}
	close(release)
	if r := onlyPartition(t, orig.recv(produceParts(topic, -1, part{0, b}), oc)); r.ErrorCode != 0 {
		t.Fatalf("original: %+v", r)
	}
}

// TestInjectedPanicsLoseNothing: a panic at each point of the Produce path —
// after the decision and before queueing, while committing the broker's
// response, while building a merged answer — is recovered, closes only that
// connection, and leaves no batch pending: the client's retry on a new
// connection is decided afresh, and nothing is stored twice.
func TestInjectedPanicsLoseNothing(t *testing.T) {
	for _, where := range []string{"plan", "commit", "merge"} {
		t.Run(where, func(t *testing.T) {
			topic := "panic-" + where
			c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
			p := startProxy(t, c, nil)
			p.expectPanics.Store(1)
			b := recordBatch(t, 5, 0, 0, 2, "v")
			req := produceParts(topic, -1, part{0, b})
			first := dialRaw(t, p.addr())
			first.learnTopics(topic)
			if where == "merge" { // the panic hits the local answer to a duplicate
				if r := onlyPartition(t, first.roundTrip(req)); r.ErrorCode != 0 {
					t.Fatalf("original: %+v", r)
				}
			}
			var fired atomic.Bool
			hook := func(at string) {
				if at == where && fired.CompareAndSwap(false, true) {
					panic("injected at " + at)
				}
			}
			testHookFn.Store(&hook)
			defer testHookFn.Store(nil)
			first.send(req)
			if _, err := readFrame(first.conn); !errors.Is(err, io.EOF) && !isReset(err) {
				t.Fatalf("after a panic at %s: %v, want the connection closed", where, err)
			}
			if !fired.Load() {
				t.Fatal("the hook never ran")
			}
			// A retry racing the broken connection's cleanup would wait
			// on the batch and get the retriable REQUEST_TIMED_OUT; a
			// client retries again. Let the cleanup finish first.
			waitFor(t, 10*time.Second, "the broken connection to be cleaned up", func() bool {
				return testutil.ToFloat64(p.Metrics.ClientConnections) == 0
			})
			retry := onlyPartition(t, dialRaw(t, p.addr()).roundTrip(req))
			if retry.ErrorCode != 0 || retry.BaseOffset != 0 {
				t.Fatalf("retry after a panic at %s: %+v", where, retry)
			}
			next := onlyPartition(t, dialRaw(t, p.addr()).roundTrip(produceParts(topic, -1, part{0, recordBatch(t, 5, 0, 2, 1, "w")})))
			if next.ErrorCode != 0 || next.BaseOffset != 2 {
				t.Fatalf("next batch: %+v, want offset 2 (nothing stored twice)", next)
			}
			if n := testutil.ToFloat64(p.Metrics.Panics); n != 1 {
				t.Fatalf("panics counted %v", n)
			}
		})
	}
}

// TestSASLDecidesOnlyAfterAuthentication: on a SASL cluster nothing is
// decided for a connection until the broker accepted its SaslAuthenticate:
// a client that skips authentication or fails it leaves the table
// untouched; an authenticated one is deduplicated as usual.
func TestSASLDecidesOnlyAfterAuthentication(t *testing.T) {
	t.Parallel()
	const topic = "sasl"
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic), kfake.EnableSASL(), kfake.Superuser("PLAIN", "admin", "secret"))
	p := startProxy(t, c, nil)
	b := recordBatch(t, 3, 0, 0, 2, "v")
	req := produceParts(topic, -1, part{0, b})
	handshake := func(rc *rawConn) {
		hs := kmsg.NewPtrSASLHandshakeRequest()
		hs.SetVersion(1)
		hs.Mechanism = "PLAIN"
		if r := rc.roundTrip(hs).(*kmsg.SASLHandshakeResponse); r.ErrorCode != 0 {
			t.Fatalf("handshake: %d", r.ErrorCode)
		}
	}
	auth := func(pass string) *kmsg.SASLAuthenticateRequest {
		a := kmsg.NewPtrSASLAuthenticateRequest()
		a.SetVersion(1)
		a.SASLAuthBytes = []byte("\x00admin\x00" + pass)
		return a
	}
	closed := func(rc *rawConn) {
		rc.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		for i := 0; i < 4; i++ { // at most the responses pipelined before the close
			if _, err := readFrame(rc.conn); err != nil {
				return
			}
		}
		t.Fatal("connection still open")
	}

	// No authentication at all: the Produce is the first request.
	skip := dialRaw(t, p.addr())
	skip.send(req)
	closed(skip)
	// A wrong password, with the Produce pipelined behind it.
	bad := dialRaw(t, p.addr())
	handshake(bad)
	bad.send(auth("wrong"))
	bad.send(req)
	closed(bad)
	if n := p.table.Len(); n != 0 {
		t.Fatalf("unauthenticated produce reached the table: %d entries", n)
	}
	if n := testutil.ToFloat64(p.Metrics.Batches[metrics.OutAccepted]); n != 0 {
		t.Fatalf("%v unauthenticated batches decided", n)
	}
	if n := testutil.ToFloat64(p.Metrics.Passthrough[decide.PassUnauthenticated]); n < 1 {
		t.Fatalf("unauthenticated passthrough counted %v", n)
	}

	// Authenticated: decided, and a retry is answered by the proxy.
	good := dialRaw(t, p.addr())
	handshake(good)
	if r := good.roundTrip(auth("secret")).(*kmsg.SASLAuthenticateResponse); r.ErrorCode != 0 {
		t.Fatalf("authenticate: %d", r.ErrorCode)
	}
	good.learnTopics(topic)
	for i := 0; i < 2; i++ {
		if r := onlyPartition(t, good.roundTrip(req)); r.ErrorCode != 0 || r.BaseOffset != 0 {
			t.Fatalf("authenticated send %d: %+v", i, r)
		}
	}
	if n := testutil.ToFloat64(p.Metrics.Batches[metrics.OutDuplicate]); n != 1 {
		t.Fatalf("duplicates on the authenticated connection: %v", n)
	}
}

// TestUnknownTopicNamesNotKept: 100,000 distinct topic names that the
// cluster does not know, sent by one client, are never interned; the
// proxy's heap stays flat and a healthy client keeps working.
func TestUnknownTopicNamesNotKept(t *testing.T) {
	const topic = "real"
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	p := startProxy(t, c, nil)
	raw := dialRaw(t, p.addr())
	raw.learnTopics(topic)
	b := recordBatch(t, 4, 0, 0, 1, "x")
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const perRequest, requests = 1000, 100
	for r := 0; r < requests; r++ {
		req := produceParts("x", -1)
		req.Topics = req.Topics[:0]
		for i := 0; i < perRequest; i++ {
			rt := kmsg.NewProduceRequestTopic()
			rt.Topic = "hostile-" + string(rune('a'+r%26)) + "-" + itoa(r*perRequest+i)
			rp := kmsg.NewProduceRequestTopicPartition()
			rp.Records = b
			rt.Partitions = append(rt.Partitions, rp)
			req.Topics = append(req.Topics, rt)
		}
		raw.roundTrip(req)
	}
	if n := testutil.ToFloat64(p.Metrics.Passthrough[decide.PassUnknownTopic]); n != perRequest*requests {
		t.Fatalf("unknown_topic passthrough %v, want %d", n, perRequest*requests)
	}
	if _, ok := p.table.LookupTopic([]byte("hostile-a-0")); ok {
		t.Fatal("a client-supplied topic name was interned")
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	grew := int64(after.HeapInuse) - int64(before.HeapInuse)
	t.Logf("heap in use grew %d KiB over 100,000 unknown topic names (includes kfake)", grew>>10)
	r := onlyPartition(t, dialRaw(t, p.addr()).roundTrip(produceParts(topic, -1, part{0, recordBatch(t, 9, 0, 0, 1, "ok")})))
	if r.ErrorCode != 0 {
		t.Fatalf("healthy client: %+v", r)
	}
}

func itoa(i int) string {
	var b [20]byte
	n := len(b)
	for {
		n--
		b[n] = byte('0' + i%10)
		if i /= 10; i == 0 {
			return string(b[n:])
		}
	}
}

// TestTopicsLearnedAtStart: after a restart, clients produce with the
// metadata they cached, without asking the proxy for Metadata. The proxy
// learns the cluster's topics (names and IDs) itself at start, so their
// batches are decided at once, by name (v9) and by topic ID (v13).
func TestTopicsLearnedAtStart(t *testing.T) {
	t.Parallel()
	const topic = "cached"
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	pc := countProduce(c)
	id := metadataTopicID(t, dialRaw(t, c.ListenAddrs()[0]).learnTopics(topic), topic)
	p := startProxy(t, c, nil)
	for i, v := range []int16{9, 13} {
		raw := dialRaw(t, p.addr()) // no Metadata through the proxy
		b := recordBatch(t, 70+int64(i), 0, 0, 1, "x")
		req := produceV(v, topic, id, -1, 5000, part{0, b})
		for j := 0; j < 2; j++ {
			if r := onlyPartition(t, raw.roundTrip(req)); r.ErrorCode != 0 || r.BaseOffset != int64(i) {
				t.Fatalf("v%d send %d: %+v", v, j, r)
			}
		}
	}
	if pc.requests.Load() != 2 {
		t.Fatalf("broker saw %d requests, want 2 (each retry answered by the proxy)", pc.requests.Load())
	}
}

// TestShutdownWithStuckWaiter: a retry waits on an original the broker
// holds; Shutdown with a short context returns within it, the waiter is
// abandoned and nothing stays pending.
func TestShutdownWithStuckWaiter(t *testing.T) {
	t.Parallel()
	const topic = "stuck"
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	entered, release, _ := holdFirstProduce(c)
	defer close(release)
	p := startProxy(t, c, nil)
	b := recordBatch(t, 88, 0, 0, 1, "x")
	req := produceParts(topic, -1, part{0, b})
	orig, retry := dialRaw(t, p.addr()), dialRaw(t, p.addr())
	orig.learnTopics(topic)
	orig.send(req)
	<-entered
	retry.send(req)
	waitFor(t, 10*time.Second, "the retry to wait on its original", func() bool {
		return testutil.ToFloat64(p.Metrics.Batches[metrics.OutInFlight]) == 1
	})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := p.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("shutdown: %v, want the context's deadline", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("shutdown took %v with a 300ms context", el)
	}
	waitFor(t, 10*time.Second, "every connection to finish", func() bool {
		return testutil.ToFloat64(p.Metrics.ClientConnections) == 0
	})
	if n := p.waitingRequests(); n != 0 {
		t.Fatalf("%d waiters left registered", n)
	}
}
