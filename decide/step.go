package decide

import (
	"time"

	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// Step is the core's one entry point for what happens (docs/produce-path.md,
// "Events in, effects out"): the caller tells it a fact (an Event), and it
// says in fx what the caller carries out. The same events in the same
// order, at the same times, give the same effects. A step locks the state
// it touches (a client instance, a partition) only while it runs, and
// never calls back into the caller.
//
// The read-only questions (Settings, Table, Gone, Siblings, LogStart,
// Warm, LegacyRecords, LegacyUse) are methods of their own.
func (c *Core) Step(ev *Event, now time.Time, fx *Effects) {
	fx.reset()
	switch ev.Kind {
	case EvConnect:
		fx.Conn = c.connect(ev.ID, ev.Client, now)
	case EvClose:
		c.disconnect(ev.Conn, ev.How, now)
	case EvSiblingClosed:
		c.disconnectSibling(ev.Conn, ev.ID, ev.How, now)
	case EvRequest:
		c.decide(ev.Req, ev.Plan, now, fx)
	case EvAnswered:
		fx.Wake, fx.Err = c.outcome(ev.Plan, ev.Scanner, ev.Body, now, fx.Wake)
	case EvLost:
		fx.Wake = c.lost(ev.Plan, now, fx.Wake)
	case EvUnsent:
		fx.Wake = c.unsent(ev.Plan, now, fx.Wake)
	case EvWritten:
		c.delivered(ev.Plan, ev.OK, now)
	case EvTailRead:
		fx.Wake = c.tailRead(ev.Tail, ev.Records, now, fx.Wake)
	case EvTailFailed:
		fx.Wake = c.tailFailed(ev.Tail, now, fx.Wake)
	case EvHandOff:
		fx.Handed = c.handOff(ev.Want, now, fx.Handed)
	case EvTakeOver:
		fx.Taken = c.takeOver(ev.Handed, now)
	case EvRewarm:
		c.rewarm(ev.Topic, ev.Partition)
	case EvLogStart:
		c.setLogStart(ev.Topic, ev.Partition, ev.LogStart)
	case EvSettings:
		c.setSettings(ev.Settings)
	}
}

// EventKind says what happened.
type EventKind uint8

const (
	_ EventKind = iota
	// EvConnect: the broker authenticated the client of connection ID
	// (Client says who it is); fx.Conn is the connection's state, for the
	// events that follow.
	EvConnect
	// EvClose: Conn ended, How as far as the caller can tell.
	EvClose
	// EvSiblingClosed: connection ID of Conn's client instance ended How,
	// seen before its own reader saw it.
	EvSiblingClosed
	// EvRequest: a Produce request was read and scanned (Req); Plan is
	// filled with the decision, whose Status says what follows.
	EvRequest
	// EvAnswered: the broker answered what Plan sent upstream: Body is
	// the response after its header, Scanner a reusable scanner.
	EvAnswered
	// EvLost: the broker's answer to Plan will never come.
	EvLost
	// EvUnsent: Plan's request was decided but never forwarded.
	EvUnsent
	// EvWritten: Plan's answer is about to be written to its client (OK),
	// or will not be.
	EvWritten
	// EvTailRead: the log of partition Tail was read: Records.
	EvTailRead
	// EvTailFailed: it could not be read.
	EvTailFailed
	// EvHandOff: the partitions Want accepts move to another replica:
	// fx.Handed is what goes with them.
	EvHandOff
	// EvTakeOver: Handed came from another replica; fx.Taken says how
	// many were taken.
	EvTakeOver
	// EvRewarm: the leadership of partition (Topic, Partition) moved to a
	// broker another replica decides for.
	EvRewarm
	// EvLogStart: the log of (Topic, Partition) starts at LogStart.
	EvLogStart
	// EvSettings: the settings changed (SIGHUP).
	EvSettings
)

// Event is one fact for Step; Kind says which, and which fields it reads.
// Callers reuse one.
type Event struct {
	Kind EventKind

	ID     ConnID // EvConnect, EvSiblingClosed
	Client Client // EvConnect
	Conn   *Conn  // EvClose, EvSiblingClosed
	How    Close  // EvClose, EvSiblingClosed

	Req  *Request // EvRequest
	Plan *Plan    // EvRequest, EvAnswered, EvLost, EvUnsent, EvWritten
	OK   bool     // EvWritten

	Body    []byte                           // EvAnswered
	Scanner *protocol.ProduceResponseScanner // EvAnswered

	Tail    TailKey // EvTailRead, EvTailFailed
	Records []byte  // EvTailRead

	Want   func(topic seqstate.TopicID, partition int32) bool // EvHandOff
	Handed []Handed                                           // EvTakeOver

	Topic     seqstate.TopicID // EvRewarm, EvLogStart
	Partition int32            // EvRewarm, EvLogStart
	LogStart  int64            // EvLogStart

	Settings *Settings // EvSettings
}

// Effects is what a step asks of its caller, besides the Plan an
// EvRequest fills (whose Status says whether to carry it out, wait, read
// the log or read records held in pipes).
type Effects struct {
	// Conn is the connection an EvConnect made.
	Conn *Conn
	// Wake lists the connections whose waiting request may now be decided
	// again.
	Wake []ConnID
	// Handed is what an EvHandOff moves; Taken, how many batches an
	// EvTakeOver took.
	Handed []Handed
	Taken  int
	// Err is an answer that could not be read in whole (EvAnswered): what
	// it did not settle was taken as lost.
	Err error
}

func (fx *Effects) reset() {
	fx.Conn, fx.Err, fx.Taken = nil, nil, 0
	fx.Wake = fx.Wake[:0]
	fx.Handed = fx.Handed[:0]
}
