package proxy

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// planner decides the Produce path (docs/produce-path.md). It does no I/O
// and reads no clock: time is an argument. A session hands it
//
//   - a Produce request: [planner.plan] returns what goes upstream, what the
//     proxy answers itself and what waits for another batch's outcome;
//   - the broker's response to what went upstream: [planner.complete]
//     commits appended batches and releases the others, handing each outcome
//     to the batches waiting on it;
//   - the loss of that response: [planner.fail];
//   - a wait's deadline: [planner.abandonWaits];
//
// and asks it for the client's answer with [planner.answer]. The session
// only reads, writes and waits. The planner is shared by every session of a
// server and safe for concurrent use.
//
// The rules (docs/kafka-rules.md §12): the proxy answers a batch itself only
// where the outcome is certain — a retry of a batch appended with acks=all
// whose offset is known, a retry of a batch still in flight (it gets the
// original's outcome), and a reused sequence with different records. A gap,
// a rewind or a stale epoch is counted and forwarded, since the table may
// lag the broker (a second proxy, a producer path that bypasses this one);
// so is everything the proxy cannot key or trust.
type planner struct {
	table   *seqstate.Table       // nil in mode off
	legacy  *seqstate.LegacyTable // nil in mode off
	keys    *seqstate.KeyTable    // nil in mode off
	metrics *Metrics

	// settings are what SIGHUP may change (Server.SetDedup); a plan loads
	// them once.
	settings atomic.Pointer[dedupSettings]

	legacyWindow time.Duration // dedup.legacy.window
	orphans      orphanStore   // candidates for re-batched retries (rebatch.go)
	settling     settling      // batches in flight from clients that have gone (settle.go)
	unread       unreadStore   // answers of connections that broke, perhaps never read (unread.go)
	// unacked holds the record stamps of legacy batches appended but
	// answered with an error, read back from the log (resent.go); unackedUntil
	// (ns) is when the last of them expires: until then forwarded legacy
	// batches are checked record by record.
	unacked      atomic.Pointer[seqstate.KeyTable] // made on first use (2.6 MB)
	unackedOnce  sync.Once
	unackedTTL   time.Duration
	unackedUntil atomic.Int64

	// waitMu guards waiters, and the wait fields of every plan registered
	// in it (produceDecision.waiting, producePlan.nWaits).
	waitMu   sync.Mutex
	waiters  map[waitKey][]waiter
	nWaiting atomic.Int64 // entries in all waiters lists: resolve skips the lock at 0

	logStart logStartOffsets
	warm     warmer // which partitions were read from the log (warm.go)

	// unknownTopics counts batches relayed for topics not yet interned;
	// the server refreshes its topics when it moves.
	unknownTopics atomic.Uint64
	// pending counts batches registered in flight upstream and not yet
	// committed or released (dedupproxy_produce_pending_batches).
	pending atomic.Int64
}

func newPlanner(cfg *DedupConfig, table *seqstate.Table, legacy *seqstate.LegacyTable, keys *seqstate.KeyTable, m *Metrics) *planner {
	pn := &planner{table: table, legacy: legacy, keys: keys, metrics: m, waiters: map[waitKey][]waiter{},
		legacyWindow: cfg.Legacy.Window}
	pn.settings.Store(newDedupSettings(cfg))
	pn.logStart.init()
	pn.unackedTTL = cfg.Legacy.Window
	if pn.unackedTTL <= 0 {
		pn.unackedTTL = seqstate.DefaultLegacyWindow
	}
	return pn
}

// dedupSettings are the dedup settings a running proxy can change.
type dedupSettings struct {
	mode        string            // dedup.mode
	legacyMatch string            // dedup.legacy.match
	topicMatch  map[string]string // dedup.topics[name].legacy_match, where set
	keyHeader   map[string]string // dedup.topics[name].idempotency_key.header, where set
}

func newDedupSettings(cfg *DedupConfig) *dedupSettings {
	ds := &dedupSettings{mode: cfg.Mode, legacyMatch: cfg.Legacy.Match, topicMatch: map[string]string{}, keyHeader: map[string]string{}}
	for name, tc := range cfg.Topics {
		if tc.LegacyMatch != "" {
			ds.topicMatch[name] = tc.LegacyMatch
		}
		if tc.IdempotencyKey != nil {
			ds.keyHeader[name] = tc.IdempotencyKey.Header
		}
	}
	return ds
}

// matchFor returns the legacy match mode of an interned topic.
func (pn *planner) matchFor(topic seqstate.TopicID) string {
	ds := pn.settings.Load()
	if len(ds.topicMatch) > 0 {
		if name, ok := pn.table.TopicName(topic); ok {
			if m, ok := ds.topicMatch[name]; ok {
				return m
			}
		}
	}
	return ds.legacyMatch
}

// action is what happens to one partition of a Produce request.
type action uint8

const (
	actForward action = iota // sent upstream; the broker answers
	actAnswer                // answered by the proxy with produceDecision.local
	actWait                  // waits for the in-flight original, then answered with its outcome
	actRebatch               // legacy re-batched retry: the records after a known prefix go upstream, rebuilt; answered by the proxy from the broker's answer
)

