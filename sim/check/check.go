package check

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/dedupproxy/dedupproxy/sim/client"
	"github.com/dedupproxy/dedupproxy/sim/kafka"
)

// The invariants checked after every run (docs/simulation.md):
//
//  1. every record a client sent as new is written, unless the client
//     gave up on it;
//  2. no record is taken for another client instance's retry;
//  3. nothing of a retry shape the rule covers is written twice;
//  4. an idempotent producer's every answer equals the broker's;
//  5. an answer's offset is true: the log holds the batch's records there;
//  6. an idempotent resend is answered here, or waits for its original's
//     answer, never forwarded while its original's outcome is the proxy's
//     to know (in the log, or on its way there with its answer due).
//
// What the rule documents it cannot tell apart is not a failure: each
// such record is counted under its shape, and the test asserts a bound
// for each (a known miss fails past its bound).

// Shape is a kind of record the rule may write twice or drop.
type Shape struct {
	Name    string
	Covered bool // the rule claims it: any count is a failure
	drop    bool // a record dropped, not written twice
	fwd     bool // an idempotent batch forwarded (invariant 6), not a record
}

// The shapes. NOTE: a new shape needs its row in docs/simulation.md and a
// bound in sim/sim_test.go.
var (
	// Resent records the rule covers.
	shIdentical  = Shape{Name: "identical resend on a new connection", Covered: true}
	shRestamped  = Shape{Name: "restamped resend by kafka-go or kafkajs", Covered: true}
	shResplit    = Shape{Name: "librdkafka re-split resend", Covered: true}
	shMoved      = Shape{Name: "kafkajs resend to another partition, original unacknowledged", Covered: true}
	shRestartID  = Shape{Name: "identical resend across a proxy restart", Covered: true}
	shHandover   = Shape{Name: "resend across a node handover", Covered: true}
	shIdempotent = Shape{Name: "idempotent resend", Covered: true}
	shIdemEpoch  = Shape{Name: "idempotent resend under a bumped epoch (Kafka dedupes within an epoch only)"}
	// Resent records the rule documents as misses (written twice).
	shSameConn          = Shape{Name: "kafkajs resend after a request timeout, its original in flight on the connection kafkajs keeps"}
	shRepartitioned     = Shape{Name: "kafkajs resend of records another broker acknowledged"}
	shRestartRestamp    = Shape{Name: "restamped resend across a proxy restart"}
	shUnrecognised      = Shape{Name: "restamped resend by a client the core takes to keep timestamps (sarama)"}
	shOvertook          = Shape{Name: "resend decided before the proxy heard the old connection end"}
	shAfterFin          = Shape{Name: "copy answered or decided on a connection whose end had reached the proxy (reader held)"}
	shSilentCut         = Shape{Name: "resend after a silent cut (the proxy never hears the old connection end)"}
	shAcks              = Shape{Name: "acks=0/1 resend"}
	shAfterWindow       = Shape{Name: "resend after the window"}
	shTailFailed        = Shape{Name: "resend decided without its partition's log (the tail read failed)"}
	shTailBeforeAppend  = Shape{Name: "resend of an unknown outcome the broker appended after the tail read that settled it"}
	shLeaderAcrossRep   = Shape{Name: "resend after a leader moved to another replica"}
	shSharedResend      = Shape{Name: "resend by a process sharing its instance with another"}
	shIdenticalInResend = Shape{Name: "resend holding identical records, by a client whose identity is content only, re-partitioned"}
	shRestartLate       = Shape{Name: "resend across a restart of a record appended after the new proxy read the log"}
	shContentOnlyTaken  = Shape{Name: "resend by a content-only client with identical records in flight (one took its original's match)"}
	shHandoverUnsettled = Shape{Name: "resend across a handover of a batch whose outcome the log had to settle (REQUEST_TIMED_OUT, a broken broker connection)"}
	shMovedAcrossRep    = Shape{Name: "kafkajs resend moved to a partition another replica decides"}
	shMiddlebox         = Shape{Name: "resend after a middlebox took its answer and closed cleanly (clean_close: read)"}
	shRestartExposure   = Shape{Name: "resend across a restart, another instance's identical record and timestamp in the log"}
	// Records dropped by design (documented), and what no design allows.
	shDropContent      = Shape{Name: "identical record of a restamping client's instance (content-only identity)", drop: true}
	shDropShared       = Shape{Name: "identical record of another process sharing the instance", drop: true}
	shDropRestart      = Shape{Name: "identical record and timestamp of another anonymous producer in the log read after a restart or a takeover", drop: true}
	shDropOwn          = Shape{Name: "identical record and timestamp of the same instance", drop: true}
	shDropUnknownOther = Shape{Name: "unknown outcome settled by another instance's identical record and timestamp in the log", drop: true}
	shDropOther        = Shape{Name: "dropped for no documented reason", Covered: true, drop: true}
	// Idempotent resends forwarded though a copy was in the log or on its
	// way there (invariant 6), per batch: the broker deduplicates them.
	shIdemForwarded   = Shape{Name: "idempotent resend forwarded, its original's outcome the proxy's to know", Covered: true, fwd: true}
	shIdemFwdLost     = Shape{Name: "idempotent resend forwarded: its original's answer lost with the broker connection", fwd: true}
	shIdemFwdNoOffset = Shape{Name: "idempotent resend forwarded: its original appended without an offset (REQUEST_TIMED_OUT) or with acks=1", fwd: true}
	shIdemFwdRestart  = Shape{Name: "idempotent resend forwarded across a proxy restart (the table is memory)", fwd: true}
	shIdemFwdBeyond   = Shape{Name: "idempotent resend forwarded, the broker refusing it as out of order: more of its producer's batches on their way than the 5 Kafka retains", fwd: true}
	// An answer's offset holding a record the rule can tell from the one
	// answered (invariant 5), per record.
	shWrongOffset = Shape{Name: "answered with the offset of another record of the same content (an unknown outcome settled from the log)"}
)

