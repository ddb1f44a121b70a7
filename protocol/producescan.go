package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/twmb/franz-go/pkg/kerr"
)

// Produce: v3-13 (the versions Kafka 4 accepts, KIP-896, up to the newest kmsg
// knows). The scanner walks a request body in place, without decoding it into
// a kmsg.ProduceRequest, because full decoding costs ~9 allocations per
// request (measured for 4 topics × 8 partitions) and this runs for every
// Produce.
//
//   - v3: transactional id; message format v2 only (KIP-98).
//   - v9: flexible versions (KIP-482): compact strings, arrays and bytes, and
//     tagged fields after the request, each topic and each partition.
//   - v13: topics are named by topic ID instead of name (KIP-516, KIP-1102).
//
// The scanner is stricter than kmsg in three ways, all of which no real client
// produces: array and byte lengths below -1 are errors (kmsg reads them as
// null), trailing bytes after the request's tagged fields are an error (kmsg
// ignores them), and versions below 3 are refused.

// ErrMalformedBatch is returned by [ReadBatch] for records too short to hold a
// v2 record batch header, or whose batch lengths do not walk.
var ErrMalformedBatch = errors.New("protocol: malformed record batch")

// ReadBatch's errors are preallocated: null or empty records reach it on the
// hot path, and an error must not cost an allocation there.
var (
	errBatchShort  = fmt.Errorf("%w: shorter than the %d-byte v2 header", ErrMalformedBatch, batchHeaderSize)
	errBatchLength = fmt.Errorf("%w: a batch length is below %d", ErrMalformedBatch, legacyRecordOverheadV0)
)

const (
	// ProduceMinVersion is the first version carrying a transactional id and
	// message format v2; Kafka 4.0 removed v0-2 (KIP-896).
	ProduceMinVersion = 3
	// produceFirstFlexible is the first KIP-482 flexible Produce version.
	produceFirstFlexible = 9
	// produceFirstTopicID is the first version naming topics by ID (KIP-516).
	produceFirstTopicID = 13
)

// ProduceScanner iterates over the partitions of a Produce request body
// without allocating. Reuse one value across requests: call Reset, then Next
// until it returns false, then check Err.
//
// Every slice it hands out aliases the body passed to Reset, with its capacity
// clipped so an append cannot write into the body.
type ProduceScanner struct {
	// TransactionalID is the request's transactional id; nil when null.
	TransactionalID []byte
	// Acks is -1 (all ISR), 1 (leader) or 0 (no response); anything else is
	// answered by the broker with INVALID_REQUIRED_ACKS.
	Acks int16
	// TimeoutMillis is how long an acks=-1 request may wait for replication.
	TimeoutMillis int32

	body       []byte
	version    int16
	flexible   bool
	off        int // next unread byte
	topicsOff  int // where the topics array length starts
	tagsOff    int // where the request's tagged fields start, once done
	topicsLeft int // topics not yet started
	partsLeft  int // partitions of the current topic not yet read
	inTopic    bool
	done       bool
	err        error
	p          ProducePartition
}

// ProducePartition is one partition entry of a Produce request, as returned
// by [ProduceScanner.Partition]. Its slices alias the request body.
type ProducePartition struct {
	// TopicIndex and PartitionIndex are the 0-based positions of the topic in
	// the request and of the partition in its topic, so answers can be merged
	// back in request order (Kafka answers in request order).
	TopicIndex, PartitionIndex int
	// Topic is the topic name for v3-12; nil from v13 on.
	Topic []byte
	// TopicID is the topic ID for v13+ (KIP-516); zero before.
	TopicID [16]byte
	// Partition is the partition number.
	Partition int32
	// Records is the partition's records field; nil when null.
	Records []byte

	// Byte offsets in the body: topicStart is where this partition's topic
	// entry starts, partsOff where its partitions array length starts; start
	// and end bound this partition entry, tags included; recordsEnd is where
	// its records field ends (its tags start).
	topicStart, partsOff, start, end, recordsEnd int
}