// produceDecision is the planner's decision for one partition of a Produce
// request that carried a batch it could key: idempotent, or legacy (producer
// id -1) with legacy dedup on for its topic.
type produceDecision struct {
	ti, pi  int // topic and partition index in the client's request
	act     action
	legacy  bool // a legacy batch: ident and lresult, not batch and result
	pending bool // registered as pending (in flight) in its table: Commit or Release it
	commit  bool // forwarded: commit it if the broker appends it
	waiting bool // actWait, not yet resolved (guarded by planner.waitMu)
	waited  bool // registered by wait: plan's own copy, read without the lock (a resolve may clear waiting at once)
	key     seqstate.Key
	batch   seqstate.Batch
	ident   uint64 // legacy: the batch's identity (protocol.MixIdentity)
	keyDrop bool   // actRebatch by idempotency key, not by a re-batched prefix
	// legacyAppended: complete committed this legacy batch as appended.
	legacyAppended bool
	// moved: a legacy batch Check found Moved, settled once the whole
	// request is planned (settleMoved).
	moved bool
	// keysAt:keysEnd are this batch's records' idempotency keys in
	// producePlan.keys (empty unless its topic has keys).
	keysAt, keysEnd int
	size            int32  // legacy: bytes of the records section
	first           uint64 // legacy: protocol.FirstRecordHash
	maxTS           int64  // the batch's maxTimestamp, kept as the original's log_append_time
	result          seqstate.Result
	lresult         seqstate.LegacyResult
	local           protocol.LocalPartitionResult // the answer when not forwarded

	// actRebatch: the orphaned batch the records begin with, its outcome,
	// and where the rebuilt batch of the rest lies in producePlan.rebuilt.
	prefix                legacyRef
	prefixResult          seqstate.LegacyResult
	rebuiltAt, rebuiltEnd int
}

// producePlan is what a Produce request carries from its decision to its
// answer. Plans are pooled; steady-state requests allocate nothing.
type producePlan struct {
	version   int16
	corrID    int32
	acks      int16
	conn      uint64 // the session: legacy batches remember where their acknowledgement goes
	decisions []produceDecision
	anyLocal  bool // some partition is answered (or waited on) by the proxy
	anyUp     bool // some partition goes upstream
	reuse     bool // some partition was answered SequenceReuse (acks=0 closes the connection)
	moved     bool // some legacy decision is moved (settleMoved)
	retried   bool // some legacy batch was answered as a retry, or re-batched
	// deadline bounds the waits: the request's own timeout_ms plus
	// waitMargin after it was read. Past it a wait is answered
	// REQUEST_TIMED_OUT, which every client retries.
	deadline time.Time
	nWaits   int           // unresolved waits (guarded by planner.waitMu)
	ready    chan struct{} // receives when nWaits reaches 0 (cap 1, may hold a stale token)
	// skeleton is the request body without records (keepSkeleton), when
	// anyLocal; skeletonHold holds its budget when it is large.
	skeleton     []byte
	skeletonHold *requestBuffer
	upstream     *[]byte // upstream response frame, when anyUp and anyLocal
	upOff        int     // its body offset after the size prefix
	rebuilt      []byte  // rebuilt batches of actRebatch decisions
	keys         []protocol.RecordKey
	drops        []bool // drops[j]: the record of keys[j] is not sent upstream
	// The idempotent batches go to the table together, so that a request
	// takes its shard lock once to decide them (plan stashes seqOps and
	// idem, planIdempotent decides) and once to settle them (seqOuts, with
	// whom to resolve in settled; see settleIdempotent).
	seqOps  []seqstate.Op
	idem    []idemBatch
	seqOuts []seqstate.Outcome
	settled []idemSettled
	// fill reads the request's holes back into place (holes.go) before
	// any record bytes of an idempotent batch are read; false when it
	// cannot, and the connection then closes. Nil when there are none.
	fill func() bool
}

// idemBatch is what planIdempotent needs of decision i's partition.
type idemBatch struct {
	i    int
	part protocol.ProducePartition // its slices alias the request body
	bh   protocol.BatchHeader
}

// idemSettled is seqOuts' decision, and the outcome its waiters get once
// the table has it.
type idemSettled struct {
	d       *produceDecision
	resolve bool
	outcome protocol.LocalPartitionResult
}

// waitMargin is added to a Produce request's timeout_ms to bound how long a
// retry waits for its in-flight original: the original's own response is due
// within timeout_ms, give or take the broker's queueing.
const waitMargin = time.Second

// maxWaitTimeout caps the timeout_ms taken from a request, so a client
// cannot park waits for hours.
const maxWaitTimeout = 5 * time.Minute

var planPool = sync.Pool{New: func() any { return &producePlan{ready: make(chan struct{}, 1)} }}

func getPlan() *producePlan {
	pl := planPool.Get().(*producePlan)
	pl.decisions = pl.decisions[:0]
	pl.anyLocal, pl.anyUp, pl.reuse, pl.moved, pl.retried = false, false, false, false, false
	pl.nWaits = 0
	pl.skeleton = pl.skeleton[:0]
	pl.rebuilt = pl.rebuilt[:0]
	pl.keys, pl.drops = pl.keys[:0], pl.drops[:0]
	pl.seqOps, pl.idem, pl.seqOuts, pl.settled = pl.seqOps[:0], pl.idem[:0], pl.seqOuts[:0], pl.settled[:0]
	pl.upstream = nil
	pl.fill = nil
	select { // a stale token from an earlier use
	case <-pl.ready:
	default:
	}
	return pl
}

