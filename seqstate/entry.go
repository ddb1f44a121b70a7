package seqstate

import "math"

// This file is the pure decision core: functions of one entry's memory and
// their arguments only. No locks, no clock, no I/O, no allocation. The Table
// (table.go) finds the memory, holds the shard lock and supplies the time.

// header is the fixed part of one (producer, partition) entry. It and the
// slots hold no pointers, so the slabs that store them are never scanned by
// the garbage collector.
type header struct {
	key Key // the entry's key, for the shard's index and eviction
	// lastSeen is the Unix-nanosecond time of the last state change: a batch
	// registered by Check or applied by Commit. It drives expiry, like
	// ProducerStateEntry.lastTimestamp; duplicates and rejections do not
	// refresh it, as they change no state in Kafka either
	// (docs/kafka-rules.md §6.1).
	lastSeen int64
	// offBase and tsBase are what the slots' 32-bit deltas are relative to
	// (see slot). They move only when a value does not fit.
	offBase int64
	tsBase  int64
	// epoch is the epoch of every batch in the window. Kafka clears the
	// retained batches whenever the epoch changes
	// (ProducerStateEntry.maybeUpdateProducerEpoch), so one epoch suffices.
	// prev and next link the shard's LRU list: the slab indexes of the
	// next more and next less recently used entries, or nilIndex.
	prev, next int32
	// first is the first sequence of the oldest batch in the window. The
	// window's batches are contiguous (see push), so each later batch starts
	// one after its predecessor's last sequence and slots keep only that.
	first int32
	epoch int16
	head  uint8 // ring index of the oldest slot
	n     uint8 // slots in use
}

// slot is one batch in the window: Kafka's BatchMetadata (lastSeq, lastOffset,
// offsetDelta, timestamp) in the form the proxy answers with, plus the records
// fingerprint and a pending flag. 16 bytes. Its first sequence is not stored:
// it is one after the previous slot's last (header.first for the oldest).
//
// The base offset and max timestamp are stored exactly, but compactly: as
// 32-bit deltas from the header's offBase and tsBase, which suits a window
// (a producer's last few batches to one partition lie close together in
// offset and time). -1 (no offset, e.g. after REQUEST_TIMED_OUT) has its own
// code, nilDelta. A value whose delta does not fit moves the bases to it (the
// others are re-encoded); any that then do not fit are kept whole in the
// shard's wide map, marked by offDelta == wideDelta. See entry.setOffsets.
type slot struct {
	// last is the last sequence. Sequences are in [0, 2^31-1], so bit 31 is
	// free and marks a batch still pending upstream.
	last        uint32
	fingerprint uint32 // Batch.Fingerprint; 0 = unknown
	offDelta    int32  // baseOffset - offBase, nilDelta or wideDelta; unused while pending
	tsDelta     int32  // maxTimestamp - tsBase or nilDelta; unused while pending or wide
}

const (
	wideDelta = math.MinInt32     // the slot's values are in the wide map
	nilDelta  = math.MinInt32 + 1 // the value is -1
	minDelta  = math.MinInt32 + 2 // smallest ordinary delta
)

// encodeDelta returns x as a delta from base, if it fits.
func encodeDelta(x, base int64) (int32, bool) {
	if x == -1 {
		return nilDelta, true
	}
	d := x - base
	if (x^base)&(x^d) < 0 || d < minDelta || d > math.MaxInt32 { // overflowed, or out of range
		return 0, false
	}
	return int32(d), true
}

func decodeDelta(d int32, base int64) int64 {
	if d == nilDelta {
		return -1
	}
	return base + int64(d)
}

// wideMap holds, per shard, the exact values of slots whose deltas do not
// fit, keyed by the slot's address (a slab page moves only while it is a
// shard's only page, and shard.resizeFirst re-keys them). It is empty
// unless offsets or timestamps within one window are more than 2^31 apart.
type wideMap map[*slot][2]int64

const pendingBit = 1 << 31

func (s *slot) pending() bool  { return s.last&pendingBit != 0 }
func (s *slot) lastSeq() int32 { return int32(s.last &^ pendingBit) }

// entry is a view of one entry: its header and its ring of len(s) slots
// (Config.RetainedBatches). The window is the n slots from head, oldest
// first, in the order the batches were accepted. Committed and pending
// batches share it: the window is Kafka's committed state with the batches in
// flight appended, which is the state the broker will have if they succeed.
//
// It is three words, so that it and a Batch pass in registers: the ring is an
// array pointer whose first len() elements are the entry's, and the shard
// supplies the length and the wide map. The absent entry has neither; it
// holds no batches, so nothing reaches them.
type entry struct {
	h  *header
	s  *[MaxRetainedBatches]slot
	sh *shard
}