// Reset starts scanning body, the bytes after the request header of a Produce
// request at version, and reads the request-level fields. An error wraps
// [ErrMalformedProduce] (and [ErrUnsupportedVersion] for a version outside
// 3 to the newest known).
func (s *ProduceScanner) Reset(body []byte, version int16) error {
	*s = ProduceScanner{body: body, version: version}
	maxV, _ := KnownAPI(0)
	if version < ProduceMinVersion || version > maxV {
		s.err = fmt.Errorf("%w: %w: produce v%d (supported v%d-v%d)", ErrMalformedProduce, ErrUnsupportedVersion, version, ProduceMinVersion, maxV)
		s.done = true
		return s.err
	}
	s.flexible = version >= produceFirstFlexible
	off := 0
	id, off, ok := readNullable(body, off, s.flexible, 2)
	if !ok {
		return s.fail("transactional id", off)
	}
	s.TransactionalID = id
	if len(body)-off < 6 {
		return s.fail("acks and timeout", off)
	}
	s.Acks = int16(binary.BigEndian.Uint16(body[off:]))
	s.TimeoutMillis = int32(binary.BigEndian.Uint32(body[off+2:]))
	off += 6
	s.topicsOff = off
	n, off, ok := readArrayLen(body, off, s.flexible, minTopicSize(version))
	if !ok {
		return s.fail("topics array length", s.topicsOff)
	}
	s.topicsLeft = n
	s.off = off
	s.p.TopicIndex = -1
	return nil
}

// fail records a malformed-request error at off and stops the scan.
func (s *ProduceScanner) fail(what string, off int) error {
	s.err = fmt.Errorf("%w: v%d: %s at byte %d of %d", ErrMalformedProduce, s.version, what, off, len(s.body))
	s.done = true
	return s.err
}

// Next advances to the next partition, across topics; topics with no
// partitions are skipped. It returns false at the end of the request or on a
// malformed one; then Err tells which.
func (s *ProduceScanner) Next() bool {
	if s.done {
		return false
	}
	b := s.body
	for s.partsLeft == 0 {
		if s.inTopic {
			s.inTopic = false
			if s.flexible {
				end, err := skipTags(b, s.off)
				if err != nil {
					s.fail("topic tagged fields", s.off)
					return false
				}
				s.off = end
			}
		}
		if s.topicsLeft == 0 {
			s.tagsOff = s.off
			if s.flexible {
				end, err := skipTags(b, s.off)
				if err != nil {
					s.fail("request tagged fields", s.off)
					return false
				}
				s.off = end
			}
			if s.off != len(b) {
				s.fail("trailing bytes", s.off)
				return false
			}
			s.done = true
			return false
		}
		s.topicsLeft--
		p := &s.p
		p.TopicIndex++
		p.PartitionIndex = -1
		p.topicStart = s.off
		off := s.off
		if s.version >= produceFirstTopicID {
			if len(b)-off < 16 {
				s.fail("topic id", off)
				return false
			}
			p.Topic = nil
			p.TopicID = [16]byte(b[off : off+16])
			off += 16
		} else {
			name, next, ok := readNullable(b, off, s.flexible, 2)
			if !ok || name == nil { // topic names are not nullable
				s.fail("topic name", off)
				return false
			}
			p.Topic = name
			off = next
		}
		p.partsOff = off
		n, next, ok := readArrayLen(b, off, s.flexible, minPartitionSize(s.flexible))
		if !ok {
			s.fail("partitions array length", off)
			return false
		}
		s.off = next
		s.partsLeft = n
		s.inTopic = true
	}
	p := &s.p
	off := s.off
	p.start = off
	if len(b)-off < 4 {
		s.fail("partition", off)
		return false
	}
	p.Partition = int32(binary.BigEndian.Uint32(b[off:]))
	off += 4
	recs, off, ok := readNullable(b, off, s.flexible, 4)
	if !ok {
		s.fail("records", off)
		return false
	}
	p.Records = recs
	p.recordsEnd = off
	if s.flexible {
		end, err := skipTags(b, off)
		if err != nil {
			s.fail("partition tagged fields", off)
			return false
		}
		off = end
	}
	p.end = off
	p.PartitionIndex++
	s.off = off
	s.partsLeft--
	return true
}

// Partition returns the current partition. The pointer is valid until the
// next call to Next or Reset.
func (s *ProduceScanner) Partition() *ProducePartition { return &s.p }

// Err returns the error that stopped the scan, or nil at a clean end.
func (s *ProduceScanner) Err() error { return s.err }