var Shapes = []Shape{shIdentical, shRestamped, shResplit, shMoved, shRestartID, shHandover, shIdempotent, shIdemEpoch,
	shSameConn, shRepartitioned, shRestartRestamp, shUnrecognised, shOvertook, shAfterFin, shSilentCut, shAcks, shAfterWindow, shTailFailed, shTailBeforeAppend, shLeaderAcrossRep, shSharedResend, shRestartExposure, shRestartLate, shIdenticalInResend, shMiddlebox, shMovedAcrossRep, shContentOnlyTaken, shHandoverUnsettled,
	shDropContent, shDropShared, shDropRestart, shDropOwn, shDropUnknownOther, shDropOther, shWrongOffset,
	shIdemForwarded, shIdemFwdLost, shIdemFwdNoOffset, shIdemFwdRestart, shIdemFwdBeyond}

// Result is what one run found.
type Result struct {
	seed     uint64
	ended    bool
	Failures []string
	counts   map[string]int // per shape: records written twice, or dropped
	resent   map[string]int // per shape: records resent (written twice or not)
	records  int
	requests int
	faults   []string
}

func (res *Result) failf(format string, a ...any) {
	res.Failures = append(res.Failures, fmt.Sprintf(format, a...))
}

// Run is what a finished run recorded, as the checks read it.
type Run struct {
	Seed     uint64
	Ended    bool // false: the run did not end within MaxSteps
	MaxSteps int
	Window   time.Duration     // the legacy rule's window
	Faults   []string          // what the scenario injected, for the report
	Records  []client.Record   // by lid
	Requests []*client.Request // by id - 1
	Clients  []*client.Client
	Broker   *kafka.Broker // the cluster as the run left it
	// TailReads and TailFails: each read of a partition's tail, by core.
	TailReads, TailFails []TailRead
	// Restarts and Handovers: when each happened; Rewarms: how many
	// times a replica forgot a partition's warm-up.
	Restarts, Handovers []time.Duration
	Rewarms             int
	Idem                *Idem // what the run's decisions showed as they were taken
}

// TailRead is one read of partition Partition's tail for core Core.
type TailRead struct {
	Core      string
	Partition int32
	At        time.Duration
}

