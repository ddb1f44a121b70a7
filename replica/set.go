package replica

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
	"sync"
	"sync/atomic"
	"time"

	"github.com/dedupproxy/dedupproxy/auth"
	"github.com/dedupproxy/dedupproxy/clock"
	"github.com/dedupproxy/dedupproxy/config"
	"github.com/dedupproxy/dedupproxy/decide"
	"github.com/dedupproxy/dedupproxy/owner"
	"github.com/dedupproxy/dedupproxy/protocol/rewrite"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// A node's state as the Produce path reads it (owner.State).
const (
	nodeForeign    = int32(owner.Foreign)
	nodeServing    = int32(owner.Serving)
	nodeCovering   = int32(owner.Covering)
	nodeTakingBack = int32(owner.TakingBack)
	nodeReleasing  = int32(owner.Releasing)
	nodeReleased   = int32(owner.Released)
)

// Node mirrors one broker node's state in the machine. The state is
// read without the lock on every Produce request (the fast path is one
// load); it is written under Set.mu, from the machine's effects.
type Node struct {
	rs     *Set
	id     int32
	owner  int
	state  atomic.Int32 // owner.State
	target atomic.Int32 // the replica a releasing or released node goes to; -1 none
	// draining: the machine asked for this node's drain (owner.Drain): a
	// Produce answer written, taken back or dropped on its connections
	// looks whether the drain ended.
	draining atomic.Bool
}

// ID is the node's id; -1 is the bootstrap listener.
func (n *Node) ID() int32 { return n.id }

// Serving reports whether this replica serves the node now: the gate's
// fast path, one load.
func (n *Node) Serving() bool { return n.state.Load() == nodeServing }

// State is the node's state here now.
func (n *Node) State() owner.State { return owner.State(n.state.Load()) }

// Target is the replica a releasing or released node goes to; -1 none.
func (n *Node) Target() int { return int(n.target.Load()) }

// Draining reports whether the machine asked for the node's drain: a
// Produce answer written, taken back or dropped on its connections calls
// CheckDrained.
func (n *Node) Draining() bool { return n.draining.Load() }

// decides reports whether this replica decides the node's Produce
// requests now, or is about to (so a returning owner must wait for it).
func decides(state int32) bool { return owner.State(state).Decides() }

