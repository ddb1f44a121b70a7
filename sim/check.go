package sim

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/dedupproxy/dedupproxy/decide"
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

// shape is a kind of record the rule may write twice or drop.
type shape struct {
	name    string
	covered bool // the rule claims it: any count is a failure
	drop    bool // a record dropped, not written twice
	fwd     bool // an idempotent batch forwarded (invariant 6), not a record
}

// The shapes. NOTE: a new shape needs its row in docs/simulation.md and a
// bound in sim_test.go.
var (
	// Resent records the rule covers.
	shIdentical  = shape{name: "identical resend on a new connection", covered: true}
	shRestamped  = shape{name: "restamped resend by kafka-go or kafkajs", covered: true}
	shResplit    = shape{name: "librdkafka re-split resend", covered: true}
	shMoved      = shape{name: "kafkajs resend to another partition, original unacknowledged", covered: true}
	shRestartID  = shape{name: "identical resend across a proxy restart", covered: true}
	shHandover   = shape{name: "resend across a node handover", covered: true}
	shIdempotent = shape{name: "idempotent resend", covered: true}
	shIdemEpoch  = shape{name: "idempotent resend under a bumped epoch (Kafka dedupes within an epoch only)"}
	// Resent records the rule documents as misses (written twice).
	shSameConn          = shape{name: "kafkajs resend after a request timeout, its original in flight on the connection kafkajs keeps"}
	shRepartitioned     = shape{name: "kafkajs resend of records another broker acknowledged"}
	shRestartRestamp    = shape{name: "restamped resend across a proxy restart"}
	shUnrecognised      = shape{name: "restamped resend by a client the core takes to keep timestamps (sarama)"}
	shOvertook          = shape{name: "resend decided before the proxy heard the old connection end"}
	shAfterFin          = shape{name: "copy answered or decided on a connection whose end had reached the proxy (reader held)"}
	shSilentCut         = shape{name: "resend after a silent cut (the proxy never hears the old connection end)"}
	shAcks              = shape{name: "acks=0/1 resend"}
	shAfterWindow       = shape{name: "resend after the window"}
	shTailFailed        = shape{name: "resend decided without its partition's log (the tail read failed)"}
	shTailBeforeAppend  = shape{name: "resend of an unknown outcome the broker appended after the tail read that settled it"}
	shLeaderAcrossRep   = shape{name: "resend after a leader moved to another replica"}
	shSharedResend      = shape{name: "resend by a process sharing its instance with another"}
	shIdenticalInResend = shape{name: "resend holding identical records, by a client whose identity is content only, re-partitioned"}
	shRestartLate       = shape{name: "resend across a restart of a record appended after the new proxy read the log"}
	shContentOnlyTaken  = shape{name: "resend by a content-only client with identical records in flight (one took its original's match)"}
	shHandoverUnsettled = shape{name: "resend across a handover of a batch whose outcome the log had to settle (REQUEST_TIMED_OUT, a broken broker connection)"}
	shMovedAcrossRep    = shape{name: "kafkajs resend moved to a partition another replica decides"}
	shMiddlebox         = shape{name: "resend after a middlebox took its answer and closed cleanly (clean_close: read)"}
	shRestartExposure   = shape{name: "resend across a restart, another instance's identical record and timestamp in the log"}
	// Records dropped by design (documented), and what no design allows.
	shDropContent      = shape{name: "identical record of a restamping client's instance (content-only identity)", drop: true}
	shDropShared       = shape{name: "identical record of another process sharing the instance", drop: true}
	shDropRestart      = shape{name: "identical record and timestamp of another anonymous producer in the log read after a restart or a takeover", drop: true}
	shDropOwn          = shape{name: "identical record and timestamp of the same instance", drop: true}
	shDropUnknownOther = shape{name: "unknown outcome settled by another instance's identical record and timestamp in the log", drop: true}
	shDropOther        = shape{name: "dropped for no documented reason", covered: true, drop: true}
	// Idempotent resends forwarded though a copy was in the log or on its
	// way there (invariant 6), per batch: the broker deduplicates them.
	shIdemForwarded   = shape{name: "idempotent resend forwarded, its original's outcome the proxy's to know", covered: true, fwd: true}
	shIdemFwdLost     = shape{name: "idempotent resend forwarded: its original's answer lost with the broker connection", fwd: true}
	shIdemFwdNoOffset = shape{name: "idempotent resend forwarded: its original appended without an offset (REQUEST_TIMED_OUT) or with acks=1", fwd: true}
	shIdemFwdRestart  = shape{name: "idempotent resend forwarded across a proxy restart (the table is memory)", fwd: true}
	shIdemFwdBeyond   = shape{name: "idempotent resend forwarded, the broker refusing it as out of order: more of its producer's batches on their way than the 5 Kafka retains", fwd: true}
	// An answer's offset holding a record the rule can tell from the one
	// answered (invariant 5), per record.
	shWrongOffset = shape{name: "answered with the offset of another record of the same content (an unknown outcome settled from the log)"}
)

