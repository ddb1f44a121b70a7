package proxy

import (
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/metrics"
)

// TestLegacyClientGoneBehindFullQueue: a client pipelines more requests than
// the proxy queues for one connection (max_inflight) to a slow broker,
// reads the first answer and resets the connection. The proxy's reader is
// then held behind the full queue for as long as the broker takes with the
// requests queued before (librdkafka keeps hundreds in flight; in the
// replicas' rolling run the reader went on for 48 ms after the client was
// gone). The retry of the first batch, sent on a new connection as soon as
// the proxy failed to write the second answer, is answered with the
// original's offset: the core hears that the connection broke when the
// write fails, not when the reader ends. The requests the reader decides
// after that are not forwarded (their answers reach no one; the client
// resends what it needs): the log holds each record at most once.
func TestLegacyClientGoneBehindFullQueue(t *testing.T) {
	t.Parallel()
	const topic, pipelined = "gone-behind-queue", 8
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	var produces atomic.Int64
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		// The broker's own slowness is the fault under test.
		switch produces.Add(1) {
		case 2: // answered once the client has reset its connection
			c.SleepControl(func() { time.Sleep(300 * time.Millisecond) })
		case 3: // holds the proxy's queue full meanwhile
			c.SleepControl(func() { time.Sleep(3 * time.Second) })
		}
		return nil, nil, false
	})
	p := startProxy(t, c, func(cfg *Config) { cfg.MaxInflight = 2 })
	first := dialRaw(t, p.addr())
	first.learnTopics(topic)
	reqs := make([]*kmsg.ProduceRequest, pipelined)
	corrs := make([]int32, pipelined)
	for i := range reqs {
		reqs[i] = produceParts(topic, -1, part{0, recordBatch(t, -1, -1, -1, 1, "record "+strconv.Itoa(i))})
		corrs[i] = first.send(reqs[i])
	}
	if r := onlyPartition(t, first.recv(reqs[0], corrs[0])); r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("first answer: %+v", r)
	}
	// Reset: the answers after the first are never read.
	if err := first.conn.(*net.TCPConn).SetLinger(0); err != nil {
		t.Fatal(err)
	}
	first.conn.Close()
	waitFor(t, 2*time.Second, "the proxy to fail writing the second answer", func() bool {
		return testutil.ToFloat64(p.Metrics.ClientErrors.WithLabelValues(metrics.ClientWrite)) >= 1
	})
	// The broker holds the third request for 3 s: the reader of the first
	// connection is still behind the full queue.
	retry := dialRaw(t, p.addr())
	if r := onlyPartition(t, retry.roundTrip(reqs[0])); r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("retry of the first batch: %+v, want the original's offset 0", r)
	}
	if n := produces.Load(); n >= pipelined {
		t.Fatalf("the broker had all %d requests before the retry: the first connection's reader was not held", n)
	}
	retry.conn.Close()
	clientsGone(t, p)
	if end, n := logEnd(t, c.ListenAddrs()[0], topic), produces.Load(); end != n || end > pipelined {
		t.Fatalf("the log holds %d records from %d Produce requests of one record each, want one per request and at most the %d sent", end, n, pipelined)
	}
}

// TestGoneSiblingSeenAtNextConnection: a client's connection whose reader
// is held (a request waits in a full queue behind one the broker holds)
// when the client gives up on it: the proxy has not read its end when the
// client resends on a new connection. The new connection's first Produce
// has the proxy look at the instance's other connections; the old one's
// end of stream is found, and the resend of its answered batch is taken
// for the retry it is.
func TestGoneSiblingSeenAtNextConnection(t *testing.T) {
	t.Parallel()
	const topic = "gone-sibling"
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	var produces atomic.Int64
	release := make(chan struct{})
	defer close(release)
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if produces.Add(1) == 2 {
			c.SleepControl(func() { <-release }) // the broker's slowness under test
		}
		return nil, nil, false
	})
	p := startProxy(t, c, func(cfg *Config) { cfg.MaxInflight = 1 })
	first := dialRaw(t, p.addr())
	first.learnTopics(topic)
	req := func(v string) *kmsg.ProduceRequest {
		return produceParts(topic, -1, part{0, recordBatch(t, -1, -1, -1, 1, v)})
	}
	charge := req("charge 1")
	if r := onlyPartition(t, first.roundTrip(charge)); r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("the charge: %+v", r)
	}
	first.send(req("held by the broker"))
	waitFor(t, 10*time.Second, "the broker to hold the second request", func() bool { return produces.Load() == 2 })
	first.send(req("behind it")) // the proxy's reader of this connection waits to queue it
	// Closed cleanly, but with requests outstanding: it gave up on them,
	// and on the connection (docs/legacy.md, "The rule", 1).
	first.conn.Close()
	retry := dialRaw(t, p.addr())
	if r := onlyPartition(t, retry.roundTrip(charge)); r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("the charge resent on a new connection: %+v, want the original's offset 0", r)
	}
	if n := produces.Load(); n != 2 {
		t.Fatalf("%d produce requests reached the broker, want 2 (the resend answered by the proxy)", n)
	}
}
