package protocol

import "github.com/cespare/xxhash/v2"

// RecordsIdentity returns the 64-bit identity of a legacy (producer id -1)
// batch's contents, for deduplicating retries that Kafka cannot recognise
// (docs/legacy.md): an xxHash64 of the records section (the bytes after the
// 61-byte batch header) mixed with its length, the record count and the
// codec.
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
	end := batchLogOverhead + int(h.Length)
	if end > len(records) || end < batchHeaderSize {
		end = len(records)
	}
	var recs []byte
	if end > batchHeaderSize {
		recs = records[batchHeaderSize:end]
	}
	x := xxhash.Sum64(recs)
	x ^= mix64(uint64(len(recs))<<32 | uint64(uint32(h.NumRecords)))
	x = mix64(x ^ uint64(h.Attributes&attrCompressionMask))
	if exact {
		x = mix64(x ^ uint64(h.FirstTimestamp))
		x = mix64(x ^ uint64(h.MaxTimestamp))
	}
	if x == 0 {
		return 1
	}
	return x
}

// MixIdentity combines a records identity with the topic it was sent to
// (an interned topic id), so that the same records sent to two topics are
// two identities. The partition is left out: a retry may carry a batch to
// another partition (kafkajs partitions keyless records round-robin on
// every attempt), so it is kept beside the identity instead. Never 0.
func MixIdentity(recordsID uint64, topic uint32) uint64 {
	x := mix64(recordsID ^ mix64(uint64(topic)))
	if x == 0 {
		return 1
	}
	return x
}