func putPlan(pl *producePlan) {
	putFrame(pl.upstream)
	pl.upstream, pl.fill = nil, nil
	if h := pl.skeletonHold; h != nil {
		h.pool.put(h, nil)
		pl.skeletonHold = nil
	}
	if cap(pl.skeleton) > maxPooledFrame {
		pl.skeleton = nil
	}
	if cap(pl.rebuilt) > maxPooledFrame {
		pl.rebuilt = nil
	}
	planPool.Put(pl)
}

// waitKey identifies an in-flight batch: by sequence numbers, or for a
// legacy batch by identity.
type waitKey struct {
	key      seqstate.Key
	epoch    int16
	firstSeq int32
	count    int32
	ident    uint64
}

func waitKeyOf(d *produceDecision) waitKey {
	return waitKey{d.key, d.batch.Epoch, d.batch.FirstSeq, d.batch.Count, d.ident}
}

// waiter is one retry waiting for its original's outcome: decision i of pl.
type waiter struct {
	pl *producePlan
	i  int
}

// Passthrough reasons, for dedupproxy_batches_passthrough_total{reason}.
//
// NOTE: add new reasons to passthroughReasons.
const (
	passLegacy          = iota // producer id -1, legacy dedup off for the topic, or acks=0
	passInvalid                // not one well-formed v2 batch: the broker answers
	passOldFormat              // message format v0/v1 (Produce v0–v2, or magic < 2)
	passUnknownTopic           // a topic not yet seen in a Metadata response
	passUnauthenticated        // the connection has not authenticated (SASL) yet
	passDedupOff               // dedup mode off: counted per request, nothing is scanned
	passKeysCompressed         // idempotency keys not checked: the batch is compressed
	numPassReasons
)

var passthroughReasons = [numPassReasons]string{
	passLegacy:          "legacy",
	passInvalid:         "invalid",
	passOldFormat:       "old_format",
	passUnknownTopic:    "unknown_topic",
	passUnauthenticated: "unauthenticated",
	passDedupOff:        "dedup_off",
	passKeysCompressed:  "keys_compressed",
}

// timedOut is the answer to a batch whose outcome the proxy cannot know: its
// original's upstream connection failed, or the wait's deadline passed.
// REQUEST_TIMED_OUT is retriable in every client; the retry is then decided
// afresh, and the broker's own duplicate check settles it.
var timedOut = protocol.LocalPartitionResult{ErrorCode: kerr.RequestTimedOut.Code, BaseOffset: -1, LogAppendTime: -1, LogStartOffset: -1}

// plan decides every partition of a Produce request whose header is h and
// whose body (after the header) sc has been Reset on. trusted says whether
// the connection may have batches decided: the broker has authenticated it
// (or the cluster needs no authentication) as principal, which scopes every
// key (docs/security.md). It returns nil when the request goes
// upstream as it came and nothing needs its response: dedup off, or no
// partition the planner could key.
// fill, when not nil, reads the request's holes back into place (holes.go).
func (pn *planner) plan(h protocol.RequestHeader, sc *protocol.ProduceScanner, conn uint64, principal principalID, trusted bool, fill func() bool, now time.Time) *producePlan {
	var pl *producePlan
	enforce := pn.settings.Load().mode == DedupEnforce
	acks := sc.Acks
	for sc.Next() {
		part := sc.Partition()
		var bh protocol.BatchHeader
		n, err := protocol.ReadBatch(part.Records, &bh)
		switch {
		case err != nil || n != 1:
			pn.metrics.passthrough[passInvalid].Inc()
			continue
		case bh.Magic < 2:
			pn.metrics.passthrough[passOldFormat].Inc()
			continue
		case bh.ProducerID < 0 && acks == 0:
			// acks=0 gets no response: nothing to answer a retry with.
			pn.metrics.passthrough[passLegacy].Inc()
			continue
		case !trusted:
			pn.metrics.passthrough[passUnauthenticated].Inc()
			continue
		}
		topic, known := pn.lookupTopic(h.APIVersion, part.Topic, part.TopicID)
		if !known {
			pn.metrics.passthrough[passUnknownTopic].Inc()
			pn.unknownTopics.Add(1)
			continue
		}
		match := MatchRecords
		if bh.ProducerID < 0 {
			if match = pn.matchFor(topic); match == MatchOff {
				pn.metrics.passthrough[passLegacy].Inc()
				continue
			}
		}
		if pl == nil {
			pl = getPlan()
			pl.version, pl.corrID, pl.acks, pl.conn = h.APIVersion, h.CorrelationID, acks, conn
			pl.deadline = now.Add(min(time.Duration(max(sc.TimeoutMillis, 0))*time.Millisecond, maxWaitTimeout) + waitMargin)
			pl.fill = fill
		}
		pl.decisions = append(pl.decisions, produceDecision{ti: part.TopicIndex, pi: part.PartitionIndex, maxTS: bh.MaxTimestamp})
		i := len(pl.decisions) - 1
		d := &pl.decisions[i]
		if bh.ProducerID < 0 {
			pn.planLegacy(pl, i, part, &bh, seqstate.Key{ProducerID: -1, Topic: topic, Partition: part.Partition, Principal: principal}, match == MatchExact, now)
			continue
		}
		d.key = seqstate.Key{ProducerID: bh.ProducerID, Topic: topic, Partition: part.Partition, Principal: principal}
		d.batch = seqstate.Batch{Epoch: bh.ProducerEpoch, FirstSeq: bh.BaseSequence, Count: bh.LastOffsetDelta + 1,
			Fingerprint: protocol.RecordsFingerprint(part.Records, &bh)}
		pl.seqOps = append(pl.seqOps, seqstate.Op{Key: d.key, Batch: d.batch})
		pl.idem = append(pl.idem, idemBatch{i: i, part: *part, bh: bh})
	}
	if pl != nil && len(pl.seqOps) > 0 {
		pn.planIdempotent(pl, enforce, now)
	}
	if pl != nil && pl.moved {
		pn.settleMoved(pl, now)
	}
	return pl
}

