package proxy

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// Replicas (docs/replicas.md). R copies of the proxy each own a share of the
// broker nodes; a node's Produce requests are decided by one replica at a
// time, the one that serves it. Ownership is fixed by configuration;
// serving moves only by an explicit handover between two replicas, which
// each publishes in its status (GET /replica on its admin listener) and
// reads in its peers'. No replica takes a node on suspicion: one that
// cannot be reached is taken to decide nothing, and its nodes wait for it.
//
// The invariant: a replica starts deciding a node only once the one that
// decided it before has no Produce of that node in flight upstream. So
// every retry finds its original's outcome in the log when the new server
// warms the partition (docs/warm.md), or in the server's own table.

// replicaPhase is where a replica is in its life.
type replicaPhase int32

const (
	phaseStarting    replicaPhase = iota // taking back its nodes from the peers covering them
	phaseServing                         // serving its nodes (and any it covers)
	phaseHandingOver                     // shutting down: handing every node it serves to a peer
)

var phaseNames = [...]string{phaseStarting: "starting", phaseServing: "serving", phaseHandingOver: "handing_over"}

func (p replicaPhase) String() string { return phaseNames[p] }

func parsePhase(s string) (replicaPhase, bool) {
	for p, name := range phaseNames {
		if name == s {
			return replicaPhase(p), true
		}
	}
	return 0, false
}

// What a replica does with a node's Produce requests: its state there.
const (
	nodeForeign    int32 = iota // neither served nor released here: relayed (and counted)
	nodeServing                 // decided here
	nodeCovering                // taken over from a peer: marking its partitions to warm first (held)
	nodeReclaiming              // owned, waiting for the peers that covered it to let go (held)
	nodeReleasing               // being handed to target: held until its Produce requests in flight are answered
	nodeReleased                // handed over: answered NOT_LEADER_OR_FOLLOWER, pointing at target
)

var nodeStateNames = [...]string{"foreign", "serving", "covering", "reclaiming", "releasing", "released"}

// replicaNode is one broker node as this replica sees it. The state is
// read without the lock on every Produce request (the fast path is one
// load); it is written under replicaSet.mu.
type replicaNode struct {
	id     int32
	owner  int
	state  atomic.Int32
	target atomic.Int32 // the replica a releasing or released node goes to; -1 none
	since  time.Time    // when reclaiming or covering began (replicaSet.mu)
	from   int          // the peer it was taken from (covered or reclaimed), -1 none (replicaSet.mu)
	taking bool         // covered or reclaimed, its legacy state being taken from the peer (replicaSet.mu)
}

// decides reports whether this replica decides the node's Produce
// requests now, or is about to (so a returning owner must wait for it).
func decides(state int32) bool {
	return state == nodeServing || state == nodeCovering || state == nodeReleasing
}

// replicaStatus is what a replica publishes at GET /replica and reads in
// its peers'. Field names are the protocol (docs/replicas.md).
type replicaStatus struct {
	Index       int    `json:"index"`
	Incarnation string `json:"incarnation"` // new at every start
	Phase       string `json:"phase"`
	// Serving lists the nodes whose Produce requests this replica decides,
	// or still has in flight (releasing).
	Serving []int32 `json:"serving"`
	// Released maps each node this replica handed over to the replica it
	// handed it to.
	Released map[int32]int `json:"released,omitempty"`
	// From maps each node it serves that it took from a peer (covered or
	// reclaimed) to that peer. The peer, restarted, redirects the node's
	// Produce requests here instead of relaying them.
	From map[int32]int `json:"from,omitempty"`
	// Yields maps each peer this replica saw up to the incarnation it saw:
	// it will not take that peer's nodes unless that incarnation hands
	// them over.
	Yields map[int]string `json:"yields,omitempty"`
	// Replicas is the replica list this replica was configured with, and
	// Layout a digest of everything that says which replica owns which
	// node and where it is advertised (layoutDigest). Peers compare them
	// with their own; a replica that publishes neither (an older version)
	// is not compared.
	Replicas []string `json:"replicas,omitempty"`
	Layout   string   `json:"layout,omitempty"`
}

// peerView is the last status read from a peer.
type peerView struct {
	status    replicaStatus
	phase     replicaPhase
	serving   map[int32]bool
	reachable bool
	err       error
	// differs: the peer publishes another replica list or layout than
	// this replica's (kept from its last answer while it is unreachable).
	differs bool
}