var allShapes = []shape{shIdentical, shRestamped, shResplit, shMoved, shRestartID, shHandover, shIdempotent, shIdemEpoch,
	shSameConn, shRepartitioned, shRestartRestamp, shUnrecognised, shOvertook, shAfterFin, shSilentCut, shAcks, shAfterWindow, shTailFailed, shTailBeforeAppend, shLeaderAcrossRep, shSharedResend, shRestartExposure, shRestartLate, shIdenticalInResend, shMiddlebox, shMovedAcrossRep, shContentOnlyTaken, shHandoverUnsettled,
	shDropContent, shDropShared, shDropRestart, shDropOwn, shDropUnknownOther, shDropOther, shWrongOffset,
	shIdemForwarded, shIdemFwdLost, shIdemFwdNoOffset, shIdemFwdRestart, shIdemFwdBeyond}

// result is what one run found.
type result struct {
	seed     uint64
	ended    bool
	failures []string
	counts   map[string]int // per shape: records written twice, or dropped
	resent   map[string]int // per shape: records resent (written twice or not)
	records  int
	requests int
	faults   []string
}

func (res *result) failf(format string, a ...any) {
	res.failures = append(res.failures, fmt.Sprintf(format, a...))
}

// checkIdempotent compares every idempotent part the proxy answered itself
// with what the broker would answer it now (invariant 4). Deliberate
// differences are not failures: a sequence reused for other records is
// answered OUT_OF_ORDER_SEQUENCE_NUMBER where Kafka would drop the
// records (docs/kafka-rules.md §12.2), and a wait past its deadline
// REQUEST_TIMED_OUT.
func (w *world) checkIdempotent(d *deciding) {
	for i, b := range d.req.parts {
		pp := &d.pl.Parts[i]
		if b.pid < 0 || pp.Act != decide.Answer {
			continue
		}
		ref, appended := w.broker.idempotent(b, headerOf(d.req.raws[i]).MaxTimestamp)
		got := partResult{partition: b.partition, code: pp.Local.ErrorCode, offset: pp.Local.BaseOffset, appendTime: pp.Local.LogAppendTime}
		switch {
		case pp.Verdict.Rule == decide.RuleSequenceReuse, got.code == kerr.RequestTimedOut.Code:
		case appended || got != ref:
			w.idemFailures = append(w.idemFailures, fmt.Sprintf("req %d p%d (pid %d seq %d): the proxy answered %+v, the broker would answer %+v (append %v)",
				d.req.id, b.partition, b.pid, b.seq, got, ref, appended))
		}
	}
}