// planIdempotent decides the idempotent batches plan stashed in pl.seqOps,
// all under one shard lock (a request's batches share a producer id), then
// acts on each decision in request order.
func (pn *planner) planIdempotent(pl *producePlan, enforce bool, now time.Time) {
	acks := pl.acks
	// acks=0 has no response to commit from: consult the table only.
	if acks == 0 {
		pn.table.DecideBatches(pl.seqOps, now)
	} else {
		pn.table.CheckBatches(pl.seqOps, now)
	}
	for j := range pl.idem {
		i, part, bh, topic := pl.idem[j].i, &pl.idem[j].part, pl.idem[j].bh, pl.seqOps[j].Key.Topic
		d := &pl.decisions[i]
		d.result = pl.seqOps[j].Result
		if enforce && acks == -1 && d.result.Decision == seqstate.InFlight {
			testHook("inflight")
			pn.wait(pl, i, now)
		}
		pn.metrics.countDecision(d.result.Decision)
		// Kafka validates a batch before its duplicate check (§2.1 rows
		// 4–12): the proxy answers only a batch the broker would not
		// reject on its own. A CRC pass over the batch: only on the
		// paths that answer.
		answerable := func() bool { return enforce && pl.filled() && protocol.BatchValid(part.Records, &bh) == 0 }
		switch r := d.result; r.Decision {
		case seqstate.Accept:
			d.pending = acks != 0
			d.commit = acks != 0
			if d.pending {
				pn.pending.Add(1)
			}
		case seqstate.Duplicate:
			// Only acks=all appends are committed with their offset (see
			// complete), so a known offset is a durable one. A duplicate
			// of a batch committed without one (REQUEST_TIMED_OUT, acks=1)
			// goes to the broker, whose own duplicate check answers with
			// the real offset.
			if r.BaseOffset >= 0 && answerable() {
				d.act = actAnswer
				d.local = protocol.LocalPartitionResult{BaseOffset: r.BaseOffset, LogAppendTime: r.MaxTimestamp, LogStartOffset: pn.logStart.get(d.key)}
				pn.metrics.dupAnswered[dupByProxy].Inc()
			} else {
				pn.metrics.dupAnswered[dupByBroker].Inc()
			}
		case seqstate.InFlight:
			if d.waited {
				d.act = actWait
			} else {
				d.commit = acks != 0 // acks=1: the broker decides; it may commit the original
			}
		case seqstate.SequenceReuse:
			// Kafka would answer success and silently drop these records.
			if answerable() {
				d.act = actAnswer
				d.local = protocol.LocalPartitionResult{ErrorCode: kerr.OutOfOrderSequenceNumber.Code, BaseOffset: -1, LogAppendTime: -1, LogStartOffset: pn.logStart.get(d.key)}
				pl.reuse = true
			}
		case seqstate.OutOfOrder, seqstate.Fenced:
			// Counted, and the broker decides: it answers 45/47 itself
			// when they are real. If it appends, the table follows.
			d.commit = acks != 0
		}
		if header, ok := pn.keyHeaderFor(topic); ok && d.act == actForward && d.commit && pl.filled() {
			pn.applyKeys(pl, i, part, &bh, header, false /* drop */, now)
		}
		pl.account(d)
	}
	// Its slices alias the request body, which the pooled plan outlives.
	clear(pl.idem)
	pl.idem = pl.idem[:0]
}

// filled reads the request's holes back, if it has any (see fill).
func (pl *producePlan) filled() bool {
	if pl.fill == nil {
		return true
	}
	if !pl.fill() {
		return false // and stays so: the connection closes
	}
	pl.fill = nil
	return true
}

// lookupTopic returns the table's key for a topic named in a Produce
// request or response: by ID from v13 (KIP-516), by name before.
func (pn *planner) lookupTopic(version int16, name []byte, id [16]byte) (seqstate.TopicID, bool) {
	if version >= 13 {
		return pn.table.LookupTopicID(id)
	}
	return pn.table.LookupTopic(name)
}

// account records where decision d goes.
func (pl *producePlan) account(d *produceDecision) {
	switch d.act {
	case actForward:
		pl.anyUp = true
	case actRebatch:
		pl.anyUp, pl.anyLocal = true, true
	default:
		pl.anyLocal = true
	}
}

