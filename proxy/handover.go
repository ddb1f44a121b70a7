package proxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// Moving a node between replicas (docs/replicas.md, "The handover
// protocol"). The replica that gives a node up first stops forwarding its
// Produce requests (new ones wait), waits until every one it forwarded has
// been answered, and only then publishes the node as released and answers
// the waiting requests NOT_LEADER_OR_FOLLOWER with the new server's address
// (KIP-951 NodeEndpoints on Produce v10+, and Metadata). The replica that
// takes it marks the node's partitions to be warmed from the log, so each
// partition's first batch there is decided on the log as it stands after
// the last batch the other replica forwarded.

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
// replica does not serve: relay it (decided here, counted), or wait while
// a peer hands the node over (it may be handed here). wait false with
// relay false means redirect.
func (rs *replicaSet) foreignProduce(n *replicaNode) (relay, wait bool) {
	rs.mu.Lock()
	stale := rs.s.now().Sub(rs.polledAt) > replicaFresh
	rs.mu.Unlock()
	if stale && rs.l.count > 1 {
		ctx, cancel := context.WithTimeout(rs.s.dialCtx, 2*replicaPeerTimeout)
		rs.pollNow(ctx)
		cancel()
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if n.state.Load() != nodeForeign {
		return false, true // moved meanwhile: look again
	}
	for i := range rs.peers {
		p := &rs.peers[i]
		if i != rs.l.self && p.reachable && p.phase == phaseHandingOver && p.serving[n.id] {
			return false, true // being released there: its outcome first
		}
	}
	for i := range rs.peers {
		p := &rs.peers[i]
		if from, ok := p.status.From[n.id]; i != rs.l.self && p.reachable && p.serving[n.id] && ok && from == rs.l.self {
			// Taken from this replica (a previous incarnation, restarted
			// since): a client still holds the address this replica had
			// for it, and relayed here its batches would be decided by two
			// replicas at once. Redirected, as a node released here is.
			return false, false
		}
	}
	return true, false
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
	if i := rs.advertised(n.id); i != rs.l.self && n.id >= 0 {
		return i
	}
	return int(n.target.Load())
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
		if host, port, ok := rs.l.nodeAddr(&c.s.Config, target, n.id); ok {
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
	rs.lastRedir.Store(time.Now().UnixNano())
	p := c.newPending(h, start, api)
	p.resp = bp
	c.queue <- p
	c.kickResponseLoop()
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
	if s := n.state.Load(); node >= 0 && n.owner != rs.l.self && !decides(s) {
		rs.m.foreignConns.Inc()
	}
}

func (rs *replicaSet) detach(tr *requestTracker) {
	rs.attachedMu.Lock()
	delete(rs.attached, tr)
	rs.attachedMu.Unlock()
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

// releaseLocked starts handing node n to replica target: its Produce
// requests wait from now on, and once those already forwarded are all
// answered (or drain_timeout passed) the node is released. Called with
// rs.mu held.
func (rs *replicaSet) releaseLocked(n *replicaNode, target int) {
	if s := n.state.Load(); (s == nodeReleasing || s == nodeReleased) && n.target.Load() == int32(target) {
		return
	}
	served := n.id >= 0 && decides(n.state.Load()) // a foreign node is drained too, but was never this replica's to give
	rs.setStateLocked(n, nodeReleasing, target)
	started := rs.s.spawn(func() {
		deadline := time.Now().Add(rs.s.Config.DrainTimeout)
		t := time.NewTicker(drainPoll)
		defer t.Stop()
		for !rs.drained(n) && time.Now().Before(deadline) {
			select {
			case <-t.C:
			case <-rs.s.stop:
				return
			}
		}
		rs.mu.Lock()
		if n.state.Load() == nodeReleasing && n.target.Load() == int32(target) {
			if !rs.drained(n) {
				rs.undrained.Store(true)
				rs.log.Warn("handing a node over with Produce requests still unanswered after drain_timeout", "node", n.id, "to", target)
			}
			rs.setStateLocked(n, nodeReleased, target)
			if served {
				rs.m.handovers[handoverReleased].Inc()
			}
		}
		rs.mu.Unlock()
		// Every peer, not only the target: each advertises the node in its
		// Metadata answers, and a client redirected here refreshes its
		// metadata wherever it likes. Until a peer polls (up to 250 ms at
		// rest) it still names this replica, and a client whose retries
		// are few and quick (sarama: 5, 50 ms apart) spends them all on
		// redirects here.
		rs.wakePeers()
	})
	if !started { // shutting down: nothing is forwarded any more
		rs.setStateLocked(n, nodeReleased, target)
	}
}

// coverLocked takes over node n, released to this replica by peer from:
// its partitions are marked to be warmed from the log on their next batch
// (their state here may be older than what the peer appended), then it is
// served. Called with rs.mu held.
func (rs *replicaSet) coverLocked(n *replicaNode, from int) {
	n.from = from
	rs.setStateLocked(n, nodeCovering, -1)
	rs.log.Info("taking over a node released by a peer", "node", n.id, "from", from)
	// Not released again until its legacy state is in: released meanwhile,
	// the next server would take it from here before it arrived.
	n.taking = true
	if !rs.s.spawn(func() { rs.finishCover(n, from) }) {
		n.taking = false
		rs.setStateLocked(n, nodeForeign, -1)
	}
}

// finishCover marks node n's partitions to be warmed and takes their
// legacy state from peer from, then serves n.
func (rs *replicaSet) finishCover(n *replicaNode, from int) {
	deadline := time.Now().Add(rs.s.Config.DrainTimeout)
	marked := 0
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(rs.s.dialCtx, rs.s.Config.DialTimeout)
		keys, err := rs.s.partitionsLedBy(ctx, n.id)
		cancel()
		if err == nil {
			marked = rs.s.rewarm(keys)
			rs.takeLegacy(from, n.id, keys)
			break
		}
		if time.Now().After(deadline) || rs.s.dialCtx.Err() != nil {
			rs.log.Warn("cannot list the partitions of a node taken over; serving it without marking them to warm again (a retry of a batch the peer appended may be written again)", "node", n.id, "err", err)
			break
		}
		t := time.NewTimer(min(time.Duration(attempt+1)*50*time.Millisecond, time.Second))
		select {
		case <-t.C:
		case <-rs.s.stop:
			t.Stop()
			rs.mu.Lock()
			n.taking = false
			rs.mu.Unlock()
			return
		}
	}
	rs.mu.Lock()
	n.taking = false
	if n.state.Load() == nodeCovering {
		rs.setStateLocked(n, nodeServing, -1)
		rs.m.handovers[handoverCovered].Inc()
	}
	rs.mu.Unlock()
	rs.wakePeers() // they advertise the node here from their next poll
	rs.log.Info("took over a node", "node", n.id, "partitions_to_warm", marked)
}

// finishReclaim takes node n's legacy state back from peer from, which
// covered it while this replica was away, then serves n.
func (rs *replicaSet) finishReclaim(n *replicaNode, from int) {
	ctx, cancel := context.WithTimeout(rs.s.dialCtx, rs.s.Config.DialTimeout)
	keys, err := rs.s.partitionsLedBy(ctx, n.id)
	cancel()
	if err != nil {
		rs.log.Warn("cannot list the partitions of a node taken back; serving it without its legacy state (retries of its batches stamped anew may be written again)", "node", n.id, "err", err)
	} else {
		rs.takeLegacy(from, n.id, keys)
	}
	rs.mu.Lock()
	n.taking = false
	if n.state.Load() == nodeReclaiming {
		rs.setStateLocked(n, nodeServing, -1)
		rs.m.handovers[handoverReclaimed].Inc()
		rs.evaluateLocked() // the replica may be serving every node it owns now
	}
	rs.mu.Unlock()
	rs.wakePeers()
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
		conn, corr, err := s.ownConn(ctx, addr)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		req := kmsg.NewPtrMetadataRequest()
		req.SetVersion(probeMetadataVersion) // nil topics: every topic
		resp := kmsg.NewPtrMetadataResponse()
		resp.SetVersion(probeMetadataVersion)
		err = s.probeRoundTrip(conn, req, resp, corr+1)
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
		s.core.Rewarm(k.Topic, k.Partition)
	}
	s.replicas.m.rewarmed.Add(float64(len(keys)))
	return len(keys)
}

// handOver is the first step of a replica's Shutdown (docs/replicas.md):
// every node it serves goes to a peer that serves (its owner when that is
// back, else the next ready replica, spread over them), each once its
// Produce requests in flight are answered; then it answers redirects until
// clients have moved and the takeovers serve the nodes, or until ctx is
// nearly over. Nodes no peer can take stay here for the drain that follows.
// It reports whether every node went, each drained: no Produce request
// this replica decided is then in flight, and what its connections still
// wait for (a consumer group's join, a long poll) holds no state of its.
func (rs *replicaSet) handOver(ctx context.Context) bool {
	rs.handOnce.Do(func() { rs.handedAll = rs.handOverOnce(ctx) })
	return rs.handedAll
}

func (rs *replicaSet) handOverOnce(ctx context.Context) bool {
	start := time.Now()
	end := start.Add(rs.s.Config.DrainTimeout)
	if dl, ok := ctx.Deadline(); ok {
		// Leave the drain that follows a second.
		if dl = dl.Add(-time.Second); dl.Before(end) {
			end = dl
		}
	}
	if rs.l.count > 1 {
		pctx, cancel := context.WithTimeout(ctx, 2*replicaPeerTimeout)
		rs.pollNow(pctx)
		cancel()
	}
	self := rs.l.self
	rs.mu.Lock()
	rs.phase = phaseHandingOver
	var ready []int // peers that serve, in ring order after this one
	for k := 1; k < rs.l.count; k++ {
		i := (self + k) % rs.l.count
		if p := &rs.peers[i]; p.reachable && p.phase == phaseServing {
			ready = append(ready, i)
		}
	}
	ids := make([]int32, 0, len(rs.nodes))
	for id := range rs.nodes {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	var moving []*replicaNode
	spread := 0
	for _, id := range ids {
		n := rs.nodes[id]
		target := -1
		switch {
		case len(ready) == 0:
		case id < 0:
		case n.owner != self && rs.peers[n.owner].reachable && rs.peers[n.owner].phase == phaseServing:
			target = n.owner
		default:
			target = ready[spread%len(ready)]
			spread++
		}
		switch state := n.state.Load(); {
		case len(ready) == 0:
			// Nobody to take anything: stay as today, drained by Shutdown.
		case decides(state) || id < 0:
			rs.releaseLocked(n, target)
			moving = append(moving, n)
		case state == nodeReclaiming:
			rs.setStateLocked(n, nodeReleased, rs.advertised(id))
		case state == nodeForeign:
			// Relayed here: drained, then pointed at whoever serves it.
			rs.releaseLocked(n, rs.advertised(id))
			moving = append(moving, n)
		}
	}
	rs.broadcastLocked()
	rs.mu.Unlock()
	rs.log.Info("handing nodes over before stopping", "nodes", len(moving), "ready_peers", ready)
	for _, i := range ready {
		rs.wakePeer(i)
	}
	// Released, each once its in-flight Produce requests are answered.
	t := time.NewTicker(drainPoll)
	defer t.Stop()
	for !rs.allReleased(moving) && time.Now().Before(end) {
		select {
		case <-t.C:
		case <-ctx.Done():
			return false
		}
	}
	released := time.Now()
	// Redirect until quiet and the takeovers serve what they were given.
	for time.Now().Before(end) {
		quiet := time.Since(time.Unix(0, rs.lastRedir.Load())) >= handoverQuiet && time.Since(released) >= handoverQuiet
		if quiet && rs.takenOver(moving) {
			break
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return false
		}
	}
	rs.mu.Lock()
	all := len(ready) > 0 && !rs.undrained.Load()
	for _, n := range rs.nodes {
		if n.state.Load() != nodeReleased {
			all = false
		}
	}
	rs.mu.Unlock()
	rs.log.Info("handed nodes over", "took", time.Since(start).Round(time.Millisecond), "released_after", released.Sub(start).Round(time.Millisecond), "all", all)
	return all
}

func (rs *replicaSet) allReleased(nodes []*replicaNode) bool {
	for _, n := range nodes {
		if n.state.Load() == nodeReleasing {
			return false
		}
	}
	return true
}

// takenOver reports whether each released node's target now says it
// serves it (or cannot be asked).
func (rs *replicaSet) takenOver(nodes []*replicaNode) bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for _, n := range nodes {
		tg := int(n.target.Load())
		if n.id < 0 || tg < 0 || tg == rs.l.self || n.state.Load() != nodeReleased {
			continue
		}
		if p := &rs.peers[tg]; p.reachable && !p.serving[n.id] {
			return false
		}
	}
	return true
}

// replicaStart sets up the replicas' side of Start, after the listeners:
// the status loop, and for a replica that just started, the taking back of
// its nodes.
func (s *Server) replicaStart() error {
	l, err := s.Config.replicaLayout(hostnameFunc)
	if err != nil || l == nil {
		return err
	}
	if s.Config.Advertise == "" {
		s.Config.Advertise = l.addrs[l.self]
	}
	s.replicas = newReplicaSet(s, l)
	s.replicas.m = s.replicaMetrics
	s.Logger.Info("replica", "index", l.self, "replicas", l.count, "addresses", l.addrs, "admin", l.admins, "incarnation", s.replicas.incarnation)
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
