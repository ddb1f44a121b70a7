package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/clock"
	"github.com/dedupproxy/dedupproxy/config"
	"github.com/dedupproxy/dedupproxy/metrics"
	"github.com/dedupproxy/dedupproxy/owner"
	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/relay"
	"github.com/dedupproxy/dedupproxy/replica"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// TestReplicasAdvertiseOwners: three replicas in front of a three-broker
// cluster. Whichever replica a client asks, and through whichever of its
// listeners (the bootstrap, a node it owns, a node it does not), node N is
// advertised at its owner's address: replica N mod 3's host, at that
// replica's port + 1 + N.
func TestReplicasAdvertiseOwners(t *testing.T) {
	c := newCluster(t)
	f := newFleet(t, c, 3, 3, nil)
	for i := range 3 {
		for _, via := range []string{f.listen[i], f.nodeAddr(i, 0), f.nodeAddr(i, 1), f.nodeAddr(i, 2)} {
			req := kmsg.NewPtrMetadataRequest()
			req.SetVersion(12)
			resp := dialRaw(t, via).roundTrip(req).(*kmsg.MetadataResponse)
			if len(resp.Brokers) != 3 {
				t.Fatalf("replica %d via %s: %d brokers, want 3", i, via, len(resp.Brokers))
			}
			for _, b := range resp.Brokers {
				want := f.nodeAddr(int(b.NodeID)%3, b.NodeID)
				if got := addrString(b.Host, b.Port); got != want {
					t.Errorf("replica %d via %s: node %d at %s, want its owner's %s", i, via, b.NodeID, got, want)
				}
			}
		}
	}
}

// holdAtNode makes the broker hold the next Produce request (acks != 0)
// that node receives, once armed, for hold: requests are then in flight
// through the replica that serves node when it is stopped. arm(node) arms
// it and returns a channel closed when a request is held; node -2 holds
// the next request any node receives (kfake may give a node no partition).
func holdAtNode(c *kfake.Cluster, hold time.Duration) (arm func(node int32) <-chan struct{}) {
	var mu sync.Mutex
	armed := int32(-1)
	var fired chan struct{}
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if req.(*kmsg.ProduceRequest).Acks == 0 {
			return nil, nil, false
		}
		mu.Lock()
		if armed == -1 || armed >= 0 && c.CurrentNode() != armed {
			mu.Unlock()
			return nil, nil, false
		}
		armed = -1
		close(fired)
		mu.Unlock()
		c.SleepControl(func() { time.Sleep(hold) }) // the broker is slow: that is the fault
		return nil, nil, false
	})
	return func(node int32) <-chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		armed, fired = node, make(chan struct{})
		return fired
	}
}

// paced produces value(prefix, i) records to topic through cl, one every
// interval, until stop is closed; it records every acknowledgement and
// error, and the longest time with records outstanding and no
// acknowledgement (the producers' stall).
type paced struct {
	mu       sync.Mutex
	sent     int
	acked    map[string]bool
	errs     []error
	lastAck  time.Time
	stall    time.Duration
	inFlight int
}

func newPaced() *paced { return &paced{acked: map[string]bool{}, lastAck: time.Now()} }

// ackedCount is how many records were acknowledged so far.
func (p *paced) ackedCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.acked)
}

func (p *paced) run(ctx context.Context, cl *kgo.Client, topic, prefix string, every time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(every)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-stop:
			cl.Flush(ctx)
			p.mu.Lock()
			p.noteStall(time.Now())
			p.mu.Unlock()
			return
		case <-t.C:
		}
		v := fmt.Sprintf("%s-%06d", prefix, i)
		p.mu.Lock()
		p.sent++
		if p.inFlight == 0 {
			p.lastAck = time.Now()
		}
		p.inFlight++
		p.mu.Unlock()
		cl.Produce(ctx, &kgo.Record{Topic: topic, Value: []byte(v)}, func(r *kgo.Record, err error) {
			p.mu.Lock()
			defer p.mu.Unlock()
			now := time.Now()
			p.noteStall(now)
			p.inFlight--
			if err != nil {
				p.errs = append(p.errs, err)
				return
			}
			p.acked[string(r.Value)] = true
			p.lastAck = now
		})
	}
}

func (p *paced) noteStall(now time.Time) {
	if p.inFlight > 0 {
		p.stall = max(p.stall, now.Sub(p.lastAck))
	}
}

