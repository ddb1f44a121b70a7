package proxy

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/metrics"
)

// TestWaitingRetryOfClosedConnectionNotAnswered: the broker is slower
// than the client (sarama, a 1 s read timeout). The client gives up on a
// Produce the broker holds and sends its records again on a new
// connection, where the retry waits for the original's outcome; it gives
// up on that connection too, with another request pipelined behind the
// retry, and closes it. When the original is appended, the retry waiting
// on it is answered to no one: it must not use the original's records up,
// or the client's next copy, on its third connection, is written again.
// The proxy reads that client's end of stream only past the pipelined
// request, which waits in turn, so the close is told by the connection's
// TCP state. The writers are held once they have written (the hook), so
// that the core hears of no broken write before the third copy is
// decided. Not parallel: the hook is global.
func TestWaitingRetryOfClosedConnectionNotAnswered(t *testing.T) {
	const topic = "gone-retry"
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(2, topic))
	// The broker holds the first two Produce requests to partition 0, each until
	// released: the broker's slowness under test.
	var entered, release [2]chan struct{}
	var frees [2]sync.Once
	for i := range entered {
		entered[i], release[i] = make(chan struct{}), make(chan struct{})
	}
	free := func(i int) { frees[i].Do(func() { close(release[i]) }) }
	defer free(0)
	defer free(1)
	var n atomic.Int64
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if req.(*kmsg.ProduceRequest).Topics[0].Partitions[0].Partition != 0 {
			return nil, nil, false
		}
		if i := n.Add(1) - 1; i < 2 {
			close(entered[i])
			c.SleepControl(func() { <-release[i] })
		}
		return nil, nil, false
	})
	var armed atomic.Bool
	var writes atomic.Int64
	writers := make(chan struct{})
	var writersOnce sync.Once
	letWritersGo := func() { writersOnce.Do(func() { close(writers) }) }
	hook := func(at string) {
		if at == "written" && armed.Load() {
			writes.Add(1)
			<-writers
		}
	}
	testHookFn.Store(&hook)
	defer testHookFn.Store(nil)
	defer letWritersGo()

	p := startProxy(t, c, nil)
	dial := func() *rawConn {
		conn := dialRaw(t, p.addr())
		conn.learnTopics(topic)
		return conn
	}
	held := func(i int) {
		t.Helper()
		select {
		case <-entered[i]:
		case <-time.After(10 * time.Second):
			t.Fatalf("the broker never held Produce request %d", i+1)
		}
	}
	t0 := time.Now().UnixMilli()
	x := produceParts(topic, -1, part{0, stampedLegacyBatch(t, []string{"x"}, []int64{t0})})
	y := produceParts(topic, -1, part{0, stampedLegacyBatch(t, []string{"y"}, []int64{t0})})

	// The client's third connection is open already, and has written z:
	// its next Produce is not its first (which looks at the other
	// connections of its client instance).
	cc := dial()
	if r := onlyPartition(t, cc.roundTrip(produceParts(topic, -1, part{1, stampedLegacyBatch(t, []string{"z"}, []int64{time.Now().UnixMilli()})}))); r.ErrorCode != 0 {
		t.Fatalf("z: error %d", r.ErrorCode)
	}
	// The originals, each on a connection the client then gives up on.
	a := dial()
	a.send(x)
	held(0)
	a2 := dial()
	a2.send(y)
	held(1)
	a.conn.Close()
	a2.conn.Close()

	// The retry of x waits for its original; y is pipelined behind it;
	// then the client gives up on this connection too.
	b := dial()
	b.send(x)
	waitFor(t, 10*time.Second, "the retry of x to wait for its original", func() bool { return p.waitingRequests() == 1 })
	b.send(y)
	b.conn.Close()

	// x is appended: the retry waiting on it is woken, and must find its
	// client gone. (It was answered, its answer written into a closed
	// connection while the request behind it waited on y.)
	armed.Store(true)
	free(0)
	// Before: answered, and its answer and x's original one written (the
	// writers held there). Now: its connection ends (x's original writer
	// held, y's in flight, the third connection open).
	waitFor(t, 10*time.Second, "the woken retry to be answered, or its connection to end", func() bool {
		answered := testutil.ToFloat64(p.Metrics.Batches[metrics.OutLegacyInFlight]) >= 1
		return answered && writes.Load() >= 2 || !answered && testutil.ToFloat64(p.Metrics.ClientConnections) <= 3
	})
	armed.Store(false)
	if n := testutil.ToFloat64(p.Metrics.Batches[metrics.OutLegacyInFlight]); n != 0 {
		t.Errorf("%v retries answered after waiting, want 0: the retry's client had closed its connection", n)
	}

	// The client's next copy of x, on its third connection, is the retry
	// that counts: answered with the original's offset, not written.
	if r := onlyPartition(t, cc.roundTrip(x)); r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Errorf("the copy of x on the third connection: error %d, base offset %d; want 0, 0 (the original's)", r.ErrorCode, r.BaseOffset)
	}
	letWritersGo()
	free(1)
	waitFor(t, 10*time.Second, "y to be appended", func() bool { return logEnd(t, c.ListenAddrs()[0], topic) >= 2 })
	if end := logEnd(t, c.ListenAddrs()[0], topic); end != 2 {
		t.Fatalf("the log holds %d records, want 2 (x and y once each)", end)
	}
}

