package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"

	"github.com/zeebo/xxh3"
)

// RecordsIdentity returns the 64-bit identity of a legacy (producer id -1)
// batch's contents, for deduplicating retries that Kafka cannot recognise
// (docs/legacy.md): an XXH3 hash of the records section (the bytes after
// the 61-byte batch header) mixed with its length, the record count and the
// codec. XXH3 reads about 90 GB/s here (AVX2), five times xxHash64, which
// matters: every legacy byte is hashed once.
//
// The header's timestamps and CRC are left out: kafka-go and kafkajs restamp
// FirstTimestamp and MaxTimestamp when they resend a batch, which changes the
// CRC, while the records and their timestamp deltas stay the same
// (docs/clients.md §3). With exact, the two header timestamps are mixed in
// too, so only byte-identical batches match.
//
// Two different record sets collide with probability about 2^-64. The
// identity is deterministic (no per-process seed), so it can be recomputed
// from the log. It is never 0. h must hold the header ReadBatch read from
// records; bytes past the batch Length are ignored.
func RecordsIdentity(records []byte, h *BatchHeader, exact bool) uint64 {
	x := recordsIdentity(recordsSection(records, h), h.NumRecords, h.Attributes)
	if exact {
		x = mix64(x ^ uint64(h.FirstTimestamp))
		x = mix64(x ^ uint64(h.MaxTimestamp))
	}
	if x == 0 {
		return 1
	}
	return x
}

// recordsSection returns the bytes after the batch header, up to the batch
// Length.
func recordsSection(records []byte, h *BatchHeader) []byte {
	end := batchLogOverhead + int(h.Length)
	if end > len(records) || end < batchHeaderSize {
		end = len(records)
	}
	if end > batchHeaderSize {
		return records[batchHeaderSize:end]
	}
	return nil
}

func recordsIdentity(recs []byte, count int32, attributes int16) uint64 {
	x := xxh3.Hash(recs)
	x ^= mix64(uint64(len(recs))<<32 | uint64(uint32(count)))
	return mix64(x ^ uint64(attributes&attrCompressionMask))
}

// ErrCompressed is returned by [DropLeadingRecords] for a compressed batch:
// its records cannot be cut without decompressing them.
var ErrCompressed = errors.New("protocol: compressed batch")

// PrefixLen returns the byte length of the first k records of this
// uncompressed batch's records section, walking only their length
// prefixes. ok is false when the batch is compressed, has no more than k
// records, or does not parse.
func PrefixLen(records []byte, h *BatchHeader, k int) (int, bool) {
	if h.Attributes&attrCompressionMask != 0 || k < 1 || int(h.NumRecords) <= k {
		return 0, false
	}
	return recordsLen(recordsSection(records, h), k)
}

// FirstRecordHash returns a hash of the first record of an uncompressed
// batch (its length prefix included), or 0 when there is none or the batch
// is compressed: a cheap test of whether a batch may begin with another
// batch's records.
func FirstRecordHash(records []byte, h *BatchHeader) uint64 {
	if h.Attributes&attrCompressionMask != 0 || h.NumRecords < 1 {
		return 0
	}
	recs := recordsSection(records, h)
	n, ok := recordsLen(recs, 1)
	if !ok {
		return 0
	}
	return xxh3.Hash(recs[:n]) | 1
}

// PrefixIdentity returns the RecordsIdentity (records mode) that a batch
// holding only the first k records of this uncompressed batch would have,
// given their byte length n from PrefixLen.
func PrefixIdentity(records []byte, h *BatchHeader, k, n int) uint64 {
	x := recordsIdentity(recordsSection(records, h)[:n], int32(k), h.Attributes)
	if x == 0 {
		x = 1
	}
	return x
}

// recordsLen returns the byte length of the first k records of a records
// section.
func recordsLen(recs []byte, k int) (int, bool) {
	off := 0
	for i := 0; i < k; i++ {
		l, n := binary.Varint(recs[off:])
		if n <= 0 || l < 0 || int64(len(recs)-off-n) < l {
			return 0, false
		}
		off += n + int(l)
	}
	return off, true
}

// DropLeadingRecords appends to dst a copy of the uncompressed v2 batch in
// records (its header in h) without its first skip records: the records
// left have their offset deltas renumbered from 0, and the header its
// record count, last offset delta, max timestamp, length and CRC
// recomputed. Producer fields, first timestamp and attributes stay, so the
// kept records' timestamps are unchanged. It is how the proxy forwards only
// the new records of a re-batched retry (docs/legacy.md).
func DropLeadingRecords(dst, records []byte, h *BatchHeader, skip int) ([]byte, error) {
	if skip < 1 || int(h.NumRecords) <= skip {
		return dst, fmt.Errorf("%w: cannot drop %d of %d records", ErrMalformedBatch, skip, h.NumRecords)
	}
	return rebuild(dst, records, h, skip, nil)
}

