package owner

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"time"
)

// State is what this replica does with a node's Produce requests.
type State int8

const (
	Foreign    State = iota // neither decided nor released here: relayed (and counted)
	Serving                 // decided here
	Covering                // released here by a peer: being taken (held)
	TakingBack              // owned: waiting for the peers that covered it to let go, then taken back (held)
	Releasing               // being handed to Target: held until its Produce requests in flight are answered
	Released                // handed over: answered NOT_LEADER_OR_FOLLOWER, pointing at Target
)

var stateNames = [...]string{"foreign", "serving", "covering", "taking_back", "releasing", "released"}

func (s State) String() string { return stateNames[s] }

// Decides reports whether a replica in state s decides the node's Produce
// requests now, or is about to (so a returning owner must wait for it).
func (s State) Decides() bool { return s == Serving || s == Covering || s == Releasing }

// Phase is where a replica is in its life.
type Phase int8

const (
	PhaseStarting    Phase = iota // taking back its nodes from the peers covering them
	PhaseServing                  // serving its nodes (and any it covers)
	PhaseHandingOver              // shutting down: handing every node it serves to a peer
)

// Phase names are the replicas' wire (GET /replica).
var phaseNames = [...]string{"starting", "serving", "handing_over"}

func (p Phase) String() string { return phaseNames[p] }

// ParsePhase reads a phase as peers publish it.
func ParsePhase(s string) (Phase, bool) {
	for p, name := range phaseNames {
		if name == s {
			return Phase(p), true
		}
	}
	return 0, false
}

// Status is what a replica publishes (GET /replica) and reads in its peers'.
type Status struct {
	Index       int
	Incarnation string // new at every start
	Phase       Phase
	// Serving lists the nodes it decides, or still has in flight
	// (releasing), by id.
	Serving []int32
	// Released maps each node it handed over to the replica it went to.
	Released map[int32]int
	// From maps each node it serves that it took from a peer (a cover or a
	// take-back) to that peer.
	From map[int32]int
	// Yields maps each peer it saw up to the incarnation it saw: it takes
	// none of that peer's nodes unless that incarnation hands them over.
	Yields map[int]string
	// Replicas and Layout are its replica list and the digest of its
	// layout; empty from a replica too old to publish them.
	Replicas []string
	Layout   string
}

// Config is a replica's fixed side.
type Config struct {
	Self, Count int
	// Owners maps the nodes owned by another replica than id mod Count.
	Owners      map[int32]int
	Incarnation string
	Replicas    []string // published, and compared with the peers'
	Layout      string   // likewise
	// DrainTimeout bounds a release's drain, the handover, and (plus
	// PeerTimeout) a take-back's wait for peers that do not let go.
	DrainTimeout time.Duration
	PeerTimeout  time.Duration
	// Quiet: after its last node is released, a replica leaving waits
	// until no redirect was needed for this long (and its takers serve
	// their nodes), so clients learn where to go.
	Quiet time.Duration
	// TakeState: a take-back from a peer takes the node's legacy state
	// (the proxy has a decision core). A cover always asks for a Take: its
	// partitions are marked to warm from the log.
	TakeState bool
}

// Machine is one replica's ownership state. The zero value is not usable:
// use New.
type Machine struct {
	cfg          Config
	phase        Phase
	nodes        map[int32]*node
	peers        []peer
	yields       map[int]string
	adv          map[int32]int
	lastRedirect time.Time
	undrained    bool      // a node was released with Produce requests unanswered
	ho           *handover // from HandOver on
}

type node struct {
	id       int32
	owner    int
	state    State
	target   int       // Releasing, Released: where it goes; -1 none
	since    time.Time // when it entered its state
	from     int       // the peer it was taken from; -1 none
	fetching bool      // a Take is under way (Taken not yet)
	decided  bool      // Releasing: it was decided here before (a handover of ours, counted)
	forced   bool      // TakingBack: taken back without every peer letting go
}

type peer struct {
	st        Status
	heard     bool // its status was read, or it did not answer, at least once
	reachable bool
	serving   map[int32]bool
	differs   bool // publishes another replica list or layout (kept while unreachable)
}