// Invariants checks a finished run.
func Invariants(run *Run) *Result {
	ended := run.Ended
	res := &Result{seed: run.Seed, ended: ended, counts: map[string]int{}, resent: map[string]int{},
		records: len(run.Records), requests: len(run.Requests), faults: run.Faults}
	if !ended {
		res.failf("the run did not end within %d steps", run.MaxSteps)
	}
	res.Failures = append(res.Failures, run.Idem.failures...)
	res.resent[shIdemForwarded.Name] = run.Idem.resent
	for name, n := range run.Idem.forwarded {
		res.counts[name] += n
	}
	// Records the rule cannot tell apart (one client instance, the same
	// key, value and headers, and the same timestamp unless the core
	// leaves timestamps out for the client) are judged together: the log
	// must hold at least one copy for each that must be written, and no
	// more copies than records were sent upstream or must be written.
	// Which lid a copy is of
	// does not matter among them; the per-record analysis below only says
	// which shape a drop or a duplicate is.
	type classKey struct {
		info client.Info
		name string
		ts   int64
	}
	classes := map[classKey][]kafka.Lid{}
	var order []classKey
	for l := range run.Records {
		ri := &run.Records[l]
		if len(ri.Sends) == 0 {
			if ri.Acked && ri.Lost == "" {
				res.failf("%s record %s (lid %d) acknowledged, never sent", ri.Client.Name, ri.Name, l)
			}
			continue
		}
		k := classKey{info: ri.Client.Info, name: ri.Name}
		if !ri.Client.ContentOnly() {
			k.ts = recIn(run.Requests[ri.Sends[0]-1], kafka.Lid(l)).ts
		}
		if _, ok := classes[k]; !ok {
			order = append(order, k)
		}
		classes[k] = append(classes[k], kafka.Lid(l))
	}
	for _, k := range order {
		lids := classes[k]
		copies, need, up := 0, 0, 0
		var dropped []kafka.Lid
		type copyOf struct {
			sh  Shape
			msg string
		}
		var extra []copyOf // the shape of each extra copy, per record
		for _, l := range lids {
			ri := &run.Records[l]
			copies += len(ri.Written)
			if ri.Upstream || ri.Acked && ri.Lost == "" {
				up++ // a copy may stand for it
			}
			switch {
			case ri.Acked && ri.Lost == "":
				need++
				if len(ri.Written) == 0 {
					dropped = append(dropped, l)
				}
			case len(ri.Written) == 0 && !ri.Acked && ri.GaveUp == "" && ended:
				res.failf("%s (%s) record %s (lid %d) was neither written nor given up at the end", ri.Client.Name, ri.Client.Workload, ri.Name, l)
			}
			// Every send decided after a copy reached the log is a resend
			// the proxy had to catch.
			for _, sid := range ri.Sends {
				s := run.Requests[sid-1]
				if s.Decided == 0 {
					continue
				}
				e := run.earlierCopy(l, s)
				if e == nil {
					continue
				}
				sh := run.resendShape(l, s, e)
				res.resent[sh.Name]++
				if slices.Contains(ri.Written, sid) {
					extra = append(extra, copyOf{sh, fmt.Sprintf("%s (%s) record %s (lid %d) written twice: req %d (%s) repeats req %d: %s",
						ri.Client.Name, ri.Client.Workload, ri.Name, l, sid, s.Conn.Describe(), e.ID, sh.Name)})
				}
			}
		}
		dups := min(max(copies-up, 0), len(extra))
		for _, x := range extra[:dups] {
			res.counts[x.sh.Name]++
			if x.sh.Covered {
				res.Failures = append(res.Failures, x.msg)
			}
		}
		drops := min(max(need-copies, 0), len(dropped))
		for _, l := range dropped[:drops] {
			sh, why := run.dropShape(l)
			res.counts[sh.Name]++
			if sh.Covered {
				ri := &run.Records[l]
				res.failf("%s (%s) record %s (lid %d) was acknowledged and never written: %s", ri.Client.Name, ri.Client.Workload, ri.Name, l, why)
			}
		}
	}
	run.checkOffsets(res)
	return res
}

// earlierCopy returns the first request that wrote l to the log before s
// was decided, or nil.
func (run *Run) earlierCopy(l kafka.Lid, s *client.Request) *client.Request {
	for _, id := range run.Records[l].Written {
		e := run.Requests[id-1]
		if e.ID != s.ID && e.Handled > 0 && e.Handled <= s.Decided {
			return e
		}
	}
	return nil
}