// len is the ring's length, Config.RetainedBatches.
func (e entry) len() int { return e.sh.retained }

func (e entry) at(i int) *slot { return &e.s[e.pos(i)] }

// pos is the ring position of window index i.
func (e entry) pos(i int) int {
	j := int(e.h.head) + i
	if r := e.len(); j >= r {
		j -= r
	}
	return j & (MaxRetainedBatches - 1)
}

// offsets returns the base offset and max timestamp of the slot at ring
// position j: -1, -1 while it is pending.
func (e entry) offsets(j int) (baseOffset, maxTimestamp int64) {
	s := &e.s[j]
	switch {
	case s.pending():
		return -1, -1
	case s.offDelta == wideDelta:
		v := e.sh.wide[s]
		return v[0], v[1]
	}
	return decodeDelta(s.offDelta, e.h.offBase), decodeDelta(s.tsDelta, e.h.tsBase)
}

// setOffsets stores the values of the committed slot at ring position j,
// exactly. If they do not fit as deltas from the bases, the bases move to
// them and the window's other committed slots are re-encoded; a slot that
// then does not fit goes to the wide map. Only a wide map insertion can
// allocate.
func (e entry) setOffsets(j int, off, ts int64) {
	s := &e.s[j]
	e.clearWide(j)
	od, ok1 := encodeDelta(off, e.h.offBase)
	td, ok2 := encodeDelta(ts, e.h.tsBase)
	if ok1 && ok2 {
		s.offDelta, s.tsDelta = od, td
		return
	}
	oldOff, oldTs := e.h.offBase, e.h.tsBase
	if off != -1 {
		e.h.offBase = off
	}
	if ts != -1 {
		e.h.tsBase = ts
	}
	for i := 0; i < int(e.h.n); i++ {
		k := e.pos(i)
		o := &e.s[k]
		if k == j || o.pending() || o.offDelta == wideDelta {
			continue
		}
		ov, tv := decodeDelta(o.offDelta, oldOff), decodeDelta(o.tsDelta, oldTs)
		od, ok1 := encodeDelta(ov, e.h.offBase)
		td, ok2 := encodeDelta(tv, e.h.tsBase)
		if ok1 && ok2 {
			o.offDelta, o.tsDelta = od, td
		} else {
			e.putWide(k, ov, tv)
		}
	}
	s.offDelta, _ = encodeDelta(off, e.h.offBase)
	s.tsDelta, _ = encodeDelta(ts, e.h.tsBase)
}

func (e entry) putWide(j int, off, ts int64) {
	if e.sh.wide == nil {
		e.sh.wide = wideMap{}
	}
	e.sh.wide[&e.s[j]] = [2]int64{off, ts}
	e.s[j].offDelta = wideDelta
}

// clearWide forgets the wide values of ring position j, if any, before the
// slot is overwritten: a wideDelta mark and a wide map key exist together.
func (e entry) clearWide(j int) {
	if e.s[j].offDelta == wideDelta {
		delete(e.sh.wide, &e.s[j])
		e.s[j].offDelta = 0
	}
}

// find returns the index in the window of the batch with exactly this
// sequence range, or -1: ProducerStateEntry.batchWithSequenceRange, where both
// ends must match, so a partial overlap is not a duplicate. Kafka returns the
// first match; a window never holds two batches with the same range (it spans
// fewer than 2^31 sequences, see push), so scanning from the newest, where
// commits and most retries land, finds the same one.
func (e entry) find(first, last int32) int {
	n := int(e.h.n)
	if n == 0 {
		return -1 // also keeps the absent entry, with no shard, out
	}
	r := e.len()
	j := int(e.h.head) + n - 1
	if j >= r {
		j -= r
	}
	for i := n - 1; i >= 0; i-- {
		if e.s[j&(MaxRetainedBatches-1)].last&^pendingBit == uint32(last) {
			// Last sequences are distinct too, for the same reason.
			if e.firstOf(i) == first {
				return i
			}
			return -1
		}
		if j--; j < 0 {
			j = r - 1
		}
	}
	return -1
}

// firstOf is the first sequence of the batch at window index i.
func (e entry) firstOf(i int) int32 {
	if i == 0 {
		return e.h.first
	}
	return incrementSequence(e.at(i-1).lastSeq(), 1)
}