// up reports whether a peer is running and not leaving.
func (p *peer) up() bool {
	return p.reachable && (p.st.Phase == PhaseStarting || p.st.Phase == PhaseServing)
}

type handover struct {
	start, until time.Time
	ready        []int   // peers that served when it began, in ring order after this one
	moving       []int32 // nodes released by it
	released     time.Time
	done         bool
}

// New returns the machine of a replica that starts at now: with peers it
// is starting (it takes its nodes back first); alone it serves. The
// bootstrap listener (node -1) is every replica's own and always served.
func New(cfg Config, now time.Time) *Machine {
	m := &Machine{cfg: cfg, nodes: map[int32]*node{}, peers: make([]peer, cfg.Count), yields: map[int]string{}, adv: map[int32]int{}}
	if cfg.Count <= 1 {
		m.phase = PhaseServing
	}
	m.nodes[-1] = &node{id: -1, owner: cfg.Self, state: Serving, target: -1, from: -1, since: now}
	return m
}

// Owner returns the replica that owns node id: the override if any, else
// id mod the count; the bootstrap listener (-1) is this replica's.
func (m *Machine) Owner(id int32) int {
	if i, ok := m.cfg.Owners[id]; ok {
		return i
	}
	if id < 0 || m.cfg.Count <= 0 {
		return m.cfg.Self
	}
	return int(id % int32(m.cfg.Count))
}

// Step applies one event at now and returns what to do, in order.
func (m *Machine) Step(ev Event, now time.Time) []Effect {
	var out []Effect
	switch e := ev.(type) {
	case Seen:
		m.see(e.Node, now, &out)
	case PeerStatus:
		m.peerStatus(e, &out)
	case PeerUnreachable:
		m.peerUnreachable(e, &out)
	case Drained:
		if n := m.nodes[e.Node]; n != nil && n.state == Releasing {
			m.released(n, false, now, &out)
		}
	case Taken:
		m.taken(e.Node, now, &out)
	case HandOver:
		m.handOver(e.Until, now, &out)
	case Redirected:
		m.lastRedirect = now
	case Tick:
	}
	m.expire(now, &out)
	m.evaluate(now, &out)
	m.progress(now, &out)
	m.advertise(&out)
	return out
}

func (m *Machine) see(id int32, now time.Time, out *[]Effect) {
	if _, ok := m.nodes[id]; ok {
		return
	}
	n := &node{id: id, owner: m.Owner(id), target: -1, from: -1, since: now}
	m.nodes[id] = n
	switch {
	case n.owner != m.cfg.Self:
		n.state = Foreign
	case m.phase == PhaseServing:
		n.state = Serving
	case m.phase == PhaseStarting:
		n.state = TakingBack
	default:
		// Handing over: an owned node first seen now goes where it is
		// advertised, as one still being taken back does at the handover.
		n.state = Released
		n.target = m.elsewhere(n)
	}
	*out = append(*out, SetState{Node: id, State: n.state, Was: n.state, Target: n.target})
}

func (m *Machine) peerStatus(e PeerStatus, out *[]Effect) {
	i := e.Peer
	if i < 0 || i >= len(m.peers) || i == m.cfg.Self {
		return
	}
	was := m.peers[i]
	v := peer{st: e.Status, heard: true, reachable: true, serving: make(map[int32]bool, len(e.Status.Serving))}
	for _, id := range e.Status.Serving {
		v.serving[id] = true
	}
	v.differs = v.st.Layout != "" && (v.st.Layout != m.cfg.Layout || !slices.Equal(v.st.Replicas, m.cfg.Replicas))
	if !was.reachable || was.st.Incarnation != v.st.Incarnation || was.st.Phase != v.st.Phase {
		*out = append(*out, PeerChanged{Peer: i, Phase: v.st.Phase, Incarnation: v.st.Incarnation})
	}
	switch {
	case v.differs && (!was.differs || was.st.Incarnation != v.st.Incarnation):
		*out = append(*out, LayoutDiffers{Peer: i, Differs: true, Replicas: v.st.Replicas, Layout: v.st.Layout})
	case !v.differs && was.differs:
		*out = append(*out, LayoutDiffers{Peer: i})
	}
	m.peers[i] = v
}

