package e2e

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dedupproxy/dedupproxy/internal/testskip"
)

// The false-positive suite (docs/legacy.md, "What is left"): records that
// different producers really sent, under the default config and without a
// fault, are never dropped. Each case runs twice: with client instances
// that differ in client id, and with instances that share a client id but
// not a host (their clients bound to 127.0.0.2 and 127.0.0.3). A retry
// comes from the client instance that sent the original; records of
// different instances are never retries of each other.

// instance is one client instance of a case: its client id and the
// address it connects from.
type instance struct {
	id   string
	host string
}

// instances returns n instances for variant: "client ids" (one host, a
// client id each) or "hosts" (one client id, a loopback address each).
func instances(variant string, n int) []instance {
	out := make([]instance, n)
	for i := range out {
		if variant == "hosts" {
			out[i] = instance{id: "svc", host: fmt.Sprintf("127.0.0.%d", i+2)}
		} else {
			out[i] = instance{id: fmt.Sprintf("svc-%c", 'a'+i), host: "127.0.0.1"}
		}
	}
	return out
}

var fpVariants = []string{"client ids", "hosts"}

// fpClient is a legacy franz-go producer of instance in, through the proxy
// at addr: idempotence off, acks=all, partitions chosen by the record.
func fpClient(t *testing.T, c *testCluster, addr string, in instance, extra ...kgo.Opt) *kgo.Client {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(in.host)}, Timeout: 5 * time.Second}
	opts := append([]kgo.Opt{kgo.SeedBrokers(addr), kgo.ClientID(in.id), kgo.DisableIdempotentWrite(),
		kgo.RequiredAcks(kgo.AllISRAcks()), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(0), kgo.Dialer(d.DialContext)}, extra...)
	if mech := kgoSASL(c.sasl()); mech != nil {
		opts = append(opts, kgo.SASL(mech))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// send produces records synchronously: each is acknowledged before send
// returns.
func send(t *testing.T, cl *kgo.Client, recs ...*kgo.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

func rec(topic string, partition int32, key, value string) *kgo.Record {
	r := &kgo.Record{Topic: topic, Partition: partition, Value: []byte(value)}
	if key != "" {
		r.Key = []byte(key)
	}
	return r
}

// wantStored fails t unless the topic holds want records in all.
func wantStored(t *testing.T, c *testCluster, topic string, want int, what string) {
	t.Helper()
	_, stored := storedValues(t, c, c.topic(topic))
	if stored != want {
		t.Fatalf("%s: the topic holds %d records, want %d: records producers really sent were dropped", what, stored, want)
	}
	t.Logf("%s: %d of %d written", what, stored, want)
}

// TestFalsePositives runs the suite's cases.
func TestFalsePositives(t *testing.T) {
	for _, variant := range fpVariants {
		t.Run(variant, func(t *testing.T) {
			t.Run("two services take turns", func(t *testing.T) { t.Parallel(); fpTakeTurns(t, variant) })
			t.Run("other producer after a close", func(t *testing.T) { t.Parallel(); fpAfterClose(t, variant) })
			t.Run("broadcast to every partition", func(t *testing.T) { t.Parallel(); fpBroadcast(t, variant) })
			t.Run("sensors share readings", func(t *testing.T) { t.Parallel(); fpSensors(t, variant) })
			t.Run("heartbeats", func(t *testing.T) { t.Parallel(); fpHeartbeats(t, variant) })
			t.Run("restart then other producers", func(t *testing.T) { t.Parallel(); fpRestart(t, variant) })
			t.Run("a copy of a record in flight", func(t *testing.T) { t.Parallel(); fpCopyInFlight(t, variant) })
		})
	}
}

// fpTakeTurns: two services, each on its own open connection, take turns
// sending the same one-record batch (key cfg, value reload) to one
// partition, 50 each: all 100 are written.
func fpTakeTurns(t *testing.T, variant string) {
	const topic = "fp-turns"
	c := newCluster(t, topic)
	p := startProxy(t, c)
	ins := instances(variant, 2)
	a, b := fpClient(t, c, p.addr(), ins[0]), fpClient(t, c, p.addr(), ins[1])
	defer a.Close()
	defer b.Close()
	for range 50 {
		send(t, a, rec(c.topic(topic), 0, "cfg", "reload"))
		send(t, b, rec(c.topic(topic), 0, "cfg", "reload"))
	}
	wantStored(t, c, topic, 100, "two services, 50 identical records each")
}

// fpAfterClose: producer 1 sends X and closes; producer 2 sends X and Y in
// one batch to the same partition, then Z to another partition after
// producer 1 sent Z to the first and closed: every record is written.
func fpAfterClose(t *testing.T, variant string) {
	const topic = "fp-close"
	c := newCluster(t, topic)
	p := startProxy(t, c)
	ins := instances(variant, 2)
	one := fpClient(t, c, p.addr(), ins[0])
	send(t, one, rec(c.topic(topic), 0, "", "X"), rec(c.topic(topic), 0, "", "Z"))
	one.Close()
	two := fpClient(t, c, p.addr(), ins[1], kgo.ProducerLinger(50*time.Millisecond))
	defer two.Close()
	send(t, two, rec(c.topic(topic), 0, "", "X"), rec(c.topic(topic), 0, "", "Y")) // one batch: linger
	send(t, two, rec(c.topic(topic), 1, "", "Z"))
	wantStored(t, c, topic, 5, "X, Z then X, Y and Z moved")
}

// fpBroadcast: each instance sends the same marker to every partition, five
// times: all are written.
func fpBroadcast(t *testing.T, variant string) {
	const topic = "fp-broadcast"
	c := newCluster(t, topic)
	p := startProxy(t, c)
	var wg sync.WaitGroup
	for _, in := range instances(variant, 2) {
		cl := fpClient(t, c, p.addr(), in)
		defer cl.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				var recs []*kgo.Record
				for part := int32(0); part < legacyPartitions; part++ {
					recs = append(recs, rec(c.topic(topic), part, "", "epoch-marker"))
				}
				send(t, cl, recs...)
			}
		}()
	}
	wg.Wait()
	wantStored(t, c, topic, 2*5*legacyPartitions, "a marker broadcast to every partition")
}

