package proxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/auth"
	"github.com/dedupproxy/dedupproxy/decide"
	"github.com/dedupproxy/dedupproxy/metrics"
	"github.com/dedupproxy/dedupproxy/owner"
	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/relay"
	"github.com/dedupproxy/dedupproxy/replica"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// Replicas (docs/replicas.md): package replica holds the protocol and the
// decisions of a node in motion; this file is the proxy's side of it: the
// gate every Produce request passes (session.readLoop), the answer that
// redirects one, the replica set built at Start, and the decision core as
// a node's move reaches it (replicaCore).

// replicaGate is the replicas' one hook into the Produce path
// (session.readLoop): it sees every Produce request before it is warmed or
// decided. It returns true when it answered the request itself, with
// NOT_LEADER_OR_FOLLOWER pointing at the replica that serves the node now;
// the caller then reads the next request. Without replicas, or on a node
// this replica serves, it returns at once.
func (c *session) replicaGate(h protocol.RequestHeader, body []byte, acks int16, start time.Time, api *metrics.API) bool {
	rs := c.s.replicas
	if rs == nil {
		return false
	}
	tr := c.tracker
	if tr == nil || c.rnode == nil || acks == 0 {
		// acks=0: no answer to redirect and no retry to protect; the
		// broker is still the partition's leader, so forwarding is right.
		return false
	}
	// Counted before the state is read: a release that begins after this
	// read waits for its answer (drained), so no request slips upstream
	// between the two.
	tr.ProduceSent(h.CorrelationID)
	if c.rnode.Serving() {
		return false
	}
	tr.ProduceUnsent()
	return c.replicaGateSlow(rs, tr, h, body, start, api)
}

// replicaGateSlow handles a Produce request for a node this replica does
// not serve plainly now: the replica set holds it while the node moves
// here or away (replica.Set.Hold), then the session forwards or redirects
// it.
func (c *session) replicaGateSlow(rs *replica.Set, tr *relay.Tracker, h protocol.RequestHeader, body []byte, start time.Time, api *metrics.API) bool {
	if !c.isAuthenticated() {
		// Not authenticated: the broker answers it (and decides nothing
		// here depends on it), as without replicas.
		tr.ProduceSent(h.CorrelationID)
		return false
	}
	n := c.rnode
	var req kmsg.ProduceRequest
	req.SetVersion(h.APIVersion)
	if err := req.ReadFrom(body[h.BodyOffset:]); err != nil {
		tr.ProduceSent(h.CorrelationID)
		return false // the Produce path closes the connection on a bad request
	}
	// Wait at most the request's own timeout (the client gives up then),
	// and no longer than a drain.
	bound := min(max(time.Duration(req.TimeoutMillis)*time.Millisecond, 250*time.Millisecond), c.s.Config.DrainTimeout)
	switch v, target := rs.Hold(n, tr.Held(h.CorrelationID, c.closed), bound, start); v {
	case replica.Forward:
		return false
	case replica.Redirect:
		c.redirect(rs, &req, h, n, target, start, api)
	case replica.Stopping:
		c.closeAll()
	}
	return true
}

// redirect answers a Produce request NOT_LEADER_OR_FOLLOWER pointing at
// target, then stops reading the connection: it closes once that answer
// and those before it are written, as a broker that stops leading closes
// its connections. Some clients (kafka-python) keep using an open
// connection to a node whatever the metadata says, and would be
// redirected here until their retries ran out; on a new connection they
// go where the metadata points.
func (c *session) redirect(rs *replica.Set, req *kmsg.ProduceRequest, h protocol.RequestHeader, n *replica.Node, target int, start time.Time, api *metrics.API) {
	c.answerNotLeader(rs, req, h, n, target, start, api)
	c.stopReading()
}