// minTopicSize is the fewest bytes a topic entry can take: an empty name (or
// a topic ID), an empty partitions array and, if flexible, an empty tag
// section. It bounds array lengths before looping, as kmsg does.
func minTopicSize(version int16) int {
	switch {
	case version >= produceFirstTopicID:
		return 16 + 1 + 1
	case version >= produceFirstFlexible:
		return 1 + 1 + 1
	}
	return 2 + 4
}

// minPartitionSize is the fewest bytes a partition entry can take: the index,
// null records and, if flexible, an empty tag section.
func minPartitionSize(flexible bool) int {
	if flexible {
		return 4 + 1 + 1
	}
	return 4 + 4
}

// readArrayLen reads an array length at off: int32 or, when flexible, a
// uvarint of length+1. Null (-1) reads as empty, like kmsg. A length whose
// minimum encoding cannot fit in the rest of b is refused.
func readArrayLen(b []byte, off int, flexible bool, minElem int) (n, next int, ok bool) {
	if flexible {
		u, next, err := uvarint(b, off)
		if err != nil {
			return 0, off, false
		}
		n = int(u) - 1
		off = next
	} else {
		if len(b)-off < 4 {
			return 0, off, false
		}
		n = int(int32(binary.BigEndian.Uint32(b[off:])))
		off += 4
	}
	switch {
	case n == -1:
		return 0, off, true
	case n < -1, n > (len(b)-off)/minElem:
		return 0, off, false
	}
	return n, off, true
}

// readNullable reads nullable bytes (or a nullable string) at off: an int16
// (width 2) or int32 (width 4) length, or when flexible a uvarint of length+1,
// then the bytes. It returns nil for null. The result's capacity is clipped.
func readNullable(b []byte, off int, flexible bool, width int) (v []byte, next int, ok bool) {
	var n int
	switch {
	case flexible:
		u, nx, err := uvarint(b, off)
		if err != nil {
			return nil, off, false
		}
		n, off = int(u)-1, nx
	case len(b)-off < width:
		return nil, off, false
	case width == 2:
		n = int(int16(binary.BigEndian.Uint16(b[off:])))
		off += 2
	default:
		n = int(int32(binary.BigEndian.Uint32(b[off:])))
		off += 4
	}
	switch {
	case n == -1:
		return nil, off, true
	case n < -1, n > len(b)-off:
		return nil, off, false
	}
	return b[off : off+n : off+n], off + n, true
}

// RecordBatch v2 layout (KIP-98; Kafka DefaultRecordBatch.java).
const (
	batchLengthOffset     = 8
	batchMagicOffset      = 16
	batchCRCOffset        = 17
	batchAttributesOffset = 21
	batchProducerIDOffset = 43
	// batchLogOverhead is baseOffset + length: the bytes not counted in Length
	// (Records.LOG_OVERHEAD).
	batchLogOverhead = 12
	// batchHeaderSize is DefaultRecordBatch.RECORD_BATCH_OVERHEAD.
	batchHeaderSize = 61
	// legacyRecordOverheadV0 is the smallest Length Kafka's batch iterator
	// accepts before it reads the magic (LegacyRecord.RECORD_OVERHEAD_V0,
	// ByteBufferLogInputStream.nextBatchSize).
	legacyRecordOverheadV0 = 14
	// batchUpToMagic is Records.HEADER_SIZE_UP_TO_MAGIC.
	batchUpToMagic = 17

	attrCompressionMask = 0x07
	attrTransactional   = 0x10
	attrControl         = 0x20
	// compressionZstd is the highest codec id Kafka knows
	// (CompressionType.forId); higher ids fail with an unexpected exception.
	compressionZstd = 4
)

// BatchHeader is the 61-byte v2 RecordBatch header (KIP-98; Kafka
// DefaultRecordBatch.java). Only a Magic of 2 makes the other fields
// meaningful.
type BatchHeader struct {
	BaseOffset           int64
	Length               int32 // bytes after the Length field: batch size - 12
	PartitionLeaderEpoch int32
	Magic                int8
	CRC                  uint32 // CRC-32C of attributes..end
	Attributes           int16
	LastOffsetDelta      int32
	FirstTimestamp       int64
	MaxTimestamp         int64
	ProducerID           int64 // -1: not idempotent
	ProducerEpoch        int16
	BaseSequence         int32
	NumRecords           int32
}

// IsTransactional reports the attributes' transactional bit (0x10).
func (h *BatchHeader) IsTransactional() bool { return h.Attributes&attrTransactional != 0 }