// DropRecords is DropLeadingRecords for any records: record i is dropped
// when drop[i]. At least one record must stay.
func DropRecords(dst, records []byte, h *BatchHeader, drop []bool) ([]byte, error) {
	if len(drop) != int(h.NumRecords) {
		return dst, fmt.Errorf("%w: %d drop flags for %d records", ErrMalformedBatch, len(drop), h.NumRecords)
	}
	kept := 0
	for _, d := range drop {
		if !d {
			kept++
		}
	}
	if kept == 0 {
		return dst, fmt.Errorf("%w: every record dropped", ErrMalformedBatch)
	}
	return rebuild(dst, records, h, 0, drop)
}

// rebuild copies the batch without its first skip records and those drop
// marks.
func rebuild(dst, records []byte, h *BatchHeader, skip int, drop []bool) ([]byte, error) {
	if h.Attributes&attrCompressionMask != 0 {
		return dst, ErrCompressed
	}
	recs := recordsSection(records, h)
	start := len(dst)
	dst = append(dst, records[:batchHeaderSize]...)
	maxDelta := int64(math.MinInt64)
	kept, i := 0, 0
	for off := 0; off < len(recs); i++ {
		l, n := binary.Varint(recs[off:])
		if n <= 0 || l < 0 || int64(len(recs)-off-n) < l {
			return dst[:start], fmt.Errorf("%w: record %d does not parse", ErrMalformedBatch, i)
		}
		body := recs[off+n : off+n+int(l)]
		off += n + int(l)
		if i < skip || (drop != nil && i < len(drop) && drop[i]) {
			continue
		}
		// attributes int8, timestampDelta varint, offsetDelta varint, rest.
		if len(body) < 1 {
			return dst[:start], fmt.Errorf("%w: empty record", ErrMalformedBatch)
		}
		tsd, m1 := binary.Varint(body[1:])
		_, m2 := binary.Varint(body[1+max(m1, 0):])
		if m1 <= 0 || m2 <= 0 {
			return dst[:start], fmt.Errorf("%w: record %d header does not parse", ErrMalformedBatch, i)
		}
		rest := body[1+m1+m2:]
		var head [1 + 2*binary.MaxVarintLen64]byte
		h2 := append(head[:0], body[0])
		h2 = binary.AppendVarint(h2, tsd)
		h2 = binary.AppendVarint(h2, int64(kept))
		dst = binary.AppendVarint(dst, int64(len(h2)+len(rest)))
		dst = append(dst, h2...)
		dst = append(dst, rest...)
		maxDelta = max(maxDelta, tsd)
		kept++
	}
	if i != int(h.NumRecords) || kept == 0 {
		return dst[:start], fmt.Errorf("%w: %d records, header says %d", ErrMalformedBatch, i, h.NumRecords)
	}
	b := dst[start:]
	binary.BigEndian.PutUint64(b[0:], 0) // base offset: the broker assigns it
	binary.BigEndian.PutUint32(b[8:], uint32(len(b)-batchLogOverhead))
	binary.BigEndian.PutUint32(b[23:], uint32(kept-1)) // last offset delta
	binary.BigEndian.PutUint64(b[35:], uint64(h.FirstTimestamp+maxDelta))
	binary.BigEndian.PutUint32(b[57:], uint32(kept))
	binary.BigEndian.PutUint32(b[17:], crc32.Checksum(b[batchAttributesOffset:], castagnoli))
	return dst, nil
}

// RecordKey is one record's idempotency key (see RecordKeys): a 128-bit
// hash (XXH3-128) of its value, or Present false when the record has no
// such header, or only an empty one.
type RecordKey struct {
	Lo, Hi  uint64
	Present bool
}