// up reports whether a peer is running and not leaving.
func (p *peerView) up() bool {
	return p.reachable && (p.phase == phaseStarting || p.phase == phaseServing)
}

// Timings of the replica protocol.
const (
	replicaPollEvery   = 250 * time.Millisecond // peers' statuses, at rest
	replicaPollBusy    = 25 * time.Millisecond  // while something waits on a peer
	replicaPeerTimeout = 500 * time.Millisecond // one status request
	// replicaFresh is how old a peer's status may be when a Produce request
	// for a node this replica does not serve is decided on it.
	replicaFresh = 100 * time.Millisecond
	// handoverQuiet: after its last node is released, a replica leaving
	// answers redirects until none was needed for this long (and the
	// takeovers serve their nodes), so active clients learn where to go
	// rather than find the connection closed.
	handoverQuiet = 300 * time.Millisecond
)

// replicaSet is this replica's side of the replica protocol.
type replicaSet struct {
	s           *Server
	m           *replicaMetrics
	l           *replicaLayout
	incarnation string
	client      *http.Client
	log         *slog.Logger

	mu       sync.Mutex
	phase    replicaPhase
	nodes    map[int32]*replicaNode
	peers    []peerView
	polledAt time.Time
	yields   map[int]string
	changed  chan struct{} // closed and replaced whenever a node's state or a peer's status changes
	busy     int           // waits on a peer: poll fast

	adv        atomic.Pointer[map[int32]int] // node → the replica it is advertised at
	wake       chan struct{}                 // poll now
	polled     chan struct{}                 // closed and replaced after every poll
	lastRedir  atomic.Int64                  // unix ns of the last redirect answered
	handOnce   sync.Once
	handedAll  bool        // every node handed over, each drained (handOver)
	undrained  atomic.Bool // a node was released with Produce requests unanswered
	attachedMu sync.Mutex
	attached   map[*requestTracker]*replicaNode
}