// fpSensors: four sensors, each on its own connection, send batches of the
// same readings (21.0, 21.5, 21.0) to one partition, ten each, all at
// once: all are written.
func fpSensors(t *testing.T, variant string) {
	const topic = "fp-sensors"
	c := newCluster(t, topic)
	p := startProxy(t, c)
	var wg sync.WaitGroup
	for _, in := range instances(variant, 4) {
		cl := fpClient(t, c, p.addr(), in, kgo.ProducerLinger(20*time.Millisecond))
		defer cl.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				send(t, cl, rec(c.topic(topic), 0, "", "21.0"), rec(c.topic(topic), 0, "", "21.5"), rec(c.topic(topic), 0, "", "21.0"))
			}
		}()
	}
	wg.Wait()
	wantStored(t, c, topic, 4*10*3, "sensors whose batches share readings")
}

// fpHeartbeats: each instance sends the same heartbeat on one connection,
// ten times waiting for each answer and ten times pipelined: all are
// written.
func fpHeartbeats(t *testing.T, variant string) {
	const topic = "fp-heartbeat"
	c := newCluster(t, topic)
	p := startProxy(t, c)
	var wg sync.WaitGroup
	for _, in := range instances(variant, 2) {
		cl := fpClient(t, c, p.addr(), in)
		defer cl.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				send(t, cl, rec(c.topic(topic), 0, "", "alive"))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var failed atomic.Pointer[error]
			for range 10 {
				cl.Produce(ctx, rec(c.topic(topic), 0, "", "alive"), func(_ *kgo.Record, err error) {
					if err != nil {
						failed.Store(&err)
					}
				})
			}
			if err := cl.Flush(ctx); err != nil {
				t.Errorf("flush: %v", err)
			}
			if err := failed.Load(); err != nil {
				t.Errorf("pipelined heartbeat: %v", *err)
			}
		}()
	}
	wg.Wait()
	wantStored(t, c, topic, 2*20, "heartbeats, sequential and pipelined")
}