// resendShape says which shape resend s of record l is, e the request
// whose copy was in the log when s was decided.
func (run *Run) resendShape(l kafka.Lid, s, e *client.Request) Shape {
	c := s.Client
	rs, re := recIn(s, l), recIn(e, l)
	switch {
	case c.Lib.Idempotent:
		if epochIn(s, l) != epochIn(e, l) {
			return shIdemEpoch
		}
		return shIdempotent
	case s.Acks != -1 || e.Acks != -1:
		return shAcks
	case s.Decided-e.Handled >= run.Window:
		return shAfterWindow
	case run.shared(c):
		return shSharedResend
	case run.tailFailedBetween(s, rs.partition, e.Handled):
		return shTailFailed
	case run.readBeforeAppend(e, re.partition):
		return shTailBeforeAppend
	case run.behindMiddlebox(l, s):
		return shMiddlebox
	case s.SentAt < e.SentAt:
		// s is the older copy, decided after a resend of it was written
		// (its connection's reader was held): to be dropped, the proxy
		// must know its client left that connection.
		switch {
		case s.Conn.Silent:
			return shSilentCut
		case s.Conn.FinAt > 0 && s.Conn.FinAt <= s.Decided:
			return shAfterFin
		}
		return shOvertook
	case run.ackedBefore(l, s):
		// Its client read an acknowledgement of it and sent it again all
		// the same: kafkajs's send retried for another part.
		return shRepartitioned
	case c.Lib.KeepConn && e.TimedOut:
		return shSameConn
	case rs.ts != re.ts && !c.ContentOnly():
		return shUnrecognised
	case c.ContentOnly() && sameNameTwice(s, l):
		return shIdenticalInResend
	case c.ContentOnly() && run.identicalBetween(l, e.SentAt, s.Decided):
		return shContentOnlyTaken
	case s.Replica != e.Replica:
		if rs.partition != re.partition {
			return shMovedAcrossRep
		}
		if run.handedOver(e, s) {
			if e.Lost || codeFor(e.Answered, e, re.partition) == kerr.RequestTimedOut.Code || codeFor(e.Written, e, re.partition) == kerr.RequestTimedOut.Code {
				// HandOff leaves a batch whose outcome the log must still
				// settle with the core that decided it.
				return shHandoverUnsettled
			}
			return shHandover
		}
		return shLeaderAcrossRep
	case s.CoreName != e.CoreName:
		switch {
		case rs.ts != re.ts:
			return shRestartRestamp
		case run.otherInstanceCopy(l, rs.ts, s.Decided):
			return shRestartExposure
		case run.readBefore(s.CoreName, rs.partition, e.Handled):
			return shRestartLate
		}
		return shRestartID
	case run.overtook(l, s) != nil:
		x := run.overtook(l, s)
		switch {
		case x.Conn.Silent:
			return shSilentCut
		case x.Conn.FinAt > 0 && x.Conn.FinAt <= x.DelivAt:
			return shAfterFin
		}
		return shOvertook
	case rs.partition != re.partition:
		return shMoved
	case rs.ts != re.ts:
		return shRestamped
	case c.Lib.Style == client.Resplit:
		return shResplit
	}
	return shIdentical
}

// overtook: when s was decided, the proxy had written a successful answer
// carrying l on a connection whose client never read it, and the core had
// not heard that connection end: to the core the client held it.
func (run *Run) overtook(l kafka.Lid, s *client.Request) *client.Request {
	for _, id := range run.Records[l].Sends {
		x := run.Requests[id-1]
		if x == s || x.DelivAt == 0 || x.DelivAt > s.Decided || x.Answered != nil {
			continue
		}
		if codeFor(x.Written, x, recIn(x, l).partition) == 0 && (x.Conn.ToldAt == 0 || x.Conn.ToldAt > s.Decided) {
			return x
		}
	}
	return nil
}

// tailFailedBetween: a read of partition p's tail for the core that
// decided s failed after from and before s was decided.
func (run *Run) tailFailedBetween(s *client.Request, p int32, from time.Duration) bool {
	for _, f := range run.TailFails {
		if f.Core == s.CoreName && f.Partition == p && f.At >= from && f.At <= s.Decided {
			return true
		}
	}
	return false
}

