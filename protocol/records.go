package protocol

import (
	"encoding/binary"
	"fmt"

	"github.com/zeebo/xxh3"
)

// RecordID is what one record of a legacy batch is, wherever and whenever a
// client sends it (docs/legacy.md, "The rule"): Hash is a 64-bit hash (XXH3)
// of its key, value and headers, and Timestamp its absolute timestamp (the
// batch's first timestamp plus the record's delta), kept beside the hash
// because clients differ: franz-go, sarama and librdkafka resend a record
// with its timestamp, kafka-go and kafkajs stamp it again. Its offset delta,
// its position in a batch, is left out: a client that puts failed records
// back in its queue resends them in other batches, at other positions.
type RecordID struct {
	Hash      uint64
	Timestamp int64
}

// AppendRecordIDs appends to dst the RecordID of each record of the
// uncompressed v2 batch in records (its header in h). A compressed batch
// gives ErrCompressed: its records cannot be read without decompressing
// them. On error dst is returned as it came. Hashes are never 0.
//
// Two different records collide with probability about 2^-64; the hash is
// deterministic, so the IDs of a batch read back from the log are the IDs
// its producer's records had.
func AppendRecordIDs(dst []RecordID, records []byte, h *BatchHeader) ([]RecordID, error) {
	if h.Attributes&attrCompressionMask != 0 {
		return dst, ErrCompressed
	}
	recs := recordsSection(records, h)
	start := len(dst)
	bad := func(i int) ([]RecordID, error) {
		return dst[:start], fmt.Errorf("%w: record %d does not parse", ErrMalformedBatch, i)
	}
	i := 0
	for off := 0; off < len(recs); i++ {
		l, n := binary.Varint(recs[off:])
		if n <= 0 || l < 1 || int64(len(recs)-off-n) < l {
			return bad(i)
		}
		r := recs[off+n : off+n+int(l)]
		off += n + int(l)
		// attributes (1 byte), timestampDelta, offsetDelta, then the
		// record's own bytes: key, value, headers.
		tsd, m := binary.Varint(r[1:])
		if m <= 0 {
			return bad(i)
		}
		p := 1 + m
		_, m = binary.Varint(r[p:])
		if m <= 0 {
			return bad(i)
		}
		p += m
		dst = append(dst, RecordID{Hash: xxh3.Hash(r[p:]) | 1, Timestamp: h.FirstTimestamp + tsd})
	}
	if i != int(h.NumRecords) {
		return dst[:start], fmt.Errorf("%w: %d records, header says %d", ErrMalformedBatch, i, h.NumRecords)
	}
	return dst, nil
}

// BatchID is the single RecordID standing for a whole compressed batch,
// whose records cannot be told apart without decompressing it: its records
// section's identity (see RecordsIdentity), and its first timestamp. A
// compressed batch is matched whole or not at all.
func BatchID(records []byte, h *BatchHeader) RecordID {
	return RecordID{Hash: RecordsIdentity(records, h, false), Timestamp: h.FirstTimestamp}
}