// planLegacy decides decision i of pl, a legacy batch (docs/legacy.md):
// a retry of a batch appended with acks=all and acknowledged on another
// connection is answered with the original's offset; a retry of one in
// flight from another connection waits for its outcome; everything else is
// forwarded and, with acks=all, remembered once appended.
func (pn *planner) planLegacy(pl *producePlan, i int, part *protocol.ProducePartition, bh *protocol.BatchHeader, key seqstate.Key, exact bool, now time.Time) {
	d := &pl.decisions[i]
	d.legacy = true
	d.key = key
	topic := key.Topic
	d.batch.Count, d.size = bh.NumRecords, bh.RecordsLen()
	d.first = protocol.FirstRecordHash(part.Records, bh)
	d.ident = protocol.MixIdentity(protocol.RecordsIdentity(part.Records, bh, exact), uint32(topic), key.Principal)
	enforce := pn.settings.Load().mode == DedupEnforce
	d.lresult = pn.legacy.Check(d.ident, part.Partition, pl.conn, now)
	if enforce && d.lresult.Decision == seqstate.LegacyInFlight {
		testHook("inflight")
		pn.wait(pl, i, now)
	}
	_, keyed := pn.keyHeaderFor(topic)
	if d.lresult.Decision == seqstate.LegacyNew {
		d.pending, d.commit = d.lresult.Tracked, true
		if d.pending {
			pn.pending.Add(1)
		}
		// Records of an unacknowledged append come back one by one, and
		// they may begin a re-batched retry too: followed one by one,
		// they are all found (resent.go); the prefix alone would let the
		// records behind it through.
		if enforce && !exact && !keyed && !d.lresult.Moved && pn.unackedLive(now) {
			pn.applyResent(pl, i, part, bh, now)
		}
	}
	if enforce && !exact && d.act == actForward && d.lresult.Decision == seqstate.LegacyNew && d.lresult.Tracked && bh.NumRecords > 1 {
		pn.matchRebatch(pl, i, part, bh, now)
	}
	if enforce && d.lresult.Decision == seqstate.LegacyNew && d.lresult.Moved && d.act == actForward {
		// Keyed topics decide by key instead; an invalid batch is the
		// broker's to reject.
		if !keyed && protocol.BatchValid(part.Records, bh) == 0 {
			d.moved, pl.moved = true, true // counted by settleMoved
		}
	}
	switch {
	case d.act == actRebatch:
		pl.retried = true
		pn.metrics.legacyRebatched.Inc()
	case !d.moved:
		pn.metrics.countLegacy(d.lresult.Decision)
	}
	switch r := d.lresult; r.Decision {
	case seqstate.LegacyNew:
		if header, ok := pn.keyHeaderFor(topic); ok && d.act == actForward {
			pn.applyKeys(pl, i, part, bh, header, enforce, now)
		}
	case seqstate.LegacyInFlight:
		if d.waited {
			d.act = actWait
		}
	case seqstate.LegacyDuplicate:
		// Answered like Kafka answers an idempotent duplicate: error 0,
		// the original's offset and append time. An original appended
		// without an offset in its response (REQUEST_TIMED_OUT) gives
		// offset -1: Kafka has it, the response did not say where, and
		// forwarding would write it twice.
		if enforce && protocol.BatchValid(part.Records, bh) == 0 {
			d.act = actAnswer
			d.local = protocol.LocalPartitionResult{BaseOffset: r.BaseOffset, LogAppendTime: r.LogAppendTime, LogStartOffset: pn.logStart.get(d.key)}
			pn.metrics.dupAnswered[dupByProxy].Inc()
			pl.retried = true
		} else {
			pn.metrics.dupAnswered[dupByBroker].Inc()
		}
	}
	pl.account(d)
}

// settleMoved decides the moved legacy batches of pl (Check's Moved: the
// same records appended to another partition, acknowledged on a connection
// still open). Alone they are new data, a record broadcast to every
// partition. Beside a batch answered as a retry they are part of that
// retry: kafkajs assigns partitions afresh on each attempt and resends only
// to the brokers that did not answer, so its retry carries records another
// broker acknowledged (docs/legacy.md, rule 4). They are answered like a
// retry that moved: error 0, offset -1, since the records are in the
// original's partition.
func (pn *planner) settleMoved(pl *producePlan, now time.Time) {
	pl.anyLocal, pl.anyUp = false, false
	for i := range pl.decisions {
		d := &pl.decisions[i]
		if d.moved && pl.retried {
			ts := d.lresult.LogAppendTime
			pn.legacy.Commit(d.ident, pl.conn, -1, ts, now)
			pn.pending.Add(-1)
			d.pending, d.commit = false, false
			d.act = actAnswer
			d.lresult = seqstate.LegacyResult{Decision: seqstate.LegacyDuplicate, BaseOffset: -1, LogAppendTime: ts}
			d.local = protocol.LocalPartitionResult{BaseOffset: -1, LogAppendTime: ts, LogStartOffset: pn.logStart.get(d.key)}
			pn.metrics.dupAnswered[dupByProxy].Inc()
		}
		if d.moved {
			pn.metrics.countLegacy(d.lresult.Decision)
		}
		pl.account(d)
	}
}