// readBeforeAppend: e's answer was lost with the broker connection, and
// the core that decided it read partition p's tail after that and before
// the broker handled e: the read, which settles such an outcome, could not
// find it, and the core took it as not written (docs/warm.md, "Unknown
// outcomes").
func (run *Run) readBeforeAppend(e *client.Request, p int32) bool {
	if !e.Lost {
		return false
	}
	for _, f := range run.TailReads {
		if f.Core == e.CoreName && f.Partition == p && f.At >= e.LostAt && f.At < e.Handled {
			return true
		}
	}
	return false
}

// otherInstanceCopy: another client instance sent a record identical to
// l, with timestamp ts, before t: after a restart the log cannot tell
// their copies apart (docs/legacy.md, "After a restart").
func (run *Run) otherInstanceCopy(l kafka.Lid, ts int64, t time.Duration) bool {
	ri := &run.Records[l]
	for m := range run.Records {
		o := &run.Records[m]
		if o.Name != ri.Name || o.Client.Info.SameInstance(ri.Client.Info) {
			continue
		}
		for _, id := range o.Sends {
			x := run.Requests[id-1]
			if x.SentAt <= t && recIn(x, kafka.Lid(m)).ts == ts {
				return true
			}
		}
	}
	return false
}

// offsetOf is the offset the answer to r gave record l, -1 if none.
func offsetOf(r *client.Request, l kafka.Lid) int64 {
	for i, b := range r.Parts {
		for j, x := range b.Recs {
			if x.Lid == l && i < len(r.Answered) && r.Answered[i].Offset >= 0 {
				return r.Answered[i].Offset + int64(j)
			}
		}
	}
	return -1
}

// readBefore: core read partition p's tail before t (its first read,
// whose records a resend after a restart may match).
func (run *Run) readBefore(core string, p int32, t time.Duration) bool {
	for _, f := range run.TailReads {
		if f.Core == core && f.Partition == p {
			return f.At < t
		}
	}
	return false
}

// logRead: some core kept the legacy records of a tail it read (after a
// restart, a takeover, or a leader that moved away and back).
func (run *Run) logRead() bool { return len(run.Restarts)+len(run.Handovers)+run.Rewarms > 0 }

// handedOver: a node was handed over between e and s.
func (run *Run) handedOver(e, s *client.Request) bool {
	for _, at := range run.Handovers {
		if at >= e.Decided && at <= s.Decided {
			return true
		}
	}
	return false
}

type recAt struct {
	partition int32
	ts        int64
}

// recIn finds record l in request r.
func recIn(r *client.Request, l kafka.Lid) recAt {
	for _, b := range r.Parts {
		for _, x := range b.Recs {
			if x.Lid == l {
				return recAt{b.Partition, x.TS}
			}
		}
	}
	return recAt{-1, 0}
}

// shared: another process is the same client instance as c and ran at
// the same time (runs of a one-shot job that do not overlap are one
// instance on fresh connections, not two processes).
func (run *Run) shared(c *client.Client) bool {
	for _, o := range run.Clients {
		if o != c && o.Info.SameInstance(c.Info) && overlap(o, c) {
			return true
		}
	}
	return false
}

func overlap(a, b *client.Client) bool {
	aEnd, bEnd := a.DiedAt, b.DiedAt
	if aEnd == 0 {
		aEnd = 1 << 62
	}
	if bEnd == 0 {
		bEnd = 1 << 62
	}
	return a.BornAt < bEnd && b.BornAt < aEnd
}

// sameNameTwice: request r carries another record with l's content.
func sameNameTwice(r *client.Request, l kafka.Lid) bool {
	name, n := "", 0
	for _, b := range r.Parts {
		for _, x := range b.Recs {
			if x.Lid == l {
				name = x.Name
			}
		}
	}
	for _, b := range r.Parts {
		for _, x := range b.Recs {
			if x.Name == name {
				n++
			}
		}
	}
	return n > 1
}

