package decide

import (
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/dedupproxy/dedupproxy/decide/internal/lockcheck"
	"github.com/dedupproxy/dedupproxy/decide/sent"
	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// Core decides Produce requests (docs/produce-path.md). It is shared by a
// server's sessions and safe for concurrent use; its locks guard its own
// state only and are never held across a call into the caller.
type Core struct {
	table    *seqstate.Table
	keys     *seqstate.KeyTable
	settings atomic.Pointer[Settings]
	legacy   sent.Store
	parts    partitions
	flying   atomic.Int64 // flying batches kept over all partitions (flying.go)
	warmOn   bool
	window   time.Duration
}

// Config configures a Core.
type Config struct {
	// Table holds idempotent producers' state and interns topics.
	// Required.
	Table *seqstate.Table
	// Keys remembers idempotency keys; nil when no topic uses them.
	Keys *seqstate.KeyTable
	// Window is how long a legacy batch's records may be answered as
	// retried, from its append. Zero means DefaultWindow.
	Window time.Duration
	// Scope is what makes connections one client instance.
	Scope Scope
	// MaxRecords bounds the legacy records remembered over all client
	// instances (16 bytes each). Zero means DefaultMaxRecords.
	MaxRecords int
	// Warm reads a partition's tail before its first decision since
	// start (docs/warm.md).
	Warm bool
}

// DefaultMaxRecords is Config.MaxRecords's default: 16 MiB of records.
const DefaultMaxRecords = 1 << 20

// DefaultWindow is Config.Window's default: the default delivery.timeout.ms
// of the Java client and librdkafka (2 minutes), after which a client gives
// up retrying.
const DefaultWindow = 2 * time.Minute

// waitMargin is added to a request's timeout_ms to bound how long it waits
// for an outcome: the original's answer is due within its own timeout.
const waitMargin = time.Second

// maxWaitTimeout caps the timeout_ms taken from a request.
const maxWaitTimeout = 5 * time.Minute

// New returns a Core with settings s.
func New(cfg Config, s *Settings) *Core {
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.MaxRecords <= 0 {
		cfg.MaxRecords = DefaultMaxRecords
	}
	c := &Core{table: cfg.Table, keys: cfg.Keys, warmOn: cfg.Warm, window: cfg.Window}
	c.legacy.Init(cfg.Scope == ScopeInstance, int64(cfg.Window), cfg.MaxRecords)
	c.parts.init()
	c.settings.Store(s)
	return c
}

// SetSettings replaces the settings (SIGHUP).
func (c *Core) setSettings(s *Settings) { c.settings.Store(s) }

// Settings returns the settings in force.
func (c *Core) Settings() *Settings { return c.settings.Load() }

// Table returns the idempotent producers' table.
func (c *Core) Table() *seqstate.Table { return c.table }

// LegacyRecords returns the legacy records remembered, and the batches not
// kept for want of room since start.
func (c *Core) LegacyRecords() (held int64, evicted uint64) {
	return c.legacy.Held()
}

// Connect returns the state of a client connection, whose client the
// broker has authenticated. Call Disconnect when it closes.
func (c *Core) connect(id ConnID, cl Client, now time.Time) *Conn {
	return c.legacy.Connect(id, cl.Principal, cl.ID, cl.Host, cl.Software != "", restampingSoftware[cl.Software], now.UnixNano())
}

// disconnect records that conn closed or broke (how says which, as far as
// the caller can tell): every batch it sent that a retry may still need is
// from now on one whose acknowledgement its client may not hold (batches
// in flight become so when their outcome arrives) — except, after a Clean
// close, those whose answer was written: their client read it.
func (c *Core) disconnect(conn *Conn, how Close, now time.Time) {
	c.legacy.Close(conn, how == Clean, now.UnixNano())
}

// Gone reports whether conn was disconnected. A request of a connection
// that is gone by the time it was decided reaches no one with its answer:
// its client resends what it needs on another connection, perhaps already
// did, so the caller does not forward it (EvUnsent).
func (c *Core) Gone(conn *Conn) bool { return conn != nil && conn.Gone() }

// Siblings appends to dst the other open connections of conn's client
// instance. A client that gives up on a connection resends on a new one at
// once, perhaps before the proxy has read the old one's end: the caller
// may check them (EvSiblingClosed for those whose client is gone) before a
// new connection's first decision.
func (c *Core) Siblings(conn *Conn, dst []ConnID) []ConnID {
	return conn.Inst.Siblings(conn, dst)
}

// disconnectSibling is disconnect for the open connection id of conn's
// client instance, if it is one.
func (c *Core) disconnectSibling(conn *Conn, id ConnID, how Close, now time.Time) {
	if sib := conn.Inst.Sibling(conn, id); sib != nil {
		c.disconnect(sib, how, now)
	}
}

// topicSettings returns the mode, match and key header of topic.
func (c *Core) topicSettings(s *Settings, topic seqstate.TopicID) (Mode, Match, string) {
	mode, match := s.Mode, s.Match
	if len(s.Topics) == 0 {
		return mode, match, ""
	}
	name, ok := c.table.TopicName(topic)
	if !ok {
		return mode, match, ""
	}
	ts, ok := s.Topics[name]
	if !ok {
		return mode, match, ""
	}
	if ts.Mode != nil {
		mode = *ts.Mode
	}
	if ts.Match != nil {
		match = *ts.Match
	}
	return mode, match, ts.KeyHeader
}

// decide decides req into pl at now; see Plan.Status for what follows.
// fx.Wake gets the request's own connection when what it waits for came
// between its look and its registration as a waiter (decideIdempotent).
func (c *Core) decide(req *Request, pl *Plan, now time.Time, fx *Effects) {
	if req.Arrived.IsZero() {
		req.Arrived = now
	}
	pl.reset(req)
	if req.Conn == nil {
		for i := range pl.Parts {
			pl.Parts[i].Verdict.Pass = PassUnauthenticated
		}
		pl.account()
		return
	}
	s := c.settings.Load()
	decided := 0
	for i := range req.Parts {
		p, st, pp := &req.Parts[i], &pl.st[i], &pl.Parts[i]
		st.key = partKeyOf(p.Topic, p.Partition)
		st.mode, st.match, st.header = c.topicSettings(s, p.Topic)
		st.legacy = p.Header.ProducerID < 0
		st.exact = st.legacy && exactIdentity(st.match, req.Conn, &p.Header)
		st.maxTS = p.Header.MaxTimestamp
		pp.Verdict.Legacy = st.legacy
		pp.Verdict.Records = p.Header.NumRecords
		switch {
		case st.mode == Off:
			st.pass = PassDedupOff
		case p.Partition < 0 || p.Partition >= c.table.TopicPartitions(p.Topic) && c.table.TopicPartitions(p.Topic) > 0:
			// Not a partition the cluster's metadata lists (partition
			// numbers are the client's choice): the broker answers it, and
			// nothing is kept or read for it.
			st.pass = PassUnknownTopic
		case st.legacy && (st.match == MatchOff || req.Acks == 0):
			// acks=0 gets no response: nothing to answer a retry with.
			st.pass = PassLegacy
		default:
			st.pass = -1
			decided++
		}
		pp.Verdict.Pass = st.pass
	}
	switch {
	case !req.Waited.IsZero() && !now.Before(req.Waited):
		pl.GaveUp = GaveUpWait
	case req.Rounds >= MaxRounds:
		pl.GaveUp = GaveUpRounds
	case req.GiveUp:
		pl.GaveUp = GaveUpAsked
	}
	if pl.GaveUp != NotGivenUp {
		c.giveUp(req, pl)
		return
	}
	if decided > 0 && c.warmOn && c.warmFirst(req, pl, now) {
		return
	}
	// Each step below holds one lock at a time (docs/architecture.md,
	// "Locks"): what partitions say first, then the idempotent parts
	// under the producers' table, then the legacy parts under their client
	// instance's lock.
	legacy := c.anyLegacy(pl)
	if legacy {
		c.identify(req, pl)
		c.partFacts(req, pl, now)
	}
	if c.decideIdempotent(req, pl, now, fx) {
		return
	}
	if legacy {
		c.decideLegacy(req, pl, now)
		if pl.Status != Ready {
			return
		}
	}
	c.rebuild(req, pl)
	pl.account()
	c.flyUnregistered(req, pl, now)
}

// decideLegacy decides the legacy parts of req, after its idempotent ones:
// the rule applied under its client instance's lock; then, with it let go,
// the records read back from partitions' logs and idempotency keys; then,
// under it again, the batches remembered. If the request must wait, or a
// partition's tail be read, it aborts what the idempotent parts
// registered and sets pl.Status.
func (c *Core) decideLegacy(req *Request, pl *Plan, now time.Time) {
	in, ns := req.Conn.Inst, now.UnixNano()
	if req.Acks == -1 {
		// Room for what this request may remember, made before its
		// instance is locked: it may come from another instance.
		c.legacy.MakeRoom(int64(len(pl.ids)), in)
	}
	in.Lock()
	in.Seen(ns)
	in.Sweep(ns, c.legacy.Window)
	c.matchLegacy(req, pl, now)
	if len(pl.waitFor) > 0 || len(pl.tailWant) > 0 {
		c.rollback(pl)
		for _, b := range pl.waitFor {
			b.Await(req.Conn.ID())
		}
		in.Unlock()
		c.abortIdempotent(pl, now)
		c.askTails(pl)
		c.await(req, pl, now)
		return
	}
	if c.anyUnlockedWork(pl) {
		in.Unlock()
		c.matchLogs(req, pl, now)
		c.keysLegacy(req, pl, now)
		in.Lock()
	}
	c.registerLegacy(req, pl, now)
	in.Unlock()
}

// partFacts reads, for each legacy part, what its partition says that the
// rule needs (records read back from its log, its log start offset, the
// highest offset answered for it), each partition's lock taken alone.
func (c *Core) partFacts(req *Request, pl *Plan, now time.Time) {
	ns := now.UnixNano()
	for i := range req.Parts {
		p, st := &req.Parts[i], &pl.st[i]
		if !st.legacy || st.pass >= 0 {
			continue
		}
		part, sh := c.parts.get(partKeyOf(p.Topic, p.Partition))
		if len(part.log) > 0 && part.logUntil <= ns {
			part.log, part.logIdx = nil, nil // none may match any more
		}
		st.logged = req.Conn.Principal == 0 && len(part.log) > 0
		st.logStart, st.seen = part.logStart, part.seen
		sh.unlock()
	}
}

// giveUp decides a request whose wait ran out: what it waited for is
// answered REQUEST_TIMED_OUT, which clients retry, and the retry is decided
// afresh. Parts that were never to be decided go upstream as they are, and
// so does an acks=0 request, which no answer reaches: the broker decides it
// (at worst a duplicate, as without the proxy).
func (c *Core) giveUp(req *Request, pl *Plan) {
	for i := range pl.Parts {
		pp := &pl.Parts[i]
		if pl.st[i].pass >= 0 {
			continue
		}
		pp.Verdict.Waited, pp.Verdict.Rule = true, RuleInFlight
		if req.Acks == 0 {
			pp.Verdict.Would = Forward
			continue
		}
		pp.Act, pp.Local = Answer, timedOut
		pp.Verdict.Would = Answer
	}
	pl.account()
}

func (c *Core) anyLegacy(pl *Plan) bool {
	for i := range pl.st {
		if pl.st[i].legacy && pl.st[i].pass < 0 {
			return true
		}
	}
	return false
}

// warmFirst makes a request wait for the first read of its partitions'
// tails since start; it reports whether it must.
func (c *Core) warmFirst(req *Request, pl *Plan, now time.Time) bool {
	for i := range req.Parts {
		st := &pl.st[i]
		if st.pass >= 0 {
			continue
		}
		k := partKeyOf(req.Parts[i].Topic, req.Parts[i].Partition)
		if c.table.TopicPartitions(k.Topic) == 0 {
			continue // only partitions the metadata lists are read
		}
		p, sh := c.parts.get(k)
		switch p.warm {
		case cold:
			p.warm = reading
			pl.Tails = append(pl.Tails, TailKey{k.Topic, k.Partition})
		case reading:
			// Registered under the partition's lock: its read cannot end
			// unseen between here and the wait.
			p.await(req.Conn.ID())
			pl.waitOn = append(pl.waitOn, k)
		}
		sh.unlock()
	}
	if len(pl.Tails) == 0 && len(pl.waitOn) == 0 {
		return false
	}
	c.await(req, pl, now)
	return true
}

// await sets pl's status for the waits and reads it collected, and
// registers the request's connection as waiting where it must.
func (c *Core) await(req *Request, pl *Plan, now time.Time) {
	pl.Until = until(req, now)
	if len(pl.Tails) > 0 {
		pl.Status = ReadTails
	} else {
		pl.Status = Wait
	}
	for _, k := range pl.waitOn {
		p, sh := c.parts.get(k)
		p.await(req.Conn.ID())
		sh.unlock()
	}
}

// until bounds how long req waits for an outcome: its own timeout_ms plus
// a margin (the original's answer is due within its own timeout).
func until(req *Request, now time.Time) time.Time {
	return now.Add(min(max(req.Timeout, 0), maxWaitTimeout) + waitMargin)
}

// decideIdempotent decides the idempotent parts (docs/kafka-rules.md §12),
// all under one table shard lock per producer. It reports whether the
// request must wait for a batch in flight, or have its records read back
// (pl.Status says which); the batches it registered are then aborted.
func (c *Core) decideIdempotent(req *Request, pl *Plan, now time.Time, fx *Effects) bool {
	for i := range req.Parts {
		p, st := &req.Parts[i], &pl.st[i]
		if st.legacy || st.pass >= 0 {
			continue
		}
		st.key = seqstate.Key{ProducerID: p.Header.ProducerID, Topic: p.Topic, Partition: p.Partition, Principal: req.Conn.Principal}
		st.batch = seqstate.Batch{Epoch: p.Header.ProducerEpoch, FirstSeq: p.Header.BaseSequence, Count: p.Header.LastOffsetDelta + 1,
			Fingerprint: protocol.RecordsFingerprint(p.Records, &p.Header)}
		pl.seqOps = append(pl.seqOps, seqstate.Op{Key: st.key, Batch: st.batch})
		pl.seqIdx = append(pl.seqIdx, i)
	}
	if len(pl.seqOps) == 0 {
		return false
	}
	// A resend of a batch on its way to the broker that the table no
	// longer holds (flying.go) waits for its answer. Looked at before the
	// table, with the wait registered: an answer settled after this wakes
	// the request, and one settled before it is in the table.
	if req.Acks == -1 && c.flying.Load() > 0 {
		for j := range pl.seqOps {
			i := pl.seqIdx[j]
			if st := &pl.st[i]; st.mode == Enforce {
				st.flying = c.awaitFlying(st.key, st.batch, req.Conn.ID(), now)
			}
		}
	}
	// acks=0 has no response to commit from: consult the table only.
	if req.Acks == 0 {
		lockcheck.Take("producer table")
		c.table.DecideBatches(pl.seqOps, now)
		lockcheck.Drop()
	} else {
		lockcheck.Take("producer table")
		c.table.CheckBatches(pl.seqOps, now)
		lockcheck.Drop()
	}
	wait, unread := false, false
	for j, op := range pl.seqOps {
		i := pl.seqIdx[j]
		p, st, pp := &req.Parts[i], &pl.st[i], &pl.Parts[i]
		enforce := st.mode == Enforce
		// Kafka validates a batch before its duplicate check (§2.1 rows
		// 4–12): the proxy answers only a batch the broker would not
		// reject on its own, so it needs its bytes.
		answerable := func() bool {
			if p.Unread {
				unread = unread || enforce
				return false
			}
			return protocol.BatchValid(p.Records, &p.Header) == 0
		}
		if r := op.Result.Decision; st.flying && r != seqstate.Accept && r != seqstate.OutOfOrder {
			// The original's answer was settled between the look and the
			// table's decision: decided as usual.
			c.unwait(req.Conn.ID(), []seqstate.Key{partKeyOf(p.Topic, p.Partition)})
			st.flying = false
		}
		if st.flying {
			// Its original's outcome is not known yet: the broker would
			// answer this resend with it.
			pp.Verdict.Rule = RuleInFlight
			st.pending, st.commit = op.Result.Decision == seqstate.Accept, false
			wait = true
			pl.waitOn = appendKey(pl.waitOn, partKeyOf(p.Topic, p.Partition))
			continue
		}
		switch r := op.Result; r.Decision {
		case seqstate.Accept:
			st.pending, st.commit = req.Acks != 0, req.Acks != 0
		case seqstate.Duplicate:
			pp.Verdict.Rule, pp.Verdict.Original = RuleDuplicate, r.BaseOffset
			// Only acks=all appends are committed with their offset, so a
			// known offset is a durable one; a duplicate of one committed
			// without goes to the broker, whose check answers it.
			if r.BaseOffset >= 0 && answerable() {
				pp.Verdict.Would, pp.Verdict.Dropped = Answer, p.Header.NumRecords
				if enforce {
					pp.Act = Answer
					pp.Local = protocol.LocalPartitionResult{BaseOffset: r.BaseOffset, LogAppendTime: r.MaxTimestamp, LogStartOffset: c.LogStart(p.Topic, p.Partition)}
				}
			}
		case seqstate.InFlight:
			pp.Verdict.Rule = RuleInFlight
			if enforce && req.Acks == -1 {
				wait = true
				pl.waitOn = appendKey(pl.waitOn, partKeyOf(p.Topic, p.Partition))
			} else {
				st.commit = req.Acks != 0 // acks=1: the broker decides; it may commit the original
			}
		case seqstate.SequenceReuse:
			pp.Verdict.Rule = RuleSequenceReuse
			// Kafka would answer success and drop these records silently.
			if answerable() {
				pp.Verdict.Would = Answer
				if enforce {
					pp.Act = Answer
					pp.Local = protocol.LocalPartitionResult{ErrorCode: kerr.OutOfOrderSequenceNumber.Code, BaseOffset: -1, LogAppendTime: -1, LogStartOffset: c.LogStart(p.Topic, p.Partition)}
					pl.Reuse = true
				}
			}
		case seqstate.OutOfOrder, seqstate.Fenced:
			// Counted, and the broker decides: it answers 45/47 itself
			// when they are real; if it appends, the table follows.
			pp.Verdict.Rule = RuleOutOfOrder
			if r.Decision == seqstate.Fenced {
				pp.Verdict.Rule = RuleFenced
			}
			st.commit = req.Acks != 0
		}
		if st.header != "" && pp.Act == Forward && st.commit {
			c.countKeys(p, pl, st, pp, now)
		}
	}
	if !wait && !unread {
		return false
	}
	// The request is decided afresh once it can be: abort what this
	// decision registered.
	c.abortIdempotent(pl, now)
	if !wait {
		// Its answer needs the records held in pipes: read them, then
		// decide again.
		pl.Status = ReadRecords
		return true
	}
	// Registered as a waiter first, then the table looked at again: an
	// outcome settled in between, whose wake may have gone out before the
	// registration, is seen here, and the request wakes itself, as if the
	// outcome had come just after it began to wait.
	pl.Status, pl.Until = Wait, until(req, now)
	for _, k := range pl.waitOn {
		p, sh := c.parts.get(k)
		p.await(req.Conn.ID())
		sh.unlock()
	}
	for j := range pl.seqOps {
		op := &pl.seqOps[j]
		if op.Result.Decision != seqstate.InFlight {
			continue
		}
		lockcheck.Take("producer table")
		r := c.table.Decide(op.Key, op.Batch, now)
		lockcheck.Drop()
		if r.Decision != seqstate.InFlight {
			c.unwait(req.Conn.ID(), pl.waitOn)
			fx.Wake = append(fx.Wake, req.Conn.ID())
			break
		}
	}
	return true
}

// abortIdempotent aborts the batches a decision that ends up waiting
// registered in the producers' table.
func (c *Core) abortIdempotent(pl *Plan, now time.Time) {
	pl.seqOuts = pl.seqOuts[:0]
	for j := range pl.seqOps {
		if st := &pl.st[pl.seqIdx[j]]; st.pending {
			pl.seqOuts = append(pl.seqOuts, seqstate.Outcome{Key: st.key, Batch: st.batch})
			st.pending, st.commit = false, false
		}
	}
	c.settleTable(pl, pl.seqOuts, now)
	pl.seqOuts = pl.seqOuts[:0]
}

// countKeys counts the repeated idempotency keys of an idempotent batch:
// dropping a record would break its producer's sequence numbers, so they
// are only counted.
func (c *Core) countKeys(p *Part, pl *Plan, st *partState, pp *PartPlan, now time.Time) {
	if c.keys == nil || p.Unread {
		return
	}
	start := len(pl.keys)
	keys, err := protocol.RecordKeys(pl.keys, p.Records, &p.Header, st.header)
	if err != nil {
		pp.Verdict.Pass = PassKeysCompressed
		return
	}
	pl.keys = keys
	st.keysAt, st.keysEnd = start, len(keys)
	for j := start; j < len(keys); j++ {
		if keys[j].Present {
			lo, hi := keyOf(keys[j], st.key)
			lockcheck.Take("key table")
			_, ok := c.keys.Lookup(lo, hi, now)
			lockcheck.Drop()
			if ok {
				pp.Verdict.Dropped++ // observed, not dropped
			}
		}
	}
	if pp.Verdict.Dropped > 0 {
		pp.Verdict.Rule, pp.Verdict.Would = RuleKey, Forward
	}
}

// keyOf mixes the topic and the principal into a record key: the same key
// on two topics, or from two principals, is two keys.
func keyOf(k protocol.RecordKey, key seqstate.Key) (lo, hi uint64) {
	return k.Lo ^ (uint64(key.Topic)+1)*0x9e3779b97f4a7c15, k.Hi ^ (uint64(key.Principal)+1)*0xbf58476d1ce4e5b9
}

// rebuild writes the rebuilt batches of Rebuild parts.
func (c *Core) rebuild(req *Request, pl *Plan) {
	for i := range pl.Parts {
		pp := &pl.Parts[i]
		if pp.Act != Rebuild {
			continue
		}
		p, st := &req.Parts[i], &pl.st[i]
		drops := pl.drops[st.idsAt:st.idsEnd]
		at := len(pl.Rebuilt)
		out, err := protocol.DropRecords(pl.Rebuilt, p.Records, &p.Header, drops)
		if err != nil {
			// Cannot be cut (it parsed before, so this is not expected):
			// forward it whole, a miss rather than a wrong answer.
			c.unmatch(pl, i)
			pp.Act = Forward
			continue
		}
		pl.Rebuilt = out
		pp.At, pp.End = at, len(out)
	}
}

// PrincipalUse is what one principal's client instances hold of the legacy
// records remembered, and how many of theirs were let go or never kept for
// want of room.
type PrincipalUse = sent.PrincipalUse

// LegacyUse appends to dst what each principal with client instances
// holds.
func (c *Core) LegacyUse(dst []PrincipalUse) []PrincipalUse { return c.legacy.Use(dst) }
