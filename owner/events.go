package owner

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Event is a fact the machine steps on.
type Event interface{ event() }

// Seen: node Node was first seen (a connection on its listener, a Metadata
// response naming it). Nodes never seen are not the machine's business.
type Seen struct{ Node int32 }

// PeerStatus: peer Peer's status was read.
type PeerStatus struct {
	Peer   int
	Status Status
}

// PeerUnreachable: peer Peer did not answer, or answered nonsense. It is
// taken to decide nothing until it answers again.
type PeerUnreachable struct {
	Peer int
	Err  error
}

// Drained: no Produce request forwarded here on node Node's connections
// awaits its answer any more (what a Drain effect asked for).
type Drained struct{ Node int32 }

// Taken: node Node's take ended (what a Take effect asked for), whether the
// legacy state came or not.
type Taken struct{ Node int32 }

// HandOver: the replica is stopping (SIGTERM); hand every node over by
// Until.
type HandOver struct{ Until time.Time }

// Redirected: a Produce request was answered NOT_LEADER_OR_FOLLOWER to
// move its client.
type Redirected struct{}

// Tick: time passed (Deadline says when one is due).
type Tick struct{}

func (Seen) event()            {}
func (PeerStatus) event()      {}
func (PeerUnreachable) event() {}
func (Drained) event()         {}
func (Taken) event()           {}
func (HandOver) event()        {}
func (Redirected) event()      {}
func (Tick) event()            {}

// Effect is what a step asks of its caller, or tells it.
type Effect interface {
	effect()
	String() string
}

// SetState: node Node is now in State (was Was), going to Target (-1:
// none). The caller's Produce path reads it.
type SetState struct {
	Node       int32
	State, Was State
	Target     int
}

// Drain: hold node Node's Produce requests (its state says so) and step
// Drained once none forwarded here awaits its answer. The machine releases
// it anyway at its bound (DrainTimeout).
type Drain struct{ Node int32 }

// Take: take node Node from peer From: its legacy state (the peer hands it
// over once the node is released there), and with Rewarm first mark its
// partitions to be warmed from the log. Step Taken when done.
type Take struct {
	Node   int32
	From   int
	Rewarm bool
}

// Move is how a node moved.
type Move int8

const (
	MoveReleased Move = iota // handed to a peer
	MoveCovered              // a peer's node taken over
	MoveTookBack             // an owned node taken back (or first served after a start)
)

// Move names are the values of dedupproxy_replica_handovers_total's event
// label.
var moveNames = [...]string{"released", "covered", "reclaimed"}

func (mv Move) String() string { return moveNames[mv] }

// Moved: node Node moved (How), from or to Peer. Counted: it is one of
// this replica's handovers (a node it relayed for a peer is released too,
// but was never its to give). Forced: past a bound rather than by the rule
// (a drain that did not end, peers that did not let go).
type Moved struct {
	Node            int32
	How             Move
	Peer            int
	Forced, Counted bool
}

// WakePeers: ask every peer to read this replica's status now.
type WakePeers struct{}

// Advertise: nodes are now advertised at At (node → replica).
type Advertise struct{ At map[int32]int }

// PhaseChanged: this replica is now in Phase.
type PhaseChanged struct{ Phase Phase }

// PeerChanged: peer Peer answers again, or in another phase or
// incarnation.
type PeerChanged struct {
	Peer        int
	Phase       Phase
	Incarnation string
}

// PeerLost: peer Peer stopped answering.
type PeerLost struct {
	Peer int
	Err  error
}

// LayoutDiffers: peer Peer publishes another replica list or layout than
// this replica's (Differs), or the same again.
type LayoutDiffers struct {
	Peer     int
	Differs  bool
	Replicas []string
	Layout   string
}

// HandingOver: the handover began, moving Nodes to the Ready peers.
type HandingOver struct {
	Nodes int
	Ready []int
}

// HandedOver: the handover ended, Took after it began, its last node
// released ReleasedAfter (0: not all were). All: every node went, each
// drained: no Produce request this replica decided is in flight, and what
// its connections still wait for holds no state of its.
type HandedOver struct {
	All                 bool
	Took, ReleasedAfter time.Duration
}

func (SetState) effect()      {}
func (Drain) effect()         {}
func (Take) effect()          {}
func (Moved) effect()         {}
func (WakePeers) effect()     {}
func (Advertise) effect()     {}
func (PhaseChanged) effect()  {}
func (PeerChanged) effect()   {}
func (PeerLost) effect()      {}
func (LayoutDiffers) effect() {}
func (HandingOver) effect()   {}
func (HandedOver) effect()    {}

func (e SetState) String() string {
	s := fmt.Sprintf("node %d: %s -> %s", e.Node, e.Was, e.State)
	if e.Target >= 0 {
		s += fmt.Sprintf(" (to %d)", e.Target)
	}
	return s
}

func (e Drain) String() string { return fmt.Sprintf("drain node %d", e.Node) }

func (e Take) String() string {
	s := fmt.Sprintf("take node %d from %d", e.Node, e.From)
	if e.Rewarm {
		s += " (rewarm)"
	}
	return s
}

func (e Moved) String() string {
	s := fmt.Sprintf("moved node %d: %s", e.Node, e.How)
	if e.Peer >= 0 {
		dir := "from"
		if e.How == MoveReleased {
			dir = "to"
		}
		s += fmt.Sprintf(" %s %d", dir, e.Peer)
	}
	if e.Forced {
		s += " (forced)"
	}
	if !e.Counted {
		s += " (not counted)"
	}
	return s
}

func (WakePeers) String() string { return "wake peers" }

func (e Advertise) String() string {
	ids := make([]int32, 0, len(e.At))
	for id := range e.At {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = fmt.Sprintf("%d@%d", id, e.At[id])
	}
	return "advertise " + strings.Join(parts, " ")
}

func (e PhaseChanged) String() string { return "phase " + e.Phase.String() }

func (e PeerChanged) String() string {
	return fmt.Sprintf("peer %d: %s, incarnation %s", e.Peer, e.Phase, e.Incarnation)
}

func (e PeerLost) String() string { return fmt.Sprintf("peer %d: unreachable", e.Peer) }

func (e LayoutDiffers) String() string {
	if !e.Differs {
		return fmt.Sprintf("peer %d: layout agrees again", e.Peer)
	}
	return fmt.Sprintf("peer %d: layout differs (%s: %s)", e.Peer, e.Layout, strings.Join(e.Replicas, ","))
}

func (e HandingOver) String() string {
	return fmt.Sprintf("handing over %d nodes to %v", e.Nodes, e.Ready)
}

func (e HandedOver) String() string {
	return fmt.Sprintf("handed over (all %v) in %v, released after %v", e.All, e.Took, e.ReleasedAfter)
}