// behindMiddlebox: an answer carrying l went to a middlebox that
// acknowledged it and passed nothing on, before s.
func (run *Run) behindMiddlebox(l kafka.Lid, s *client.Request) bool {
	for _, id := range run.Records[l].Sends {
		x := run.Requests[id-1]
		if x != s && x.DelivAt > 0 && x.DelivAt <= s.Decided && x.Conn.Middlebox {
			return true
		}
	}
	return false
}

// identicalBetween: l's instance sent another record with l's content
// between from and to: a client whose identity is content only cannot
// have them told apart.
func (run *Run) identicalBetween(l kafka.Lid, from, to time.Duration) bool {
	ri := &run.Records[l]
	for m := range run.Records {
		o := &run.Records[m]
		if kafka.Lid(m) == l || o.Name != ri.Name || !o.Client.Info.SameInstance(ri.Client.Info) {
			continue
		}
		for _, id := range o.Sends {
			if at := run.Requests[id-1].SentAt; at >= from && at < to {
				return true
			}
		}
	}
	return false
}

// ackedBefore: an answer its client read before sending s said l was
// written.
func (run *Run) ackedBefore(l kafka.Lid, s *client.Request) bool {
	for _, id := range run.Records[l].Sends {
		x := run.Requests[id-1]
		if x != s && x.SentAt < s.SentAt && x.Answered != nil && codeFor(x.Answered, x, recIn(x, l).partition) == 0 {
			return true
		}
	}
	return false
}

// epochIn is the producer epoch of the batch of r that carries l.
func epochIn(r *client.Request, l kafka.Lid) int16 {
	for _, b := range r.Parts {
		for _, x := range b.Recs {
			if x.Lid == l {
				return b.Epoch
			}
		}
	}
	return -2
}

// codeFor is the error code of partition p in answer a to r, -1 if none.
func codeFor(a []kafka.PartResult, r *client.Request, p int32) int16 {
	for i, b := range r.Parts {
		if b.Partition == p && i < len(a) {
			return a[i].Code
		}
	}
	return -1
}

// dropShape says why record l, acknowledged, is not in the log.
func (run *Run) dropShape(l kafka.Lid) (Shape, string) {
	ri := &run.Records[l]
	c := ri.Client
	r := run.Requests[ri.Sends[len(ri.Sends)-1]-1]
	ts := recIn(r, l).ts
	restamps := c.ContentOnly()
	last := run.Requests[ri.Sends[len(ri.Sends)-1]-1].Decided
	var sameInst, sameExact, otherProc, otherAnon, otherInst bool
	for m := range run.Records {
		o := &run.Records[m]
		if kafka.Lid(m) == l || o.Name != ri.Name {
			continue
		}
		for _, id := range o.Sends {
			x := run.Requests[id-1]
			if x.SentAt > last {
				break
			}
			ots := recIn(x, kafka.Lid(m)).ts
			if o.Client.Info.SameInstance(c.Info) {
				sameInst = true
				sameExact = sameExact || ots == ts
				otherProc = otherProc || o.Client != c && overlap(o.Client, c)
			} else if ots == ts {
				otherInst = true
				otherAnon = otherAnon || o.Client.Info.Principal == 0
			}
		}
	}
	switch {
	case otherProc:
		return shDropShared, "another process with the same principal, client id and host sent it"
	case sameInst && restamps:
		return shDropContent, "its instance sent the same record before"
	case sameExact:
		return shDropOwn, "its instance sent the same record with the same timestamp before"
	}
	unknown := slices.ContainsFunc(ri.Sends, func(id int) bool {
		x := run.Requests[id-1]
		return x.Lost || codeFor(x.Answered, x, recIn(x, l).partition) == kerr.RequestTimedOut.Code
	})
	// The answer that made its client take it as written: whose record is
	// at the offset it names?
	for i := len(ri.Sends) - 1; i >= 0; i-- {
		x := run.Requests[ri.Sends[i]-1]
		at := recIn(x, l)
		if x.Answered == nil || codeFor(x.Answered, x, at.partition) != 0 {
			continue
		}
		off := offsetOf(x, l)
		if off < 0 {
			break
		}
		got, ok := run.Broker.At(at.partition, off)
		if !ok || run.Records[got.Lid].Client.Info.SameInstance(c.Info) {
			break
		}
		switch {
		case unknown:
			return shDropUnknownOther, fmt.Sprintf("req %d was answered offset %d, %s's record", x.ID, off, run.Records[got.Lid].Client.Name)
		case run.logRead():
			return shDropRestart, "another producer's identical record was in the log read after a restart or a takeover"
		}
		return shDropOther, fmt.Sprintf("req %d was answered offset %d, %s's record", x.ID, off, run.Records[got.Lid].Client.Name)
	}
	if unknown && otherInst {
		return shDropUnknownOther, "an unknown outcome of it, and another instance's identical record and timestamp"
	}
	if otherAnon && run.logRead() {
		return shDropRestart, "another producer's identical record was in the log read after a restart or a takeover"
	}
	return shDropOther, fmt.Sprintf("last sent in req %d (%s)", r.ID, r.Conn.Describe())
}