// storedCopies reads every record of topic straight from the cluster and
// counts the copies of each value.
func storedCopies(t testing.TB, c *kfake.Cluster, topic string, partitions int32) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ends := map[int32]int64{}
	total := int64(0)
	for p := range partitions {
		ends[p] = partitionEnd(t, c.ListenAddrs()[c.LeaderFor(topic, p)], topic, p)
		total += ends[p]
	}
	offsets := map[int32]kgo.Offset{}
	for p := range ends {
		offsets[p] = kgo.NewOffset().AtStart()
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: offsets}),
		kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	copies := map[string]int{}
	got := int64(0)
	for polls := 0; got < total && polls < 10000 && ctx.Err() == nil; polls++ {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			if r.Offset < ends[r.Partition] {
				copies[string(r.Value)]++
				got++
			}
		})
	}
	if got < total {
		t.Fatalf("read %d of %d records of %s", got, total, topic)
	}
	return copies
}

// TestReplicasRollingRestartFranzGo: three replicas in front of a
// three-broker cluster; a legacy and an idempotent franz-go producer write
// without pause while the replicas are restarted one after another as a
// rolling upgrade does (SIGTERM's Shutdown, which hands the replica's nodes
// to its peers; start again; wait until it took them back; next), each
// stopped while the broker holds a Produce request of one of its nodes for
// 300 ms. Nothing is written twice, nothing acknowledged is lost, the
// producers see no error, and the stopped replicas redirected requests
// (NOT_LEADER_OR_FOLLOWER) that their peers then served.
func TestReplicasRollingRestartFranzGo(t *testing.T) {
	const topic = "rolling"
	c := newCluster(t, kfake.SeedTopics(6, topic))
	arm := holdAtNode(c, 300*time.Millisecond)
	f := newFleet(t, c, 3, 3, nil)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	producers := []*paced{newPaced(), newPaced()}
	for k, idem := range []bool{false, true} {
		opts := []kgo.Opt{kgo.SeedBrokers(f.listen[1]), kgo.RequiredAcks(kgo.AllISRAcks()),
			kgo.MetadataMinAge(250 * time.Millisecond), kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond }),
			kgo.ProducerLinger(5 * time.Millisecond), kgo.RecordPartitioner(kgo.RoundRobinPartitioner())}
		prefix := "idempotent"
		if !idem {
			opts = append(opts, kgo.DisableIdempotentWrite())
			prefix = "legacy"
		}
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			producers[k].run(ctx, cl, topic, prefix, 2*time.Millisecond, stop)
		}()
	}
	// A steady stream before the first stop.
	waitFor(t, 10*time.Second, "the producers' first acknowledgements", func() bool {
		return producers[0].ackedCount() > 50 && producers[1].ackedCount() > 50
	})
	var redirected, covered float64
	for i := range 3 {
		// Node i is replica i's; kfake may have given it no partition, and
		// then a request held at another node will do.
		held := arm(int32(i))
		select {
		case <-held:
		case <-time.After(time.Second):
			held = arm(-2)
		}
		select {
		case <-held:
		case <-time.After(10 * time.Second):
			t.Fatal("no Produce reached the broker in 10 s")
		}
		start := time.Now()
		r := f.replica(i)
		if err := f.stop(i); err != nil {
			t.Errorf("replica %d shutdown: %v", i, err)
		}
		redirected += testutil.ToFloat64(r.replicaMetrics.Redirected)
		t.Logf("replica %d stopped in %v (redirected %v)", i, time.Since(start).Round(time.Millisecond), testutil.ToFloat64(r.replicaMetrics.Redirected))
		f.start(i)
		f.waitReady(i)
		t.Logf("replica %d back and serving its nodes %v after its stop began", i, time.Since(start).Round(time.Millisecond))
	}
	var rewarmed float64
	f.mu.Lock()
	for _, r := range f.all {
		covered += testutil.ToFloat64(r.replicaMetrics.Handovers[owner.MoveCovered])
		rewarmed += testutil.ToFloat64(r.replicaMetrics.Rewarmed)
	}
	f.mu.Unlock()
	close(stop)
	wg.Wait()
	copies := storedCopies(t, c, topic, 6)
	var sent, acked, dups, lost int
	for _, p := range producers {
		sent += p.sent
		acked += len(p.acked)
		if len(p.errs) > 0 {
			t.Errorf("%d produce errors, the first: %v", len(p.errs), p.errs[0])
		}
		for v := range p.acked {
			if copies[v] == 0 {
				lost++
			}
		}
		t.Logf("sent %d, acknowledged %d, longest stall %v", p.sent, len(p.acked), p.stall.Round(time.Millisecond))
	}
	for v, n := range copies {
		if n > 1 {
			dups += n - 1
			if dups < 5 {
				t.Errorf("%s stored %d times", v, n)
			}
		}
	}
	t.Logf("stored %d distinct values (%d acknowledged of %d sent); redirected %v, nodes covered %v, partitions marked to warm %v", len(copies), acked, sent, redirected, covered, rewarmed)
	if dups > 0 {
		t.Errorf("%d records written twice", dups)
	}
	if lost > 0 {
		t.Errorf("%d acknowledged records lost", lost)
	}
	if redirected == 0 || covered < 3 || rewarmed == 0 {
		t.Errorf("the handovers did not happen as they should: %v requests redirected, %v nodes covered (want 3), %v partitions marked to warm", redirected, covered, rewarmed)
	}
}