// lastSeq is ProducerStateEntry.lastSeq(): the newest batch's last sequence,
// or NO_SEQUENCE when the window is empty.
func (e entry) lastSeq() int32 {
	if e.h.n == 0 {
		return noSequence
	}
	return e.at(int(e.h.n) - 1).lastSeq()
}

// absentHeader is the state of a key with no entry: ProducerStateEntry.empty,
// whose epoch is NO_PRODUCER_EPOCH and which retains no batches. Only decide
// reads it, so concurrent use is safe.
var absentHeader = header{epoch: noProducerEpoch}

// absent is the view of a key with no entry.
func absent() entry { return entry{h: &absentHeader} }

// decideLast is Kafka's decision for batch b, whose last sequence is last,
// against this entry, in Kafka's order: the duplicate check, then the epoch
// check, then the sequence check. It does not change the entry.
func (e entry) decideLast(b Batch, last int32) Result {
	epoch := e.h.epoch

	// The common case, a producer's next batch: the window spans fewer than
	// 2^31 sequences and is contiguous (see push), so a batch starting right
	// after its last sequence matches none of its batches and is in sequence.
	if b.Epoch == epoch && e.h.n > 0 && inSequence(e.lastSeq(), b.FirstSeq) {
		return result(Accept)
	}

	// UnifiedLog.analyzeAndValidateProducerState, then
	// ProducerStateEntry.findDuplicateBatch: same epoch and an exact
	// (firstSeq, lastSeq) match among the retained batches. It runs before the
	// epoch and sequence checks, so a duplicate is never out of order.
	if b.Epoch == epoch {
		if i := e.find(b.FirstSeq, last); i >= 0 {
			s := e.at(i)
			if b.Fingerprint != 0 && s.fingerprint != 0 && b.Fingerprint != s.fingerprint {
				// Not in Kafka: kafkajs reuses sequences for new records
				// after a failed send (sendMessages.js; see SequenceReuse).
				return result(SequenceReuse)
			}
			if s.pending() {
				return result(InFlight)
			}
			off, ts := e.offsets(e.pos(i))
			return Result{Decision: Duplicate, BaseOffset: off, MaxTimestamp: ts}
		}
	}

	// ProducerAppendInfo.checkProducerEpoch: a lower epoch is fenced, even if
	// the batch would otherwise be a duplicate. An absent entry has epoch -1,
	// so only epochs below -1 are fenced there.
	if b.Epoch < epoch {
		return result(Fenced)
	}

	// ProducerAppendInfo.checkSequence.
	if b.Epoch != epoch {
		// A higher epoch must start at 0 ("Invalid sequence number for new
		// epoch"), unless the partition has no state for the producer: since
		// Kafka 2.5 (KIP-360, KAFKA-8710) that accepts any sequence.
		if b.FirstSeq != 0 && epoch != noProducerEpoch {
			return result(OutOfOrder)
		}
		return result(Accept)
	}
	// Same epoch: continue at lastSeq+1, wrapping at Integer.MAX_VALUE. An
	// entry whose epoch is NO_PRODUCER_EPOCH accepts any sequence.
	if epoch != noProducerEpoch && !inSequence(e.lastSeq(), b.FirstSeq) {
		return result(OutOfOrder)
	}
	return result(Accept)
}

// push appends a batch to the window and returns its ring position; the
// caller sets its values if it is committed. A full window drops its oldest
// batch, as ProducerStateEntry.addBatchMetadata does. last carries the
// pending bit.
//
// Two invariants make slots smaller and the common check faster, and cost
// nothing a real producer does:
//   - The window is contiguous: each batch starts one after the previous
//     one's last sequence. Within an epoch Check accepts and Commit appends
//     only batches that follow the tail, except when the epoch is
//     NO_PRODUCER_EPOCH (-1), which accepts any sequence; such a batch that
//     does not follow the tail replaces the window instead of joining it.
//   - The window spans at most 2^31-1 sequences, so no two of its batches
//     have the same range and the sequence after its tail starts none of
//     them. Only batches of hundreds of millions of records come near it;
//     the oldest batches are dropped to keep it.
//
// Both only drop batches Kafka would still retain, which makes the table know
// less than the broker, never contradict it: a retry of a dropped batch is
// forwarded, and the broker answers it.
func (e entry) push(first int32, last uint32, count int32, fingerprint uint32) int {
	switch {
	case e.h.n == 0:
	case !inSequence(e.lastSeq(), first):
		e.h.n = 0
	default:
		// Sequences the window spans once the new batch joins it: the
		// window from its first sequence up to the new batch, plus the new
		// batch. It spans at most 2^31-1 before, so the sum cannot wrap.
		for span := seqDistance(e.h.first, first) + uint32(count); span > math.MaxInt32; e.h.n-- {
			span -= seqDistance(e.h.first, e.at(0).lastSeq()) + 1
			e.dropOldest()
		}
	}
	if int(e.h.n) == e.len() {
		e.dropOldest()
		e.h.n--
	}
	if e.h.n == 0 {
		e.h.head, e.h.first = 0, first
	}
	j := e.pos(int(e.h.n))
	e.clearWide(j)
	e.s[j] = slot{last: last, fingerprint: fingerprint}
	e.h.n++
	return j
}