// wait registers decision i of pl, found in flight, as waiting for its
// original. The table is checked again under waitMu, with nWaiting raised
// first: a resolve updates the table before it looks for waiters, so either
// it finds this one or this check sees the outcome it committed. In the
// second case the fresh result replaces the decision's and nothing waits.
func (pn *planner) wait(pl *producePlan, i int, now time.Time) {
	d := &pl.decisions[i]
	pn.waitMu.Lock()
	defer pn.waitMu.Unlock()
	pn.nWaiting.Add(1)
	var inFlight bool
	if d.legacy {
		d.lresult = pn.legacy.Check(d.ident, d.key.Partition, pl.conn, now)
		inFlight = d.lresult.Decision == seqstate.LegacyInFlight
	} else {
		d.result = pn.table.Check(d.key, d.batch, now)
		inFlight = d.result.Decision == seqstate.InFlight
	}
	if !inFlight {
		pn.nWaiting.Add(-1)
		return
	}
	wk := waitKeyOf(d)
	pn.waiters[wk] = append(pn.waiters[wk], waiter{pl, i})
	d.waiting, d.waited = true, true
	pl.nWaits++
}

// waitsDone reports whether every wait of pl is resolved.
func (pn *planner) waitsDone(pl *producePlan) bool {
	pn.waitMu.Lock()
	defer pn.waitMu.Unlock()
	return pl.nWaits == 0
}

// resolve hands the outcome of decision d to every request waiting on it.
// The caller has updated the table first (see wait). Waiters inherit only a
// success: an error was the broker's answer to another request, and a
// waiter is decided afresh instead — answered REQUEST_TIMED_OUT, which every
// client retries, and its retry goes to the broker (docs/security.md).
func (pn *planner) resolve(d *produceDecision, r protocol.LocalPartitionResult) {
	if pn.nWaiting.Load() == 0 {
		return
	}
	if r.ErrorCode != 0 {
		r = timedOut
	}
	wk := waitKeyOf(d)
	pn.waitMu.Lock()
	ws := pn.waiters[wk]
	delete(pn.waiters, wk)
	pn.nWaiting.Add(-int64(len(ws)))
	for _, w := range ws {
		wd := &w.pl.decisions[w.i]
		wd.local, wd.waiting = r, false
		if w.pl.nWaits--; w.pl.nWaits == 0 {
			select {
			case w.pl.ready <- struct{}{}:
			default:
			}
		}
	}
	pn.waitMu.Unlock()
}

// abandonWaits answers every unresolved wait of pl with REQUEST_TIMED_OUT
// and forgets it: its deadline passed, or its connection is closing.
func (pn *planner) abandonWaits(pl *producePlan) {
	pn.waitMu.Lock()
	defer pn.waitMu.Unlock()
	for i := range pl.decisions {
		d := &pl.decisions[i]
		if !d.waiting {
			continue
		}
		wk := waitKeyOf(d)
		ws := pn.waiters[wk]
		for j, w := range ws {
			if w.pl == pl && w.i == i {
				ws = append(ws[:j], ws[j+1:]...)
				pn.nWaiting.Add(-1)
				break
			}
		}
		if len(ws) == 0 {
			delete(pn.waiters, wk)
		} else {
			pn.waiters[wk] = ws
		}
		d.waiting, d.local = false, timedOut
		pl.nWaits--
	}
}

// fail settles pl when its upstream response will never come (the broker
// connection failed, or the connection is torn down): every batch still
// pending is released, its fate unknown, and its waiters get
// REQUEST_TIMED_OUT; pl's own waits are abandoned. It is idempotent.
func (pn *planner) fail(pl *producePlan) {
	for i := range pl.decisions {
		d := &pl.decisions[i]
		d.commit = false
		if d.pending {
			d.pending = false
			pn.pending.Add(-1)
			if d.legacy {
				pn.legacy.Release(d.ident, pl.conn)
				// Its fate is unknown: the partition's log will tell,
				// so it is read again on the next touch (warm.go).
				pn.warm.forget(d.key)
				pn.resolve(d, timedOut)
			} else {
				pl.seqOuts = append(pl.seqOuts, seqstate.Outcome{Key: d.key, Batch: d.batch})
				pl.settled = append(pl.settled, idemSettled{d: d, resolve: true, outcome: timedOut})
			}
		}
	}
	pn.settleIdempotent(pl, time.Time{}) // releases only: no time needed
	pn.abandonWaits(pl)
}

// settleIdempotent applies pl.seqOuts to the table under one shard lock,
// then resolves the waiters of the pending ones: a resolve follows the
// table update (see wait).
func (pn *planner) settleIdempotent(pl *producePlan, now time.Time) {
	if len(pl.seqOuts) == 0 {
		return
	}
	pn.table.SettleBatches(pl.seqOuts, now)
	for _, st := range pl.settled {
		if st.resolve {
			pn.resolve(st.d, st.outcome)
		}
	}
	pl.seqOuts, pl.settled = pl.seqOuts[:0], pl.settled[:0]
}