// IsControl reports the attributes' control-batch bit (0x20), which only
// transaction coordinators may set.
func (h *BatchHeader) IsControl() bool { return h.Attributes&attrControl != 0 }

// RecordsLen is the length of the records section: Length less the header
// fields that follow it.
func (h *BatchHeader) RecordsLen() int32 {
	return h.Length - int32(batchHeaderSize-batchLogOverhead)
}

// ReadBatch decodes the header of the first batch in records into h and
// reports how many batches records holds, walking only the Length fields (as
// Kafka's ByteBufferLogInputStream does). A trailing piece too short to be a
// whole batch counts as one more batch, so a caller checking for exactly one
// batch refuses it. It errors, wrapping [ErrMalformedBatch], when records is
// shorter than a v2 header or a Length is smaller than any batch can be.
func ReadBatch(records []byte, h *BatchHeader) (numBatches int, err error) {
	if len(records) < batchHeaderSize {
		return 0, errBatchShort
	}
	b := records[:batchHeaderSize]
	h.BaseOffset = int64(binary.BigEndian.Uint64(b[0:]))
	h.Length = int32(binary.BigEndian.Uint32(b[8:]))
	h.PartitionLeaderEpoch = int32(binary.BigEndian.Uint32(b[12:]))
	h.Magic = int8(b[16])
	h.CRC = binary.BigEndian.Uint32(b[17:])
	h.Attributes = int16(binary.BigEndian.Uint16(b[21:]))
	h.LastOffsetDelta = int32(binary.BigEndian.Uint32(b[23:]))
	h.FirstTimestamp = int64(binary.BigEndian.Uint64(b[27:]))
	h.MaxTimestamp = int64(binary.BigEndian.Uint64(b[35:]))
	h.ProducerID = int64(binary.BigEndian.Uint64(b[43:]))
	h.ProducerEpoch = int16(binary.BigEndian.Uint16(b[51:]))
	h.BaseSequence = int32(binary.BigEndian.Uint32(b[53:]))
	h.NumRecords = int32(binary.BigEndian.Uint32(b[57:]))
	for off := 0; off < len(records); {
		numBatches++
		if len(records)-off < batchLogOverhead {
			break // a trailing partial batch
		}
		l := int(int32(binary.BigEndian.Uint32(records[off+batchLengthOffset:])))
		if l < legacyRecordOverheadV0 {
			return numBatches, errBatchLength
		}
		off += batchLogOverhead + l // cannot overflow: l < 2^31
	}
	return numBatches, nil
}

// BatchValid reports, as a Kafka error code (0 when valid), whether the one
// batch in records passes the checks Kafka applies before its duplicate check
// that depend only on the bytes (docs/kafka-rules.md §2.1, in Kafka's order):
//
//   - ProduceRequest.validateRecords (v3+): at least one batch, first batch
//     magic 2, exactly one batch: INVALID_RECORD. A batch size below 14 or a
//     magic above 2 found while iterating (ByteBufferLogInputStream
//     .nextBatchSize): CORRUPT_MESSAGE.
//   - UnifiedLog.analyzeAndValidateRecords: baseOffset != 0: INVALID_RECORD;
//     size below 61 or a CRC-32C mismatch (DefaultRecordBatch.isValid):
//     CORRUPT_MESSAGE; a compression id above zstd makes
//     CompressionType.forId throw IllegalArgumentException:
//     UNKNOWN_SERVER_ERROR.
//   - LogValidator.validateBatch: lastOffsetDelta < 0, recordsCount <= 0,
//     recordsCount != lastOffsetDelta+1, a control batch, or a producer id
//     with a negative base sequence: INVALID_RECORD.
//
// h must hold the header ReadBatch read from the same records. Bytes after
// the first batch are INVALID_RECORD even when they are too short to be a
// batch, where Kafka would trim them (UnifiedLog.trimInvalidBytes): no client
// sends them. Checks needing broker config (max.message.bytes, zstd with
// Produce v<7, topic message format) are the broker's.
func BatchValid(records []byte, h *BatchHeader) int16 {
	n := len(records)
	if n < batchLogOverhead {
		return kerr.InvalidRecord.Code // "at least one record batch per partition"
	}
	size := batchLogOverhead + int(int32(binary.BigEndian.Uint32(records[batchLengthOffset:])))
	if size < batchLogOverhead+legacyRecordOverheadV0 {
		return kerr.CorruptMessage.Code
	}
	if n < batchUpToMagic {
		return kerr.InvalidRecord.Code // no whole batch
	}
	if magic := int8(records[batchMagicOffset]); magic < 0 || magic > 2 {
		return kerr.CorruptMessage.Code
	}
	if n < size {
		return kerr.InvalidRecord.Code // no whole batch
	}
	if records[batchMagicOffset] != 2 {
		return kerr.InvalidRecord.Code
	}
	if n > size {
		return kerr.InvalidRecord.Code // "exactly one record batch per partition"
	}
	if binary.BigEndian.Uint64(records) != 0 {
		return kerr.InvalidRecord.Code
	}
	if size < batchHeaderSize || crc32.Checksum(records[batchAttributesOffset:], castagnoli) != h.CRC {
		return kerr.CorruptMessage.Code
	}
	if h.Attributes&attrCompressionMask > compressionZstd {
		return kerr.UnknownServerError.Code
	}
	switch {
	case h.LastOffsetDelta < 0,
		h.NumRecords <= 0,
		int64(h.NumRecords) != int64(h.LastOffsetDelta)+1,
		h.IsControl(),
		h.ProducerID >= 0 && h.BaseSequence < 0:
		return kerr.InvalidRecord.Code
	}
	return 0
}

