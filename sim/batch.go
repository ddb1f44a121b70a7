package sim

import (
	"encoding/binary"
	"hash/crc32"
	"slices"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/protocol"
)

// The simulated topic: one topic, as in the decide scripts, whose
// partitions a run uses a few of.
const (
	topicName     = "t"
	maxPartitions = 4
)

// lid names one logical record: what a client means to write once. A
// retry carries the lids of the records it repeats; a fresh record, even
// one whose bytes equal an earlier one's (a heartbeat), has a new lid.
type lid int32

// rec is one record as a client puts it in a batch: its lid, its name
// (the record's value; its key is null and it has no headers, as in the
// decide scripts) and its timestamp in ms since the Unix epoch.
type rec struct {
	lid  lid
	name string
	ts   int64
}

// writer is how a client writes the header fields of a batch without a
// producer id that the proxy reads to tell clients apart
// (decide/rule.go, restamps).
type writer struct {
	leaderEpoch int32 // partition leader epoch: 0, or -1 (kafka-go, Java)
	legacyEpoch int16 // producer epoch of a legacy batch: -1, or 0 (kafkajs)
}

// batchSpec is one batch a client sends to one partition.
type batchSpec struct {
	partition int32
	recs      []rec
	pid       int64 // -1: legacy
	epoch     int16
	seq       int32
	w         writer
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// bytes builds the v2 batch exactly as decide/script_test.go's
// scriptBatch does, so that a script replays the same bytes.
func (b *batchSpec) bytes() []byte {
	ts := make([]int64, len(b.recs))
	for i, r := range b.recs {
		ts[i] = r.ts
	}
	rb := kmsg.RecordBatch{Magic: 2, ProducerID: b.pid, ProducerEpoch: b.epoch, FirstSequence: b.seq,
		NumRecords: int32(len(b.recs)), LastOffsetDelta: int32(len(b.recs) - 1), FirstTimestamp: ts[0], MaxTimestamp: slices.Max(ts)}
	if b.pid < 0 {
		rb.ProducerEpoch, rb.FirstSequence = b.w.legacyEpoch, -1
	}
	for i, r := range b.recs {
		rec := []byte{0}
		rec = binary.AppendVarint(rec, ts[i]-ts[0])
		rec = binary.AppendVarint(rec, int64(i))
		rec = binary.AppendVarint(rec, -1)
		rec = binary.AppendVarint(rec, int64(len(r.name)))
		rec = append(rec, r.name...)
		rec = binary.AppendVarint(rec, 0)
		rb.Records = append(binary.AppendVarint(rb.Records, int64(len(rec))), rec...)
	}
	raw := rb.AppendTo(nil)
	binary.BigEndian.PutUint32(raw[8:], uint32(len(raw)-12))
	binary.BigEndian.PutUint32(raw[12:], uint32(b.w.leaderEpoch))
	binary.BigEndian.PutUint32(raw[17:], crc32.Checksum(raw[21:], castagnoli))
	return raw
}

// recordIDs reads the identities of a batch's records (hash of key, value
// and headers; absolute timestamp).
func recordIDs(raw []byte) []protocol.RecordID {
	var h protocol.BatchHeader
	if _, err := protocol.ReadBatch(raw, &h); err != nil {
		panic(err)
	}
	ids, err := protocol.AppendRecordIDs(nil, raw, &h)
	if err != nil {
		panic(err)
	}
	return ids
}

// nameHash is the hash of a record named n, as protocol.AppendRecordIDs
// computes it.
func nameHash(n string) uint64 {
	b := batchSpec{recs: []rec{{name: n, ts: 0}}, pid: -1, w: writer{legacyEpoch: -1}}
	return recordIDs(b.bytes())[0].Hash
}

// keptRecords says which records of sent a rebuilt batch kept: the
// rebuilt batch holds a subsequence of them, in order. Records identical
// in bytes (name and timestamp) cannot be told apart in the log, so among
// each such group the kept ones are taken to be those whose lid is not
// written yet (written reports it): the log is then read as favourably to
// the proxy as its bytes allow, never less.
func keptRecords(sent []rec, rebuilt []byte, written func(lid) bool) []rec {
	type key struct {
		hash uint64
		ts   int64
	}
	want := map[key]int{}
	for _, id := range recordIDs(rebuilt) {
		want[key{id.Hash, id.Timestamp}]++
	}
	hashes := map[string]uint64{}
	keyOf := func(r rec) key {
		h, ok := hashes[r.name]
		if !ok {
			h = nameHash(r.name)
			hashes[r.name] = h
		}
		return key{h, r.ts}
	}
	var kept []rec
	for pass := 0; pass < 2; pass++ {
		for _, r := range sent {
			k := keyOf(r)
			if want[k] == 0 || written(r.lid) == (pass == 0) || slices.ContainsFunc(kept, func(x rec) bool { return x.lid == r.lid }) {
				continue
			}
			want[k]--
			kept = append(kept, r)
		}
	}
	// Back in the order they were sent.
	slices.SortFunc(kept, func(a, b rec) int {
		return slices.IndexFunc(sent, func(x rec) bool { return x.lid == a.lid }) - slices.IndexFunc(sent, func(x rec) bool { return x.lid == b.lid })
	})
	return kept
}
