package proxy

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestReplicaReleaseWakesEveryPeer: the replica that releases a node and
// the one that takes it over wake every peer (POST /replica/wake), not only
// each other. Every replica advertises the node in its Metadata answers,
// and a client redirected by the release refreshes its metadata at any of
// them: a peer left to its next poll (up to 250 ms) still names the
// releasing replica, and sarama (5 retries, 50 ms apart) spent its retries
// on redirects there and failed records with EOF in a rolling run.
func TestReplicaReleaseWakesEveryPeer(t *testing.T) {
	const topic, owner = "wake", 0
	c := newCluster(t, kfake.SeedTopics(1, topic))
	f := newFleet(t, c, 3, 3, nil)
	var before [3]int64
	for i := range before {
		before[i] = f.replica(i).wakes.Load()
	}
	r := f.replica(owner)
	stopped := make(chan error, 1)
	go func() { stopped <- f.stop(owner) }()
	n := r.replicas.Node(owner) // node 0: replica 0's
	waitFor(t, 10*time.Second, "the node released", func() bool { return n.State() == nodeReleased })
	target := n.Target()
	if target == owner || target < 0 {
		t.Fatalf("released to %d", target)
	}
	other := 3 - owner - target
	u := f.replica(other)
	// Woken when the handover began (it is a ready peer), when the node was
	// released, and when the target took it over.
	waitFor(t, 5*time.Second, "the third replica woken by the release and by the take", func() bool {
		return u.wakes.Load()-before[other] >= 3
	})
	waitFor(t, 5*time.Second, "the third replica to advertise the node at its taker", func() bool {
		return u.replicas.Advertised(owner) == target
	})
	if err := <-stopped; err != nil {
		t.Errorf("stop: %v", err)
	}
}

// TestReplicaRestartedCoverRedirects: a replica that covered a node and
// gave it back to its owner, then restarted, gets Produce requests for
// that node from clients whose metadata still names it (librdkafka keeps a
// connection to every broker address it knows and reconnects to the same
// one). It does not relay them, as it would for a node no peer took from
// it: the owner, which says in its status that it took the node back from
// this replica, decides that node now, and a relay would have two replicas
// deciding it at once (a rolling run of confluent-kafka-python wrote 10,882
// records twice that way). They are redirected to the owner, nothing
// reaching the broker.
func TestReplicaRestartedCoverRedirects(t *testing.T) {
	const topic, owner = "restarted-cover", 1
	c := newCluster(t, kfake.SeedTopics(1, topic))
	if err := c.MoveTopicPartition(topic, 0, owner); err != nil {
		t.Fatal(err)
	}
	f := newFleet(t, c, 3, 3, nil)
	cover := f.stopOwner(owner)
	f.start(owner)
	f.waitReady(owner) // it took the node back from cover
	if from, ok := f.replica(owner).replicas.Status().From[owner]; !ok || from != cover {
		t.Fatalf("the owner's status says it took node %d from %v (%v), want replica %d", owner, from, ok, cover)
	}
	if err := f.stop(cover); err != nil {
		t.Fatalf("stop replica %d: %v", cover, err)
	}
	f.start(cover)
	f.waitReady(cover)
	before := partitionEnd(t, c.ListenAddrs()[owner], topic, 0)
	raw := dialRaw(t, f.nodeAddr(cover, owner)) // the address the cover had for the node
	raw.learnTopics(topic)
	req := produceParts(topic, -1, part{0, recordBatchAt(t, -1, -1, -1, 1, "late", time.Now().UnixMilli())})
	req.SetVersion(10)
	resp := raw.roundTrip(req).(*kmsg.ProduceResponse)
	if p := resp.Topics[0].Partitions[0]; p.ErrorCode != kerr.NotLeaderForPartition.Code {
		t.Fatalf("Produce at the restarted cover answered error %d, want NOT_LEADER_OR_FOLLOWER", p.ErrorCode)
	}
	if len(resp.Brokers) != 1 || addrString(resp.Brokers[0].Host, resp.Brokers[0].Port) != f.nodeAddr(owner, owner) {
		t.Errorf("NodeEndpoints %+v, want node %d at %s", resp.Brokers, owner, f.nodeAddr(owner, owner))
	}
	if after := partitionEnd(t, c.ListenAddrs()[owner], topic, 0); after != before {
		t.Errorf("log end %d -> %d: the batch was relayed", before, after)
	}
	if r := f.replica(cover); testutil.ToFloat64(r.replicaMetrics.ForeignProduce) != 0 {
		t.Errorf("the restarted cover relayed %v Produce requests", testutil.ToFloat64(r.replicaMetrics.ForeignProduce))
	}
}

