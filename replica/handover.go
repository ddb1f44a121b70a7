package replica

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/config"
	"github.com/dedupproxy/dedupproxy/owner"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// A handover: a node moving between replicas (docs/replicas.md, "The
// handover protocol"). The replica that gives a node up first stops
// forwarding its Produce requests (new ones wait), waits until every one it
// forwarded has been answered, and only then publishes the node as released
// and answers the waiting requests NOT_LEADER_OR_FOLLOWER with the new
// server's address (KIP-951 NodeEndpoints on Produce v10+, and Metadata).
// The replica that takes it marks the node's partitions to be warmed from
// the log, so each partition's first batch there is decided on the log as
// it stands after the last batch the other replica forwarded. Which node
// moves when is package owner's; this file holds the Produce path's side
// (the gate's decision, the drain) and the take's I/O.

// Verdict is what becomes of a Produce request held at the gate (Hold).
type Verdict uint8

const (
	// Forward: the request goes to the broker, counted as forwarded on
	// its connection (Held.Sent).
	Forward Verdict = iota
	// Redirect: the request is answered NOT_LEADER_OR_FOLLOWER, pointing
	// at the replica Hold names (-1: none known), and its connection is
	// read no further.
	Redirect
	// Dropped: its connection closed meanwhile; nothing more is answered.
	Dropped
	// Stopping: the proxy stops without a handover; the connection closes
	// and the client retries elsewhere.
	Stopping
)

// Held is the connection of a Produce request held at the gate.
type Held interface {
	// Sent counts the request as forwarded on its connection, awaiting
	// its answer; Unsent takes that back. The gate counts it before it
	// reads the node's state, so that a release that begins after the
	// read waits for its answer (drained): no request slips upstream
	// between the two.
	Sent()
	Unsent()
	// Closed is closed when the connection is closing, Gone when the
	// client left.
	Closed() <-chan struct{}
	Gone() <-chan struct{}
}

// Hold decides a Produce request for node n, which this replica does not
// serve plainly now (Node.Serving was false): it waits while the node
// moves here or away, at most bound, then forwards it (served here, or
// relayed for a foreign node), or redirects it. start is when the request
// was read.
func (rs *Set) Hold(n *Node, c Held, bound time.Duration, start time.Time) (v Verdict, target int) {
	timer := rs.Clock.NewTimer(bound)
	defer timer.Stop()
	waited := false
	defer func() {
		if waited {
			rs.m.Held.Observe(rs.Clock.Now().Sub(start).Seconds())
		}
	}()
	for {
		changed := rs.waitChange()
		rs.mu.Lock()
		polled := rs.polled
		rs.mu.Unlock()
		c.Sent()
		st := n.state.Load()
		if st == nodeServing {
			return Forward, 0
		}
		c.Unsent()
		switch st {
		case nodeReleased:
			return Redirect, rs.redirectTarget(n)
		case nodeForeign:
			relay, wait := rs.foreignProduce(n)
			if relay {
				c.Sent()
				if n.state.Load() == nodeForeign {
					rs.m.ForeignProduce.Inc()
					return Forward, 0
				}
				c.Unsent()
				continue // it began to move: look again
			}
			if !wait {
				return Redirect, rs.redirectTarget(n)
			}
		}
		waited = true
		rs.mu.Lock()
		rs.busy++
		rs.mu.Unlock()
		select {
		case <-changed:
		case <-polled:
		case <-timer.C:
			rs.mu.Lock()
			rs.busy--
			rs.mu.Unlock()
			// Still moving: the client retries after a metadata refresh.
			// Forwarding it could write it twice.
			return Redirect, -1
		case <-c.Closed():
		case <-c.Gone():
		case <-rs.Stop:
		}
		rs.mu.Lock()
		rs.busy--
		rs.mu.Unlock()
		select {
		case <-c.Closed():
			return Dropped, 0 // closing: nothing more is answered
		case <-c.Gone():
			return Dropped, 0 // the client left (or its answers failed): the read that follows ends the loop
		case <-rs.Stop:
			return Stopping, 0
		default:
		}
	}
}

