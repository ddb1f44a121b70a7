package proxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/decide"
	"github.com/dedupproxy/dedupproxy/owner"
	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
	"github.com/dedupproxy/dedupproxy/tail"
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
// (the gate, the drain) and the take's I/O.

// replicaGate is the replicas' one hook into the Produce path
// (session.readLoop): it sees every Produce request before it is warmed or
// decided. It returns true when it answered the request itself, with
// NOT_LEADER_OR_FOLLOWER pointing at the replica that serves the node now;
// the caller then reads the next request. Without replicas, or on a node
// this replica serves, it returns at once.
func (c *session) replicaGate(h protocol.RequestHeader, body []byte, acks int16, start time.Time, api *apiMetrics) bool {
	rs := c.s.replicas
	if rs == nil {
		return false
	}
	tr, ok := c.client.(*requestTracker)
	if !ok || tr.rnode == nil || acks == 0 {
		// acks=0: no answer to redirect and no retry to protect; the
		// broker is still the partition's leader, so forwarding is right.
		return false
	}
	// Counted before the state is read: a release that begins after this
	// read waits for its answer (drained), so no request slips upstream
	// between the two.
	tr.produceSent(h.CorrelationID)
	if tr.rnode.state.Load() == nodeServing {
		return false
	}
	tr.produceUnsent()
	return c.replicaGateSlow(rs, tr, h, body, start, api)
}