// answerNotLeader queues, in order, the answer to a Produce request the
// proxy does not forward: NOT_LEADER_OR_FOLLOWER, pointing at the replica
// target (replica.Set.NotLeader).
func (c *session) answerNotLeader(rs *replica.Set, req *kmsg.ProduceRequest, h protocol.RequestHeader, n *replica.Node, target int, start time.Time, api *metrics.API) {
	resp := rs.NotLeader(&c.s.Config, req, n, target)
	bp := relay.GetFrame(256)
	buf := append((*bp)[:0], 0, 0, 0, 0)
	buf = protocol.AppendResponseHeader(buf, int16(kmsg.Produce), h.APIVersion, h.CorrelationID)
	buf = resp.AppendTo(buf)
	binary.BigEndian.PutUint32(buf, uint32(len(buf)-4))
	*bp = buf
	p := c.newPending(h, start, api)
	p.resp = bp
	c.enqueue(p)
	c.kickResponseLoop()
	rs.Redirected() // counted; a handover waits for the redirects to stop
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
	o := replica.Options{
		Layout: l, DrainTimeout: s.Config.DrainTimeout, DialTimeout: s.Config.DialTimeout, AdminTLS: s.Config.AdminTLS.Enabled(),
		Log: s.Logger, Clock: s.clock(), Ctx: s.dialCtx, Stop: s.stop, Spawn: s.spawn, Metrics: s.replicaMetrics,
	}
	if s.core != nil {
		o.Core = replicaCore{s}
	}
	s.replicas = replica.New(o)
	s.Logger.Info("replica", "index", l.Self, "replicas", l.Count, "addresses", l.Addrs, "admin", l.Admins, "incarnation", s.replicas.Incarnation())
	return nil
}

// newReplicaMetrics makes the replicas' metrics on s's registry: a proxy
// on its own exports them too, as the one replica of every node.
func newReplicaMetrics(s *Server) *replica.Metrics {
	return replica.NewMetrics(s.Metrics.Registerer(), replica.Gauges{
		Set:      func() *replica.Set { return s.replicas },
		Nodes:    func() int { return len(s.NodeListeners()) },
		Draining: s.Draining,
	})
}

// replicaCore is the decision core as a node's move sees it
// (replica.Core).
type replicaCore struct{ s *Server }

func (rc replicaCore) Rewarm(k seqstate.Key) {
	rc.s.step(&decide.Event{Kind: decide.EvRewarm, Topic: k.Topic, Partition: k.Partition}, rc.s.now(), nil)
}

func (rc replicaCore) Warm(topic seqstate.TopicID, partition int32) bool {
	return rc.s.core.Warm(topic, partition)
}

func (rc replicaCore) LookupTopic(name string) (seqstate.TopicID, bool) {
	return rc.s.table.LookupTopic([]byte(name))
}

func (rc replicaCore) TopicName(id seqstate.TopicID) (string, bool) { return rc.s.table.TopicName(id) }

func (rc replicaCore) HandOff(want func(seqstate.TopicID, int32) bool) []decide.Handed {
	var fx decide.Effects
	rc.s.step(&decide.Event{Kind: decide.EvHandOff, Want: want}, rc.s.now(), &fx)
	return fx.Handed
}

func (rc replicaCore) TakeOver(hs []decide.Handed) int {
	var fx decide.Effects
	rc.s.step(&decide.Event{Kind: decide.EvTakeOver, Handed: hs}, rc.s.now(), &fx)
	return fx.Taken
}

func (rc replicaCore) PrincipalName(id auth.PrincipalID) (string, bool) {
	return rc.s.principals.Name(id)
}

func (rc replicaCore) PrincipalID(name string) (auth.PrincipalID, bool) {
	return rc.s.principals.ID(name)
}

// PartitionsLedBy asks a bootstrap broker which partitions node leads
// (tail.Conns.PartitionsLedBy).
func (rc replicaCore) PartitionsLedBy(ctx context.Context, node int32) ([]seqstate.Key, error) {
	return rc.s.own.PartitionsLedBy(ctx, rc.s.Config.Upstream, node, rc.s.table)
}

// errReplicaNotReady wraps Ready's answer while a replica takes back its
// nodes.
var errReplicaNotReady = errors.New("proxy: replica not ready")

// replicasReady is the replicas' part of Ready: ErrDraining once this
// replica hands its nodes over.
func replicasReady(rs *replica.Set) error {
	if err := rs.Ready(); err != nil {
		if errors.Is(err, owner.ErrHandingOver) {
			return ErrDraining
		}
		return fmt.Errorf("%w: %v", errReplicaNotReady, err)
	}
	return nil
}

// ReplicaHandler serves the replica protocol's endpoints, GET /replica and
// POST /replica/wake, for the admin listener; without replicas it answers
// 404. Call it after Start.
func (s *Server) ReplicaHandler() http.Handler {
	if s == nil || s.replicas == nil {
		return http.NotFoundHandler()
	}
	return s.replicas.Handler()
}