// complete applies the broker's response to what pl sent upstream (body is
// the response body after its header): appended batches are committed with
// their offsets, the others released, and waiters get the same outcome. A
// batch the response does not mention is released. sc is the caller's
// reusable scanner.
func (pn *planner) complete(pl *producePlan, sc *protocol.ProduceResponseScanner, body []byte, now time.Time) error {
	if err := sc.Reset(body, pl.version); err != nil {
		pn.fail(pl)
		return err
	}
	cursor := 0
	anyError := false // some partition of the response failed
	for sc.Next() {
		pr := sc.Partition()
		anyError = anyError || pr.ErrorCode != 0
		topic, ok := pn.lookupTopic(pl.version, pr.Topic, pr.TopicID)
		if !ok {
			continue
		}
		// Brokers answer in request order in practice, so the decision at
		// the cursor is nearly always the one; Kafka does not promise it.
		d := pl.find(topic, pr.Partition, &cursor)
		if d == nil {
			continue
		}
		pn.logStart.set(d.key, pr.LogStartOffset)
		outcome := protocol.LocalPartitionResult{ErrorCode: pr.ErrorCode, BaseOffset: pr.BaseOffset, LogAppendTime: pr.LogAppendTime, LogStartOffset: pr.LogStartOffset}
		switch pr.ErrorCode {
		case 0, kerr.RequestTimedOut.Code, kerr.NotEnoughReplicasAfterAppend.Code:
			// Kafka counts these as appended (docs/kafka-rules.md §2.1
			// row 16): its producer state moved, so ours does too.
			ts := pr.LogAppendTime
			if ts < 0 {
				ts = d.maxTS
			}
			// Only an acks=all append is durable: an unclean leader
			// election can lose an acks=1 one, and a retry the new
			// leader never saw must be written. Without an offset, a
			// later retry goes to the broker.
			off := pr.BaseOffset
			if pr.ErrorCode != 0 || pl.acks != -1 {
				off = -1
			}
			switch {
			case !d.legacy:
				pl.seqOuts = append(pl.seqOuts, seqstate.Outcome{Key: d.key, Batch: d.batch, Appended: true, BaseOffset: off, MaxTimestamp: ts})
			case d.act == actRebatch:
				pn.completeRebatch(pl, d, pr, off, ts, now)
			case !d.pending:
				// Not registered (the same records are in flight to
				// another partition): nothing to commit but its keys.
			case pl.acks == -1:
				pn.legacy.Commit(d.ident, pl.conn, off, ts, now)
				d.legacyAppended = true
				if pr.ErrorCode != 0 {
					// Appended (REQUEST_TIMED_OUT and the like), but the
					// client got an error, not an acknowledgement: its
					// retry, even on this connection, is a retry. The log
					// has the offset; reading the partition again before
					// the retry finds it (warm.go).
					pn.disown(pl, d, now)
					pn.warm.forget(d.key)
				}
			default:
				// A legacy acks=1 append is not remembered: a retry of
				// it is written again, as without the proxy.
				pn.legacy.Release(d.ident, pl.conn)
			}
			if d.keysEnd > d.keysAt && pl.acks == -1 {
				// Like legacy batches, only a durable append makes its
				// keys known: an unclean leader election can lose an
				// acks=1 one, and its resend must then be written.
				pn.commitKeys(pl, d, off, now)
			}
			if pr.ErrorCode == 0 {
				outcome.LogAppendTime = ts // what a retry of it is answered with
			}
		default:
			switch {
			case d.legacy && d.pending:
				pn.legacy.Release(d.ident, pl.conn)
			case d.pending:
				pl.seqOuts = append(pl.seqOuts, seqstate.Outcome{Key: d.key, Batch: d.batch})
			}
			if d.act == actRebatch {
				d.local = outcome // the broker's error, for the whole retry
			}
		}
		wasPending := d.pending
		d.pending, d.commit = false, false
		if wasPending {
			pn.pending.Add(-1)
		}
		if d.act == actRebatch {
			outcome = d.local
		}
		switch {
		case !d.legacy && len(pl.seqOuts) > len(pl.settled):
			// resolved once the table has the outcome (see wait)
			pl.settled = append(pl.settled, idemSettled{d: d, resolve: wasPending, outcome: outcome})
		case wasPending:
			pn.resolve(d, outcome)
		}
	}
	pn.settleIdempotent(pl, now)
	err := sc.Err()
	if anyError {
		// kafkajs resends every record of a request when any partition
		// of it failed, even those appended: their acknowledgement on
		// this connection does not make a resend new data.
		for i := range pl.decisions {
			if d := &pl.decisions[i]; d.legacyAppended {
				pn.disown(pl, d, now)
			}
		}
	}
	pn.fail(pl) // anything the response did not mention
	return err
}

// disown records that legacy batch d, appended, may be sent again by a
// client that holds no acknowledgement for it: an identical batch from any
// connection is its retry (LegacyTable.Disown), and so is a bigger batch
// that begins with its records — a client that puts failed records back in
// its queue (sarama, librdkafka) re-batches them with newer ones.
func (pn *planner) disown(pl *producePlan, d *produceDecision, now time.Time) {
	pn.legacy.Disown(d.ident, pl.conn)
	ref := legacyRef{id: d.ident, topic: d.key.Topic, partition: d.key.Partition, count: d.batch.Count, size: d.size, first: d.first}
	pn.orphans.add([]legacyRef{ref}, now.Add(pn.legacyWindow).UnixNano())
}