// dropOldest moves the window's start past its oldest batch; the caller
// decrements n.
func (e entry) dropOldest() {
	e.h.first = incrementSequence(e.at(0).lastSeq(), 1)
	if e.h.head++; int(e.h.head) == e.len() {
		e.h.head = 0
	}
}

// seqDistance is how many increments lead from sequence a to sequence b in
// the wrapping sequence space [0, 2^31-1].
func seqDistance(a, b int32) uint32 { return uint32(b-a) & math.MaxInt32 }

// setEpoch is ProducerStateEntry.maybeUpdateProducerEpoch: a different epoch
// clears the retained batches.
func (e entry) setEpoch(epoch int16) {
	if e.h.epoch != epoch {
		e.h.epoch = epoch
		e.h.head, e.h.n = 0, 0
	}
}

// register records an accepted batch as pending: it is the tail that the next
// batch must follow, so a client may pipeline batches (Kafka clients keep up
// to 5 in flight, ProducerConfig.MAX_IN_FLIGHT_REQUESTS_PER_CONNECTION_FOR_IDEMPOTENCE).
//
// Pending batches share the window with committed ones, so a full window drops
// its oldest batch now rather than when this one commits. Every batch a client
// can still retry is one it has not seen acknowledged, and an idempotent client
// keeps at most 5 of those per partition, so with RetainedBatches >= 5 none is
// lost; only a client with more than RetainedBatches in flight can push a
// pending batch out (its Abort is then a no-op and its Commit forgets the
// entry, see commit).
func (e entry) register(b Batch, last int32, now int64) {
	e.setEpoch(b.Epoch)
	e.push(b.FirstSeq, uint32(last)|pendingBit, b.Count, b.Fingerprint)
	e.h.lastSeen = now
}

// appendNext is Check's common case, decided and registered without the
// general path: b is at the entry's epoch and follows its tail, so it is
// accepted (see decideLast) and pushed, and the push is plain (no window
// span to trim, no wide values to clear; see push). It reports false,
// having changed nothing, when that does not apply.
func (e entry) appendNext(b Batch, last int32, now int64) bool {
	// decideLast's first test, then push's plain case.
	if e.h.epoch != b.Epoch || e.h.n == 0 || !inSequence(e.lastSeq(), b.FirstSeq) ||
		seqDistance(e.h.first, b.FirstSeq)+uint32(b.Count) > math.MaxInt32 || len(e.sh.wide) > 0 {
		return false
	}
	if int(e.h.n) == e.len() {
		e.dropOldest()
		e.h.n--
	}
	*e.at(int(e.h.n)) = slot{last: uint32(last) | pendingBit, fingerprint: b.Fingerprint}
	e.h.n++
	e.h.lastSeen = now
	return true
}

// commitNewest is Commit's common case without the general path: b is the
// window's newest batch, pending, and its values fit as deltas (see
// setOffsets). It reports false, having changed nothing, when that does not
// apply.
func (e entry) commitNewest(b Batch, baseOffset, maxTimestamp, now int64) bool {
	if e.h.epoch != b.Epoch || e.h.n == 0 {
		return false
	}
	i := int(e.h.n) - 1
	s := e.at(i)
	if s.last != uint32(b.LastSeq())|pendingBit || e.firstOf(i) != b.FirstSeq {
		return false
	}
	od, ok1 := encodeDelta(baseOffset, e.h.offBase)
	td, ok2 := encodeDelta(maxTimestamp, e.h.tsBase)
	if !ok1 || !ok2 {
		return false
	}
	s.last &^= pendingBit
	s.offDelta, s.tsDelta = od, td
	e.h.lastSeen = now
	return true
}

// outcome tells the Table what to do with the entry after commit or abort.
type outcome uint8

const (
	keep   outcome = iota // the entry is consistent; keep it
	forget                // the table can no longer mirror the broker: drop the entry
)