// fpRestart: one producer writes records, the proxy restarts (killed, a new
// one on the same ports), then other producers send the same records, to
// the same partition and another: all are written. After a restart the
// proxy knows records only from the log, which says nothing of who wrote
// them; it takes a record for a resend only with its timestamp, which
// another producer's records do not share (docs/legacy.md, "After a
// restart").
func fpRestart(t *testing.T, variant string) {
	const topic = "fp-restart"
	c := newCluster(t, topic)
	listen := freeListenPair(t)
	first := startProxyOn(t, c, listen)
	ins := instances(variant, 3)
	h := fpClient(t, c, first.addr(), ins[0])
	send(t, h, rec(c.topic(topic), 0, "k", "status ok"), rec(c.topic(topic), 0, "", "charge 7"))
	h.Close()
	first.kill()
	second, err := startProxyOnErr(c, listen)
	if err != nil {
		t.Fatal(err)
	}
	defer second.kill()
	for _, in := range ins[1:] {
		s := fpClient(t, c, second.addr(), in)
		send(t, s, rec(c.topic(topic), 0, "k", "status ok"), rec(c.topic(topic), 0, "", "charge 7"))
		send(t, s, rec(c.topic(topic), 1, "k", "status ok"))
		s.Close()
	}
	wantStored(t, c, topic, 2+2*3, "other producers' identical records after a restart")
}

// fpCopyInFlight: an instance's heartbeat is held by the broker; another
// instance sends the same record meanwhile, to the same partition. It is
// not the first's retry: written at once, without waiting. The first's
// later heartbeats are written too.
func fpCopyInFlight(t *testing.T, variant string) {
	const topic = "fp-inflight"
	c := newCluster(t, topic)
	fake := c.kfake(t, "holding a Produce request")
	var fired atomic.Int64
	release := make(chan struct{})
	holdProduce(fake, 1, &fired, func() { <-release })
	p := startProxy(t, c)
	ins := instances(variant, 2)
	a, b := fpClient(t, c, p.addr(), ins[0]), fpClient(t, c, p.addr(), ins[1])
	defer a.Close()
	defer b.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		send(t, a, rec(c.topic(topic), 0, "", "alive"))
	}()
	if !eventually(10*time.Second, func() bool { return fired.Load() == 1 }) {
		close(release)
		t.Fatal("the broker never held the first heartbeat")
	}
	start := time.Now()
	send(t, b, rec(c.topic(topic), 0, "", "alive"))
	waited := time.Since(start)
	close(release)
	<-done
	if waited > 2*time.Second {
		t.Errorf("the other instance's copy waited %v for the held original", waited)
	}
	for range 8 {
		send(t, a, rec(c.topic(topic), 0, "", "alive"))
	}
	if n := p.metric("dedupproxy_batches_total", "outcome=legacy_duplicate"); n != 0 {
		t.Errorf("%v batches answered as retries", n)
	}
	wantStored(t, c, topic, 10, "a copy of a record in flight from another instance")
}

// TestOneShotJobs: a job that connects, sends a record, reads its answer
// and closes, run again and again as the same client instance (the same
// client id from the same host) within the window. Each run closes
// cleanly, having read its answer, and stamps its record anew: every run
// is written (docs/legacy.md, "The rule"), as are jobs that name
// themselves (a client id per run). Before the rule looked at how a
// connection ended and at timestamps, 1 of 20 was written.
func TestOneShotJobs(t *testing.T) {
	const topic, runs = "one-shot", 20
	c := newCluster(t, topic)
	p := startProxy(t, c)
	run := func(id string) {
		cl := fpClient(t, c, p.addr(), instance{id: id, host: "127.0.0.1"})
		send(t, cl, rec(c.topic(topic), 0, "", "nightly report done"))
		cl.Close()
	}
	for range runs {
		run("report-job")
	}
	_, same := storedValues(t, c, c.topic(topic))
	for i := range runs {
		run(fmt.Sprintf("report-job-%d", i))
	}
	_, all := storedValues(t, c, c.topic(topic))
	named := all - same
	t.Logf("one client instance on fresh connections: %d of %d runs written; a client id per run: %d of %d", same, runs, named, runs)
	if same != runs {
		t.Errorf("the same instance's runs: %d of %d written: runs taken for retries of the first", same, runs)
	}
	if named != runs {
		t.Errorf("runs with a client id each: %d of %d written", named, runs)
	}
}