// check runs the invariants over a finished run.
func (w *world) check(ended bool) *result {
	res := &result{seed: w.seed, ended: ended, counts: map[string]int{}, resent: map[string]int{},
		records: len(w.recs), requests: len(w.reqs), faults: w.faults}
	if !ended {
		res.failf("the run did not end within %d steps", w.maxSteps)
	}
	res.failures = append(res.failures, w.idemFailures...)
	res.resent[shIdemForwarded.name] = w.idemResent
	for name, n := range w.idemForwarded {
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
		info clientInfo
		name string
		ts   int64
	}
	classes := map[classKey][]lid{}
	var order []classKey
	for l := range w.recs {
		ri := &w.recs[l]
		if len(ri.sends) == 0 {
			if ri.acked && ri.lost == "" {
				res.failf("%s record %s (lid %d) acknowledged, never sent", ri.c.name, ri.name, l)
			}
			continue
		}
		k := classKey{info: ri.c.info, name: ri.name}
		if !ri.c.contentOnly() {
			k.ts = recIn(w.reqs[ri.sends[0]-1], lid(l)).ts
		}
		if _, ok := classes[k]; !ok {
			order = append(order, k)
		}
		classes[k] = append(classes[k], lid(l))
	}
	for _, k := range order {
		lids := classes[k]
		copies, need, up := 0, 0, 0
		var dropped []lid
		type copyOf struct {
			sh  shape
			msg string
		}
		var extra []copyOf // the shape of each extra copy, per record
		for _, l := range lids {
			ri := &w.recs[l]
			copies += len(ri.written)
			if ri.upstream || ri.acked && ri.lost == "" {
				up++ // a copy may stand for it
			}
			switch {
			case ri.acked && ri.lost == "":
				need++
				if len(ri.written) == 0 {
					dropped = append(dropped, l)
				}
			case len(ri.written) == 0 && !ri.acked && ri.gaveUp == "" && ended:
				res.failf("%s (%s) record %s (lid %d) was neither written nor given up at the end", ri.c.name, ri.c.workload, ri.name, l)
			}
			// Every send decided after a copy reached the log is a resend
			// the proxy had to catch.
			for _, sid := range ri.sends {
				s := w.reqs[sid-1]
				if s.decided == 0 {
					continue
				}
				e := w.earlierCopy(l, s)
				if e == nil {
					continue
				}
				sh := w.resendShape(l, s, e)
				res.resent[sh.name]++
				if slices.Contains(ri.written, sid) {
					extra = append(extra, copyOf{sh, fmt.Sprintf("%s (%s) record %s (lid %d) written twice: req %d (%s) repeats req %d: %s",
						ri.c.name, ri.c.workload, ri.name, l, sid, s.cn.describe(), e.id, sh.name)})
				}
			}
		}
		dups := min(max(copies-up, 0), len(extra))
		for _, x := range extra[:dups] {
			res.counts[x.sh.name]++
			if x.sh.covered {
				res.failures = append(res.failures, x.msg)
			}
		}
		drops := min(max(need-copies, 0), len(dropped))
		for _, l := range dropped[:drops] {
			sh, why := w.dropShape(l)
			res.counts[sh.name]++
			if sh.covered {
				ri := &w.recs[l]
				res.failf("%s (%s) record %s (lid %d) was acknowledged and never written: %s", ri.c.name, ri.c.workload, ri.name, l, why)
			}
		}
	}
	w.checkOffsets(res)
	return res
}

// contentOnly: the core leaves the timestamp out of this client's record
// identities (decide/rule.go, restamps): sarama names itself and restamps
// its retries; kafkajs writes producer epoch 0 into a legacy batch;
// kafka-go names no software and writes partition leader epoch -1.
func (c *client) contentOnly() bool {
	return c.info.software == "sarama" || c.lib.w.legacyEpoch == 0 || c.info.software == "" && c.lib.w.leaderEpoch == -1
}

// earlierCopy returns the first request that wrote l to the log before s
// was decided, or nil.
func (w *world) earlierCopy(l lid, s *wireReq) *wireReq {
	for _, id := range w.recs[l].written {
		e := w.reqs[id-1]
		if e.id != s.id && e.handled > 0 && e.handled <= s.decided {
			return e
		}
	}
	return nil
}

func (cn *conn) describe() string {
	return fmt.Sprintf("conn %d to node %d via replica %d", cn.id, cn.node, cn.r.id)
}