// TestReplicaLeaderMovedAwayRewarms: a replica that decided a partition
// sees, in a Metadata response it relays, the partition's leader move to a
// node another replica serves: its warm-up of that partition is forgotten,
// so if the leadership comes back, the partition is read from the log again
// before its next batch is decided here (the other replica may have
// appended batches meanwhile).
func TestReplicaLeaderMovedAwayRewarms(t *testing.T) {
	const topic = "moves"
	c := newCluster(t, kfake.SeedTopics(1, topic))
	f := newFleet(t, c, 3, 3, nil)
	leader := c.LeaderFor(topic, 0)
	r := f.replica(int(leader)) // node N is replica N's
	cl, err := kgo.NewClient(kgo.SeedBrokers(f.bootstrap()...), kgo.DefaultProduceTopic(topic), kgo.DisableIdempotentWrite(),
		kgo.MetadataMinAge(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("before")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	id, ok := r.table.LookupTopic([]byte(topic))
	if !ok {
		t.Fatal("topic not interned")
	}
	key := seqstate.Key{Topic: id, Partition: 0}
	if !r.core.Warm(key.Topic, key.Partition) {
		t.Fatal("the partition was not warmed by its first batch")
	}
	to := (leader + 1) % 3
	if err := c.MoveTopicPartition(topic, 0, to); err != nil {
		t.Fatal(err)
	}
	// A client's Metadata request through the replica that served it.
	req := kmsg.NewPtrMetadataRequest()
	req.SetVersion(12)
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	dialRaw(t, f.listen[leader]).roundTrip(req)
	if r.core.Warm(key.Topic, key.Partition) {
		t.Fatalf("replica %d still takes partition 0 as warm after its leader moved to node %d", leader, to)
	}
	if n := testutil.ToFloat64(r.replicaMetrics.Rewarmed); n != 1 {
		t.Errorf("rewarm_partitions_total %v, want 1", n)
	}
	// The leadership comes back: the next batch here reads the log first.
	if err := c.MoveTopicPartition(topic, 0, leader); err != nil {
		t.Fatal(err)
	}
	warmed := testutil.ToFloat64(r.Metrics.Warmups[metrics.WarmOK])
	waitFor(t, 10*time.Second, "a batch decided by the first replica again", func() bool {
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("back")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		return r.core.Warm(key.Topic, key.Partition)
	})
	if got := testutil.ToFloat64(r.Metrics.Warmups[metrics.WarmOK]); got != warmed+1 {
		t.Errorf("warm-ups at replica %d: %v, want %v (read again when the leadership came back)", leader, got, warmed+1)
	}
}

// gateFixture is a session on a node its replica serves, for the gate's
// hot path: what every Produce request of a replica pays.
func gateFixture() (*session, *relay.Tracker, protocol.RequestHeader) {
	l := &config.Layout{Self: 0, Count: 3, Owners: map[int32]int{}}
	s := &Server{Logger: slog.New(slog.DiscardHandler), Metrics: NewMetrics(nil)}
	s.replicas = replica.New(replica.Options{Layout: l, Log: s.Logger, Clock: clock.Real, Ctx: context.Background(), Spawn: func(func()) bool { return false }})
	for peer := 1; peer < l.Count; peer++ { // nobody else decides anything: serving
		s.replicas.Step(owner.PeerUnreachable{Peer: peer})
	}
	tr := relay.NewTracker(nil)
	n := s.replicas.Attach(tr, 0)
	tr.Drain = n
	return &session{s: s, client: tr, tracker: tr, rnode: n}, tr, protocol.RequestHeader{APIKey: 0, APIVersion: 9, CorrelationID: 7}
}

// TestReplicaGateNoAllocs: on a node its replica serves, the gate costs a
// Produce request no allocation.
func TestReplicaGateNoAllocs(t *testing.T) {
	c, tr, h := gateFixture()
	if c.replicaGate(h, nil, -1, time.Time{}, nil) {
		t.Fatal("a served node's request was answered by the gate")
	}
	tr.ProduceUnsent()
	if n := testing.AllocsPerRun(1000, func() {
		if c.replicaGate(h, nil, -1, time.Time{}, nil) {
			panic("answered")
		}
		tr.ProduceUnsent() // as its answer would
	}); n != 0 {
		t.Errorf("%v allocations per Produce request", n)
	}
}

// BenchmarkReplicaGate is the gate on a served node.
func BenchmarkReplicaGate(b *testing.B) {
	c, tr, h := gateFixture()
	b.ReportAllocs()
	for b.Loop() {
		c.replicaGate(h, nil, -1, time.Time{}, nil)
		tr.ProduceUnsent()
	}
}

// TestReplicaForeignConnectionRelayed: a client that reaches a replica on
// the listener of a node another replica owns (metadata from before a
// handover) is relayed, not refused: its batch is written, and the
// connection and the request are counted.
func TestReplicaForeignConnectionRelayed(t *testing.T) {
	const topic = "foreign"
	c := newCluster(t, kfake.SeedTopics(1, topic))
	f := newFleet(t, c, 3, 3, nil)
	leader := c.LeaderFor(topic, 0)
	other := (int(leader) + 1) % 3
	raw := dialRaw(t, f.nodeAddr(other, leader)) // replica other, node leader: not its own
	raw.learnTopics(topic)
	before := partitionEnd(t, c.ListenAddrs()[leader], topic, 0)
	if p := onlyPartition(t, raw.roundTrip(produceParts(topic, -1, part{0, recordBatchAt(t, -1, -1, -1, 1, "relayed", time.Now().UnixMilli())}))); p.ErrorCode != 0 {
		t.Fatalf("relayed Produce answered error %d", p.ErrorCode)
	}
	if after := partitionEnd(t, c.ListenAddrs()[leader], topic, 0); after != before+1 {
		t.Errorf("log end %d -> %d, want one record more", before, after)
	}
	r := f.replica(other)
	if n := testutil.ToFloat64(r.replicaMetrics.ForeignConns); n != 1 {
		t.Errorf("foreign_connections_total %v, want 1", n)
	}
	if n := testutil.ToFloat64(r.replicaMetrics.ForeignProduce); n != 1 {
		t.Errorf("foreign_produce_requests_total %v, want 1", n)
	}
}

// TestReplicaHandoverRedirect: once a replica stopping has released its
// node, a Produce request on that node's connection is answered
// NOT_LEADER_OR_FOLLOWER with the node (KIP-951 CurrentLeader, epoch -1)
// at its taker's address in NodeEndpoints, and the connection closes;
// its Metadata already points there.
func TestReplicaHandoverRedirect(t *testing.T) {
	const topic = "redirect"
	c := newCluster(t, kfake.SeedTopics(1, topic))
	f := newFleet(t, c, 3, 3, nil)
	leader := c.LeaderFor(topic, 0)
	owner := int(leader)
	raw := dialRaw(t, f.nodeAddr(owner, leader))
	raw.learnTopics(topic)
	produce := func() *kmsg.ProduceResponse {
		req := produceParts(topic, -1, part{0, recordBatchAt(t, -1, -1, -1, 1, "x", time.Now().UnixMilli())})
		req.SetVersion(10)
		return raw.roundTrip(req).(*kmsg.ProduceResponse)
	}
	if p := produce().Topics[0].Partitions[0]; p.ErrorCode != 0 {
		t.Fatalf("before the handover: error %d", p.ErrorCode)
	}
	r := f.replica(owner)
	stopped := make(chan error, 1)
	go func() { stopped <- f.stop(owner) }()
	n := r.replicas.Node(leader)
	waitFor(t, 10*time.Second, "the node released", func() bool { return n.State() == nodeReleased })
	target := n.Target()
	if target == owner || target < 0 {
		t.Fatalf("released to %d", target)
	}
	mreq := kmsg.NewPtrMetadataRequest()
	mreq.SetVersion(12)
	for _, b := range dialRaw(t, f.listen[owner]).roundTrip(mreq).(*kmsg.MetadataResponse).Brokers {
		if b.NodeID == leader && addrString(b.Host, b.Port) != f.nodeAddr(target, leader) {
			t.Errorf("the stopping replica's Metadata: node %d at %s, want %s", leader, addrString(b.Host, b.Port), f.nodeAddr(target, leader))
		}
	}
	resp := produce()
	p := resp.Topics[0].Partitions[0]
	if p.ErrorCode != kerr.NotLeaderForPartition.Code || p.CurrentLeader.LeaderID != leader || p.CurrentLeader.LeaderEpoch != -1 {
		t.Errorf("partition answer %+v, want NOT_LEADER_OR_FOLLOWER naming node %d, epoch -1", p, leader)
	}
	if len(resp.Brokers) != 1 || resp.Brokers[0].NodeID != leader || addrString(resp.Brokers[0].Host, resp.Brokers[0].Port) != f.nodeAddr(target, leader) {
		t.Errorf("NodeEndpoints %+v, want node %d at %s", resp.Brokers, leader, f.nodeAddr(target, leader))
	}
	if _, err := readFrame(raw.conn); err == nil {
		t.Error("the redirected connection stayed open")
	}
	if err := <-stopped; err != nil {
		t.Errorf("stop: %v", err)
	}
}