func (m *Machine) peerUnreachable(e PeerUnreachable, out *[]Effect) {
	i := e.Peer
	if i < 0 || i >= len(m.peers) || i == m.cfg.Self {
		return
	}
	p := &m.peers[i]
	if p.reachable {
		*out = append(*out, PeerLost{Peer: i, Err: e.Err})
	}
	// What it said last is kept, but it decides nothing now.
	p.heard, p.reachable, p.serving = true, false, nil
}

// set changes node n's state and says so.
func (m *Machine) set(n *node, state State, target int, now time.Time, out *[]Effect) {
	*out = append(*out, SetState{Node: n.id, State: state, Was: n.state, Target: target})
	n.state, n.target, n.since = state, target, now
}

// release starts handing node n to replica target: its Produce requests
// wait from now on, and once those already forwarded are all answered
// (Drained) or the drain's bound passed, it is released.
func (m *Machine) release(n *node, target int, now time.Time, out *[]Effect) {
	if (n.state == Releasing || n.state == Released) && n.target == target {
		return
	}
	// A foreign node is drained too, but was never this replica's to give.
	n.decided = n.id >= 0 && n.state.Decides()
	m.set(n, Releasing, target, now, out)
	*out = append(*out, Drain{Node: n.id})
}

// released ends node n's release: published, advertised at its target,
// and every peer woken (each advertises the node in its Metadata answers,
// and a redirected client refreshes its metadata at any of them).
func (m *Machine) released(n *node, forced bool, now time.Time, out *[]Effect) {
	if forced {
		m.undrained = true
	}
	m.set(n, Released, n.target, now, out)
	*out = append(*out, Moved{Node: n.id, How: MoveReleased, Peer: n.target, Forced: forced, Counted: n.decided}, WakePeers{})
}

// cover takes over node n, released to this replica by peer from: a Take
// marks its partitions to be warmed from the log (its state here may be
// older than what the peer appended) and takes its legacy state; then it is
// served. Until then it is not released again: released meanwhile, the
// next server would take its state from here before it arrived.
func (m *Machine) cover(n *node, from int, now time.Time, out *[]Effect) {
	n.from, n.fetching = from, true
	m.set(n, Covering, -1, now, out)
	*out = append(*out, Take{Node: n.id, From: from, Rewarm: true})
}

func (m *Machine) taken(id int32, now time.Time, out *[]Effect) {
	n := m.nodes[id]
	if n == nil || !n.fetching {
		return
	}
	n.fetching = false
	switch n.state {
	case Covering:
		m.set(n, Serving, -1, now, out)
		*out = append(*out, Moved{Node: id, How: MoveCovered, Peer: n.from, Counted: true})
	case TakingBack:
		m.set(n, Serving, -1, now, out)
		*out = append(*out, Moved{Node: id, How: MoveTookBack, Peer: n.from, Forced: n.forced, Counted: true})
	}
	*out = append(*out, WakePeers{}) // they advertise the node here from their next poll
}

// expire applies the bounds time sets: a release whose drain did not end
// within DrainTimeout is released anyway (logged by the caller).
func (m *Machine) expire(now time.Time, out *[]Effect) {
	for _, id := range m.sortedIDs() {
		n := m.nodes[id]
		if n.state == Releasing && !now.Before(n.since.Add(m.cfg.DrainTimeout)) {
			m.released(n, true, now, out)
		}
	}
}

