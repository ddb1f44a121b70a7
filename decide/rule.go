package decide

import (
	"slices"
	"time"

	"github.com/dedupproxy/dedupproxy/decide/internal/lockcheck"
	"github.com/dedupproxy/dedupproxy/decide/sent"
	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// identify computes the identities of the records of every legacy part of
// req, before any lock is taken: what a client sent costs its own time,
// not that of a lock another connection may wait on.
func (c *Core) identify(req *Request, pl *Plan) {
	for i := range req.Parts {
		p, st, pp := &req.Parts[i], &pl.st[i], &pl.Parts[i]
		if !st.legacy || st.pass >= 0 {
			continue
		}
		st.idsAt = len(pl.ids)
		var err error
		if pl.ids, err = protocol.AppendRecordIDs(pl.ids, p.Records, &p.Header); err != nil {
			if err != protocol.ErrCompressed {
				// Malformed: the broker rejects it; nothing to remember.
				pl.ids = pl.ids[:st.idsAt]
				st.pass = PassInvalid
				pp.Verdict.Pass = PassInvalid
				continue
			}
			// A compressed batch is one unit: matched whole or not at all.
			pl.ids = append(pl.ids[:st.idsAt], protocol.BatchID(p.Records, &p.Header))
		}
		st.idsEnd = len(pl.ids)
		for range st.idsEnd - st.idsAt {
			pl.matches = append(pl.matches, match{})
			pl.drops = append(pl.drops, false)
		}
	}
}

// matchLegacy applies the rule (docs/legacy.md, "The rule") to every
// legacy part of req, with the instance locked: for each record, what of
// its instance's it repeats, if anything. Records it takes as retries are
// used up at once (each earlier record answers for one retry); rollback
// restores them when the request ends up waiting. A part whose partition
// has records read back from its log gets its verdict once matchLogs has
// looked there too.
func (c *Core) matchLegacy(req *Request, pl *Plan, now time.Time) {
	conn, in := req.Conn, req.Conn.Inst
	ns := now.UnixNano()
	for i := range req.Parts {
		p, st := &req.Parts[i], &pl.st[i]
		if !st.legacy || st.pass >= 0 {
			continue
		}
		st.key = seqstate.Key{ProducerID: -1, Topic: p.Topic, Partition: p.Partition, Principal: conn.Principal}
		ids := pl.ids[st.idsAt:st.idsEnd]
		ms := pl.matches[st.idsAt:st.idsEnd]
		if !in.AnyDisowned() && !st.logged && !in.AnyOtherUndelivered(conn, p.Topic, p.Partition) {
			continue // nothing this batch could repeat: the common case
		}
		var prev sent.Candidate
		for j, id := range ids {
			cand, ok := c.findCandidate(pl, conn, in, p, prev, recHash(id, st.exact), ns)
			if ok {
				ms[j] = c.classify(pl, conn, in, p, st, cand, ns)
				if ms[j].kind == matchDrop {
					prev = cand
				} else {
					prev = sent.Candidate{}
				}
				continue
			}
			prev = sent.Candidate{}
		}
		if !st.logged {
			c.verdictLegacy(pl, i, ms, st.mode)
		}
	}
}

// anyUnlockedWork reports whether a legacy part of pl is still to be
// matched with its instance let go: against its partition's log, or
// against the idempotency keys.
func (c *Core) anyUnlockedWork(pl *Plan) bool {
	for i := range pl.st {
		st := &pl.st[i]
		if st.legacy && st.pass < 0 && (st.logged || st.header != "" && c.keys != nil) {
			return true
		}
	}
	return false
}

// matchLogs matches the records of each part whose partition has records
// read back from its log that repeat nothing of their instance's, under
// the partition's lock alone, and sets those parts' verdicts.
func (c *Core) matchLogs(req *Request, pl *Plan, now time.Time) {
	ns := now.UnixNano()
	for i := range req.Parts {
		p, st := &req.Parts[i], &pl.st[i]
		if !st.legacy || st.pass >= 0 || !st.logged {
			continue
		}
		ids, ms := pl.ids[st.idsAt:st.idsEnd], pl.matches[st.idsAt:st.idsEnd]
		part, sh := c.parts.get(partKeyOf(p.Topic, p.Partition))
		for j := range ms {
			if ms[j].kind == matchNone {
				ms[j] = c.matchLog(part, ids[j], st.mode == Enforce, ns)
			}
		}
		sh.unlock()
		c.verdictLegacy(pl, i, ms, st.mode)
	}
}

// recHash is the hash a record is compared by: with exact, its timestamp
// is part of it.
func recHash(id protocol.RecordID, exact bool) uint64 {
	if exact {
		return mixTS(id.Hash, id.Timestamp)
	}
	return id.Hash
}

// exactIdentity reports whether a legacy record's timestamp is part of its
// identity, for a batch with header h sent on conn (docs/legacy.md, "What
// a record is"): with match auto, for every client but one that stamps a
// resend anew.
func exactIdentity(m Match, conn *Conn, h *protocol.BatchHeader) bool {
	switch m {
	case MatchExact:
		return true
	case MatchRecords, MatchOff:
		return false
	}
	return !restamps(conn, h)
}

// restamps reports whether a legacy batch comes from a client known to
// stamp a resent record anew (docs/clients.md §3), by what it says or
// writes on the wire: sarama names itself in ApiVersions and stamps a
// record that has no timestamp of its own each time it adds it to a
// batch, a retry included; kafkajs writes producer epoch 0 into a batch
// without a producer id, where every other client writes -1; kafka-go
// names no software in ApiVersions and writes partition leader epoch -1,
// which no other client that names none writes. Any other client is taken
// to keep its timestamps: a resend that restamps is then missed (a
// duplicate), never a new record dropped.
func restamps(conn *Conn, h *protocol.BatchHeader) bool {
	switch {
	case h.ProducerEpoch == 0:
		return true
	case conn == nil:
		return false
	case conn.Restamps:
		return true
	}
	return !conn.Named && h.PartitionLeaderEpoch == -1
}

// restampingSoftware are the client software names (ApiVersions v3+) of
// clients known to stamp a resent record anew.
var restampingSoftware = map[string]bool{"sarama": true}

// mixTS mixes a timestamp into a record hash. Never 0.
func mixTS(h uint64, ts int64) uint64 {
	x := (h ^ uint64(ts)*0x9e3779b97f4a7c15) * 0xbf58476d1ce4e5b9
	x ^= x >> 31
	return x | 1
}

// findCandidate returns the earlier record a record with id may repeat:
// the next record of the batch the previous record matched (a retry keeps
// its records' order), a disowned record of the topic, or a record of a
// batch to the same partition not yet answered to another connection.
func (c *Core) findCandidate(pl *Plan, conn *Conn, in *sent.Instance, p *Part, prev sent.Candidate, h uint64, now int64) (sent.Candidate, bool) {
	if b := prev.B; b != nil && b.Conn == nil && int(prev.I)+1 < len(b.Recs) && b.Recs[prev.I+1].Hash == h {
		return sent.Candidate{B: b, I: prev.I + 1}, true
	}
	if cand, ok := in.Lookup(p.Topic, h, now, &pl.undo); ok {
		return cand, true
	}
	return in.SameParts(conn, p.Topic, p.Partition, h, now, &pl.undo)
}

// classify decides one record against the earlier record cand it repeats.
func (c *Core) classify(pl *Plan, conn *Conn, in *sent.Instance, p *Part, st *partState, cand sent.Candidate, ns int64) match {
	b := cand.B
	if old := b.Conn; old != nil && old != conn && st.mode == Enforce {
		// Not yet answered to another connection, to this very
		// partition: its client gave up on that connection (a client
		// gives up on a connection as a whole: librdkafka "22 request(s)
		// timed out: disconnect") and resends here, perhaps before the
		// proxy sees the old one close. Every answer not yet written
		// there may never be read.
		old.Abandon(in)
	}
	r := &b.Recs[cand.I]
	enforce := st.mode == Enforce
	switch {
	case b.Phase == sent.InFlight:
		if enforce {
			// Waited for under the instance's lock, which its outcome
			// is settled under (sent.Batch.Await).
			pl.waitFor = append(pl.waitFor, b)
		}
		return match{kind: matchWait, rule: RuleInFlight}
	case b.Phase == sent.Unknown || (r.Off == sent.OffUnknown && b.Phase == sent.Resolving):
		if enforce {
			pl.tailWant = appendKey(pl.tailWant, partKeyOf(b.Topic, b.Partition))
		}
		return match{kind: matchTail, rule: RuleRetry}
	}
	m := match{kind: matchDrop, off: r.Off, rule: RuleRetry, at: b.AppendTime, age: ns - (b.Until - c.legacy.Window)}
	if b.Partition != p.Partition {
		// Moved to another partition (kafkajs partitions keyless
		// records afresh on each attempt): the records are in the
		// original's partition, and no offset of this one is true.
		m.off, m.at = sent.OffUnknown, -1
	}
	if enforce {
		cand.UseUp(&pl.undo)
	}
	return m
}

func appendKey(keys []seqstate.Key, k seqstate.Key) []seqstate.Key {
	for _, x := range keys {
		if x == k {
			return keys
		}
	}
	return append(keys, k)
}

// askTails asks for a read of each partition whose log settles a batch a
// record repeats, or waits for the read under way: each partition's lock
// taken alone, after the instance's was let go. (A read that ended
// meanwhile settled the batch: it is read again, at worst once too often.)
func (c *Core) askTails(pl *Plan) {
	for _, k := range pl.tailWant {
		p, sh := c.parts.get(k)
		switch {
		case p.warm == reading:
			// Registered under the partition's lock: the read cannot end
			// unseen between here and the wait.
			p.await(pl.conn.ID())
			pl.waitOn = appendKey(pl.waitOn, k)
		case !slices.Contains(pl.Tails, TailKey{k.Topic, k.Partition}):
			p.warm = reading
			pl.Tails = append(pl.Tails, TailKey{k.Topic, k.Partition})
		}
		sh.unlock()
	}
}

// rollback restores the records a decision that ends in a wait used up.
func (c *Core) rollback(pl *Plan) {
	// In reverse (sent.Undo).
	for k := len(pl.undo) - 1; k >= 0; k-- {
		pl.undo[k].Restore()
	}
	pl.undo = pl.undo[:0]
}

// unmatch makes part i new data again (its records are not dropped).
func (c *Core) unmatch(pl *Plan, i int) {
	st := &pl.st[i]
	for j := st.idsAt; j < st.idsEnd; j++ {
		pl.drops[j] = false
		pl.matches[j] = match{}
	}
	pl.Parts[i].Verdict.Dropped = 0
}

// verdictLegacy sets part i's act from its records' matches.
func (c *Core) verdictLegacy(pl *Plan, i int, ms []match, mode Mode) {
	pp, st := &pl.Parts[i], &pl.st[i]
	dropped := 0
	for j, m := range ms {
		switch m.kind {
		case matchDrop:
			dropped++
			pl.drops[st.idsAt+j] = true
			if pp.Verdict.Rule == RuleNone || pp.Verdict.Rule == RuleRetry {
				pp.Verdict.Rule = m.rule
			}
			if pp.Verdict.Original < 0 && m.off >= 0 {
				pp.Verdict.Original = m.off
				pp.Verdict.Age = time.Duration(m.age)
			}
		case matchWait, matchTail:
			pp.Verdict.Rule = m.rule
			pp.Verdict.Waited = true
		}
	}
	st.dropped = int32(dropped)
	pp.Verdict.Dropped = int32(dropped)
	if dropped > 0 && len(ms) == 1 {
		pp.Verdict.Dropped = pp.Verdict.Records // a compressed batch is one unit
	}
	switch {
	case dropped == 0:
		pp.Verdict.Would = Forward
	case dropped == len(ms):
		pp.Verdict.Would = Answer
	default:
		pp.Verdict.Would = Rebuild
	}
	if mode != Enforce {
		// Observe: nothing is used up or waited for; the verdict says
		// what enforce would have done.
		for j := range ms {
			pl.drops[st.idsAt+j] = false
		}
		return
	}
	pp.Act = pp.Verdict.Would
}

// matchLog matches a record against the records read back from its
// partition's log after a restart (docs/legacy.md, "After a restart"): the
// same key, value, headers and timestamp, sent by ANONYMOUS (the only
// principal a log can vouch for). Call with part's shard locked. Nothing
// it takes is given back: no decision waits after it.
func (c *Core) matchLog(part *partition, id protocol.RecordID, enforce bool, ns int64) match {
	h := mixTS(id.Hash, id.Timestamp)
	if id.Hash == 0 {
		return match{}
	}
	for j := part.logIdx[h]; j != 0; {
		r := &part.log[j-1]
		j = r.next
		if r.hash != h || r.taken || r.until <= ns {
			// Never matches again: the chain starts past it, so that
			// identical records cost O(1) each.
			part.logIdx[h] = j
			continue
		}
		if enforce {
			r.taken = true
		}
		return match{kind: matchDrop, off: r.off, rule: RuleLog, at: -1, age: ns - (r.until - c.legacy.Window)}
	}
	return match{}
}

// keysLegacy drops the records of legacy parts whose idempotency key was
// written before (docs/legacy.md, "Idempotency keys"), from records not
// already dropped as retries.
func (c *Core) keysLegacy(req *Request, pl *Plan, now time.Time) {
	if c.keys == nil {
		return
	}
	for i := range req.Parts {
		p, st, pp := &req.Parts[i], &pl.st[i], &pl.Parts[i]
		if !st.legacy || st.pass >= 0 || st.header == "" || pp.Act == Answer {
			continue
		}
		start := len(pl.keys)
		keys, err := protocol.RecordKeys(pl.keys, p.Records, &p.Header, st.header)
		if err != nil {
			pp.Verdict.Pass = PassKeysCompressed
			continue
		}
		pl.keys = keys
		st.keysAt, st.keysEnd = start, len(keys)
		ms := pl.matches[st.idsAt:st.idsEnd]
		known := 0
		for j := range ms {
			k := keys[start+j]
			if ms[j].kind == matchDrop || !k.Present {
				continue
			}
			lo, hi := keyOf(k, st.key)
			lockcheck.Take("key table")
			off, ok := c.keys.Lookup(lo, hi, now)
			lockcheck.Drop()
			if !ok {
				continue
			}
			known++
			if st.mode == Enforce {
				ms[j] = match{kind: matchDrop, off: off, rule: RuleKey, at: -1}
			}
		}
		if known == 0 {
			continue
		}
		if st.mode != Enforce {
			pp.Verdict.Rule, pp.Verdict.Dropped = RuleKey, pp.Verdict.Dropped+int32(known)
			continue
		}
		rule := pp.Verdict.Rule
		c.verdictLegacy(pl, i, ms, st.mode)
		if rule == RuleNone {
			pp.Verdict.Rule = RuleKey
		}
	}
}

// registerLegacy remembers the legacy batches of a decided request, each
// acks=all batch on its connection in up to two parts: the records it
// repeats, with their original offsets, and the records it sends upstream,
// pending. Until its answer is written, the first part stays matchable from
// any connection of the instance, this one included: a client that sent a
// retry and, before reading its answer, resends the same records cut at
// other boundaries (librdkafka pipelines both on its new connection) is
// still resending.
func (c *Core) registerLegacy(req *Request, pl *Plan, now time.Time) {
	conn, in := req.Conn, req.Conn.Inst
	ns := now.UnixNano()
	registered := false
	for i := range req.Parts {
		p, st, pp := &req.Parts[i], &pl.st[i], &pl.Parts[i]
		if !st.legacy || st.pass >= 0 {
			continue
		}
		ids, ms := pl.ids[st.idsAt:st.idsEnd], pl.matches[st.idsAt:st.idsEnd]
		if pp.Act == Answer {
			pp.Local = c.answerOf(ms, st.logStart)
		}
		if req.Acks != -1 {
			// Only an acks=all append is durable: an unclean leader
			// election can lose an acks=1 one, and its resend must then be
			// written.
			continue
		}
		if !c.legacy.Room(int64(len(ids)), conn) {
			c.legacy.NotKept(in, len(ids))
			continue
		}
		whole := p.Header.Attributes&0x07 != 0
		if pp.Act != Forward {
			m := in.NewBatch(conn, p.Topic, p.Partition, whole, st.exact, int(st.dropped))
			m.Phase, m.AppendTime = sent.Appended, -1
			for j := range ids {
				if ms[j].kind != matchDrop {
					continue
				}
				m.Recs = append(m.Recs, sent.Rec{Hash: recHash(ids[j], st.exact), Off: ms[j].off})
				if o := ns + c.legacy.Window - ms[j].age; m.Until == 0 || o < m.Until {
					m.Until = o // the window runs from the original's append
				}
				m.AppendTime = ms[j].at
			}
			in.Keep(m)
			in.Disown(m)
			m.Conn = conn // matchable, and this connection's once its answer is written
			st.m = m.Ref()
		}
		if pp.Act != Answer {
			f := in.NewBatch(conn, p.Topic, p.Partition, whole, st.exact, len(ids)-int(st.dropped))
			f.Phase, f.AppendTime = sent.InFlight, -1
			// Another client's batch of the same records may be in the log
			// before it: looking for it there starts past what was
			// answered before it was sent (settleLocked).
			f.After = st.seen
			for j := range ids {
				if pp.Act == Rebuild && ms[j].kind == matchDrop {
					continue
				}
				f.Recs = append(f.Recs, sent.Rec{Hash: recHash(ids[j], st.exact), Off: sent.OffPending})
			}
			in.Keep(f)
			st.b = f.Ref()
		}
		registered = true
	}
	if registered {
		conn.Reqs++
		if !conn.Open {
			// Read before its connection broke, decided after: no answer
			// of it will reach the client.
			conn.LetGo()
		}
	}
}

// answerOf is the proxy's answer to a legacy part it answers whole: error
// 0, and the one base offset true for all its records, or -1.
func (c *Core) answerOf(ms []match, logStart int64) protocol.LocalPartitionResult {
	base := baseOf(func(j int) int64 { return ms[j].off }, len(ms))
	at := ms[0].at
	for _, m := range ms {
		if m.at != at {
			at = -1
		}
	}
	return protocol.LocalPartitionResult{BaseOffset: base, LogAppendTime: at, LogStartOffset: logStart}
}