// replicaGateSlow handles a Produce request for a node this replica does
// not serve plainly now: it waits while the node moves here or away, then
// forwards (served, or relayed for a foreign node) or redirects.
func (c *session) replicaGateSlow(rs *replicaSet, tr *requestTracker, h protocol.RequestHeader, body []byte, start time.Time, api *apiMetrics) bool {
	if !c.isAuthenticated() {
		// Not authenticated: the broker answers it (and decides nothing
		// here depends on it), as without replicas.
		tr.produceSent(h.CorrelationID)
		return false
	}
	n := tr.rnode
	var req kmsg.ProduceRequest
	req.SetVersion(h.APIVersion)
	if err := req.ReadFrom(body[h.BodyOffset:]); err != nil {
		tr.produceSent(h.CorrelationID)
		return false // the Produce path closes the connection on a bad request
	}
	// Wait at most the request's own timeout (the client gives up then),
	// and no longer than a drain.
	bound := min(max(time.Duration(req.TimeoutMillis)*time.Millisecond, 250*time.Millisecond), c.s.Config.DrainTimeout)
	timer := time.NewTimer(bound)
	defer timer.Stop()
	waited := false
	defer func() {
		if waited {
			rs.m.held.Observe(time.Since(start).Seconds())
		}
	}()
	for {
		changed := rs.waitChange()
		rs.mu.Lock()
		polled := rs.polled
		rs.mu.Unlock()
		tr.produceSent(h.CorrelationID)
		st := n.state.Load()
		if st == nodeServing {
			return false
		}
		tr.produceUnsent()
		switch st {
		case nodeReleased:
			c.redirect(rs, &req, h, n, rs.redirectTarget(n), start, api)
			return true
		case nodeForeign:
			relay, wait := rs.foreignProduce(n)
			if relay {
				tr.produceSent(h.CorrelationID)
				if n.state.Load() == nodeForeign {
					rs.m.foreignProduce.Inc()
					return false
				}
				tr.produceUnsent()
				continue // it began to move: look again
			}
			if !wait {
				c.redirect(rs, &req, h, n, rs.redirectTarget(n), start, api)
				return true
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
			c.redirect(rs, &req, h, n, -1, start, api)
			return true
		case <-c.closed:
		case <-tr.gone:
		case <-c.s.stop:
		}
		rs.mu.Lock()
		rs.busy--
		rs.mu.Unlock()
		select {
		case <-c.closed:
			return true // closing: nothing more is answered
		case <-tr.gone:
			return true // the client left (or its answers failed): the read that follows ends the loop
		case <-c.s.stop:
			// Shutting down without a handover (its context ended): the
			// connection closes; the client retries elsewhere.
			c.closeAll()
			return true
		default:
		}
	}
}

// foreignProduce decides a Produce request on a connection to a node this
// replica does not serve (owner.Machine.Foreign), on peers' statuses at most
// replicaFresh old: relay it (decided here, counted), or wait while a peer
// hands the node over (it may be handed here). wait false with relay false
// means redirect.
func (rs *replicaSet) foreignProduce(n *replicaNode) (relay, wait bool) {
	rs.mu.Lock()
	stale := rs.s.now().Sub(rs.polledAt) > replicaFresh
	rs.mu.Unlock()
	if stale && rs.l.Count > 1 {
		ctx, cancel := context.WithTimeout(rs.s.dialCtx, 2*replicaPeerTimeout)
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

// redirect answers a Produce request NOT_LEADER_OR_FOLLOWER pointing at
// target, then stops reading the connection: it closes once that answer
// and those before it are written, as a broker that stops leading closes
// its connections. Some clients (kafka-python) keep using an open
// connection to a node whatever the metadata says, and would be
// redirected here until their retries ran out; on a new connection they
// go where the metadata points.
func (c *session) redirect(rs *replicaSet, req *kmsg.ProduceRequest, h protocol.RequestHeader, n *replicaNode, target int, start time.Time, api *apiMetrics) {
	c.answerNotLeader(rs, req, h, n, target, start, api)
	c.stopReading()
}

// redirectTarget is the replica a redirected request for node n is sent
// to: the one known to serve it, else the one it was released to; -1 when
// none is known.
func (rs *replicaSet) redirectTarget(n *replicaNode) int {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.own.RedirectTarget(n.id)
}

// answerNotLeader queues, in order, the answer to a Produce request the
// proxy does not forward: NOT_LEADER_OR_FOLLOWER for every partition, the
// answer Kafka gives a client that asked the wrong broker, which every
// client retries after refreshing where the partition's leader is. From
// v10 on, CurrentLeader names the node (its epoch -1: unknown, so clients
// refresh their metadata rather than trust an epoch the proxy cannot
// know) and NodeEndpoints gives the node at target's address (KIP-951).
func (c *session) answerNotLeader(rs *replicaSet, req *kmsg.ProduceRequest, h protocol.RequestHeader, n *replicaNode, target int, start time.Time, api *apiMetrics) {
	resp := kmsg.NewPtrProduceResponse()
	resp.SetVersion(h.APIVersion)
	leader := n.id
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
	if h.APIVersion >= 10 && leader >= 0 {
		if host, port, ok := rs.l.NodeAddr(&c.s.Config, target, n.id); ok {
			b := kmsg.NewProduceResponseBroker()
			b.NodeID, b.Host, b.Port = n.id, host, port
			resp.Brokers = append(resp.Brokers, b)
		}
	}
	bp := getFrame(256)
	buf := append((*bp)[:0], 0, 0, 0, 0)
	buf = protocol.AppendResponseHeader(buf, int16(kmsg.Produce), h.APIVersion, h.CorrelationID)
	buf = resp.AppendTo(buf)
	binary.BigEndian.PutUint32(buf, uint32(len(buf)-4))
	*bp = buf
	rs.m.redirected.Inc()
	p := c.newPending(h, start, api)
	p.resp = bp
	c.enqueue(p)
	c.kickResponseLoop()
	rs.step(owner.Redirected{}) // a handover waits for the redirects to stop
}

// attach files a client connection under the node whose listener took it
// (-1: the bootstrap listener), so its Produce requests can be held and
// counted; detach forgets it.
func (rs *replicaSet) attach(tr *requestTracker, node int32) {
	n := rs.node(node)
	tr.rnode = n
	rs.attachedMu.Lock()
	rs.attached[tr] = n
	rs.attachedMu.Unlock()
	if s := n.state.Load(); node >= 0 && n.owner != rs.l.Self && !decides(s) {
		rs.m.foreignConns.Inc()
	}
}

func (rs *replicaSet) detach(tr *requestTracker) {
	rs.attachedMu.Lock()
	n := rs.attached[tr]
	delete(rs.attached, tr)
	rs.attachedMu.Unlock()
	if n != nil {
		n.checkDrained() // its Produce requests in flight went with it
	}
}

// drained reports whether no Produce request this replica forwarded on a
// connection to node n still awaits its answer.
func (rs *replicaSet) drained(n *replicaNode) bool {
	rs.attachedMu.Lock()
	defer rs.attachedMu.Unlock()
	for tr, an := range rs.attached {
		if an == n && tr.producesAwaited() > 0 {
			return false
		}
	}
	return true
}

// checkDrained tells the machine that node n's drain ended, if it is being
// drained and did. It is called when the drain begins and whenever one of
// its Produce requests stops being awaited (answered, taken back, its
// connection gone): the drain ends on that event, not on a poll. The
// counts are read after the draining flag is set, and the flag after a
// count drops, so one of the two sees the other.
func (n *replicaNode) checkDrained() {
	if !n.draining.Load() || n.state.Load() != nodeReleasing || !n.rs.drained(n) {
		return
	}
	n.rs.step(owner.Drained{Node: n.id})
}

// take carries out an owner.Take: node n's partitions (one Metadata
// request) marked to warm from the log on their next batch (a cover: the
// state here may be older than what the peer appended), and their legacy
// state taken from the peer; then the machine serves the node.
func (rs *replicaSet) take(t owner.Take) {
	deadline := rs.s.now().Add(rs.s.Config.DrainTimeout)
	var keys []seqstate.Key
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(rs.s.dialCtx, rs.s.Config.DialTimeout)
		var err error
		keys, err = rs.s.partitionsLedBy(ctx, t.Node)
		cancel()
		if err == nil {
			break
		}
		if !t.Rewarm || rs.s.now().After(deadline) || rs.s.dialCtx.Err() != nil {
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
		timer := time.NewTimer(min(time.Duration(attempt+1)*50*time.Millisecond, time.Second))
		select {
		case <-timer.C:
		case <-rs.s.stop:
			timer.Stop()
			return // stopping: nothing is served any more
		}
	}
	marked := 0
	if t.Rewarm {
		marked = rs.s.rewarm(keys)
	}
	rs.takeLegacy(t.From, t.Node, keys)
	rs.step(owner.Taken{Node: t.Node})
	if t.Rewarm {
		rs.log.Info("covered a node", "node", t.Node, "from", t.From, "partitions_to_warm", marked)
	}
}

// partitionsLedBy asks a bootstrap broker which partitions node leads,
// keyed as the table keys them. The topics of the answer are interned (they
// come from the cluster): a replica that just started knows none yet, and
// takes the legacy state of their partitions back from a peer.
func (s *Server) partitionsLedBy(ctx context.Context, node int32) ([]seqstate.Key, error) {
	t := s.table
	if t == nil {
		return nil, nil
	}
	var errs []error
	for _, addr := range s.Config.Upstream {
		conn, err := s.own.Open(ctx, addr)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		req := kmsg.NewPtrMetadataRequest()
		req.SetVersion(tail.MetadataVersion) // nil topics: every topic
		resp := kmsg.NewPtrMetadataResponse()
		resp.SetVersion(tail.MetadataVersion)
		err = conn.RoundTrip(req, resp)
		conn.Close()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		refs := make([]seqstate.TopicRef, 0, len(resp.Topics))
		for _, tp := range resp.Topics {
			if tp.Topic != nil && tp.ErrorCode == 0 {
				refs = append(refs, seqstate.TopicRef{Name: *tp.Topic, ID: tp.TopicID, Partitions: int32(len(tp.Partitions))})
			}
		}
		t.InternTopics(refs)
		var keys []seqstate.Key
		for _, tp := range resp.Topics {
			if tp.Topic == nil || tp.ErrorCode != 0 {
				continue
			}
			id, ok := t.LookupTopic([]byte(*tp.Topic))
			if !ok {
				continue
			}
			for _, p := range tp.Partitions {
				if p.Leader == node {
					keys = append(keys, seqstate.Key{Topic: id, Partition: p.Partition})
				}
			}
		}
		return keys, nil
	}
	if len(errs) == 0 {
		return nil, errors.New("no upstream brokers")
	}
	return nil, errors.Join(errs...)
}

// rewarm makes each partition of keys warm from the log on its next batch
// here, and returns how many it marked. This is the replicas' one hook into
// the warm-up (docs/warm.md).
func (s *Server) rewarm(keys []seqstate.Key) int {
	if s.core == nil {
		return 0
	}
	for _, k := range keys {
		s.step(&decide.Event{Kind: decide.EvRewarm, Topic: k.Topic, Partition: k.Partition}, s.now(), nil)
	}
	s.replicas.m.rewarmed.Add(float64(len(keys)))
	return len(keys)
}

// handOver is the first step of a replica's Shutdown (docs/replicas.md):
// every node it serves goes to a peer that serves, each once its Produce
// requests in flight are answered; then it answers redirects until clients
// have moved and the takers serve the nodes, or until ctx is nearly over
// (owner.HandOver). Nodes no peer can take stay here for the drain that
// follows. It reports whether every node went, each drained: no Produce
// request this replica decided is then in flight, and what its connections
// still wait for (a consumer group's join, a long poll) holds no state of
// its.
func (rs *replicaSet) handOver(ctx context.Context) bool {
	rs.handOnce.Do(func() { rs.handedAll = rs.handOverOnce(ctx) })
	return rs.handedAll
}

func (rs *replicaSet) handOverOnce(ctx context.Context) bool {
	until := rs.s.now().Add(rs.s.Config.DrainTimeout)
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
	rs.step(owner.HandOver{Until: until})
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

// replicaStart sets up the replicas' side of Start, after the listeners:
// the status loop, and for a replica that just started, the taking back of
// its nodes.
func (s *Server) replicaStart() error {
	l, err := s.Config.ReplicaLayout()
	if err != nil || l == nil {
		return err
	}
	if s.Config.Advertise == "" {
		s.Config.Advertise = l.Addrs[l.Self]
	}
	s.replicas = newReplicaSet(s, l)
	s.replicas.m = s.replicaMetrics
	s.Logger.Info("replica", "index", l.Self, "replicas", l.Count, "addresses", l.Addrs, "admin", l.Admins, "incarnation", s.replicas.incarnation)
	return nil
}

// errReplicaNotReady wraps Ready's answer while a replica takes back its
// nodes.
var errReplicaNotReady = errors.New("proxy: replica not ready")

func (rs *replicaSet) readyErr() error {
	if err := rs.ready(); err != nil {
		if errors.Is(err, ErrDraining) {
			return err
		}
		return fmt.Errorf("%w: %v", errReplicaNotReady, err)
	}
	return nil
}