// evaluate moves nodes by the protocol (docs/replicas.md, "The handover
// protocol"), from this replica's state and its peers'.
func (m *Machine) evaluate(now time.Time, out *[]Effect) {
	self := m.cfg.Self
	// Yield to every peer that is up: from now on its nodes are taken only
	// if that incarnation hands them over.
	for i := range m.peers {
		if p := &m.peers[i]; i != self && p.up() && m.yields[i] != p.st.Incarnation {
			m.yields[i] = p.st.Incarnation
		}
	}
	for _, id := range m.sortedIDs() {
		if id < 0 {
			continue
		}
		n := m.nodes[id]
		owner := &m.peers[n.owner]
		switch {
		case n.owner != self && (n.state == Serving || n.state == Covering) && owner.up() && !n.fetching:
			// The owner is back: give the node back once what is in
			// flight here is answered.
			m.release(n, n.owner, now, out)
		case n.state == Foreign || n.state == Released:
			if m.phase != PhaseServing {
				break
			}
			for i := range m.peers {
				p := &m.peers[i]
				if to, ok := p.st.Released[id]; i == self || !p.reachable || p.st.Phase != PhaseHandingOver || !ok || to != self || p.serving[id] {
					continue
				}
				// Released to this replica by peer i: covered, unless its
				// owner is back (it then takes it back itself).
				if n.owner != i && owner.up() {
					break
				}
				m.cover(n, i, now, out)
				break
			}
		case n.state == TakingBack && !n.fetching && m.heardAll():
			letGo := m.peersLetGo(id)
			if !letGo && !now.After(n.since.Add(m.cfg.DrainTimeout+m.cfg.PeerTimeout)) {
				break
			}
			n.forced = !letGo
			n.from = -1
			for i := range m.peers {
				if to, ok := m.peers[i].st.Released[id]; i != self && m.peers[i].reachable && ok && to == self {
					n.from = i // the peer that covered it gave it back
				}
			}
			if n.from >= 0 && m.cfg.TakeState {
				// Its legacy state first, then served.
				n.fetching = true
				*out = append(*out, Take{Node: id, From: n.from})
				break
			}
			m.set(n, Serving, -1, now, out)
			*out = append(*out, Moved{Node: id, How: MoveTookBack, Peer: n.from, Forced: n.forced, Counted: true})
		}
	}
	if m.phase == PhaseStarting && m.heardAll() && len(m.waiting()) == 0 {
		m.phase = PhaseServing
		*out = append(*out, PhaseChanged{Phase: PhaseServing})
	}
}

// waiting lists the owned nodes still being taken back.
func (m *Machine) waiting() []int32 {
	var ids []int32
	for _, id := range m.sortedIDs() {
		if n := m.nodes[id]; id >= 0 && n.owner == m.cfg.Self && n.state == TakingBack {
			ids = append(ids, id)
		}
	}
	return ids
}

// heardAll reports whether every peer was heard from (read, or found not
// to answer) at least once: before that, a replica starting cannot know
// which of its nodes a peer covers.
func (m *Machine) heardAll() bool {
	for i := range m.peers {
		if i != m.cfg.Self && !m.peers[i].heard {
			return false
		}
	}
	return true
}

// peersLetGo reports whether every reachable peer has seen this
// incarnation up (so it takes none of its nodes unless handed them) and
// decides node id no more.
func (m *Machine) peersLetGo(id int32) bool {
	for i := range m.peers {
		p := &m.peers[i]
		if i == m.cfg.Self || !p.reachable {
			continue
		}
		if p.st.Yields[m.cfg.Self] != m.cfg.Incarnation || p.serving[id] {
			return false
		}
	}
	return true
}