// passed reports whether b ends before the window's first sequence (within
// half the sequence space, so that a wrapped producer's new batches are
// not taken for old ones).
func (e entry) passed(b Batch) bool {
	d := seqDistance(b.FirstSeq, e.h.first)
	return d >= uint32(b.Count) && d < 1<<30
}

// pendingInto appends to dropped, when it is not nil, the pending batches
// of the window but the one at index skip (-1 for none), with k as their
// key: an abort or a forgotten entry takes them, still on their way to
// the broker.
func (e entry) pendingInto(k Key, skip int, dropped *[]Op) {
	if dropped == nil {
		return
	}
	for j := 0; j < int(e.h.n); j++ {
		if s := e.at(j); j != skip && s.pending() {
			first := e.firstOf(j)
			*dropped = append(*dropped, Op{Key: k, Batch: Batch{Epoch: e.h.epoch, FirstSeq: first,
				Count: int32(seqDistance(first, s.lastSeq())) + 1, Fingerprint: s.fingerprint}})
		}
	}
}

// commit applies an append the broker confirmed.
//
// A pending batch becomes committed in place, with its offsets; earlier batches
// may still be pending (responses on different connections arrive in any
// order). A batch committed twice keeps its first offsets, which are also what
// the broker returns for a duplicate.
//
// A batch the window does not hold (evicted, expired or truncated since Check,
// or never registered because the caller used Decide) is applied the way the
// broker applied it, ProducerStateEntry.addBatch without sequence checks (as
// for origin REPLICATION): a lower epoch is stale and ignored, since the newer
// epoch cleared it (maybeUpdateProducerEpoch); a higher epoch restarts the
// window with it; the same epoch appends it if it follows the tail. Anything
// else means the broker's state and ours disagree, so the entry is forgotten:
// an unknown producer accepts any sequence, so the table can never be stricter
// than the broker.
func (e entry) commit(b Batch, baseOffset, maxTimestamp, now int64) outcome {
	last := b.LastSeq()
	if b.Epoch == e.h.epoch {
		if i := e.find(b.FirstSeq, last); i >= 0 {
			j := e.pos(i)
			if s := &e.s[j]; s.pending() {
				s.last &^= pendingBit
				e.setOffsets(j, baseOffset, maxTimestamp)
				e.h.lastSeen = now
			}
			return keep
		}
	}
	switch {
	case b.Epoch < e.h.epoch:
		return keep
	case b.Epoch == e.h.epoch && e.h.epoch != noProducerEpoch && e.h.n > 0 &&
		!inSequence(e.lastSeq(), b.FirstSeq):
		return forget
	}
	e.setEpoch(b.Epoch)
	e.pushCommitted(b, last, baseOffset, maxTimestamp)
	e.h.lastSeen = now
	return keep
}

// pushCommitted appends a committed batch with its values.
func (e entry) pushCommitted(b Batch, last int32, baseOffset, maxTimestamp int64) {
	e.setOffsets(e.push(b.FirstSeq, uint32(last), b.Count, b.Fingerprint), baseOffset, maxTimestamp)
}

// abort drops a pending batch the broker did not append, and every batch
// after it: the next expected sequence falls back to the batch before it.
// Later pending batches go too, because the broker will reject them as out of
// order when they arrive (ProducerAppendInfo.checkSequence: they no longer
// follow its last sequence); their own Abort is then a no-op, and if the
// broker does append one (it had no state for the producer) its Commit is
// applied as described at commit.
//
// The entry is forgotten, so the producer becomes unknown, when the window
// ends up empty (the entry was created by, or its epoch changed with, the
// aborted batch, so the table no longer knows the broker's state) or when a
// committed batch followed the aborted one (the broker appended a batch
// without its predecessor, which only a stateless producer can do).
//
// A batch that is not pending (unknown, already committed, or already
// dropped) is ignored.
//
// The later pending batches dropped are appended to dropped (with k as
// their key), when it is not nil: they are still on their way to the
// broker, which may yet append one (see Table.SettleBatchesDropped).
func (e entry) abort(k Key, b Batch, dropped *[]Op) outcome {
	if b.Epoch != e.h.epoch {
		return keep
	}
	i := e.find(b.FirstSeq, b.LastSeq())
	if i < 0 || !e.at(i).pending() {
		return keep
	}
	for j := i + 1; j < int(e.h.n); j++ {
		if !e.at(j).pending() {
			e.pendingInto(k, i, dropped)
			return forget
		}
	}
	e.pendingInto(k, i, dropped)
	e.h.n = uint8(i)
	if i == 0 {
		return forget
	}
	return keep
}