// status is what a replica publishes at GET /replica and reads in
// its peers'. Field names are the protocol (docs/replicas.md).
type status struct {
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
	// taken back) to that peer. The peer, restarted, redirects the node's
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

func wireStatus(st owner.Status) status {
	return status{Index: st.Index, Incarnation: st.Incarnation, Phase: st.Phase.String(), Serving: st.Serving,
		Released: st.Released, From: st.From, Yields: st.Yields, Replicas: st.Replicas, Layout: st.Layout}
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
	// takers serve their nodes), so active clients learn where to go
	// rather than find the connection closed.
	handoverQuiet = 300 * time.Millisecond
)

// Options is what a replica's side of the protocol is given.
type Options struct {
	Layout       *config.Layout
	DrainTimeout time.Duration // drain_timeout: a drain's and a take's bound
	DialTimeout  time.Duration // dial_timeout: a take's Metadata request
	AdminTLS     bool          // the peers' admin listeners serve HTTPS
	Log          *slog.Logger
	Clock        clock.Clock // the proxy's: the machine's deadlines, holds and polls run on it
	// Ctx ends when the proxy stops: requests to peers and brokers are
	// abandoned. Stop is closed then: the loops end.
	Ctx  context.Context
	Stop <-chan struct{}
	// Spawn runs a function on a goroutine the proxy waits for, unless it
	// is stopping (then it reports false).
	Spawn func(func()) bool
	// Core is the decision core's side of a node's move; nil when dedup
	// is off (no state moves with a node).
	Core    Core
	Metrics *Metrics
}

// Core is what a node's move and a partition's leader move do to the
// decision core, and what they ask of the cluster.
type Core interface {
	// PartitionsLedBy asks the cluster which partitions node leads, keyed
	// as the tables key them (their topics learned).
	PartitionsLedBy(ctx context.Context, node int32) ([]seqstate.Key, error)
	// Rewarm marks a partition to be warmed from the log on its next batch
	// (decide.EvRewarm); Warm reports whether it is warm now.
	Rewarm(seqstate.Key)
	Warm(topic seqstate.TopicID, partition int32) bool
	LookupTopic(name string) (seqstate.TopicID, bool)
	TopicName(seqstate.TopicID) (string, bool)
	// HandOff moves out of the core the legacy state of the partitions
	// want accepts (decide.EvHandOff); TakeOver takes in what a peer
	// handed off (decide.EvTakeOver) and says how many batches it took.
	HandOff(want func(seqstate.TopicID, int32) bool) []decide.Handed
	TakeOver([]decide.Handed) int
	// PrincipalName and PrincipalID translate the core's principal
	// numbers, which are per process, to the names on the wire.
	PrincipalName(auth.PrincipalID) (string, bool)
	PrincipalID(string) (auth.PrincipalID, bool)
}

// Conn is a client connection filed under a node (Attach): its Produce
// requests forwarded and not yet answered hold the node's drain.
type Conn interface {
	ProducesAwaited() int
}

// Set is this replica's side of the replica protocol: the shell of
// its owner.Machine.
type Set struct {
	Options
	m           *Metrics
	l           *config.Layout
	incarnation string
	client      *http.Client
	log         *slog.Logger

	mu       sync.Mutex
	own      *owner.Machine
	nodes    map[int32]*Node
	deadline time.Time     // the machine's, as the tick timer is armed
	polledAt time.Time     // the last poll's end
	changed  chan struct{} // closed and replaced whenever a node's state, the phase or a take changes
	busy     int           // waits on a peer: poll fast

	adv        atomic.Pointer[map[int32]int] // node → the replica it is advertised at
	wake       chan struct{}                 // poll now
	rearm      chan struct{}                 // the machine's deadline changed
	polled     chan struct{}                 // closed and replaced after every poll
	handed     chan struct{}                 // closed when the handover ended
	handOnce   sync.Once
	handedAll  bool // every node handed over, each drained (handOver)
	attachedMu sync.Mutex
	attached   map[Conn]*Node
}

// New makes a replica's side of the replica protocol; [Set.PollLoop]
// runs it.
func New(o Options) *Set {
	var b [8]byte
	rand.Read(b[:])
	l := o.Layout
	rs := &Set{
		Options: o, m: o.Metrics, l: l, incarnation: hex.EncodeToString(b[:]),
		log:      o.Log.With("replica", l.Self),
		nodes:    map[int32]*Node{},
		changed:  make(chan struct{}),
		wake:     make(chan struct{}, 1),
		rearm:    make(chan struct{}, 1),
		polled:   make(chan struct{}),
		handed:   make(chan struct{}),
		attached: map[Conn]*Node{},
	}
	if rs.m == nil {
		rs.m = NewMetrics(nil, Gauges{})
	}
	rs.own = owner.New(owner.Config{
		Self: l.Self, Count: l.Count, Owners: l.Owners, Incarnation: rs.incarnation,
		Replicas: l.Addrs, Layout: l.Digest,
		DrainTimeout: o.DrainTimeout, PeerTimeout: replicaPeerTimeout, Quiet: handoverQuiet,
		TakeState: o.Core != nil,
	}, o.Clock.Now())
	tr := &http.Transport{MaxIdleConnsPerHost: 2, IdleConnTimeout: 30 * time.Second}
	if o.AdminTLS {
		// Peers' admin listeners serve HTTPS; their certificates are
		// verified against the system roots like any other server's.
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	rs.client = &http.Client{Transport: tr, Timeout: replicaPeerTimeout}
	empty := map[int32]int{}
	rs.adv.Store(&empty)
	// The bootstrap listener is every replica's own, served from the start.
	boot := &Node{rs: rs, id: -1, owner: l.Self}
	boot.state.Store(nodeServing)
	boot.target.Store(-1)
	rs.nodes[-1] = boot
	return rs
}

// Node returns node id's state, making it known to the machine on first
// sight: an owned node is served at once while this replica serves, and
// taken back from the peers otherwise; any other node is foreign.
func (rs *Set) Node(id int32) *Node {
	rs.mu.Lock()
	if n, ok := rs.nodes[id]; ok {
		rs.mu.Unlock()
		return n
	}
	n := rs.mirrorLocked(id)
	effects := rs.stepLocked(owner.Seen{Node: id})
	rs.mu.Unlock()
	rs.carry(effects)
	return n
}

func (rs *Set) mirrorLocked(id int32) *Node {
	n, ok := rs.nodes[id]
	if !ok {
		n = &Node{rs: rs, id: id, owner: rs.own.Owner(id)}
		n.target.Store(-1)
		rs.nodes[id] = n
	}
	return n
}

// Step feeds the machine one event and carries out its effects.
func (rs *Set) Step(ev owner.Event) {
	rs.mu.Lock()
	effects := rs.stepLocked(ev)
	rs.mu.Unlock()
	rs.carry(effects)
}

// stepLocked steps the machine and applies, under rs.mu, the effects that
// others read under it or without a lock: node states, advertised
// addresses, the change broadcast and the tick timer. carry does the rest,
// without the lock.
func (rs *Set) stepLocked(ev owner.Event) []owner.Effect {
	now := rs.Clock.Now()
	effects := rs.own.Step(ev, now)
	changed := false
	if _, ok := ev.(owner.Taken); ok {
		changed = true // a handler waits for the take's end (serveLegacy)
	}
	for _, e := range effects {
		switch e := e.(type) {
		case owner.SetState:
			n := rs.mirrorLocked(e.Node)
			n.target.Store(int32(e.Target))
			n.state.Store(int32(e.State))
			if e.State != owner.Releasing {
				n.draining.Store(false)
			}
			changed = true
		case owner.Advertise:
			at := e.At
			rs.adv.Store(&at)
		case owner.PhaseChanged:
			changed = true
		}
	}
	if changed {
		rs.broadcastLocked()
	}
	if at, _ := rs.own.Deadline(now); !at.Equal(rs.deadline) {
		rs.deadline = at
		select {
		case rs.rearm <- struct{}{}:
		default:
		}
	}
	return effects
}

// carry carries out what needs no lock: drains, takes, wake-ups, logs and
// metrics. It may step the machine again (a drain already over).
func (rs *Set) carry(effects []owner.Effect) {
	for _, e := range effects {
		switch e := e.(type) {
		case owner.SetState:
			if e.Was != e.State {
				rs.log.Info("replica node state", "node", e.Node, "from", e.Was.String(), "to", e.State.String(), "target", e.Target)
			}
		case owner.Drain:
			rs.mu.Lock()
			n := rs.nodes[e.Node]
			rs.mu.Unlock()
			if n != nil {
				n.draining.Store(true)
				n.CheckDrained()
			}
		case owner.Take:
			if e.Rewarm {
				rs.log.Info("covering a node a peer released", "node", e.Node, "from", e.From)
			}
			rs.Spawn(func() { rs.take(e) })
		case owner.Moved:
			if e.Counted {
				rs.m.Handovers[e.How].Inc()
			}
			switch {
			case e.How == owner.MoveReleased && e.Forced:
				rs.log.Warn("handing a node over with Produce requests still unanswered after drain_timeout", "node", e.Node, "to", e.Peer)
			case e.How == owner.MoveTookBack && e.Forced:
				rs.log.Warn("a peer did not let go of this replica's node within drain_timeout; serving it anyway", "node", e.Node)
			}
		case owner.WakePeers:
			rs.wakePeers()
		case owner.PhaseChanged:
			if e.Phase == owner.PhaseServing {
				rs.mu.Lock()
				owned, _, _ := rs.own.Count()
				rs.mu.Unlock()
				rs.log.Info("replica serving: every node it owns is back", "owned", owned)
			}
		case owner.PeerChanged:
			rs.log.Info("replica peer", "peer", e.Peer, "phase", e.Phase.String(), "incarnation", e.Incarnation)
		case owner.PeerLost:
			rs.log.Warn("replica peer unreachable; it is taken to decide nothing until it answers again", "peer", e.Peer, "err", e.Err)
		case owner.LayoutDiffers:
			if e.Differs {
				rs.log.Error("replica peer publishes another replica list or layout than this replica's: the two advertise broker nodes at different addresses, some where nothing serves them; give every replica the same replicas, replica_count, replica_owners and node ports",
					"peer", e.Peer, "peer_replicas", e.Replicas, "peer_layout", e.Layout, "replicas", rs.l.Addrs, "layout", rs.l.Digest)
			} else {
				rs.log.Info("replica peer publishes this replica's list and layout again", "peer", e.Peer)
			}
		case owner.HandingOver:
			rs.log.Info("handing nodes over before stopping", "nodes", e.Nodes, "ready_peers", e.Ready)
		case owner.HandedOver:
			rs.log.Info("handed nodes over", "took", e.Took.Round(time.Millisecond), "released_after", e.ReleasedAfter.Round(time.Millisecond), "all", e.All)
			close(rs.handed)
		}
	}
}

func (rs *Set) broadcastLocked() {
	close(rs.changed)
	rs.changed = make(chan struct{})
}

// waitChange returns a channel closed at the next change of state.
func (rs *Set) waitChange() <-chan struct{} {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.changed
}

// Status is this replica's published state.
func (rs *Set) Status() owner.Status {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.own.Status()
}

// Ready reports whether this replica serves every node it owns (and so
// takes traffic), and its replica list is not outnumbered by its peers':
// nil, or why not (owner.ErrHandingOver once it hands its nodes over).
func (rs *Set) Ready() error {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.own.Ready()
}

// Advertised returns the replica clients are told serves node id.
func (rs *Set) Advertised(id int32) int {
	if i, ok := (*rs.adv.Load())[id]; ok {
		return i
	}
	return rs.l.Owner(id)
}

// PollLoop reads the peers' statuses, quickly while something waits on a
// peer, and ticks the machine at its deadlines, until the server stops.
func (rs *Set) PollLoop() {
	poll := rs.Clock.NewTimer(0)
	defer poll.Stop()
	tick := rs.Clock.NewTimer(time.Hour)
	defer tick.Stop()
	rearm := func() {
		rs.mu.Lock()
		at := rs.deadline
		rs.mu.Unlock()
		tick.Stop()
		if !at.IsZero() {
			tick.Reset(max(at.Sub(rs.Clock.Now()), 0))
		}
	}
	rearm()
	for first := true; ; {
		select {
		case <-rs.Stop:
			return
		case <-rs.rearm:
			rearm()
			continue
		case <-tick.C:
			rs.Step(owner.Tick{})
			rearm()
			continue
		case <-rs.wake:
		case <-poll.C:
		}
		if rs.l.Count > 1 {
			rs.pollOnce()
			if first {
				// Tell the peers this incarnation is up: those covering its
				// nodes give them back without waiting for their next poll.
				rs.wakePeers()
				first = false
			}
		}
		rs.mu.Lock()
		every := replicaPollEvery
		if rs.busy > 0 || rs.own.Busy() {
			every = replicaPollBusy
		}
		rs.mu.Unlock()
		if rs.l.Count > 1 {
			poll.Reset(every)
		}
	}
}

// poke asks pollLoop to poll now.
func (rs *Set) poke() {
	select {
	case rs.wake <- struct{}{}:
	default:
	}
}

// pollNow polls the peers once more (pollLoop does it, now) and waits for
// that poll, at most until ctx ends.
func (rs *Set) pollNow(ctx context.Context) {
	for range 2 {
		// One that started before the poke may have read an older status:
		// wait for the next one too.
		rs.mu.Lock()
		polled := rs.polled
		rs.mu.Unlock()
		rs.poke()
		select {
		case <-polled:
		case <-ctx.Done():
		case <-rs.Stop:
		}
	}
}

// pollOnce reads every peer's status at once and feeds them to the
// machine.
func (rs *Set) pollOnce() {
	events := make([]owner.Event, rs.l.Count)
	var wg sync.WaitGroup
	for i := range events {
		if i == rs.l.Self {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			events[i] = rs.fetch(i)
		}()
	}
	wg.Wait()
	for _, ev := range events {
		if ev != nil {
			rs.Step(ev)
		}
	}
	rs.mu.Lock()
	rs.polledAt = rs.Clock.Now()
	close(rs.polled)
	rs.polled = make(chan struct{})
	rs.mu.Unlock()
}

// fetch reads peer i's status. A peer that does not answer, or answers
// nonsense, is unreachable: to this replica, it decides nothing.
func (rs *Set) fetch(i int) owner.Event {
	lost := func(err error) owner.Event { return owner.PeerUnreachable{Peer: i, Err: err} }
	ctx, cancel := context.WithTimeout(rs.Ctx, replicaPeerTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rs.peerURL(i, "/replica"), nil)
	if err != nil {
		return lost(err)
	}
	resp, err := rs.client.Do(req)
	if err != nil {
		return lost(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return lost(err)
	}
	if resp.StatusCode != http.StatusOK {
		return lost(fmt.Errorf("GET /replica: %s", resp.Status))
	}
	var st status
	if err := json.Unmarshal(body, &st); err != nil {
		return lost(fmt.Errorf("GET /replica: %w", err))
	}
	phase, ok := owner.ParsePhase(st.Phase)
	if !ok || st.Index != i {
		return lost(fmt.Errorf("GET /replica: replica %d answered as replica %d in phase %q (check replica_admin)", i, st.Index, st.Phase))
	}
	return owner.PeerStatus{Peer: i, Status: owner.Status{Index: st.Index, Incarnation: st.Incarnation, Phase: phase,
		Serving: st.Serving, Released: st.Released, From: st.From, Yields: st.Yields, Replicas: st.Replicas, Layout: st.Layout}}
}

func (rs *Set) peerURL(i int, path string) string {
	scheme := "http"
	if rs.AdminTLS {
		scheme = "https"
	}
	return scheme + "://" + rs.l.Admins[i] + path
}

// wakePeers asks every peer to poll now (POST /replica/wake): a hint that
// something changed here. It changes nothing there by itself.
func (rs *Set) wakePeers() {
	for i := range rs.l.Count {
		if i == rs.l.Self {
			continue
		}
		rs.Spawn(func() {
			ctx, cancel := context.WithTimeout(rs.Ctx, replicaPeerTimeout)
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
}

// Handover events, for dedupproxy_replica_handovers_total{event}: indexed
// by owner.Move.
const (
	handoverReleased  = int(owner.MoveReleased)
	handoverCovered   = int(owner.MoveCovered)
	handoverReclaimed = int(owner.MoveTookBack)
	numHandoverEvents = 3
)

var handoverEvents = [numHandoverEvents]string{
	handoverReleased: owner.MoveReleased.String(), handoverCovered: owner.MoveCovered.String(), handoverReclaimed: owner.MoveTookBack.String()}

// ObserveLeaders notes where each partition of topic is led, as a
// Metadata response (a client's, or the proxy's own) names it. A partition
// whose leader moved from a node this replica decides to one it does not
// is marked to be warmed from the log again here: should its leadership
// come back, the batches appended meanwhile through another replica are
// read before its next batch is decided (docs/replicas.md, "Leader moves").
func (rs *Set) ObserveLeaders(topic string, leaders []rewrite.PartitionLeader) {
	c := rs.Core
	if c == nil {
		return
	}
	id, ok := c.LookupTopic(topic)
	if !ok {
		return
	}
	var moved []seqstate.Key
	rs.mu.Lock()
	for _, pl := range leaders {
		if n := rs.nodes[pl.Leader]; n != nil && decides(n.state.Load()) {
			continue
		}
		if k := (seqstate.Key{Topic: id, Partition: pl.Partition}); c.Warm(k.Topic, k.Partition) {
			moved = append(moved, k)
		}
	}
	rs.mu.Unlock()
	if len(moved) > 0 {
		rs.rewarm(moved)
	}
}

// Handler serves GET /replica (this replica's status), POST
// /replica/wake (poll the peers now) and POST /replica/legacy (give the
// legacy state of a node's partitions to the peer taking it: legacy.go),
// for the admin listener.
func (rs *Set) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /replica", func(w http.ResponseWriter, _ *http.Request) {
		var b bytes.Buffer
		json.NewEncoder(&b).Encode(wireStatus(rs.Status()))
		w.Header().Set("Content-Type", "application/json")
		w.Write(b.Bytes())
	})
	mux.HandleFunc("POST /replica/wake", func(w http.ResponseWriter, _ *http.Request) {
		rs.poke()
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /replica/legacy", rs.serveLegacy)
	return mux
}