// checkOffsets: every offset a client was answered holds its record
// (invariant 5): the record itself, or one the rule cannot tell from it (a
// restamped retry is answered with its original's offset). An offset
// holding the same content from another client instance, or with another
// timestamp where timestamps count, is counted under its shape.
func (run *Run) checkOffsets(res *Result) {
	for _, r := range run.Requests {
		for i, b := range r.Parts {
			if i >= len(r.Answered) {
				break
			}
			a := r.Answered[i]
			if a.Code != 0 || a.Offset < 0 {
				continue
			}
			for j, x := range b.Recs {
				got, ok := run.Broker.At(b.Partition, a.Offset+int64(j))
				switch {
				case !ok || got.Name != x.Name:
					res.failf("req %d p%d answered offset %d, but offset %d holds %q, not %q", r.ID, b.Partition, a.Offset, a.Offset+int64(j), got.Name, x.Name)
				case !run.sameClass(got.Lid, x.Lid):
					res.counts[shWrongOffset.Name]++
					continue
				default:
					continue
				}
				break
			}
		}
	}
}

// sameClass: the rule cannot tell records a and b apart: one client
// instance, the same content, and the same first timestamp unless the
// core leaves timestamps out for the client.
func (run *Run) sameClass(a, b kafka.Lid) bool {
	ra, rb := &run.Records[a], &run.Records[b]
	if !ra.Client.Info.SameInstance(rb.Client.Info) || ra.Name != rb.Name {
		return false
	}
	return ra.Client.ContentOnly() || run.firstTS(a) == run.firstTS(b)
}

func (run *Run) firstTS(l kafka.Lid) int64 {
	return recIn(run.Requests[run.Records[l].Sends[0]-1], l).ts
}

// Report is a failing run's account.
func (res *Result) Report() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "seed %d: %d records, %d requests; faults:\n", res.seed, res.records, res.requests)
	for _, f := range res.faults {
		fmt.Fprintf(&sb, "  - %s\n", f)
	}
	for _, f := range res.Failures {
		fmt.Fprintf(&sb, "  FAIL %s\n", f)
	}
	return sb.String()
}

// Table sums per shape over runs.
type Table struct {
	Runs           int
	records        int
	Counts, resent map[string]int
	Seeds          map[string][]uint64 // the first seeds of each shape's counts
}

func (t *Table) Add(res *Result) {
	if t.Counts == nil {
		t.Counts, t.resent, t.Seeds = map[string]int{}, map[string]int{}, map[string][]uint64{}
	}
	t.Runs++
	t.records += res.records
	for k, v := range res.counts {
		t.Counts[k] += v
		if len(t.Seeds[k]) < 5 {
			t.Seeds[k] = append(t.Seeds[k], res.seed)
		}
	}
	for k, v := range res.resent {
		t.resent[k] += v
	}
}

func (t *Table) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d runs, %d records\n", t.Runs, t.records)
	for _, s := range Shapes {
		kind := "written twice"
		switch {
		case s.drop:
			kind = "dropped"
		case s.fwd:
			kind = "forwarded"
		}
		cov := "miss"
		if s.Covered {
			cov = "covered"
		}
		fmt.Fprintf(&sb, "  %-95s %-7s resent %6d, %s %5d  seeds %v\n", s.Name, cov, t.resent[s.Name], kind, t.Counts[s.Name], t.Seeds[s.Name])
	}
	return sb.String()
}
