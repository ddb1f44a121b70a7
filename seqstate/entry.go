package seqstate

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
	// refresh it, as they change no state in Kafka either (§6.1).
	lastSeen int64
	// epoch is the epoch of every batch in the window. Kafka clears the
	// retained batches whenever the epoch changes
	// (ProducerStateEntry.maybeUpdateProducerEpoch), so one epoch suffices.
	// prev and next link the shard's LRU list: the slab indexes of the
	// next more and next less recently used entries, or nilIndex.
	prev, next int32
	hash       uint32 // the key's hash in the shard's index
	epoch      int16
	head       uint8 // ring index of the oldest slot
	n          uint8 // slots in use
}

// slot is one batch in the window: Kafka's BatchMetadata (lastSeq, lastOffset,
// offsetDelta, timestamp) in the form the proxy answers with, plus the records
// fingerprint and a pending flag. 32 bytes.
type slot struct {
	baseOffset   int64  // first offset; BatchMetadata.firstOffset()
	maxTimestamp int64  // BatchMetadata.timestamp
	fingerprint  uint64 // Batch.Fingerprint; 0 = unknown
	// first is the first sequence. Sequences are in [0, 2^31-1], so bit 31 is
	// free and marks a batch still pending upstream.
	first uint32
	last  int32
}

const pendingBit = 1 << 31

func (s *slot) pending() bool   { return s.first&pendingBit != 0 }
func (s *slot) firstSeq() int32 { return int32(s.first &^ pendingBit) }

// entry is a view of one entry: its header and its ring of len(s) slots
// (Config.RetainedBatches). The window is the n slots from head, oldest
// first, in the order the batches were accepted. Committed and pending
// batches share it: the window is Kafka's committed state with the batches in
// flight appended, which is the state the broker will have if they succeed.
type entry struct {
	h *header
	s []slot
}

func (e entry) at(i int) *slot {
	j := int(e.h.head) + i
	if j >= len(e.s) {
		j -= len(e.s)
	}
	return &e.s[j]
}

// find returns the index in the window of the batch with exactly this
// sequence range, or -1: ProducerStateEntry.batchWithSequenceRange, where both
// ends must match, so a partial overlap is not a duplicate. Kafka returns the
// first match; a window never holds two batches with the same range (a
// matching batch is never registered or committed again), so scanning from
// the newest, where commits and most retries land, finds the same one.
func (e entry) find(first, last int32) int {
	n := int(e.h.n)
	j := int(e.h.head) + n - 1
	if j >= len(e.s) {
		j -= len(e.s)
	}
	for i := n - 1; i >= 0; i-- {
		if s := &e.s[j]; s.last == last && s.first&^pendingBit == uint32(first) {
			return i
		}
		if j--; j < 0 {
			j = len(e.s) - 1
		}
	}
	return -1
}

// lastSeq is ProducerStateEntry.lastSeq(): the newest batch's last sequence,
// or NO_SEQUENCE when the window is empty.
func (e entry) lastSeq() int32 {
	if e.h.n == 0 {
		return noSequence
	}
	return e.at(int(e.h.n) - 1).last
}

// absentHeader is the state of a key with no entry: ProducerStateEntry.empty,
// whose epoch is NO_PRODUCER_EPOCH and which retains no batches. Only decide
// reads it, so concurrent use is safe.
var absentHeader = header{epoch: noProducerEpoch}

// absent is the view of a key with no entry.
func absent() entry { return entry{h: &absentHeader} }

// decide is Kafka's decision for batch b against this entry, in Kafka's order:
// the duplicate check, then the epoch check, then the sequence check. It does
// not change the entry.
func (e entry) decide(b Batch) Result {
	return e.decideLast(b, b.LastSeq())
}

func (e entry) decideLast(b Batch, last int32) Result {
	epoch := e.h.epoch

	// UnifiedLog.analyzeAndValidateProducerState, then
	// ProducerStateEntry.findDuplicateBatch: same epoch and an exact
	// (firstSeq, lastSeq) match among the retained batches. It runs before the
	// epoch and sequence checks, so a duplicate is never out of order.
	if b.Epoch == epoch {
		if i := e.find(b.FirstSeq, last); i >= 0 {
			s := e.at(i)
			if b.Fingerprint != 0 && s.fingerprint != 0 && b.Fingerprint != s.fingerprint {
				// Not in Kafka: kafkajs reuses sequences for new records
				// (reference/clients.md §3, conclusion 2).
				return result(SequenceReuse)
			}
			if s.pending() {
				return result(InFlight)
			}
			return Result{Decision: Duplicate, BaseOffset: s.baseOffset, MaxTimestamp: s.maxTimestamp}
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

// push appends a batch to the window. A full window drops its oldest batch,
// as ProducerStateEntry.addBatchMetadata does.
func (e entry) push(s slot) {
	if int(e.h.n) == len(e.s) {
		e.h.head++
		if int(e.h.head) == len(e.s) {
			e.h.head = 0
		}
		e.h.n--
	}
	*e.at(int(e.h.n)) = s
	e.h.n++
}

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
// pending batch out (its Release is then a no-op and its Commit forgets the
// entry, see commit).
func (e entry) register(b Batch, last int32, now int64) {
	e.setEpoch(b.Epoch)
	e.push(slot{
		baseOffset:   -1,
		maxTimestamp: -1,
		fingerprint:  b.Fingerprint,
		first:        uint32(b.FirstSeq) | pendingBit,
		last:         last,
	})
	e.h.lastSeen = now
}

// outcome tells the Table what to do with the entry after commit or release.
type outcome uint8

const (
	keep   outcome = iota // the entry is consistent; keep it
	forget                // the table can no longer mirror the broker: drop the entry
)

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
			s := e.at(i)
			if s.pending() {
				s.first &^= pendingBit
				s.baseOffset, s.maxTimestamp = baseOffset, maxTimestamp
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
	e.push(committedSlot(b, baseOffset, maxTimestamp))
	e.h.lastSeen = now
	return keep
}

func committedSlot(b Batch, baseOffset, maxTimestamp int64) slot {
	return slot{
		baseOffset:   baseOffset,
		maxTimestamp: maxTimestamp,
		fingerprint:  b.Fingerprint,
		first:        uint32(b.FirstSeq),
		last:         b.LastSeq(),
	}
}

// release drops a pending batch the broker did not append, and every batch
// after it: the next expected sequence falls back to the batch before it.
// Later pending batches go too, because the broker will reject them as out of
// order when they arrive (ProducerAppendInfo.checkSequence: they no longer
// follow its last sequence); their own Release is then a no-op, and if the
// broker does append one (it had no state for the producer) its Commit is
// applied as described at commit.
//
// The entry is forgotten, so the producer becomes unknown, when the window
// ends up empty (the entry was created by, or its epoch changed with, the
// released batch, so the table no longer knows the broker's state) or when a
// committed batch followed the released one (the broker appended a batch
// without its predecessor, which only a stateless producer can do).
//
// A batch that is not pending (unknown, already committed, or already
// dropped) is ignored.
func (e entry) release(b Batch) outcome {
	if b.Epoch != e.h.epoch {
		return keep
	}
	i := e.find(b.FirstSeq, b.LastSeq())
	if i < 0 || !e.at(i).pending() {
		return keep
	}
	for j := i + 1; j < int(e.h.n); j++ {
		if !e.at(j).pending() {
			return forget
		}
	}
	e.h.n = uint8(i)
	if i == 0 {
		return forget
	}
	return keep
}
