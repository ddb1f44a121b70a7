package kafka

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
	Topic         = "t"
	MaxPartitions = 4
)

// Lid names one logical record: what a client means to write once. A
// retry carries the lids of the records it repeats; a fresh record, even
// one whose bytes equal an earlier one's (a heartbeat), has a new lid.
type Lid int32

// Rec is one record as a client puts it in a batch: its lid, its name
// (the record's value; its key is null and it has no headers, as in the
// decide scripts) and its timestamp in ms since the Unix epoch.
type Rec struct {
	Lid  Lid
	Name string
	TS   int64
}

// Writer is how a client writes the header fields of a batch without a
// producer id that the proxy reads to tell clients apart
// (decide/rule.go, restamps).
type Writer struct {
	LeaderEpoch int32 // partition leader epoch: 0, or -1 (kafka-go, Java)
	LegacyEpoch int16 // producer epoch of a legacy batch: -1, or 0 (kafkajs)
}

// Batch is one batch a client sends to one partition.
type Batch struct {
	Partition int32
	Recs      []Rec
	PID       int64 // -1: legacy
	Epoch     int16
	Seq       int32
	W         Writer
}

// PartResult is the broker's answer for one partition.
type PartResult struct {
	Partition  int32
	Code       int16
	Offset     int64
	AppendTime int64 // log append time, -1 for CreateTime
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Bytes builds the v2 batch exactly as decide/script_test.go's
// scriptBatch does, so that a script replays the same bytes.
func (b *Batch) Bytes() []byte {
	ts := make([]int64, len(b.Recs))
	for i, r := range b.Recs {
		ts[i] = r.TS
	}
	rb := kmsg.RecordBatch{Magic: 2, ProducerID: b.PID, ProducerEpoch: b.Epoch, FirstSequence: b.Seq,
		NumRecords: int32(len(b.Recs)), LastOffsetDelta: int32(len(b.Recs) - 1), FirstTimestamp: ts[0], MaxTimestamp: slices.Max(ts)}
	if b.PID < 0 {
		rb.ProducerEpoch, rb.FirstSequence = b.W.LegacyEpoch, -1
	}
	for i, r := range b.Recs {
		rec := []byte{0}
		rec = binary.AppendVarint(rec, ts[i]-ts[0])
		rec = binary.AppendVarint(rec, int64(i))
		rec = binary.AppendVarint(rec, -1)
		rec = binary.AppendVarint(rec, int64(len(r.Name)))
		rec = append(rec, r.Name...)
		rec = binary.AppendVarint(rec, 0)
		rb.Records = append(binary.AppendVarint(rb.Records, int64(len(rec))), rec...)
	}
	raw := rb.AppendTo(nil)
	binary.BigEndian.PutUint32(raw[8:], uint32(len(raw)-12))
	binary.BigEndian.PutUint32(raw[12:], uint32(b.W.LeaderEpoch))
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
	b := Batch{Recs: []Rec{{Name: n, TS: 0}}, PID: -1, W: Writer{LegacyEpoch: -1}}
	return recordIDs(b.Bytes())[0].Hash
}

// KeptRecords says which records of sent a rebuilt batch kept: the
// rebuilt batch holds a subsequence of them, in order. Records identical
// in bytes (name and timestamp) cannot be told apart in the log, so among
// each such group the kept ones are taken to be those whose lid is not
// written yet (written reports it): the log is then read as favourably to
// the proxy as its bytes allow, never less.
func KeptRecords(sent []Rec, rebuilt []byte, written func(Lid) bool) []Rec {
	type key struct {
		hash uint64
		ts   int64
	}
	want := map[key]int{}
	for _, id := range recordIDs(rebuilt) {
		want[key{id.Hash, id.Timestamp}]++
	}
	hashes := map[string]uint64{}
	keyOf := func(r Rec) key {
		h, ok := hashes[r.Name]
		if !ok {
			h = nameHash(r.Name)
			hashes[r.Name] = h
		}
		return key{h, r.TS}
	}
	var kept []Rec
	for pass := 0; pass < 2; pass++ {
		for _, r := range sent {
			k := keyOf(r)
			if want[k] == 0 || written(r.Lid) == (pass == 0) || slices.ContainsFunc(kept, func(x Rec) bool { return x.Lid == r.Lid }) {
				continue
			}
			want[k]--
			kept = append(kept, r)
		}
	}
	// Back in the order they were sent.
	slices.SortFunc(kept, func(a, b Rec) int {
		return slices.IndexFunc(sent, func(x Rec) bool { return x.Lid == a.Lid }) - slices.IndexFunc(sent, func(x Rec) bool { return x.Lid == b.Lid })
	})
	return kept
}

// HeaderOf reads the header of batch raw.
func HeaderOf(raw []byte) protocol.BatchHeader {
	var h protocol.BatchHeader
	if _, err := protocol.ReadBatch(raw, &h); err != nil {
		panic(err)
	}
	return h
}