// RecordKeys appends to dst, for each record of the uncompressed v2 batch
// in records, the hash of the value of its first header named name (an
// idempotency key naming the logical operation: docs/legacy.md). A
// compressed batch gives ErrCompressed: its records cannot be read without
// decompressing them.
func RecordKeys(dst []RecordKey, records []byte, h *BatchHeader, name string) ([]RecordKey, error) {
	if h.Attributes&attrCompressionMask != 0 {
		return dst, ErrCompressed
	}
	recs := recordsSection(records, h)
	start := len(dst)
	bad := func(i int) ([]RecordKey, error) {
		return dst[:start], fmt.Errorf("%w: record %d does not parse", ErrMalformedBatch, i)
	}
	for off, i := 0, 0; off < len(recs); i++ {
		l, n := binary.Varint(recs[off:])
		if n <= 0 || l < 0 || int64(len(recs)-off-n) < l {
			return bad(i)
		}
		r := recs[off+n : off+n+int(l)]
		off += n + int(l)
		if len(r) < 1 {
			return bad(i)
		}
		p := 1
		for f := 0; f < 2; f++ { // timestampDelta, offsetDelta
			_, m := binary.Varint(r[p:])
			if m <= 0 {
				return bad(i)
			}
			p += m
		}
		for f := 0; f < 2; f++ { // key, value
			bl, m := binary.Varint(r[p:])
			if m <= 0 || bl < -1 || int64(len(r)-p-m) < max(bl, 0) {
				return bad(i)
			}
			p += m + int(max(bl, 0))
		}
		nh, m := binary.Varint(r[p:])
		if m <= 0 || nh < 0 {
			return bad(i)
		}
		p += m
		var k RecordKey
		for j := int64(0); j < nh; j++ {
			kl, m := binary.Varint(r[p:])
			if m <= 0 || kl < 0 || int64(len(r)-p-m) < kl {
				return bad(i)
			}
			hk := r[p+m : p+m+int(kl)]
			p += m + int(kl)
			vl, m2 := binary.Varint(r[p:])
			if m2 <= 0 || vl < -1 || int64(len(r)-p-m2) < max(vl, 0) {
				return bad(i)
			}
			v := r[p+m2 : p+m2+int(max(vl, 0))]
			p += m2 + int(max(vl, 0))
			// An empty or null value names no operation: it is no key.
			if !k.Present && vl > 0 && string(hk) == name {
				h := xxh3.Hash128(v)
				k = RecordKey{Lo: h.Lo, Hi: h.Hi, Present: true}
			}
		}
		dst = append(dst, k)
	}
	if len(dst)-start != int(h.NumRecords) {
		return dst[:start], fmt.Errorf("%w: %d records, header says %d", ErrMalformedBatch, len(dst)-start, h.NumRecords)
	}
	return dst, nil
}

// MixIdentity combines a records identity with the topic it was sent to
// (an interned topic id) and the principal that sent it (the caller's
// number), so that the same records sent to two topics, or by two
// principals, are two identities. The partition is left out: a retry may
// carry a batch to another partition (kafkajs partitions keyless records
// round-robin on every attempt), so it is kept beside the identity instead.
// Never 0.
func MixIdentity(recordsID uint64, topic, principal uint32) uint64 {
	x := mix64(recordsID ^ mix64(uint64(topic)|uint64(principal)<<32))
	if x == 0 {
		return 1
	}
	return x
}

// RecordStamps appends to dst, for each record of the uncompressed v2 batch
// in records, a 128-bit hash of what the record is wherever it sits and
// whenever it is sent: its key, value and headers. Its offset and timestamp
// deltas are left out: a client that puts failed records back in its queue
// resends them in other batches, at other positions (sarama behind newer
// records, librdkafka at other boundaries), and sarama stamps them again
// with the time of the resend (docs/legacy.md, "Records of an
// unacknowledged append"). A compressed batch gives ErrCompressed.
func RecordStamps(dst []RecordKey, records []byte, h *BatchHeader) ([]RecordKey, error) {
	if h.Attributes&attrCompressionMask != 0 {
		return dst, ErrCompressed
	}
	recs := recordsSection(records, h)
	start := len(dst)
	for off, i := 0, 0; off < len(recs); i++ {
		l, n := binary.Varint(recs[off:])
		if n <= 0 || l < 0 || int64(len(recs)-off-n) < l {
			return dst[:start], fmt.Errorf("%w: record %d does not parse", ErrMalformedBatch, i)
		}
		r := recs[off+n : off+n+int(l)]
		off += n + int(l)
		// attributes (1 byte), timestampDelta, offsetDelta, then the
		// record's own bytes.
		_, m := binary.Varint(r[min(1, len(r)):])
		if len(r) < 1 || m <= 0 {
			return dst[:start], fmt.Errorf("%w: record %d does not parse", ErrMalformedBatch, i)
		}
		p := 1 + m
		_, m = binary.Varint(r[p:])
		if m <= 0 {
			return dst[:start], fmt.Errorf("%w: record %d does not parse", ErrMalformedBatch, i)
		}
		p += m
		s := xxh3.Hash128(r[p:])
		dst = append(dst, RecordKey{Lo: s.Lo, Hi: s.Hi, Present: true})
	}
	if len(dst)-start != int(h.NumRecords) {
		return dst[:start], fmt.Errorf("%w: %d records, header says %d", ErrMalformedBatch, len(dst)-start, h.NumRecords)
	}
	return dst, nil
}
