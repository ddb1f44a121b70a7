package decide

import (
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/dedupproxy/dedupproxy/decide/internal/lockcheck"
	"github.com/dedupproxy/dedupproxy/decide/sent"
	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// Outcome applies the broker's answer to what pl sent upstream: body is
// the Produce response body after its header, sc the caller's reusable
// scanner. Appended batches are committed with their offsets, the others
// aborted; a part the answer does not mention is handled as Lost. It
// appends to wake the connections whose waiting requests may now be
// decided.
func (c *Core) outcome(pl *Plan, sc *protocol.ProduceResponseScanner, body []byte, now time.Time, wake []ConnID) ([]ConnID, error) {
	if pl.settled {
		return wake, nil
	}
	if err := sc.Reset(body, pl.version); err != nil {
		return c.lost(pl, now, wake), err
	}
	if cap(pl.done) < len(pl.Parts) {
		pl.done = make([]bool, len(pl.Parts))
	}
	done := pl.done[:len(pl.Parts)]
	clear(done)
	anyError := false
	cursor := 0
	pl.seqOuts = pl.seqOuts[:0]
	for sc.Next() {
		pr := sc.Partition()
		topic, ok := c.lookupTopic(pl.version, pr.Topic, pr.TopicID)
		if !ok {
			continue
		}
		i := pl.find(topic, pr.Partition, &cursor, done)
		if i < 0 {
			continue
		}
		done[i] = true
		anyError = anyError || pr.ErrorCode != 0
		c.outcomePart(pl, i, pr, now)
	}
	err := sc.Err()
	c.settleIdempotent(pl, now)
	if anyError {
		// A client that gets an error for one partition of a request may
		// resend all of it (kafkajs does): the appended batches of the
		// request are ones whose acknowledgement it may not hold.
		c.disownAppended(pl)
	}
	for i := range pl.Parts {
		if !done[i] && pl.Parts[i].Act != Answer {
			c.lostPart(pl, i, now)
		}
	}
	pl.settled = true
	return c.wakeUpstream(pl, wake), err
}

// wakeUpstream signals an event on every partition pl sent upstream, and
// names the waiters of the legacy batches it settled (pl.woken),
// once the state their waiters look at is settled: a waiter that
// registered after the signal found that state settled already.
func (c *Core) wakeUpstream(pl *Plan, wake []ConnID) []ConnID {
	wake = append(wake, pl.woken...)
	pl.woken = pl.woken[:0]
	for i := range pl.Parts {
		if pl.Parts[i].Act != Answer {
			st := &pl.st[i]
			wake = c.wakePartition(partKeyOf(st.key.Topic, st.key.Partition), wake)
		}
	}
	return wake
}

// appendedCode reports whether an error code means the broker appended the
// batch: Kafka counts REQUEST_TIMED_OUT and NOT_ENOUGH_REPLICAS_AFTER_APPEND
// as appended (docs/kafka-rules.md §2.1 row 16).
func appendedCode(code int16) bool {
	return code == 0 || code == kerr.RequestTimedOut.Code || code == kerr.NotEnoughReplicasAfterAppend.Code
}

func (c *Core) outcomePart(pl *Plan, i int, pr *protocol.ProduceResponsePartition, now time.Time) {
	st, pp := &pl.st[i], &pl.Parts[i]
	k := partKeyOf(st.key.Topic, st.key.Partition)
	appended := appendedCode(pr.ErrorCode)
	// Only an acks=all append is durable, so only its offset is kept: a
	// later retry of an acks=1 one goes to the broker.
	off := pr.BaseOffset
	if pr.ErrorCode != 0 || pl.acks != -1 {
		off = -1
	}
	switch {
	case st.pass >= 0:
	case !st.legacy:
		// A batch forwarded without a registration and not appended has
		// nothing of its own to abort, and an abort would take another
		// copy's registration of the same sequences.
		if st.pending || st.commit && appended {
			ts := pr.LogAppendTime
			if ts < 0 {
				ts = st.maxTS
			}
			pl.seqOuts = append(pl.seqOuts, seqstate.Outcome{Key: st.key, Batch: st.batch, Appended: appended, BaseOffset: off, MaxTimestamp: ts})
		}
		if appended && pl.acks == -1 {
			c.commitKeys(pl, i, off, now)
		}
	default:
		c.outcomeLegacy(pl, i, pr, appended, now)
		if appended && pl.acks == -1 {
			c.commitKeys(pl, i, off, now)
		}
		if pp.Act == Rebuild {
			pp.Local = c.rebuiltAnswer(pl, i, pr, appended)
		}
	}
	if pr.LogStartOffset >= 0 || pr.ErrorCode == 0 && pr.BaseOffset >= 0 {
		p, sh := c.parts.get(k)
		if pr.LogStartOffset >= 0 {
			p.logStart = pr.LogStartOffset
		}
		if pr.ErrorCode == 0 {
			p.seen = max(p.seen, pr.BaseOffset)
		}
		sh.unlock()
	}
}

// rebuiltAnswer is the answer to a part the proxy forwarded without the
// records it repeats: the broker's error if it appended nothing, else
// error 0 and the one base offset true for all its records, or -1, never a
// wrong one. REQUEST_TIMED_OUT and NOT_ENOUGH_REPLICAS_AFTER_APPEND mean
// appended; their answer carries no offset.
func (c *Core) rebuiltAnswer(pl *Plan, i int, pr *protocol.ProduceResponsePartition, appended bool) protocol.LocalPartitionResult {
	if !appended {
		return protocol.LocalPartitionResult{ErrorCode: pr.ErrorCode, BaseOffset: -1, LogAppendTime: -1, LogStartOffset: pr.LogStartOffset}
	}
	st := &pl.st[i]
	drops, ms := pl.drops[st.idsAt:st.idsEnd], pl.matches[st.idsAt:st.idsEnd]
	base := int64(-1)
	if pr.ErrorCode == 0 {
		k := int64(0)
		offs := func(j int) int64 {
			if drops[j] {
				return ms[j].off
			}
			o := pr.BaseOffset + k
			k++
			return o
		}
		base = baseOf(offs, len(drops))
	}
	return protocol.LocalPartitionResult{BaseOffset: base, LogAppendTime: pr.LogAppendTime, LogStartOffset: pr.LogStartOffset}
}

// outcomeLegacy settles the records part i sent upstream, under their
// instance's lock, and names the batch's waiters to wake (pl.woken); a batch
// whose offsets only the log can tell is then filed with its partition.
func (c *Core) outcomeLegacy(pl *Plan, i int, pr *protocol.ProduceResponsePartition, written bool, now time.Time) {
	st := &pl.st[i]
	b := st.b.B
	if b == nil {
		return
	}
	in := pl.conn.Inst
	in.Lock()
	if !st.b.Live() || b.Phase != sent.InFlight {
		in.Unlock()
		return
	}
	c.settleOutcome(pl, st, b, pr, written, now.UnixNano())
	pl.woken = b.Woken(pl.woken)
	ref, resolving := b.Ref(), b.Phase == sent.Resolving
	in.Unlock()
	if resolving {
		c.listUnknown(ref, now.UnixNano())
	}
}

// settleOutcome is outcomeLegacy's settling, with b's instance locked.
func (c *Core) settleOutcome(pl *Plan, st *partState, b *sent.Batch, pr *protocol.ProduceResponsePartition, written bool, ns int64) {
	if !written {
		// Not written: nothing of it is in the log. (The records the
		// proxy matched, in st.m, were appended long ago; the client, told
		// of the error, will send them again, and they are matchable.)
		for j := range b.Recs {
			b.Recs[j].Hash = 0
		}
		b.Phase, b.Until, b.Answer = sent.Appended, ns, sent.Answered
		b.Inst.DropUndelivered(b)
		if m := st.m.B; st.m.Live() {
			m.Inst.Disown(m)
			m.Conn = nil
		}
		return
	}
	base := pr.BaseOffset
	if pr.ErrorCode != 0 {
		base = -1
	}
	for j := range b.Recs {
		if base >= 0 {
			b.Recs[j].Off = base + int64(j)
		} else {
			b.Recs[j].Off = sent.OffUnknown
		}
	}
	b.Phase = sent.Appended
	b.AppendTime = pr.LogAppendTime
	b.Until = ns + c.legacy.Window
	if pr.ErrorCode != 0 {
		// Appended, but answered with an error: the client holds no
		// acknowledgement, and the log has the offsets.
		b.Phase = sent.Resolving
		b.Inst.Disown(b)
	} else if b.Conn == nil || !b.Conn.Open {
		b.Inst.Disown(b)
	}
}

// listUnknown files batch ref with its partition, whose next tail read
// settles it; call with no lock held. Past maxUnknown, it is settled at
// once as if the read had not found it: a retry of it is forwarded, at
// worst a duplicate, as without the proxy. (A read that ends between the
// batch's change and this finds it unlisted: a retry waiting on it asks
// for another.)
func (c *Core) listUnknown(ref sent.Ref, ns int64) {
	p, sh := c.parts.get(partKeyOf(ref.B.Topic, ref.B.Partition))
	full := len(p.unknown) >= maxUnknown
	if !full {
		p.unknown = append(p.unknown, ref)
	}
	sh.unlock()
	if full {
		c.settleFromLog(ref, nil, false, ns)
	}
}

// maxUnknown bounds the batches a partition's next read must settle.
const maxUnknown = 1024

// disownAppended disowns every appended legacy batch of pl.
func (c *Core) disownAppended(pl *Plan) {
	if pl.conn == nil {
		return
	}
	in := pl.conn.Inst
	in.Lock()
	defer in.Unlock()
	for i := range pl.st {
		st := &pl.st[i]
		for _, r := range [2]sent.Ref{st.m, st.b} {
			if st.legacy && r.Live() && r.B.InLog() {
				r.B.Inst.Disown(r.B)
				r.B.Conn = nil
			}
		}
	}
}

// settleIdempotent applies pl.seqOuts to the table.
func (c *Core) settleIdempotent(pl *Plan, now time.Time) {
	if len(pl.seqOuts) > 0 {
		c.settleTable(pl, pl.seqOuts, now)
		pl.seqOuts = pl.seqOuts[:0]
	}
	if c.flying.Load() > 0 {
		c.landFlown(pl, now)
	}
	for i := range pl.st {
		pl.st[i].pending, pl.st[i].commit = false, false
	}
}

// Lost settles pl when the broker's answer will never come (the broker
// connection broke, or was never written to): idempotent batches are
// aborted, and legacy ones become unknown — the partition's log will tell
// whether they were appended (docs/warm.md, "Unknown outcomes").
func (c *Core) lost(pl *Plan, now time.Time, wake []ConnID) []ConnID {
	if pl.settled || pl.Status != Ready {
		return wake
	}
	pl.seqOuts = pl.seqOuts[:0]
	for i := range pl.Parts {
		if pl.Parts[i].Act != Answer {
			c.lostPart(pl, i, now)
		}
	}
	c.settleIdempotent(pl, now)
	pl.settled = true
	return c.wakeUpstream(pl, wake)
}

// Unsent settles pl when its request was never forwarded (its client
// left while it waited): nothing of it is in the log. Its idempotent
// batches are aborted and its legacy ones settled as not written, so
// that nothing waits on them.
func (c *Core) unsent(pl *Plan, now time.Time, wake []ConnID) []ConnID {
	if pl.settled || pl.Status != Ready {
		return wake
	}
	pl.seqOuts = pl.seqOuts[:0]
	for i := range pl.Parts {
		st := &pl.st[i]
		switch {
		case pl.Parts[i].Act == Answer || st.pass >= 0:
		case !st.legacy:
			if st.pending {
				pl.seqOuts = append(pl.seqOuts, seqstate.Outcome{Key: st.key, Batch: st.batch})
			}
		default:
			c.outcomeLegacy(pl, i, nil, false, now)
		}
	}
	c.settleIdempotent(pl, now)
	pl.settled = true
	return c.wakeUpstream(pl, wake)
}

func (c *Core) lostPart(pl *Plan, i int, now time.Time) {
	st := &pl.st[i]
	if st.pass >= 0 {
		return
	}
	if !st.legacy {
		if st.pending {
			pl.seqOuts = append(pl.seqOuts, seqstate.Outcome{Key: st.key, Batch: st.batch})
		}
	} else if b := st.b.B; b != nil {
		in := pl.conn.Inst
		in.Lock()
		if !st.b.Live() || b.Phase != sent.InFlight {
			in.Unlock()
			return
		}
		b.Phase = sent.Unknown
		b.Inst.Disown(b)
		pl.woken = b.Woken(pl.woken)
		ref := b.Ref()
		in.Unlock()
		c.listUnknown(ref, now.UnixNano())
	}
}

// Delivered records whether pl's answer goes to its client's socket (ok)
// or not. The session calls it just before the write: a client may read
// the answer and act on it before the writer runs again, and a write that
// fails then disconnects, which undoes ok. Batches whose answer does not
// go out, or whose connection has closed,
// are ones their client may not hold the acknowledgement of; the records a
// retry repeated, answered here, are this connection's from now on.
func (c *Core) delivered(pl *Plan, ok bool, now time.Time) {
	conn := pl.conn
	if conn == nil || pl.Status != Ready {
		return
	}
	any := false
	for i := range pl.st {
		if st := &pl.st[i]; st.legacy && (st.b.B != nil || st.m.B != nil) {
			any = true
			break
		}
	}
	if !any {
		return
	}
	in := conn.Inst
	in.Lock()
	defer in.Unlock()
	ns := now.UnixNano()
	hold := ns + int64(min(max(pl.timeout, 0), maxWaitTimeout)+waitMargin)
	late := lateAnswer(pl, now)
	for i := range pl.st {
		st := &pl.st[i]
		if !st.legacy {
			continue
		}
		for _, r := range [2]sent.Ref{st.m, st.b} {
			b := r.B
			if !r.Live() {
				continue
			}
			in.Deliver(b, late, hold)
			switch {
			case !ok || !conn.Open:
				in.Disown(b)
				b.Conn = nil
			case b == st.m.B && b.Conn == conn:
				in.Undisown(b)
			}
		}
	}
	if conn.Open {
		conn.Trim(sent.KeepRequests, &c.legacy, ns, false)
	}
	in.Sweep(ns, c.legacy.Window)
}

// lateAnswer reports whether pl's answer, delivered at now, comes later
// than half its request's timeout after the request arrived. A client may
// have given up on the request by then — librdkafka reads an answer that
// comes after it timed the request out, discards it and sends the records
// again — so even a clean close does not show that the client took it
// (docs/legacy.md, "The rule", 1). Half: the client started its clock
// before the proxy read the request, and the answer takes time to reach
// it.
func lateAnswer(pl *Plan, now time.Time) bool {
	return now.Sub(pl.arrived) > pl.timeout/2
}

// commitKeys remembers the idempotency keys of part i's records the broker
// appended at base (-1 if unknown); dropped records are skipped, so the
// others are numbered as in the batch that went upstream.
func (c *Core) commitKeys(pl *Plan, i int, base int64, now time.Time) {
	st := &pl.st[i]
	if c.keys == nil || st.keysEnd == st.keysAt {
		return
	}
	delta := int64(0)
	for j := st.keysAt; j < st.keysEnd; j++ {
		if st.legacy && pl.drops[st.idsAt+j-st.keysAt] {
			continue
		}
		if k := pl.keys[j]; k.Present {
			off := int64(-1)
			if base >= 0 {
				off = base + delta
			}
			lo, hi := keyOf(k, st.key)
			lockcheck.Take("key table")
			c.keys.Commit(lo, hi, off, now)
			lockcheck.Drop()
		}
		delta++
	}
}

// lookupTopic returns the table's key for a topic named in a Produce
// request or response: by ID from v13 (KIP-516), by name before.
func (c *Core) lookupTopic(version int16, name []byte, id [16]byte) (seqstate.TopicID, bool) {
	if version >= 13 {
		return c.table.LookupTopicID(id)
	}
	return c.table.LookupTopic(name)
}

// find returns the index of the part of topic/partition not yet settled
// that went upstream, searching from *cursor (brokers answer in request
// order in practice; Kafka does not promise it), or -1.
func (pl *Plan) find(topic seqstate.TopicID, partition int32, cursor *int, done []bool) int {
	n := len(pl.st)
	for k := 0; k < n; k++ {
		j := (*cursor + k) % n
		st := &pl.st[j]
		if !done[j] && pl.Parts[j].Act != Answer && st.key.Topic == topic && st.key.Partition == partition {
			*cursor = j + 1
			return j
		}
	}
	return -1
}
