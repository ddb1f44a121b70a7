package decide

import (
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/dedupproxy/dedupproxy/decide/sent"
	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// Plan is the core's decision for one Produce request, and what the core
// needs to settle it when the broker answers. Decide fills it; reuse it for
// the next request once Delivered (or Lost) was called, or when its Status
// is not Ready.
type Plan struct {
	Status Status
	// Until bounds a Wait: past it, the request is given up (Request.Waited).
	Until time.Time
	// GaveUp says why the request was given up, if it was.
	GaveUp GaveUp
	// Tails are the partitions to read for ReadTails.
	Tails []TailKey
	// Parts are aligned with Request.Parts.
	Parts []PartPlan
	// AnyUp: something goes upstream. AnyLocal: some part is answered by
	// the proxy (Answer or Rebuild), so the response is built by merging.
	AnyUp, AnyLocal bool
	// Rebuild: some part goes upstream rebuilt (the request is rewritten).
	Rebuild bool
	// Reuse: some idempotent part reuses a sequence for other records;
	// with acks=0 the connection must close (Kafka closes on a failed
	// acks=0 write).
	Reuse bool
	// Rebuilt holds the rebuilt batches of Rebuild parts.
	Rebuilt []byte

	version int16
	acks    int16
	timeout time.Duration // the request's timeout_ms
	arrived time.Time     // when the request was read (Request.Arrived)
	conn    *Conn
	st      []partState
	seqOps  []seqstate.Op
	seqIdx  []int // seqOps[j] is part seqIdx[j]
	seqOuts []seqstate.Outcome
	dropped []seqstate.Op // pending batches an abort took with it
	ids     []protocol.RecordID
	keys    []protocol.RecordKey
	drops   []bool
	matches []match
	undo    []sent.Undo
	waitOn  []seqstate.Key
	// waitFor: batches in flight that legacy records repeat, whose
	// outcome the request waits for; tailWant: partitions whose tail
	// settles a batch a record repeats.
	waitFor  []*sent.Batch
	tailWant []seqstate.Key
	woken    []ConnID // waiters of the legacy batches an outcome settled, to wake
	done     []bool
	settled  bool // Outcome or Lost ran
}

// partState is what the plan keeps of one part.
type partState struct {
	ti, pi int
	legacy bool
	mode   Mode
	match  Match
	exact  bool   // legacy: a record's timestamp is part of its identity
	header string // idempotency key header
	pass   int8
	key    seqstate.Key // idempotent: the producer's key; legacy: the partition (ProducerID -1)
	batch  seqstate.Batch
	maxTS  int64
	// legacy: what its partition said before the instance was locked
	// (partFacts): records read back from its log may match (logged), its
	// log start offset, the highest offset answered for it.
	logged   bool
	logStart int64
	seen     int64
	pending  bool // idempotent: registered in the table
	flying   bool // idempotent: a resend of a flying batch (flying.go), waiting for it
	flew     bool // idempotent: forwarded without a registration in the table, kept flying until its answer
	commit   bool // idempotent: commit if appended
	// legacy: m holds the records it repeats, b those sent upstream
	m, b            sent.Ref
	idsAt, idsEnd   int // this part's record IDs in Plan.ids
	keysAt, keysEnd int // its idempotency keys in Plan.keys
	dropped         int32
}

// match is what one record of a legacy batch repeats.
type match struct {
	kind matchKind
	off  int64 // the original's offset (offUnknown if not known)
	rule Rule
	age  int64 // ns since the original's append
	at   int64 // the original's log append time
}

type matchKind uint8

const (
	matchNone matchKind = iota
	matchDrop
	matchWait
	matchTail
)

// timedOut answers a part whose outcome the proxy cannot know in time:
// REQUEST_TIMED_OUT is retriable in every client, and its retry is decided
// afresh.
var timedOut = protocol.LocalPartitionResult{ErrorCode: kerr.RequestTimedOut.Code, BaseOffset: -1, LogAppendTime: -1, LogStartOffset: -1}

func (pl *Plan) reset(req *Request) {
	pl.Status, pl.Until, pl.Tails, pl.GaveUp = Ready, time.Time{}, pl.Tails[:0], NotGivenUp
	pl.AnyUp, pl.AnyLocal, pl.Rebuild, pl.Reuse = false, false, false, false
	pl.Rebuilt = pl.Rebuilt[:0]
	pl.version, pl.acks, pl.conn, pl.timeout, pl.arrived = req.Version, req.Acks, req.Conn, req.Timeout, req.Arrived
	n := len(req.Parts)
	if cap(pl.Parts) < n {
		pl.Parts = make([]PartPlan, n)
		pl.st = make([]partState, n)
	}
	pl.Parts, pl.st = pl.Parts[:n], pl.st[:n]
	clear(pl.Parts)
	clear(pl.st)
	pl.seqOps, pl.seqIdx, pl.seqOuts = pl.seqOps[:0], pl.seqIdx[:0], pl.seqOuts[:0]
	pl.ids, pl.keys, pl.drops, pl.matches = pl.ids[:0], pl.keys[:0], pl.drops[:0], pl.matches[:0]
	pl.undo, pl.waitOn, pl.tailWant = pl.undo[:0], pl.waitOn[:0], pl.tailWant[:0]
	clear(pl.waitFor)
	pl.waitFor, pl.woken = pl.waitFor[:0], pl.woken[:0]
	pl.settled = false
	for i := range pl.Parts {
		pl.Parts[i].Verdict.Pass = -1
		pl.Parts[i].Verdict.Original = -1
		pl.st[i].ti, pl.st[i].pi = req.Parts[i].TI, req.Parts[i].PI
	}
	if cap(pl.Rebuilt) > maxKeptRebuilt {
		pl.Rebuilt = nil
	}
}

const maxKeptRebuilt = 1 << 20

// account sets AnyUp and AnyLocal from the parts.
func (pl *Plan) account() {
	pl.AnyUp, pl.AnyLocal, pl.Rebuild = false, false, false
	for i := range pl.Parts {
		switch pl.Parts[i].Act {
		case Forward:
			pl.AnyUp = true
		case Answer:
			pl.AnyLocal = true
		case Rebuild:
			pl.AnyUp, pl.AnyLocal, pl.Rebuild = true, true, true
		}
	}
}

// Local returns the proxy's answer for the part at request indexes
// (ti, pi), for protocol.MergeProduceResponse: ok is false for a part the
// broker answers.
func (pl *Plan) Local(cursor *int, ti, pi int) (protocol.LocalPartitionResult, bool) {
	for ; *cursor < len(pl.st); *cursor++ {
		p := &pl.st[*cursor]
		if p.ti > ti || (p.ti == ti && p.pi > pi) {
			break
		}
		if p.ti == ti && p.pi == pi {
			a := pl.Parts[*cursor].Act
			return pl.Parts[*cursor].Local, a != Forward
		}
	}
	return protocol.LocalPartitionResult{}, false
}

// Upstream reports, for a rewritten request, whether the part at (ti, pi)
// goes upstream and with which records (nil: its own).
func (pl *Plan) Upstream(cursor *int, ti, pi int) (bool, []byte) {
	for ; *cursor < len(pl.st); *cursor++ {
		p := &pl.st[*cursor]
		if p.ti > ti || (p.ti == ti && p.pi > pi) {
			break
		}
		if p.ti == ti && p.pi == pi {
			pp := &pl.Parts[*cursor]
			switch pp.Act {
			case Rebuild:
				return true, pl.Rebuilt[pp.At:pp.End]
			case Answer:
				return false, nil
			}
			return true, nil
		}
	}
	return true, nil
}

// baseOf returns the one base offset true for every record of offs (each
// record at base + its index), or -1.
func baseOf(offs func(j int) int64, n int) int64 {
	if n == 0 {
		return -1
	}
	base := offs(0)
	if base < 0 {
		return -1
	}
	for j := 1; j < n; j++ {
		if offs(j) != base+int64(j) {
			return -1
		}
	}
	return base
}