// resendShape says which shape resend s of record l is, e the request
// whose copy was in the log when s was decided.
func (w *world) resendShape(l lid, s, e *wireReq) shape {
	c := s.c
	rs, re := recIn(s, l), recIn(e, l)
	switch {
	case c.lib.idempotent:
		if epochIn(s, l) != epochIn(e, l) {
			return shIdemEpoch
		}
		return shIdempotent
	case s.acks != -1 || e.acks != -1:
		return shAcks
	case s.decided-e.handled >= w.cfg.window:
		return shAfterWindow
	case w.shared(c):
		return shSharedResend
	case w.tailFailedBetween(s, rs.partition, e.handled):
		return shTailFailed
	case w.readBeforeAppend(e, re.partition):
		return shTailBeforeAppend
	case w.behindMiddlebox(l, s):
		return shMiddlebox
	case s.sentAt < e.sentAt:
		// s is the older copy, decided after a resend of it was written
		// (its connection's reader was held): to be dropped, the proxy
		// must know its client left that connection.
		switch {
		case s.cn.silent:
			return shSilentCut
		case s.cn.finAt > 0 && s.cn.finAt <= s.decided:
			return shAfterFin
		}
		return shOvertook
	case w.ackedBefore(l, s):
		// Its client read an acknowledgement of it and sent it again all
		// the same: kafkajs's send retried for another part.
		return shRepartitioned
	case c.lib.keepConn && e.timedOut:
		return shSameConn
	case rs.ts != re.ts && !c.contentOnly():
		return shUnrecognised
	case c.contentOnly() && sameNameTwice(s, l):
		return shIdenticalInResend
	case c.contentOnly() && w.identicalBetween(l, e.sentAt, s.decided):
		return shContentOnlyTaken
	case s.replica != e.replica:
		if rs.partition != re.partition {
			return shMovedAcrossRep
		}
		if w.handedOver(e, s) {
			if e.lost || codeFor(e.answered, e, re.partition) == kerr.RequestTimedOut.Code || codeFor(e.written, e, re.partition) == kerr.RequestTimedOut.Code {
				// HandOff leaves a batch whose outcome the log must still
				// settle with the core that decided it.
				return shHandoverUnsettled
			}
			return shHandover
		}
		return shLeaderAcrossRep
	case s.coreName != e.coreName:
		switch {
		case rs.ts != re.ts:
			return shRestartRestamp
		case w.otherInstanceCopy(l, rs.ts, s.decided):
			return shRestartExposure
		case w.readBefore(s.coreName, rs.partition, e.handled):
			return shRestartLate
		}
		return shRestartID
	case w.overtook(l, s) != nil:
		x := w.overtook(l, s)
		switch {
		case x.cn.silent:
			return shSilentCut
		case x.cn.finAt > 0 && x.cn.finAt <= x.delivAt:
			return shAfterFin
		}
		return shOvertook
	case rs.partition != re.partition:
		return shMoved
	case rs.ts != re.ts:
		return shRestamped
	case c.lib.style == resplit:
		return shResplit
	}
	return shIdentical
}

// overtook: when s was decided, the proxy had written a successful answer
// carrying l on a connection whose client never read it, and the core had
// not heard that connection end: to the core the client held it.
func (w *world) overtook(l lid, s *wireReq) *wireReq {
	for _, id := range w.recs[l].sends {
		x := w.reqs[id-1]
		if x == s || x.delivAt == 0 || x.delivAt > s.decided || x.answered != nil {
			continue
		}
		if codeFor(x.written, x, recIn(x, l).partition) == 0 && (x.cn.toldAt == 0 || x.cn.toldAt > s.decided) {
			return x
		}
	}
	return nil
}