// completeRebatch settles a re-batched retry whose new records the broker
// appended at off (-1 if its response carried none) and sets its answer:
// error 0, and the prefix's base offset when the new records follow it
// directly (then one base offset is true for the whole batch), -1
// otherwise. The client is never told a wrong offset.
func (pn *planner) completeRebatch(pl *producePlan, d *produceDecision, pr *protocol.ProduceResponsePartition, off, ts int64, now time.Time) {
	answer := int64(-1)
	if p := d.prefixResult.BaseOffset; !d.keyDrop && p >= 0 && off >= 0 && off == p+int64(d.prefix.count) {
		answer = p
	}
	if pl.acks == -1 {
		pn.legacy.Commit(d.ident, pl.conn, answer, ts, now)
	} else {
		pn.legacy.Release(d.ident, pl.conn)
	}
	if !d.keyDrop {
		pn.legacy.Adopt(d.prefix.id, pl.conn, now)
	}
	// REQUEST_TIMED_OUT and NOT_ENOUGH_REPLICAS_AFTER_APPEND mean
	// appended: answered as success, as for a legacy duplicate.
	d.local = protocol.LocalPartitionResult{BaseOffset: answer, LogAppendTime: ts, LogStartOffset: pr.LogStartOffset}
}

// find returns the forwarded, not yet completed decision for
// topic/partition, searching from *cursor and leaving it after the match.
func (pl *producePlan) find(topic seqstate.TopicID, partition int32, cursor *int) *produceDecision {
	n := len(pl.decisions)
	for i := 0; i < n; i++ {
		j := (*cursor + i) % n
		d := &pl.decisions[j]
		if (d.act == actForward || d.act == actRebatch) && (d.pending || d.commit) && d.key.Topic == topic && d.key.Partition == partition {
			*cursor = j + 1
			return d
		}
	}
	return nil
}

// answer appends to dst the client's Produce response frame (size prefix
// included) for a plan the proxy answered at least partly itself: its own
// answers merged, in request order, with upBody, the broker's response body
// to the reduced request (nil when nothing went upstream). Call it once
// every wait is resolved or abandoned.
func (pn *planner) answer(dst []byte, pl *producePlan, upBody []byte) ([]byte, error) {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = protocol.AppendResponseHeader(dst, int16(kmsg.Produce), pl.version, pl.corrID)
	di := 0
	out, err := protocol.MergeProduceResponse(dst, pl.version, pl.skeleton, upBody, func(ti, pi int) (protocol.LocalPartitionResult, bool) {
		// decisions are in request order, so a cursor finds each one.
		for ; di < len(pl.decisions); di++ {
			d := &pl.decisions[di]
			if d.ti > ti || (d.ti == ti && d.pi > pi) {
				break
			}
			if d.ti == ti && d.pi == pi {
				return d.local, d.act != actForward
			}
		}
		return protocol.LocalPartitionResult{}, false
	})
	if err != nil {
		return dst[:start], err
	}
	size := uint32(len(out) - start - 4)
	out[start], out[start+1], out[start+2], out[start+3] = byte(size>>24), byte(size>>16), byte(size>>8), byte(size)
	return out, nil
}

// keepUpstream reports, for a reduced request, whether partition (ti, pi)
// goes upstream, and the records to send instead of its own (a re-batched
// retry's rebuilt batch). Partitions the planner did not decide always go.
func (pl *producePlan) keepUpstream(cursor *int, ti, pi int) (bool, []byte) {
	for ; *cursor < len(pl.decisions); *cursor++ {
		d := &pl.decisions[*cursor]
		if d.ti > ti || (d.ti == ti && d.pi > pi) {
			break
		}
		if d.ti == ti && d.pi == pi {
			if d.act == actRebatch {
				return true, pl.rebuilt[d.rebuiltAt:d.rebuiltEnd]
			}
			return d.act == actForward, nil
		}
	}
	return true, nil
}

// logStartOffsets keeps the last log start offset seen per partition, for
// the proxy's own answers (Kafka's carry the current one). It is sharded so
// that commits on different partitions do not share a lock, bounded, and
// written only when the value changes.
type logStartOffsets struct {
	shards [logStartShards]logStartShard
}

const (
	logStartShards   = 64
	logStartPerShard = 4096 // 256 Ki partitions in all
)

type logStartShard struct {
	mu sync.Mutex
	m  map[seqstate.Key]int64 // ProducerID 0: per partition
	_  [40]byte               // own cache line
}

func (l *logStartOffsets) init() {
	for i := range l.shards {
		l.shards[i].m = map[seqstate.Key]int64{}
	}
}

func (l *logStartOffsets) shard(k seqstate.Key) *logStartShard {
	h := (uint64(k.Topic)<<32 | uint64(uint32(k.Partition))) * 0x9e3779b97f4a7c15
	return &l.shards[h>>(64-6)]
}

// get returns the log start offset of k's partition, or -1 when unknown.
func (l *logStartOffsets) get(k seqstate.Key) int64 {
	k = k.PartitionKey()
	s := l.shard(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.m[k]; ok {
		return v
	}
	return -1
}

func (l *logStartOffsets) set(k seqstate.Key, v int64) {
	if v < 0 {
		return
	}
	k = k.PartitionKey()
	s := l.shard(k)
	s.mu.Lock()
	if old, ok := s.m[k]; !ok || old != v {
		if !ok && len(s.m) >= logStartPerShard {
			for victim := range s.m { // any one: a forgotten value only means -1 in an answer
				delete(s.m, victim)
				break
			}
		}
		s.m[k] = v
	}
	s.mu.Unlock()
}