// deriveRecordsCRCFrom is the records size from which deriving their CRC
// from the header's (about 150 ns whatever the size) beats reading them
// (about 200 ns for 2 KiB in cache, several times that from memory).
const deriveRecordsCRCFrom = 2 << 10

// castagnoli is the CRC-32C table; hash/crc32 uses the SSE4.2 or ARMv8 CRC
// instructions for it where the CPU has them.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// RecordsFingerprint returns a 32-bit fingerprint of the batch's records: the
// bytes after the 61-byte header, plus the record count and compression codec.
// It leaves out the header's timestamps, CRC, producer fields and leader
// epoch, so a retried batch that a client restamped (kafkajs and kafka-go set
// new First/MaxTimestamp and so a new CRC; docs/clients.md §3) matches the
// original, while different records sent under reused sequence numbers
// (kafkajs rolls sequences back after a failed request) do not.
//
// It is the CRC-32C of the records (one pass, with the CPU's crc32
// instruction on amd64 and arm64) mixed with their length, count and codec,
// and folded to 32 bits, the size seqstate keeps per retained batch. Two
// different record sets collide with probability 2^-32, which separates
// honest retries from honest new data — all the proxy needs, since a client
// can only hurt itself by forging a collision. It is never 0, which seqstate
// reads as "unknown".
//
// h must hold the header ReadBatch read from records; bytes past the batch
// Length are ignored.
func RecordsFingerprint(records []byte, h *BatchHeader) uint32 {
	end := batchLogOverhead + int(h.Length)
	if end > len(records) || end < batchHeaderSize {
		end = len(records)
	}
	var recs []byte
	if end > batchHeaderSize {
		recs = records[batchHeaderSize:end]
	}
	var crc uint32
	if len(recs) >= deriveRecordsCRCFrom && end == batchLogOverhead+int(h.Length) {
		// Derived from the batch's own CRC in constant time (crc32c.go).
		// A wrong header CRC gives a wrong fingerprint, which is harmless:
		// the broker rejects such a batch, and the proxy answers a batch
		// itself only after BatchValid has checked its CRC.
		crc = crcSuffix(h.CRC, records[batchAttributesOffset:batchHeaderSize], len(recs))
	} else {
		crc = crc32.Checksum(recs, castagnoli)
	}
	sum := uint64(len(recs))<<32 | uint64(crc)
	// Fold in the count and codec through a bijective mixer (the splitmix64
	// finalizer) rather than by hashing a few more bytes: a byte slice handed
	// to hash/crc32 escapes, which would cost an allocation per batch.
	meta := uint64(uint32(h.NumRecords))<<3 | uint64(h.Attributes&attrCompressionMask)
	x := mix64(sum ^ mix64(meta))
	if fp := uint32(x) ^ uint32(x>>32); fp != 0 {
		return fp
	}
	return 1
}

// mix64 is the splitmix64 finalizer, a bijection on uint64.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