// tailFailedBetween: a read of partition p's tail for the core that
// decided s failed after from and before s was decided.
func (w *world) tailFailedBetween(s *wireReq, p int32, from time.Duration) bool {
	for _, f := range w.tailFails {
		if f.core == s.coreName && f.p == p && f.at >= from && f.at <= s.decided {
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
func (w *world) readBeforeAppend(e *wireReq, p int32) bool {
	if !e.lost {
		return false
	}
	for _, f := range w.tailReads {
		if f.core == e.coreName && f.p == p && f.at >= e.lostAt && f.at < e.handled {
			return true
		}
	}
	return false
}

// otherInstanceCopy: another client instance sent a record identical to
// l, with timestamp ts, before t: after a restart the log cannot tell
// their copies apart (docs/legacy.md, "After a restart").
func (w *world) otherInstanceCopy(l lid, ts int64, t time.Duration) bool {
	ri := &w.recs[l]
	for m := range w.recs {
		o := &w.recs[m]
		if o.name != ri.name || o.c.info.sameInstance(ri.c.info) {
			continue
		}
		for _, id := range o.sends {
			x := w.reqs[id-1]
			if x.sentAt <= t && recIn(x, lid(m)).ts == ts {
				return true
			}
		}
	}
	return false
}

// offsetOf is the offset the answer to r gave record l, -1 if none.
func offsetOf(r *wireReq, l lid) int64 {
	for i, b := range r.parts {
		for j, x := range b.recs {
			if x.lid == l && i < len(r.answered) && r.answered[i].offset >= 0 {
				return r.answered[i].offset + int64(j)
			}
		}
	}
	return -1
}

// readBefore: core read partition p's tail before t (its first read,
// whose records a resend after a restart may match).
func (w *world) readBefore(core string, p int32, t time.Duration) bool {
	for _, f := range w.tailReads {
		if f.core == core && f.p == p {
			return f.at < t
		}
	}
	return false
}

// logRead: some core kept the legacy records of a tail it read (after a
// restart, a takeover, or a leader that moved away and back).
func (w *world) logRead() bool { return len(w.restarts)+len(w.handovers)+w.rewarms > 0 }

// handedOver: a node was handed over between e and s.
func (w *world) handedOver(e, s *wireReq) bool {
	for _, at := range w.handovers {
		if at >= e.decided && at <= s.decided {
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
func recIn(r *wireReq, l lid) recAt {
	for _, b := range r.parts {
		for _, x := range b.recs {
			if x.lid == l {
				return recAt{b.partition, x.ts}
			}
		}
	}
	return recAt{-1, 0}
}

// shared: another process is the same client instance as c and ran at
// the same time (runs of a one-shot job that do not overlap are one
// instance on fresh connections, not two processes).
func (w *world) shared(c *client) bool {
	for _, o := range w.clients {
		if o != c && o.info.sameInstance(c.info) && overlap(o, c) {
			return true
		}
	}
	return false
}

func overlap(a, b *client) bool {
	aEnd, bEnd := a.diedAt, b.diedAt
	if aEnd == 0 {
		aEnd = 1 << 62
	}
	if bEnd == 0 {
		bEnd = 1 << 62
	}
	return a.bornAt < bEnd && b.bornAt < aEnd
}

// sameNameTwice: request r carries another record with l's content.
func sameNameTwice(r *wireReq, l lid) bool {
	name, n := "", 0
	for _, b := range r.parts {
		for _, x := range b.recs {
			if x.lid == l {
				name = x.name
			}
		}
	}
	for _, b := range r.parts {
		for _, x := range b.recs {
			if x.name == name {
				n++
			}
		}
	}
	return n > 1
}

// behindMiddlebox: an answer carrying l went to a middlebox that
// acknowledged it and passed nothing on, before s.
func (w *world) behindMiddlebox(l lid, s *wireReq) bool {
	for _, id := range w.recs[l].sends {
		x := w.reqs[id-1]
		if x != s && x.delivAt > 0 && x.delivAt <= s.decided && x.cn.middlebox {
			return true
		}
	}
	return false
}

// identicalBetween: l's instance sent another record with l's content
// between from and to: a client whose identity is content only cannot
// have them told apart.
func (w *world) identicalBetween(l lid, from, to time.Duration) bool {
	ri := &w.recs[l]
	for m := range w.recs {
		o := &w.recs[m]
		if lid(m) == l || o.name != ri.name || !o.c.info.sameInstance(ri.c.info) {
			continue
		}
		for _, id := range o.sends {
			if at := w.reqs[id-1].sentAt; at >= from && at < to {
				return true
			}
		}
	}
	return false
}

// ackedBefore: an answer its client read before sending s said l was
// written.
func (w *world) ackedBefore(l lid, s *wireReq) bool {
	for _, id := range w.recs[l].sends {
		x := w.reqs[id-1]
		if x != s && x.sentAt < s.sentAt && x.answered != nil && codeFor(x.answered, x, recIn(x, l).partition) == 0 {
			return true
		}
	}
	return false
}

// epochIn is the producer epoch of the batch of r that carries l.
func epochIn(r *wireReq, l lid) int16 {
	for _, b := range r.parts {
		for _, x := range b.recs {
			if x.lid == l {
				return b.epoch
			}
		}
	}
	return -2
}

// codeFor is the error code of partition p in answer a to r, -1 if none.
func codeFor(a []partResult, r *wireReq, p int32) int16 {
	for i, b := range r.parts {
		if b.partition == p && i < len(a) {
			return a[i].code
		}
	}
	return -1
}

// dropShape says why record l, acknowledged, is not in the log.
func (w *world) dropShape(l lid) (shape, string) {
	ri := &w.recs[l]
	c := ri.c
	r := w.reqs[ri.sends[len(ri.sends)-1]-1]
	ts := recIn(r, l).ts
	restamps := c.contentOnly()
	last := w.reqs[ri.sends[len(ri.sends)-1]-1].decided
	var sameInst, sameExact, otherProc, otherAnon, otherInst bool
	for m := range w.recs {
		o := &w.recs[m]
		if lid(m) == l || o.name != ri.name {
			continue
		}
		for _, id := range o.sends {
			x := w.reqs[id-1]
			if x.sentAt > last {
				break
			}
			ots := recIn(x, lid(m)).ts
			if o.c.info.sameInstance(c.info) {
				sameInst = true
				sameExact = sameExact || ots == ts
				otherProc = otherProc || o.c != c && overlap(o.c, c)
			} else if ots == ts {
				otherInst = true
				otherAnon = otherAnon || o.c.info.principal == 0
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
	unknown := slices.ContainsFunc(ri.sends, func(id int) bool {
		x := w.reqs[id-1]
		return x.lost || codeFor(x.answered, x, recIn(x, l).partition) == kerr.RequestTimedOut.Code
	})
	// The answer that made its client take it as written: whose record is
	// at the offset it names?
	for i := len(ri.sends) - 1; i >= 0; i-- {
		x := w.reqs[ri.sends[i]-1]
		at := recIn(x, l)
		if x.answered == nil || codeFor(x.answered, x, at.partition) != 0 {
			continue
		}
		off := offsetOf(x, l)
		if off < 0 {
			break
		}
		got, ok := w.broker.at(at.partition, off)
		if !ok || w.recs[got.lid].c.info.sameInstance(c.info) {
			break
		}
		switch {
		case unknown:
			return shDropUnknownOther, fmt.Sprintf("req %d was answered offset %d, %s's record", x.id, off, w.recs[got.lid].c.name)
		case w.logRead():
			return shDropRestart, "another producer's identical record was in the log read after a restart or a takeover"
		}
		return shDropOther, fmt.Sprintf("req %d was answered offset %d, %s's record", x.id, off, w.recs[got.lid].c.name)
	}
	if unknown && otherInst {
		return shDropUnknownOther, "an unknown outcome of it, and another instance's identical record and timestamp"
	}
	if otherAnon && w.logRead() {
		return shDropRestart, "another producer's identical record was in the log read after a restart or a takeover"
	}
	return shDropOther, fmt.Sprintf("last sent in req %d (%s)", r.id, r.cn.describe())
}

// checkOffsets: every offset a client was answered holds its record
// (invariant 5): the record itself, or one the rule cannot tell from it (a
// restamped retry is answered with its original's offset). An offset
// holding the same content from another client instance, or with another
// timestamp where timestamps count, is counted under its shape.
func (w *world) checkOffsets(res *result) {
	for _, r := range w.reqs {
		for i, b := range r.parts {
			if i >= len(r.answered) {
				break
			}
			a := r.answered[i]
			if a.code != 0 || a.offset < 0 {
				continue
			}
			for j, x := range b.recs {
				got, ok := w.broker.at(b.partition, a.offset+int64(j))
				switch {
				case !ok || got.name != x.name:
					res.failf("req %d p%d answered offset %d, but offset %d holds %q, not %q", r.id, b.partition, a.offset, a.offset+int64(j), got.name, x.name)
				case !w.sameClass(got.lid, x.lid):
					res.counts[shWrongOffset.name]++
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
func (w *world) sameClass(a, b lid) bool {
	ra, rb := &w.recs[a], &w.recs[b]
	if !ra.c.info.sameInstance(rb.c.info) || ra.name != rb.name {
		return false
	}
	return ra.c.contentOnly() || w.firstTS(a) == w.firstTS(b)
}

func (w *world) firstTS(l lid) int64 { return recIn(w.reqs[w.recs[l].sends[0]-1], l).ts }

// report is a failing run's account.
func (res *result) report() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "seed %d: %d records, %d requests; faults:\n", res.seed, res.records, res.requests)
	for _, f := range res.faults {
		fmt.Fprintf(&sb, "  - %s\n", f)
	}
	for _, f := range res.failures {
		fmt.Fprintf(&sb, "  FAIL %s\n", f)
	}
	return sb.String()
}

// table sums per shape over runs.
type table struct {
	runs           int
	records        int
	counts, resent map[string]int
	seeds          map[string][]uint64 // the first seeds of each shape's counts
}

func (t *table) add(res *result) {
	if t.counts == nil {
		t.counts, t.resent, t.seeds = map[string]int{}, map[string]int{}, map[string][]uint64{}
	}
	t.runs++
	t.records += res.records
	for k, v := range res.counts {
		t.counts[k] += v
		if len(t.seeds[k]) < 5 {
			t.seeds[k] = append(t.seeds[k], res.seed)
		}
	}
	for k, v := range res.resent {
		t.resent[k] += v
	}
}

func (t *table) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d runs, %d records\n", t.runs, t.records)
	for _, s := range allShapes {
		kind := "written twice"
		switch {
		case s.drop:
			kind = "dropped"
		case s.fwd:
			kind = "forwarded"
		}
		cov := "miss"
		if s.covered {
			cov = "covered"
		}
		fmt.Fprintf(&sb, "  %-95s %-7s resent %6d, %s %5d  seeds %v\n", s.name, cov, t.resent[s.name], kind, t.counts[s.name], t.seeds[s.name])
	}
	return sb.String()
}