func newReplicaSet(s *Server, l *replicaLayout) *replicaSet {
	var b [8]byte
	rand.Read(b[:])
	rs := &replicaSet{
		s: s, l: l, incarnation: hex.EncodeToString(b[:]),
		log:      s.Logger.With("replica", l.self),
		nodes:    map[int32]*replicaNode{},
		peers:    make([]peerView, l.count),
		yields:   map[int]string{},
		changed:  make(chan struct{}),
		wake:     make(chan struct{}, 1),
		polled:   make(chan struct{}),
		attached: map[*requestTracker]*replicaNode{},
	}
	if l.count == 1 {
		rs.phase = phaseServing // nobody to take anything back from
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 2, IdleConnTimeout: 30 * time.Second}
	if s.Config.AdminTLS.Enabled() {
		// Peers' admin listeners serve HTTPS; their certificates are
		// verified against the system roots like any other server's.
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	rs.client = &http.Client{Transport: tr, Timeout: replicaPeerTimeout}
	empty := map[int32]int{}
	rs.adv.Store(&empty)
	// The bootstrap listener is every replica's own.
	boot := &replicaNode{id: -1, owner: l.self}
	boot.state.Store(nodeServing)
	boot.target.Store(-1)
	rs.nodes[-1] = boot
	return rs
}

// node returns node id's state, creating it on first sight: an owned node
// is served at once while this replica serves, and reclaimed from the peers
// otherwise; any other node is foreign.
func (rs *replicaSet) node(id int32) *replicaNode {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.nodeLocked(id)
}

func (rs *replicaSet) nodeLocked(id int32) *replicaNode {
	n, ok := rs.nodes[id]
	if ok {
		return n
	}
	n = &replicaNode{id: id, owner: rs.l.owner(id), since: rs.s.now(), from: -1}
	n.target.Store(-1)
	switch {
	case n.owner != rs.l.self:
		n.state.Store(nodeForeign)
	case rs.phase == phaseServing:
		n.state.Store(nodeServing)
	default:
		n.state.Store(nodeReclaiming)
	}
	rs.nodes[id] = n
	rs.recomputeLocked()
	return n
}

// setState changes node n's state, under rs.mu, and wakes every waiter.
func (rs *replicaSet) setStateLocked(n *replicaNode, state int32, target int) {
	old := n.state.Load()
	n.target.Store(int32(target))
	n.state.Store(state)
	if state == nodeCovering || state == nodeReclaiming {
		n.since = rs.s.now()
	}
	if old != state {
		rs.log.Info("replica node state", "node", n.id, "from", nodeStateNames[old], "to", nodeStateNames[state], "target", target)
	}
	rs.recomputeLocked()
	rs.broadcastLocked()
}

func (rs *replicaSet) broadcastLocked() {
	close(rs.changed)
	rs.changed = make(chan struct{})
}

// waitChange returns a channel closed at the next change of state.
func (rs *replicaSet) waitChange() <-chan struct{} {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.changed
}

// status is this replica's published state.
func (rs *replicaSet) status() replicaStatus {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	st := replicaStatus{Index: rs.l.self, Incarnation: rs.incarnation, Phase: rs.phase.String(), Serving: []int32{},
		Released: map[int32]int{}, From: map[int32]int{}, Yields: map[int]string{},
		Replicas: rs.l.addrs, Layout: rs.l.digest}
	for id, n := range rs.nodes {
		if id < 0 {
			continue
		}
		switch s := n.state.Load(); {
		case decides(s):
			st.Serving = append(st.Serving, id)
			if n.from >= 0 {
				st.From[id] = n.from
			}
		case s == nodeReleased:
			st.Released[id] = int(n.target.Load())
		}
	}
	sort.Slice(st.Serving, func(i, j int) bool { return st.Serving[i] < st.Serving[j] })
	for p, inc := range rs.yields {
		st.Yields[p] = inc
	}
	return st
}

// ready reports whether this replica serves every node it owns (and so
// takes traffic): readiness means its nodes were taken back.
func (rs *replicaSet) ready() error {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.phase == phaseHandingOver {
		return ErrDraining
	}
	if differ, agree := rs.layoutVotesLocked(); len(differ) > 0 && len(differ) >= agree {
		return fmt.Errorf("replica %d's replica list or layout differs from that of replicas %v, and no more of the replicas it reads share its own (%d, itself included): they would advertise nodes at different addresses; give every replica the same replicas, replica_count, replica_owners and node ports", rs.l.self, differ, agree)
	}
	switch rs.phase {
	case phaseStarting:
		var waiting []string
		for id, n := range rs.nodes {
			if id >= 0 && n.state.Load() == nodeReclaiming {
				waiting = append(waiting, strconv.Itoa(int(id)))
			}
		}
		sort.Strings(waiting)
		return fmt.Errorf("replica %d is taking back its nodes from the peers that covered them (waiting for node %v)", rs.l.self, waiting)
	}
	return nil
}

// layoutVotesLocked returns the reachable peers that publish another
// replica list or layout than this replica's, and how many replicas it
// reads, itself included, publish its own. Only what is certain counts: a
// peer that cannot be read, or publishes no layout, is neither.
func (rs *replicaSet) layoutVotesLocked() (differ []int, agree int) {
	agree = 1
	for i := range rs.peers {
		p := &rs.peers[i]
		switch {
		case i == rs.l.self || !p.reachable || p.status.Layout == "":
		case p.differs:
			differ = append(differ, i)
		default:
			agree++
		}
	}
	return differ, agree
}

// advertised returns the replica clients are told serves node id.
func (rs *replicaSet) advertised(id int32) int {
	if i, ok := (*rs.adv.Load())[id]; ok {
		return i
	}
	return rs.l.owner(id)
}

// recomputeLocked refreshes which replica each node is advertised at:
// the one that decides it now, as far as this replica knows. A node
// nobody is known to serve is advertised at its owner, even one that is
// down: no replica takes it on suspicion, so its producers wait for it.
func (rs *replicaSet) recomputeLocked() {
	adv := make(map[int32]int, len(rs.nodes))
	for id, n := range rs.nodes {
		if id < 0 {
			continue
		}
		state := n.state.Load()
		switch {
		case decides(state):
			adv[id] = rs.l.self
			continue
		}
		at := -1
		// A peer serving it; the owner first.
		if p := &rs.peers[n.owner]; n.owner != rs.l.self && p.reachable && p.serving[id] {
			at = n.owner
		}
		for i := range rs.peers {
			if at < 0 && i != rs.l.self && rs.peers[i].reachable && rs.peers[i].serving[id] {
				at = i
			}
		}
		if at < 0 && state == nodeReleased {
			at = int(n.target.Load())
		}
		if at < 0 {
			at = n.owner
		}
		adv[id] = at
	}
	rs.adv.Store(&adv)
}

// pollLoop reads the peers' statuses, quickly while something waits on a
// peer, until the server stops.
func (rs *replicaSet) pollLoop() {
	if rs.l.count == 1 {
		return
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for first := true; ; first = false {
		select {
		case <-rs.s.stop:
			return
		case <-rs.wake:
		case <-t.C:
		}
		rs.pollOnce()
		if first {
			// Tell the peers this incarnation is up: those covering its
			// nodes give them back without waiting for their next poll.
			rs.wakePeers()
		}
		rs.mu.Lock()
		every := replicaPollEvery
		if rs.busy > 0 || rs.phase != phaseServing || rs.transitioningLocked() {
			every = replicaPollBusy
		}
		rs.mu.Unlock()
		t.Reset(every)
	}
}

// transitioningLocked reports whether a node is between two servers here.
func (rs *replicaSet) transitioningLocked() bool {
	for _, n := range rs.nodes {
		switch n.state.Load() {
		case nodeCovering, nodeReclaiming, nodeReleasing:
			return true
		}
	}
	return false
}

// poke asks pollLoop to poll now.
func (rs *replicaSet) poke() {
	select {
	case rs.wake <- struct{}{}:
	default:
	}
}

// pollNow polls the peers once more (pollLoop does it, now) and waits for
// that poll, at most until ctx ends.
func (rs *replicaSet) pollNow(ctx context.Context) {
	rs.mu.Lock()
	polled := rs.polled
	rs.mu.Unlock()
	rs.poke()
	select {
	case <-polled:
	case <-ctx.Done():
	case <-rs.s.stop:
	}
	// One that started before the poke may have read an older status:
	// wait for the next one too.
	rs.mu.Lock()
	polled = rs.polled
	rs.mu.Unlock()
	rs.poke()
	select {
	case <-polled:
	case <-ctx.Done():
	case <-rs.s.stop:
	}
}

// pollOnce reads every peer's status at once and applies them.
func (rs *replicaSet) pollOnce() {
	views := make([]peerView, rs.l.count)
	var wg sync.WaitGroup
	for i := range views {
		if i == rs.l.self {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			views[i] = rs.fetch(i)
		}()
	}
	wg.Wait()
	rs.apply(views)
}

// fetch reads peer i's status. A peer that does not answer is unreachable:
// to this replica, it decides nothing.
func (rs *replicaSet) fetch(i int) peerView {
	ctx, cancel := context.WithTimeout(rs.s.dialCtx, replicaPeerTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rs.peerURL(i, "/replica"), nil)
	if err != nil {
		return peerView{err: err}
	}
	resp, err := rs.client.Do(req)
	if err != nil {
		return peerView{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return peerView{err: err}
	}
	if resp.StatusCode != http.StatusOK {
		return peerView{err: fmt.Errorf("GET /replica: %s", resp.Status)}
	}
	var st replicaStatus
	if err := json.Unmarshal(body, &st); err != nil {
		return peerView{err: fmt.Errorf("GET /replica: %w", err)}
	}
	phase, ok := parsePhase(st.Phase)
	if !ok || st.Index != i {
		return peerView{err: fmt.Errorf("GET /replica: replica %d answered as replica %d in phase %q (check replica_admin)", i, st.Index, st.Phase)}
	}
	v := peerView{status: st, phase: phase, reachable: true, serving: map[int32]bool{}}
	for _, id := range st.Serving {
		v.serving[id] = true
	}
	return v
}

func (rs *replicaSet) peerURL(i int, path string) string {
	scheme := "http"
	if rs.s.Config.AdminTLS.Enabled() {
		scheme = "https"
	}
	return scheme + "://" + rs.l.admins[i] + path
}

// wakePeers wakes every peer (wakePeer).
func (rs *replicaSet) wakePeers() {
	for i := range rs.l.count {
		rs.wakePeer(i)
	}
}

// wakePeer asks peer i to poll now (POST /replica/wake): a hint that
// something changed here. It changes nothing there by itself.
func (rs *replicaSet) wakePeer(i int) {
	if i < 0 || i == rs.l.self || i >= rs.l.count {
		return
	}
	rs.s.spawn(func() {
		ctx, cancel := context.WithTimeout(rs.s.dialCtx, replicaPeerTimeout)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, rs.peerURL(i, "/replica/wake"), nil)
		if err != nil {
			return
		}
		if resp, err := rs.client.Do(req); err == nil {
			resp.Body.Close()
		}
	})
}

// apply takes in the peers' statuses and moves nodes accordingly.
func (rs *replicaSet) apply(views []peerView) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for i := range views {
		if i == rs.l.self {
			continue
		}
		was := rs.peers[i]
		v := views[i]
		if !v.reachable {
			// Keep what it said last, but it decides nothing now.
			v.status, v.phase, v.differs = was.status, was.phase, was.differs
			if was.reachable {
				rs.log.Warn("replica peer unreachable; it is taken to decide nothing until it answers again", "peer", i, "err", v.err)
			}
		} else {
			if !was.reachable || was.status.Incarnation != v.status.Incarnation || was.phase != v.phase {
				rs.log.Info("replica peer", "peer", i, "phase", v.phase.String(), "incarnation", v.status.Incarnation)
			}
			v.differs = v.status.Layout != "" && (v.status.Layout != rs.l.digest || !slices.Equal(v.status.Replicas, rs.l.addrs))
			switch {
			case v.differs && (!was.differs || was.status.Incarnation != v.status.Incarnation):
				rs.log.Error("replica peer publishes another replica list or layout than this replica's: the two advertise broker nodes at different addresses, some where nothing serves them; give every replica the same replicas, replica_count, replica_owners and node ports",
					"peer", i, "peer_replicas", v.status.Replicas, "peer_layout", v.status.Layout, "replicas", rs.l.addrs, "layout", rs.l.digest)
			case !v.differs && was.differs:
				rs.log.Info("replica peer publishes this replica's list and layout again", "peer", i)
			}
		}
		rs.peers[i] = v
	}
	rs.polledAt = rs.s.now()
	rs.evaluateLocked()
	close(rs.polled)
	rs.polled = make(chan struct{})
}

// evaluateLocked moves nodes by the protocol (docs/replicas.md, "The
// handover protocol"), from this replica's state and its peers'.
func (rs *replicaSet) evaluateLocked() {
	self := rs.l.self
	// Yield to every peer that is up: from now on its nodes are taken only
	// if that incarnation hands them over.
	for i := range rs.peers {
		if p := &rs.peers[i]; i != self && p.up() && rs.yields[i] != p.status.Incarnation {
			rs.yields[i] = p.status.Incarnation
		}
	}
	ids := make([]int32, 0, len(rs.nodes))
	for id := range rs.nodes {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		if id < 0 {
			continue
		}
		n := rs.nodes[id]
		owner := &rs.peers[n.owner]
		switch state := n.state.Load(); {
		case n.owner != self && (state == nodeServing || state == nodeCovering) && owner.up() && !n.taking:
			// The owner is back: give the node back once what is in
			// flight here is answered.
			rs.releaseLocked(n, n.owner)
		case state == nodeForeign || state == nodeReleased:
			if rs.phase != phaseServing {
				break
			}
			for i := range rs.peers {
				p := &rs.peers[i]
				if to, ok := p.status.Released[id]; i == self || !p.reachable || p.phase != phaseHandingOver || !ok || to != self || p.serving[id] {
					continue
				}
				// Released to this replica by peer i: taken, unless its
				// owner is back (it then takes it back itself).
				if n.owner != i && owner.up() {
					break
				}
				rs.coverLocked(n, i)
				break
			}
		case state == nodeReclaiming && !n.taking:
			if rs.peersLetGoLocked(id) || rs.s.now().Sub(n.since) > rs.s.Config.DrainTimeout+replicaPeerTimeout {
				if !rs.peersLetGoLocked(id) {
					rs.log.Warn("a peer did not let go of this replica's node within drain_timeout; serving it anyway", "node", id)
				}
				n.from = -1
				for i := range rs.peers {
					if to, ok := rs.peers[i].status.Released[id]; i != self && rs.peers[i].reachable && ok && to == self {
						n.from = i // the peer that covered it gave it back
					}
				}
				if from := n.from; from >= 0 && rs.s.core != nil {
					// Its legacy state first (handoff.go), then served.
					n.taking = true
					if rs.s.spawn(func() { rs.finishReclaim(n, from) }) {
						break
					}
					n.taking = false
				}
				rs.setStateLocked(n, nodeServing, -1)
				rs.m.handovers[handoverReclaimed].Inc()
			}
		}
	}
	if rs.phase == phaseStarting {
		all := true
		for id, n := range rs.nodes {
			if id >= 0 && n.owner == self && n.state.Load() == nodeReclaiming {
				all = false
			}
		}
		if all {
			rs.phase = phaseServing
			rs.log.Info("replica serving: every node it owns is back", "owned", rs.countLocked(func(n *replicaNode) bool { return n.owner == self }))
			rs.broadcastLocked()
		}
	}
	rs.recomputeLocked()
}

// peersLetGoLocked reports whether every reachable peer has seen this
// incarnation up (so it takes none of its nodes unless handed them) and
// decides node id no more.
func (rs *replicaSet) peersLetGoLocked(id int32) bool {
	for i := range rs.peers {
		p := &rs.peers[i]
		if i == rs.l.self || !p.reachable {
			continue
		}
		if p.status.Yields[rs.l.self] != rs.incarnation || p.serving[id] {
			return false
		}
	}
	return true
}

func (rs *replicaSet) countLocked(f func(*replicaNode) bool) int {
	c := 0
	for id, n := range rs.nodes {
		if id >= 0 && f(n) {
			c++
		}
	}
	return c
}

// Handover events, for dedupproxy_replica_handovers_total{event}.
const (
	handoverReleased  = iota // a node handed to a peer
	handoverCovered          // a peer's node taken over
	handoverReclaimed        // an owned node taken back (or first served after a start)
	numHandoverEvents
)

var handoverEvents = [numHandoverEvents]string{"released", "covered", "reclaimed"}

// observeLeaders notes where each partition of topic is led, as a
// Metadata response (a client's, or the proxy's own) names it. A partition
// whose leader moved from a node this replica decides to one it does not
// is marked to be warmed from the log again here: should its leadership
// come back, the batches appended meanwhile through another replica are
// read before its next batch is decided (docs/replicas.md, "Leader moves").
func (rs *replicaSet) observeLeaders(topic string, leaders []protocol.PartitionLeader) {
	s := rs.s
	if s.table == nil {
		return
	}
	id, ok := s.table.LookupTopic([]byte(topic))
	if !ok {
		return
	}
	var moved []seqstate.Key
	rs.mu.Lock()
	for _, pl := range leaders {
		if n := rs.nodes[pl.Leader]; n != nil && decides(n.state.Load()) {
			continue
		}
		if k := (seqstate.Key{Topic: id, Partition: pl.Partition}); s.core.Warm(k.Topic, k.Partition) {
			moved = append(moved, k)
		}
	}
	rs.mu.Unlock()
	if len(moved) > 0 {
		rs.s.rewarm(moved)
	}
}

// statusHandler serves GET /replica (this replica's status), POST
// /replica/wake (poll the peers now) and POST /replica/legacy (hand the
// legacy state of a node's partitions to the peer taking it: handoff.go).
func (rs *replicaSet) statusHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /replica", func(w http.ResponseWriter, _ *http.Request) {
		var b bytes.Buffer
		json.NewEncoder(&b).Encode(rs.status())
		w.Header().Set("Content-Type", "application/json")
		w.Write(b.Bytes())
	})
	mux.HandleFunc("POST /replica/wake", func(w http.ResponseWriter, _ *http.Request) {
		rs.poke()
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /replica/legacy", rs.handOffLegacy)
	return mux
}

// ReplicaHandler serves the replica protocol's endpoints, GET /replica and
// POST /replica/wake, for the admin listener; without replicas it answers
// 404. Call it after Start.
func (s *Server) ReplicaHandler() http.Handler {
	if s == nil || s.replicas == nil {
		return http.NotFoundHandler()
	}
	return s.replicas.statusHandler()
}
