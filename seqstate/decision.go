package seqstate

import (
	"math"
	"strconv"
)

// Decision is what the table concludes about one incoming batch. It is a
// value, not an error, so the hot path never allocates to report a rejection.
//
// NOTE: add new decisions to String, to the proxy's metrics table and to the
// datadriven runner's output.
type Decision uint8

const (
	// Accept: forward the batch. Check has registered it as pending; the
	// caller must later Commit or Abort it.
	Accept Decision = iota + 1
	// Duplicate: the batch is a retry of a batch the broker already appended.
	// Answer error NONE with Result.BaseOffset and Result.MaxTimestamp as
	// log_append_time_ms (UnifiedLog.analyzeAndValidateProducerState:
	// findDuplicateBatch). Never answer DUPLICATE_SEQUENCE_NUMBER (46).
	Duplicate
	// InFlight: the batch is identical to one still pending upstream. Do not
	// forward it again: wait for the original's outcome and answer with it.
	InFlight
	// OutOfOrder: a gap, a rewind, a partial overlap, or a new epoch not
	// starting at sequence 0 (ProducerAppendInfo.checkSequence). Kafka answers
	// OUT_OF_ORDER_SEQUENCE_NUMBER (45).
	OutOfOrder
	// Fenced: the epoch is lower than the one stored for the partition
	// (ProducerAppendInfo.checkProducerEpoch), or than the epoch of a
	// transactional InitProducerId seen for the producer. Kafka answers
	// INVALID_PRODUCER_EPOCH (47) on every Produce version.
	Fenced
	// SequenceReuse: same epoch and (first, last) sequence as a retained batch
	// but a different records fingerprint. Kafka would call it a duplicate and
	// silently drop new records; kafkajs reuses sequences for different
	// records after a failed send (kafkajs sendMessages.js rolls back the
	// sequences of every partition of a failed request, appended or not),
	// so the proxy answers OUT_OF_ORDER_SEQUENCE_NUMBER (45) instead.
	SequenceReuse
	// Invalid: not a valid idempotent batch (FirstSeq < 0 or Count < 1).
	// Kafka rejects it before any sequence check, in LogValidator.validateBatch,
	// with INVALID_RECORD (87). The table keeps no state for it.
	Invalid
)

var decisionNames = [...]string{
	Accept:        "accept",
	Duplicate:     "duplicate",
	InFlight:      "in_flight",
	OutOfOrder:    "out_of_order",
	Fenced:        "fenced",
	SequenceReuse: "sequence_reuse",
	Invalid:       "invalid",
}

// String returns a lower-case snake_case name, suitable as a metric label.
func (d Decision) String() string {
	if int(d) < len(decisionNames) && decisionNames[d] != "" {
		return decisionNames[d]
	}
	return "Decision(" + strconv.Itoa(int(d)) + ")"
}

// Result is a decision plus what the proxy needs to answer it.
type Result struct {
	Decision Decision
	// BaseOffset is the original batch's first offset for a Duplicate, and -1
	// otherwise (Kafka's value on an error response). It is also -1 for a
	// duplicate of a batch committed without an offset (for example after
	// REQUEST_TIMED_OUT, whose response carries none): the caller may then
	// forward the retry and let the broker answer with the real offsets.
	BaseOffset int64
	// MaxTimestamp is the original batch's maxTimestamp for a Duplicate, sent
	// back as log_append_time_ms even on CreateTime topics
	// (UnifiedLog.analyzeAndValidateProducerState sets logAppendTime =
	// BatchMetadata.timestamp); -1 otherwise.
	MaxTimestamp int64
}

func result(d Decision) Result { return Result{Decision: d, BaseOffset: -1, MaxTimestamp: -1} }

// TopicID is an interned topic name (see Table.InternTopics). It keeps Key
// fixed-size and free of pointers.
type TopicID uint32

// Key identifies one producer on one partition: Kafka keeps producer state per
// (partition, PID) and shares nothing between partitions
// (ProducerStateManager.producers is per partition log). The proxy scopes it
// by principal too, so that a batch carrying another principal's producer id
// can neither be answered from that principal's writes nor change its state
// (docs/security.md).
type Key struct {
	ProducerID int64
	Topic      TopicID
	Partition  int32
	Principal  uint32 // the caller's number for the authenticated principal; 0 for one alone
}

// PartitionKey is k's partition alone: producer id and principal zeroed.
func (k Key) PartitionKey() Key { return Key{Topic: k.Topic, Partition: k.Partition} }

// Batch is what the table needs from a v2 RecordBatch header.
type Batch struct {
	Epoch    int16 // producerEpoch
	FirstSeq int32 // baseSequence
	// Count is lastOffsetDelta+1, which LogValidator.validateBatch requires to
	// equal recordsCount; lastOffsetDelta doubles as the sequence delta.
	Count int32
	// Fingerprint identifies the batch's records (for example a hash of the
	// records section). 0 means unknown: it is never compared, so a batch or
	// a retained batch with fingerprint 0 matches any fingerprint. Callers
	// that hash should map a hash of 0 to 1. 32 bits tell an honest retry
	// from honest new data under the same sequences (a 2^-32 chance of
	// mistaking one for the other), and keep a retained batch at 16 bytes.
	Fingerprint uint32
}

// LastSeq is DefaultRecordBatch.lastSequence: FirstSeq+Count-1, wrapping from
// Integer.MAX_VALUE to 0 (DefaultRecordBatch.incrementSequence).
func (b Batch) LastSeq() int32 { return incrementSequence(b.FirstSeq, b.Count-1) }

// valid reports whether Kafka's LogValidator.validateBatch would let the batch
// reach the producer-state checks: a producer id requires baseSequence >= 0
// ("Invalid sequence number"), and the record count must be positive.
func (b Batch) valid() bool { return b.FirstSeq >= 0 && b.Count >= 1 }

const (
	noProducerEpoch int16 = -1 // RecordBatch.NO_PRODUCER_EPOCH
	noSequence      int32 = -1 // RecordBatch.NO_SEQUENCE
)

// incrementSequence is DefaultRecordBatch.incrementSequence: the sequence
// space is [0, Integer.MAX_VALUE] and Integer.MAX_VALUE is a valid sequence.
func incrementSequence(s, inc int32) int32 {
	if s > math.MaxInt32-inc {
		return inc - (math.MaxInt32 - s) - 1
	}
	return s + inc
}

// inSequence is ProducerAppendInfo.inSequence: next must be last+1 (computed
// as a long, so last == -1 expects 0), or 0 after Integer.MAX_VALUE.
func inSequence(last, next int32) bool {
	return int64(next) == int64(last)+1 || (next == 0 && last == math.MaxInt32)
}