// TestReplicaHandoverCarriesLegacyState: a legacy client's answer is lost
// with its connection at the replica that serves the node, the node moves
// (the replica stops as SIGTERM does), and the client resends the record
// stamped anew (kafka-go's batches, see asKafkaGo) to the replica that took the node over.
// Knowing the original only from the log, that replica matched nothing
// and wrote it again; with the legacy state handed over it answers the
// retry with the original's offset (docs/replicas.md, "Legacy state at a
// handover"). The same again when the owner starts and takes its node back.
func TestReplicaHandoverCarriesLegacyState(t *testing.T) {
	const topic, owner = "handover-legacy", 1
	c := newCluster(t, kfake.SeedTopics(1, topic))
	if err := c.MoveTopicPartition(topic, 0, owner); err != nil {
		t.Fatal(err)
	}
	leader := c.ListenAddrs()[owner]
	f := newFleet(t, c, 3, 3, nil)
	ts := time.Now().UnixMilli()
	// loseAnswer sends one record through replica i and closes the
	// connection once the broker holds it, unread: the client does not
	// hold its acknowledgement.
	loseAnswer := func(i int, value string, want int64) {
		t.Helper()
		raw := dialRaw(t, f.nodeAddr(i, owner))
		raw.learnTopics(topic)
		raw.send(produceParts(topic, -1, part{0, asKafkaGo(recordBatchAt(t, -1, -1, -1, 1, value, ts))}))
		waitFor(t, 10*time.Second, "the broker to append "+value, func() bool { return partitionEnd(t, leader, topic, 0) == want })
		addr := raw.conn.LocalAddr().String()
		raw.conn.Close()
		r := f.replica(i)
		waitFor(t, 10*time.Second, "the replica to see its client leave", func() bool {
			gone := true
			r.byID.Range(func(_, v any) bool {
				gone = v.(*session).client.RemoteAddr().String() != addr
				return gone
			})
			return gone
		})
	}
	// resend sends the record again, stamped anew, through replica i: it
	// must be answered with the original's offset and not written.
	resend := func(i int, value string, orig int64) {
		t.Helper()
		raw := dialRaw(t, f.nodeAddr(i, owner))
		raw.learnTopics(topic)
		req := produceParts(topic, -1, part{0, asKafkaGo(recordBatchAt(t, -1, -1, -1, 1, value, ts+500))})
		if r := onlyPartition(t, raw.roundTrip(req)); r.ErrorCode != 0 || r.BaseOffset != orig {
			t.Fatalf("the restamped resend of %q at replica %d: error %d, base offset %d; want 0, %d (its original's)", value, i, r.ErrorCode, r.BaseOffset, orig)
		}
		if end := partitionEnd(t, leader, topic, 0); end != orig+1 {
			t.Fatalf("the log ends at %d after the resend of %q, want %d: written again", end, value, orig+1)
		}
	}

	loseAnswer(owner, "charge 7", 1)
	cover := f.stopOwner(owner)
	resend(cover, "charge 7", 0)

	loseAnswer(cover, "charge 8", 2)
	f.start(owner)
	f.waitReady(owner) // it took the node back from cover
	resend(owner, "charge 8", 1)
}

// stopOwner stops replica owner as SIGTERM does and returns the replica
// its node owner went to.
func (f *fleet) stopOwner(owner int) int {
	f.t.Helper()
	n := f.replica(owner).replicas.Node(int32(owner))
	stopped := make(chan error, 1)
	go func() { stopped <- f.stop(owner) }()
	waitFor(f.t, 10*time.Second, "the owner's node released", func() bool { return n.State() == nodeReleased })
	cover := n.Target()
	if err := <-stopped; err != nil {
		f.t.Fatalf("stop: %v", err)
	}
	return cover
}