// TestSharedIdentity measures two producer processes the proxy cannot tell
// apart: the same client id (a library's default, such as librdkafka's
// "rdkafka") from the same host under the same principal are one client
// instance to it (docs/legacy.md, "What is left"). Taking turns on their
// open connections they lose nothing; nor does a copy stamped at its own
// time sent while the other's is still in flight to the same partition
// (its client keeps timestamps: a later one is another record). A copy
// identical to the millisecond (a relay forwarding events with their
// source timestamps) sent while the other's is in flight is taken for that
// record's retry.
func TestSharedIdentity(t *testing.T) {
	const topic = "shared-id"
	c := newCluster(t, topic)
	fake := c.kfake(t, "holding a Produce request")
	var fired atomic.Int64
	release := make(chan struct{})
	holdProduce(fake, 101, &fired, func() { <-release })
	p := startProxy(t, c)
	in := instance{id: "rdkafka", host: "127.0.0.1"}
	a, b := fpClient(t, c, p.addr(), in), fpClient(t, c, p.addr(), in)
	defer a.Close()
	defer b.Close()
	for range 50 {
		send(t, a, rec(c.topic(topic), 0, "cfg", "reload"))
		send(t, b, rec(c.topic(topic), 0, "cfg", "reload"))
	}
	_, turns := storedValues(t, c, c.topic(topic))
	at := time.Now().Add(-time.Second)
	stamped := func(d time.Duration) *kgo.Record {
		r := rec(c.topic(topic), 0, "", "alive")
		r.Timestamp = at.Add(d)
		return r
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		send(t, a, stamped(0))
	}()
	if !eventually(10*time.Second, func() bool { return fired.Load() == 1 }) {
		close(release)
		t.Fatal("the broker never held the first copy")
	}
	// Its own copy, stamped a millisecond later: another record, written
	// at once.
	send(t, b, stamped(time.Millisecond))
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		send(t, b, stamped(0))
	}()
	if !eventually(10*time.Second, func() bool { return p.metric("dedupproxy_produce_waiting_retries", "") == 1 }) {
		t.Error("the copy never waited for the first")
	}
	close(release)
	<-done
	<-copied
	_, all := storedValues(t, c, c.topic(topic))
	t.Logf("one client id and host, two processes: taking turns %d of 100 written; copies of a record in flight, one stamped anew and one to the millisecond: %d of 3 written", turns, all-turns)
	if turns != 100 {
		t.Errorf("taking turns on open connections: %d of 100 written", turns)
	}
	if all-turns != 2 {
		t.Errorf("copies of a record in flight: %d of 3 written, docs/legacy.md says 2 (the copy identical to the millisecond is taken for a retry)", all-turns)
	}
}

// The reconnects of TestHeartbeatsAcrossReconnect.
const (
	// reconnectClose: the client closes; a new one with the same client
	// id goes on (the same client instance to the proxy).
	reconnectClose = "client closes"
	// reconnectRestart: the proxy is killed and a new one starts on its
	// ports; the same client reconnects and goes on.
	reconnectRestart = "proxy restarts"
	// reconnectHandover: through three replicas, the one serving the
	// partition's node stops as SIGTERM does, handing the node to
	// another (docs/replicas.md); the same client follows it and goes on.
	reconnectHandover = "handover"
)

// heartbeatsPerSide is how many beats a client sends before the reconnect,
// and again after it, each at least heartbeatEvery after the one before
// (a timer's beats, ms apart: the workload's shape, not a
// synchronisation).
const (
	heartbeatsPerSide = 40
	heartbeatEvery    = 5 * time.Millisecond
)

// TestHeartbeatsAcrossReconnect: one client instance sends the same record
// (hb=ok, partition 0) on a timer, each beat once the last is acknowledged,
// reconnects, and goes on (docs/legacy.md, "What is left"). Every beat is
// new data, and every one must be written, after each kind of reconnect:
// a client that keeps its timestamps sends a later record each time; one
// that stamps a resend anew (compared by content) closes cleanly itself,
// having read every answer, or reaches a proxy that knows the earlier
// beats only from the log (a restart: matched only with their
// timestamps) or a replica that took the node over with only what its
// client may not have acknowledged (a handover: nothing, between beats).
// The documented loss of such a client after a reset (at most its last
// 64 requests' records) is proxy/heartbeat_test.go's.
func TestHeartbeatsAcrossReconnect(t *testing.T) {
	for _, c := range heartbeatClients() {
		t.Run(c.name, func(t *testing.T) {
			if c.open == nil {
				if err := c.available(); err != nil {
					testskip.Skipf(t, "%s runs only where installed: %v", c.name, err)
				}
			}
			requireClient(t, c.name, c.available())
			for _, kind := range []string{reconnectClose, reconnectRestart, reconnectHandover} {
				t.Run(kind, func(t *testing.T) { runHeartbeats(t, c, kind) })
			}
		})
	}
}