// handOver is the first step of a replica's stop: every node it serves
// goes to a peer that serves (its owner when that is back, else the next
// ready replica, spread over them), each once its Produce requests in
// flight are answered. Nodes no peer can take stay for the drain that
// follows.
func (m *Machine) handOver(until, now time.Time, out *[]Effect) {
	if m.ho != nil {
		return
	}
	self := m.cfg.Self
	m.phase = PhaseHandingOver
	*out = append(*out, PhaseChanged{Phase: PhaseHandingOver})
	ho := &handover{start: now, until: until}
	for k := 1; k < m.cfg.Count; k++ {
		i := (self + k) % m.cfg.Count
		if p := &m.peers[i]; p.reachable && p.st.Phase == PhaseServing {
			ho.ready = append(ho.ready, i)
		}
	}
	spread := 0
	for _, id := range m.sortedIDs() {
		n := m.nodes[id]
		if len(ho.ready) == 0 {
			break // nobody to take anything: kept, and drained by the stop
		}
		target := -1
		switch {
		case id < 0: // the bootstrap listener goes nowhere: drained, then redirects
		case n.owner != self && m.peers[n.owner].reachable && m.peers[n.owner].st.Phase == PhaseServing:
			target = n.owner
		default:
			target = ho.ready[spread%len(ho.ready)]
			spread++
		}
		switch {
		case n.state.Decides() || id < 0:
			m.release(n, target, now, out)
			ho.moving = append(ho.moving, id)
		case n.state == TakingBack:
			m.set(n, Released, m.elsewhere(n), now, out)
		case n.state == Foreign:
			// Relayed here: drained, then pointed at whoever serves it.
			m.release(n, m.elsewhere(n), now, out)
			ho.moving = append(ho.moving, id)
		}
	}
	m.ho = ho
	*out = append(*out, HandingOver{Nodes: len(ho.moving), Ready: ho.ready}, WakePeers{})
}

// progress ends the handover: once every node it moves is released, it
// answers redirects until none was needed for Quiet and each taker serves
// what it was given, or until its bound.
func (m *Machine) progress(now time.Time, out *[]Effect) {
	ho := m.ho
	if ho == nil || ho.done {
		return
	}
	if ho.released.IsZero() {
		for _, id := range ho.moving {
			if m.nodes[id].state == Releasing {
				if !now.Before(ho.until) {
					m.endHandover(now, out)
				}
				return
			}
		}
		ho.released = now
	}
	quiet := !now.Before(m.lastRedirect.Add(m.cfg.Quiet)) && !now.Before(ho.released.Add(m.cfg.Quiet))
	if quiet && m.takenOver() || !now.Before(ho.until) {
		m.endHandover(now, out)
	}
}

func (m *Machine) endHandover(now time.Time, out *[]Effect) {
	ho := m.ho
	ho.done = true
	_, all := m.HandedOver()
	e := HandedOver{All: all, Took: now.Sub(ho.start)}
	if !ho.released.IsZero() {
		e.ReleasedAfter = ho.released.Sub(ho.start)
	}
	*out = append(*out, e)
}

// takenOver reports whether each node the handover released reads as
// served by its target (or the target cannot be asked). A node relayed
// here for a peer is not waited for: where it is served is not this
// replica's handover.
func (m *Machine) takenOver() bool {
	for _, id := range m.ho.moving {
		n := m.nodes[id]
		if !n.decided || n.target < 0 || n.target == m.cfg.Self || n.state != Released {
			continue
		}
		if p := &m.peers[n.target]; p.reachable && !p.serving[id] {
			return false
		}
	}
	return true
}

// advertisedAt is the replica node n is advertised at: the one that
// decides it now, as far as this replica knows. A node nobody is known to
// serve is advertised at its owner, even one that is down: no replica takes
// it on suspicion, so its producers wait for it.
func (m *Machine) advertisedAt(n *node) int {
	if n.state.Decides() {
		return m.cfg.Self
	}
	// A peer serving it; the owner first.
	if p := &m.peers[n.owner]; n.owner != m.cfg.Self && p.reachable && p.serving[n.id] {
		return n.owner
	}
	for i := range m.peers {
		if i != m.cfg.Self && m.peers[i].reachable && m.peers[i].serving[n.id] {
			return i
		}
	}
	if n.state == Released && n.target >= 0 {
		return n.target
	}
	return n.owner
}

// elsewhere is where a node this replica gives up without handing it to a
// peer goes: where it is advertised, or -1 (nowhere known) rather than
// here.
func (m *Machine) elsewhere(n *node) int {
	if at := m.advertisedAt(n); at != m.cfg.Self {
		return at
	}
	return -1
}