// foreignProduce decides a Produce request on a connection to a node this
// replica does not serve (owner.Machine.Foreign), on peers' statuses at most
// replicaFresh old: relay it (decided here, counted), or wait while a peer
// hands the node over (it may be handed here). wait false with relay false
// means redirect.
func (rs *Set) foreignProduce(n *Node) (relay, wait bool) {
	rs.mu.Lock()
	stale := rs.Clock.Now().Sub(rs.polledAt) > replicaFresh
	rs.mu.Unlock()
	if stale && rs.l.Count > 1 {
		ctx, cancel := context.WithTimeout(rs.Ctx, 2*replicaPeerTimeout)
		rs.pollNow(ctx)
		cancel()
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	switch rs.own.Foreign(n.id) {
	case owner.Relay:
		return true, false
	case owner.Wait:
		return false, true
	}
	return false, false
}

// redirectTarget is the replica a redirected request for node n is sent
// to: the one known to serve it, else the one it was released to; -1 when
// none is known.
func (rs *Set) redirectTarget(n *Node) int {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.own.RedirectTarget(n.id)
}

// NotLeader is the answer to a Produce request (decoded at its version)
// for node n that the proxy does not forward: NOT_LEADER_OR_FOLLOWER for
// every partition, the answer Kafka gives a client that asked the wrong
// broker, which every client retries after refreshing where the
// partition's leader is. From v10 on, CurrentLeader names the node (its
// epoch -1: unknown, so clients refresh their metadata rather than trust an
// epoch the proxy cannot know) and NodeEndpoints gives the node at target's
// address (KIP-951); target -1 names no one.
func (rs *Set) NotLeader(cfg *config.Config, req *kmsg.ProduceRequest, n *Node, target int) *kmsg.ProduceResponse {
	resp := kmsg.NewPtrProduceResponse()
	resp.SetVersion(req.GetVersion())
	leader := n.ID()
	if target < 0 || leader < 0 {
		leader = -1
	}
	for _, rt := range req.Topics {
		t := kmsg.NewProduceResponseTopic()
		t.Topic, t.TopicID = rt.Topic, rt.TopicID
		for _, rp := range rt.Partitions {
			p := kmsg.NewProduceResponseTopicPartition()
			p.Partition = rp.Partition
			p.ErrorCode = kerr.NotLeaderForPartition.Code
			p.BaseOffset, p.LogAppendTime, p.LogStartOffset = -1, -1, -1
			p.CurrentLeader.LeaderID, p.CurrentLeader.LeaderEpoch = leader, -1
			t.Partitions = append(t.Partitions, p)
		}
		resp.Topics = append(resp.Topics, t)
	}
	if req.GetVersion() >= 10 && leader >= 0 {
		if host, port, ok := rs.Layout.NodeAddr(cfg, target, n.ID()); ok {
			b := kmsg.NewProduceResponseBroker()
			b.NodeID, b.Host, b.Port = n.ID(), host, port
			resp.Brokers = append(resp.Brokers, b)
		}
	}
	return resp
}

// Redirected counts a Produce request answered NOT_LEADER_OR_FOLLOWER: a
// handover waits for the redirects to stop.
func (rs *Set) Redirected() {
	rs.m.Redirected.Inc()
	rs.Step(owner.Redirected{})
}

// Attach files a client connection under the node whose listener took it
// (-1: the bootstrap listener), so its Produce requests can be held and
// counted, and returns the node; Detach forgets it.
func (rs *Set) Attach(c Conn, node int32) *Node {
	n := rs.Node(node)
	rs.attachedMu.Lock()
	rs.attached[c] = n
	rs.attachedMu.Unlock()
	if s := n.state.Load(); node >= 0 && n.owner != rs.l.Self && !decides(s) {
		rs.m.ForeignConns.Inc()
	}
	return n
}

// Detach forgets a connection Attach filed.
func (rs *Set) Detach(c Conn) {
	rs.attachedMu.Lock()
	n := rs.attached[c]
	delete(rs.attached, c)
	rs.attachedMu.Unlock()
	if n != nil {
		n.CheckDrained() // its Produce requests in flight went with it
	}
}

// drained reports whether no Produce request this replica forwarded on a
// connection to node n still awaits its answer.
func (rs *Set) drained(n *Node) bool {
	rs.attachedMu.Lock()
	defer rs.attachedMu.Unlock()
	for c, an := range rs.attached {
		if an == n && c.ProducesAwaited() > 0 {
			return false
		}
	}
	return true
}

// CheckDrained tells the machine that node n's drain ended, if it is being
// drained and did. It is called when the drain begins and whenever one of
// its Produce requests stops being awaited (answered, taken back, its
// connection gone): the drain ends on that event, not on a poll. The
// counts are read after the draining flag is set, and the flag after a
// count drops, so one of the two sees the other.
func (n *Node) CheckDrained() {
	if !n.draining.Load() || n.state.Load() != nodeReleasing || !n.rs.drained(n) {
		return
	}
	n.rs.Step(owner.Drained{Node: n.id})
}

// take carries out an owner.Take: node n's partitions (one Metadata
// request) marked to warm from the log on their next batch (a cover: the
// state here may be older than what the peer appended), and their legacy
// state taken from the peer; then the machine serves the node.
func (rs *Set) take(t owner.Take) {
	deadline := rs.Clock.Now().Add(rs.DrainTimeout)
	var keys []seqstate.Key
	for attempt := 0; rs.Core != nil; attempt++ {
		ctx, cancel := context.WithTimeout(rs.Ctx, rs.DialTimeout)
		var err error
		keys, err = rs.Core.PartitionsLedBy(ctx, t.Node)
		cancel()
		if err == nil {
			break
		}
		if !t.Rewarm || rs.Clock.Now().After(deadline) || rs.Ctx.Err() != nil {
			if t.Rewarm {
				rs.log.Warn("cannot list the partitions of a node covered; serving it without marking them to warm again (a retry of a batch the peer appended may be written again)", "node", t.Node, "err", err)
			} else {
				rs.log.Warn("cannot list the partitions of a node taken back; serving it without its legacy state (retries of its batches stamped anew may be written again)", "node", t.Node, "err", err)
			}
			keys = nil
			break
		}
		// A cover retries: without the marks, the node's batches would be
		// decided on state older than the log.
		timer := rs.Clock.NewTimer(min(time.Duration(attempt+1)*50*time.Millisecond, time.Second))
		select {
		case <-timer.C:
		case <-rs.Stop:
			timer.Stop()
			return // stopping: nothing is served any more
		}
	}
	marked := 0
	if t.Rewarm {
		marked = rs.rewarm(keys)
	}
	rs.takeLegacy(t.From, t.Node, keys)
	rs.Step(owner.Taken{Node: t.Node})
	if t.Rewarm {
		rs.log.Info("covered a node", "node", t.Node, "from", t.From, "partitions_to_warm", marked)
	}
}

// rewarm makes each partition of keys warm from the log on its next batch
// here, and returns how many it marked. This is the replicas' one hook into
// the warm-up (docs/warm.md).
func (rs *Set) rewarm(keys []seqstate.Key) int {
	if rs.Core == nil {
		return 0
	}
	for _, k := range keys {
		rs.Core.Rewarm(k)
	}
	rs.m.Rewarmed.Add(float64(len(keys)))
	return len(keys)
}

// HandOver is the first step of a replica's Shutdown (docs/replicas.md):
// every node it serves goes to a peer that serves, each once its Produce
// requests in flight are answered; then it answers redirects until clients
// have moved and the takers serve the nodes, or until ctx is nearly over
// (owner.HandOver). Nodes no peer can take stay here for the drain that
// follows. It reports whether every node went, each drained: no Produce
// request this replica decided is then in flight, and what its connections
// still wait for (a consumer group's join, a long poll) holds no state of
// its.
func (rs *Set) HandOver(ctx context.Context) bool {
	rs.handOnce.Do(func() { rs.handedAll = rs.handOverOnce(ctx) })
	return rs.handedAll
}

func (rs *Set) handOverOnce(ctx context.Context) bool {
	until := rs.Clock.Now().Add(rs.DrainTimeout)
	if dl, ok := ctx.Deadline(); ok {
		// Leave the drain that follows a second.
		if dl = dl.Add(-time.Second); dl.Before(until) {
			until = dl
		}
	}
	if rs.l.Count > 1 {
		pctx, cancel := context.WithTimeout(ctx, 2*replicaPeerTimeout)
		rs.pollNow(pctx)
		cancel()
	}
	rs.Step(owner.HandOver{Until: until})
	select {
	case <-rs.handed:
	case <-ctx.Done():
		return false
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	_, all := rs.own.HandedOver()
	return all
}

// Incarnation is this run's identity among the replicas, new at every
// start.
func (rs *Set) Incarnation() string { return rs.incarnation }