func runHeartbeats(t *testing.T, c hbClient, kind string) {
	name := strings.NewReplacer(" ", "-", "/", "-", "@", "").Replace(c.name)
	const topicName = "heartbeats"
	var (
		tc          *testCluster
		bootstrap   string
		reconnect   func()
		newInstance bool
	)
	switch kind {
	case reconnectClose, reconnectRestart:
		tc = newCluster(t, topicName)
		listen := freeListenPair(t)
		px := startProxyOn(t, tc, listen)
		bootstrap = px.addr()
		if kind == reconnectClose {
			newInstance = true
			reconnect = func() {
				if !eventually(10*time.Second, func() bool { return px.metric("dedupproxy_client_connections", "") == 0 }) {
					t.Fatalf("the proxy still has %v client connections 10 s after the client closed", px.metric("dedupproxy_client_connections", ""))
				}
			}
			break
		}
		reconnect = func() {
			px.kill()
			next, err := startProxyOnErr(tc, listen)
			if err != nil {
				t.Fatalf("restarting the proxy: %v", err)
			}
			t.Cleanup(next.kill)
		}
	case reconnectHandover:
		tc = newClusterOf(t, fleetSize, topicName)
		cluster := tc.kfake(t, "in-process replicas")
		f := newReplicaFleet(t, cluster, nil)
		bootstrap = strings.Join(f.listen, ",")
		// Node N is replica N mod 3's (docs/replicas.md).
		owner := int(cluster.LeaderFor(tc.topic(topicName), 0)) % fleetSize
		reconnect = func() {
			if n := f.member(owner).metric("dedupproxy_requests_total", "api=Produce"); n < 1 {
				t.Fatalf("replica %d, the node's owner, served none of the beats", owner)
			}
			if err := f.stop(owner); err != nil {
				t.Fatalf("stopping replica %d: %v", owner, err)
			}
			if n := f.sum("dedupproxy_replica_handovers_total", "event=covered"); n < 1 {
				t.Fatalf("replica %d stopped, and no replica covers its nodes (%v covered)", owner, n)
			}
		}
	}
	topic := tc.topic(topicName)
	env := hbEnv{bootstrap: bootstrap, topic: topic, id: "beater-" + name, logged: partitionZeroEnd(t, tc, topic)}
	b, err := c.open(t, env)
	if err != nil {
		t.Fatalf("%s: %v", c.name, err)
	}
	beats := func(side string) {
		tick := time.NewTicker(heartbeatEvery)
		defer tick.Stop()
		for i := range heartbeatsPerSide {
			if i > 0 {
				<-tick.C
			}
			if err := b.beat(); err != nil {
				t.Fatalf("%s: beat %d %s: %v", c.name, i+1, side, err)
			}
		}
	}
	beats("before the reconnect")
	newInstance = newInstance || c.onePass
	if newInstance {
		if err := b.close(); err != nil {
			t.Fatalf("%s: close: %v", c.name, err)
		}
	}
	reconnect()
	if newInstance {
		if b, err = c.open(t, env); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
	}
	beats("after the reconnect")
	if err := b.close(); err != nil {
		t.Errorf("%s: close: %v", c.name, err)
	}
	copies, stored := storedValues(t, tc, topic)
	written, want := copies[heartbeatValue], 2*heartbeatsPerSide
	t.Logf("%s, %s: %d of %d beats written (%d records stored)", c.name, kind, written, want, stored)
	switch {
	case written > want:
		t.Errorf("%d of %d beats written: beats written twice", written, want)
	case written < want:
		t.Errorf("%d of %d beats written: beats this client really sent were taken for retries", written, want)
	}
}

// partitionZeroEnd returns a function that asks the cluster for the end
// offset of topic's partition 0 (how many records it holds), -1 if it
// cannot tell.
func partitionZeroEnd(t *testing.T, c *testCluster, topic string) func() int64 {
	cl, err := kgo.NewClient(c.clientOpts(t)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	adm := kadm.NewClient(cl)
	return func() int64 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ends, err := adm.ListEndOffsets(ctx, topic)
		if err != nil {
			return -1
		}
		o, ok := ends.Lookup(topic, 0)
		if !ok || o.Err != nil {
			return -1
		}
		return o.Offset
	}
}