// TestHeldAnswerToGoneClientKeepsBrokerConnection: a connection's retry
// waits for its original while a request before it is held by the broker;
// once decided, a request the client pipelined behind the retry goes
// upstream too; then the client gives up on the connection. When the
// answer of a request whose decision waited comes up, its client is found
// gone, and the answer is not taken as delivered. The broker connection
// must stay: the request behind is still in flight, and its outcome is
// read and committed as for any client that left ("never abandon an
// in-flight Produce", docs/produce-path.md). Cut, its outcome was
// unknown, and its resend had to be looked for in the log.
func TestHeldAnswerToGoneClientKeepsBrokerConnection(t *testing.T) {
	t.Parallel()
	const topic = "gone-behind"
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(2, topic))
	// The broker holds the first Produce to partition 0 and the first
	// two to partition 1, each until released: the broker's slowness
	// under test.
	var entered, release [3]chan struct{}
	var frees [3]sync.Once
	for i := range entered {
		entered[i], release[i] = make(chan struct{}), make(chan struct{})
	}
	free := func(i int) { frees[i].Do(func() { close(release[i]) }) }
	for i := range frees {
		defer free(i)
	}
	var toZero, toOne atomic.Int64
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		i := -1
		if req.(*kmsg.ProduceRequest).Topics[0].Partitions[0].Partition == 0 {
			if toZero.Add(1) == 1 {
				i = 0
			}
		} else if n := toOne.Add(1); n <= 2 {
			i = int(n)
		}
		if i >= 0 {
			close(entered[i])
			c.SleepControl(func() { <-release[i] })
		}
		return nil, nil, false
	})
	p := startProxy(t, c, nil)
	dial := func() *rawConn {
		conn := dialRaw(t, p.addr())
		conn.learnTopics(topic)
		return conn
	}
	held := func(i int) {
		t.Helper()
		select {
		case <-entered[i]:
		case <-time.After(10 * time.Second):
			t.Fatalf("the broker never held Produce %d", i+1)
		}
	}
	t0 := time.Now().UnixMilli()
	batch := func(partition int32, v string) *kmsg.ProduceRequest {
		return produceParts(topic, -1, part{partition, stampedLegacyBatch(t, []string{v}, []int64{t0})})
	}

	// x's original, on a connection its client gives up on.
	a := dial()
	a.send(batch(0, "x"))
	held(0)
	a.conn.Close()

	// v, held by the broker; the retry of x, waiting for its original;
	// w, pipelined behind, forwarded once the retry is decided.
	b := dial()
	b.send(batch(1, "v"))
	held(1)
	b.send(batch(0, "x"))
	waitFor(t, 10*time.Second, "the retry of x to wait for its original", func() bool { return p.waitingRequests() == 1 })
	b.send(batch(1, "w"))
	free(0)
	waitFor(t, 10*time.Second, "the retry to be answered and w forwarded behind v", func() bool {
		return testutil.ToFloat64(p.Metrics.Batches[metrics.OutLegacyInFlight]) == 1 && p.pendingBatches.Load() == 2
	})
	b.conn.Close()
	// v is appended and answered; w, behind it, is held in turn: in
	// flight when the retry's answer comes up.
	free(1)
	held(2)
	free(2)

	// w was appended after v: its resend on the client's next connection
	// is answered with its offset.
	if r := onlyPartition(t, dial().roundTrip(batch(1, "w"))); r.ErrorCode != 0 || r.BaseOffset != 1 {
		t.Errorf("the resend of w: error %d, base offset %d; want 0, 1 (the original's)", r.ErrorCode, r.BaseOffset)
	}
	if n := testutil.ToFloat64(p.Metrics.BrokerErrors.WithLabelValues(metrics.BrokerRead)); n != 0 {
		t.Errorf("%v broker connections failed: the proxy cut one with a request in flight", n)
	}
	if end := partitionEnd(t, c.ListenAddrs()[0], topic, 1); end != 2 {
		t.Errorf("partition 1 holds %d records, want 2 (v and w once each)", end)
	}
}