// advertise recomputes where each node is advertised, and says so when
// that changed.
func (m *Machine) advertise(out *[]Effect) {
	adv := make(map[int32]int, len(m.nodes))
	for id, n := range m.nodes {
		if id >= 0 {
			adv[id] = m.advertisedAt(n)
		}
	}
	if len(adv) == len(m.adv) {
		same := true
		for id, i := range adv {
			if j, ok := m.adv[id]; !ok || i != j {
				same = false
				break
			}
		}
		if same {
			return
		}
	}
	m.adv = adv
	cp := make(map[int32]int, len(adv))
	for id, i := range adv {
		cp[id] = i
	}
	*out = append(*out, Advertise{At: cp})
}

func (m *Machine) sortedIDs() []int32 {
	ids := make([]int32, 0, len(m.nodes))
	for id := range m.nodes {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Queries. They change nothing.

// Phase is where this replica is in its life.
func (m *Machine) Phase() Phase { return m.phase }

// State returns node id's state and target; ok false for a node never seen.
func (m *Machine) State(id int32) (s State, target int, ok bool) {
	n := m.nodes[id]
	if n == nil {
		return Foreign, -1, false
	}
	return n.state, n.target, true
}

// Fetching reports whether node id's take is under way.
func (m *Machine) Fetching(id int32) bool {
	n := m.nodes[id]
	return n != nil && n.fetching
}

// Advertised returns the replica clients are told serves node id.
func (m *Machine) Advertised(id int32) int {
	if i, ok := m.adv[id]; ok {
		return i
	}
	return m.Owner(id)
}

// RedirectTarget is the replica a redirected request for node id is sent
// to: the one known to serve it, else the one it was released to; -1 when
// none is known.
func (m *Machine) RedirectTarget(id int32) int {
	if i := m.Advertised(id); i != m.cfg.Self && id >= 0 {
		return i
	}
	if n := m.nodes[id]; n != nil {
		return n.target
	}
	return -1
}

// Verdict is what to do with a Produce request for a node this replica
// does not serve.
type Verdict int8

const (
	Relay    Verdict = iota // decide it here and forward it (counted)
	Wait                    // a peer is releasing it (maybe here): wait for the outcome
	Redirect                // answer NOT_LEADER_OR_FOLLOWER, pointing at RedirectTarget
)

var verdictNames = [...]string{"relay", "wait", "redirect"}

func (v Verdict) String() string { return verdictNames[v] }

// Foreign decides a Produce request on a connection to node id, which this
// replica does not serve: relay it, wait while a peer hands the node over
// (it may be handed here), or redirect it to a peer that took the node from
// this replica (a previous incarnation of it: a client still holds the
// address it had, and relayed here its batches would be decided by two
// replicas at once).
func (m *Machine) Foreign(id int32) Verdict {
	n := m.nodes[id]
	if n == nil || n.state != Foreign {
		return Wait // moved meanwhile: look again
	}
	for i := range m.peers {
		if p := &m.peers[i]; i != m.cfg.Self && p.reachable && p.st.Phase == PhaseHandingOver && p.serving[id] {
			return Wait
		}
	}
	for i := range m.peers {
		p := &m.peers[i]
		if from, ok := p.st.From[id]; i != m.cfg.Self && p.reachable && p.serving[id] && ok && from == m.cfg.Self {
			return Redirect
		}
	}
	return Relay
}

// Status is this replica's published state.
func (m *Machine) Status() Status {
	st := Status{Index: m.cfg.Self, Incarnation: m.cfg.Incarnation, Phase: m.phase, Serving: []int32{},
		Released: map[int32]int{}, From: map[int32]int{}, Yields: map[int]string{},
		Replicas: m.cfg.Replicas, Layout: m.cfg.Layout}
	for _, id := range m.sortedIDs() {
		n := m.nodes[id]
		switch {
		case id < 0:
		case n.state.Decides():
			st.Serving = append(st.Serving, id)
			if n.from >= 0 {
				st.From[id] = n.from
			}
		case n.state == Released:
			st.Released[id] = n.target
		}
	}
	for p, inc := range m.yields {
		st.Yields[p] = inc
	}
	return st
}

// ErrHandingOver is Ready's answer once the handover began.
var ErrHandingOver = errors.New("owner: handing over")

// Ready is nil when this replica serves every node it owns, is not
// handing over, and its replica list is not outnumbered: no fewer of the
// replicas it reads share its layout (itself counted) than publish another.
func (m *Machine) Ready() error {
	if m.phase == PhaseHandingOver {
		return ErrHandingOver
	}
	if differ, agree := m.LayoutVotes(); len(differ) > 0 && len(differ) >= agree {
		return fmt.Errorf("replica %d's replica list or layout differs from that of replicas %v, and no more of the replicas it reads share its own (%d, itself included): they would advertise nodes at different addresses; give every replica the same replicas, replica_count, replica_owners and node ports", m.cfg.Self, differ, agree)
	}
	if m.phase == PhaseStarting {
		var waiting []string
		for _, id := range m.waiting() {
			waiting = append(waiting, strconv.Itoa(int(id)))
		}
		sort.Strings(waiting)
		return fmt.Errorf("replica %d is taking back its nodes from the peers that covered them (waiting for node %v)", m.cfg.Self, waiting)
	}
	return nil
}

// LayoutVotes returns the reachable peers that publish another replica
// list or layout than this replica's, and how many replicas it reads,
// itself included, publish its own. A peer that cannot be read, or
// publishes no layout, is neither.
func (m *Machine) LayoutVotes() (differ []int, agree int) {
	agree = 1
	for i := range m.peers {
		p := &m.peers[i]
		switch {
		case i == m.cfg.Self || !p.reachable || p.st.Layout == "":
		case p.differs:
			differ = append(differ, i)
		default:
			agree++
		}
	}
	return differ, agree
}

// Count is how many nodes (the bootstrap listener aside) are owned here,
// decided here, and decided here for a peer.
func (m *Machine) Count() (owned, serving, covered int) {
	for id, n := range m.nodes {
		if id < 0 {
			continue
		}
		if n.owner == m.cfg.Self {
			owned++
		}
		if n.state.Decides() {
			serving++
			if n.owner != m.cfg.Self {
				covered++
			}
		}
	}
	return owned, serving, covered
}

// Reachable is how many peers answered their last status request.
func (m *Machine) Reachable() int {
	c := 0
	for i := range m.peers {
		if i != m.cfg.Self && m.peers[i].reachable {
			c++
		}
	}
	return c
}

// Busy reports whether a node is between two servers here, or this replica
// is not simply serving: its peers are then read often.
func (m *Machine) Busy() bool {
	if m.phase != PhaseServing {
		return true
	}
	for _, n := range m.nodes {
		switch n.state {
		case Covering, TakingBack, Releasing:
			return true
		}
	}
	return false
}

// Deadline is when, after now, the machine next needs a Tick, if ever: a
// release's drain bound, a take-back's bound on peers that do not let go,
// the handover's quiet and its end.
func (m *Machine) Deadline(now time.Time) (time.Time, bool) {
	var at time.Time
	note := func(t time.Time) {
		if t.After(now) && (at.IsZero() || t.Before(at)) {
			at = t
		}
	}
	for _, n := range m.nodes {
		switch {
		case n.state == Releasing:
			note(n.since.Add(m.cfg.DrainTimeout))
		case n.state == TakingBack && !n.fetching:
			// evaluate takes it back once strictly past the bound.
			note(n.since.Add(m.cfg.DrainTimeout + m.cfg.PeerTimeout + time.Nanosecond))
		}
	}
	if ho := m.ho; ho != nil && !ho.done {
		note(ho.until)
		if !ho.released.IsZero() {
			quiet := ho.released
			if m.lastRedirect.After(quiet) {
				quiet = m.lastRedirect
			}
			note(quiet.Add(m.cfg.Quiet))
		}
	}
	return at, !at.IsZero()
}

// HandedOver reports whether the handover ended with every node handed
// over, each drained.
func (m *Machine) HandedOver() (done, all bool) {
	if m.ho == nil || !m.ho.done {
		return false, false
	}
	for _, n := range m.nodes {
		if n.state != Released {
			return true, false
		}
	}
	return true, len(m.ho.ready) > 0 && !m.undrained
}
