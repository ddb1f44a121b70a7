package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

func legacyBatch(tb testing.TB, n int, value string, ts int64) ([]byte, BatchHeader) {
	tb.Helper()
	values, stamps := make([]string, n), make([]int64, n)
	for i := range values {
		values[i], stamps[i] = fmt.Sprintf("%s-%d", value, i), ts
	}
	return stampedBatch(tb, values, stamps)
}

// TestRecordsIdentity: a restamped retry (kafka-go, kafkajs) has the same
// identity, unless exact; different records or counts do not.
func TestRecordsIdentity(t *testing.T) {
	a, ha := legacyBatch(t, 3, "v", 1000)
	restamped, hr := legacyBatch(t, 3, "v", 2000)
	other, ho := legacyBatch(t, 3, "w", 1000)
	fewer, hf := legacyBatch(t, 2, "v", 1000)
	id := RecordsIdentity(a, &ha, false)
	if id == 0 || id != RecordsIdentity(restamped, &hr, false) {
		t.Fatal("restamped retry has another identity")
	}
	if RecordsIdentity(a, &ha, true) == RecordsIdentity(restamped, &hr, true) {
		t.Fatal("exact identity ignores the timestamps")
	}
	if id == RecordsIdentity(other, &ho, false) || id == RecordsIdentity(fewer, &hf, false) {
		t.Fatal("different records share an identity")
	}
	if MixIdentity(id, 1, 0) == MixIdentity(id, 2, 0) || MixIdentity(id, 1, 0) == MixIdentity(id, 1, 1) {
		t.Fatal("topics share an identity")
	}
	if n := testing.AllocsPerRun(100, func() { sinkID = RecordsIdentity(a, &ha, false) }); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}

var sinkID uint64

func BenchmarkRecordsIdentity(b *testing.B) {
	for _, n := range []int{1, 100, 1000} {
		raw, h := legacyBatch(b, n, "a record value of some thirty bytes", 1000)
		b.Run(fmt.Sprintf("records=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(raw)))
			for b.Loop() {
				sinkID = RecordsIdentity(raw, &h, false)
			}
		})
	}
}

// TestDropLeadingRecords: a librdkafka re-batched retry holds the lost
// batch's records first; the rebuilt batch keeps only the rest, renumbered,
// valid (CRC, count, last offset delta), and the prefix has the identity
// the lost batch had.
func TestDropLeadingRecords(t *testing.T) {
	full, h := legacyBatch(t, 5, "v", 1000)
	lost, hl := legacyBatch(t, 2, "v", 1000)
	n, ok := PrefixLen(full, &h, 2)
	if !ok || n != len(lost)-batchHeaderSize {
		t.Fatalf("prefix length: ok=%v n=%d, want %d", ok, n, len(lost)-batchHeaderSize)
	}
	if id := PrefixIdentity(full, &h, 2, n); id != RecordsIdentity(lost, &hl, false) {
		t.Fatal("the prefix's identity is not the lost batch's")
	}
	if _, ok := PrefixLen(full, &h, 5); ok {
		t.Fatal("a prefix as long as the batch")
	}
	out, err := DropLeadingRecords(nil, full, &h, 2)
	if err != nil {
		t.Fatal(err)
	}
	var hb BatchHeader
	if _, err := ReadBatch(out, &hb); err != nil {
		t.Fatal(err)
	}
	if code := BatchValid(out, &hb); code != 0 {
		t.Fatalf("rebuilt batch invalid: error %d", code)
	}
	rb := kmsg.RecordBatch{}
	if err := rb.ReadFrom(out); err != nil {
		t.Fatal(err)
	}
	if rb.NumRecords != 3 || rb.LastOffsetDelta != 2 || rb.FirstTimestamp != 1000 || rb.MaxTimestamp != 1000 {
		t.Fatalf("header: %+v", rb)
	}
	recs := rb.Records
	for i := 0; i < 3; i++ {
		var r kmsg.Record
		l, m := binary.Varint(recs)
		if err := r.ReadFrom(recs[:m+int(l)]); err != nil {
			t.Fatal(err)
		}
		if r.OffsetDelta != int32(i) || string(r.Value) != fmt.Sprintf("v-%d", i+2) {
			t.Fatalf("record %d: delta %d value %q", i, r.OffsetDelta, r.Value)
		}
		recs = recs[m+int(l):]
	}
	if _, err := DropLeadingRecords(nil, full, &h, 5); err == nil {
		t.Fatal("dropped every record")
	}
	h.Attributes |= 1 // gzip
	if _, err := DropLeadingRecords(nil, full, &h, 1); !errors.Is(err, ErrCompressed) {
		t.Fatalf("compressed: %v", err)
	}
}

// FuzzDropLeadingRecords: never panics; what it returns is a valid batch of
// the records after skip.
func FuzzDropLeadingRecords(f *testing.F) {
	full, _ := legacyBatch(f, 4, "seed", 1000)
	f.Add(full, 1)
	f.Add(full, 3)
	f.Add(full[:len(full)-2], 1)
	f.Add([]byte{}, 1)
	f.Fuzz(func(t *testing.T, records []byte, skip int) {
		var h BatchHeader
		if _, err := ReadBatch(records, &h); err != nil {
			return
		}
		if n, ok := PrefixLen(records, &h, skip); ok {
			PrefixIdentity(records, &h, skip, n)
		}
		out, err := DropLeadingRecords(nil, records, &h, skip)
		if err != nil {
			return
		}
		var hb BatchHeader
		if _, err := ReadBatch(out, &hb); err != nil {
			t.Fatalf("rebuilt batch does not read: %v", err)
		}
		if int(hb.NumRecords) != int(h.NumRecords)-skip || hb.LastOffsetDelta != hb.NumRecords-1 {
			t.Fatalf("rebuilt: %d records, last delta %d; from %d minus %d", hb.NumRecords, hb.LastOffsetDelta, h.NumRecords, skip)
		}
	})
}

// keyedBatch builds an uncompressed legacy batch whose record i carries
// header "idempotency-key" = keys[i] (none when keys[i] is "").
func keyedBatch(tb testing.TB, keys []string) ([]byte, BatchHeader) {
	tb.Helper()
	b := kmsg.RecordBatch{Magic: 2, ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1, NumRecords: int32(len(keys)),
		LastOffsetDelta: int32(len(keys) - 1), FirstTimestamp: 1000, MaxTimestamp: 1000}
	for i, k := range keys {
		v := fmt.Sprintf("value-%d", i)
		rec := []byte{0}
		rec = binary.AppendVarint(rec, 0)
		rec = binary.AppendVarint(rec, int64(i))
		rec = binary.AppendVarint(rec, -1)
		rec = binary.AppendVarint(rec, int64(len(v)))
		rec = append(rec, v...)
		if k == "" {
			rec = binary.AppendVarint(rec, 1)
			rec = binary.AppendVarint(rec, 5)
			rec = append(rec, "other"...)
			rec = binary.AppendVarint(rec, 1)
			rec = append(rec, 'x')
		} else {
			rec = binary.AppendVarint(rec, 2)
			rec = binary.AppendVarint(rec, 5)
			rec = append(rec, "trace"...)
			rec = binary.AppendVarint(rec, -1)
			rec = binary.AppendVarint(rec, 15)
			rec = append(rec, "idempotency-key"...)
			rec = binary.AppendVarint(rec, int64(len(k)))
			rec = append(rec, k...)
		}
		b.Records = append(binary.AppendVarint(b.Records, int64(len(rec))), rec...)
	}
	raw := b.AppendTo(nil)
	binary.BigEndian.PutUint32(raw[8:], uint32(len(raw)-12))
	binary.BigEndian.PutUint32(raw[17:], crc32.Checksum(raw[21:], castagnoli))
	var h BatchHeader
	if _, err := ReadBatch(raw, &h); err != nil {
		tb.Fatal(err)
	}
	return raw, h
}

// TestRecordKeys: each record's idempotency key is found among its
// headers; equal keys hash equal; DropRecords keeps the others, valid.
func TestRecordKeys(t *testing.T) {
	raw, h := keyedBatch(t, []string{"evt-1", "", "evt-2", "evt-1"})
	keys, err := RecordKeys(nil, raw, &h, "idempotency-key")
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 4 || !keys[0].Present || keys[1].Present || !keys[2].Present || keys[0] != keys[3] || keys[0] == keys[2] {
		t.Fatalf("keys: %+v", keys)
	}
	out, err := DropRecords(nil, raw, &h, []bool{true, false, true, false})
	if err != nil {
		t.Fatal(err)
	}
	var hb BatchHeader
	if _, err := ReadBatch(out, &hb); err != nil || hb.NumRecords != 2 || BatchValid(out, &hb) != 0 {
		t.Fatalf("rebuilt: %v %+v", err, hb)
	}
	if k2, err := RecordKeys(nil, out, &hb, "idempotency-key"); err != nil || len(k2) != 2 || k2[0].Present || k2[1] != keys[3] {
		t.Fatalf("keys of the rebuilt batch: %v %+v", err, k2)
	}
	if _, err := DropRecords(nil, raw, &h, []bool{true, true, true, true}); err == nil {
		t.Fatal("dropped every record")
	}
	buf := make([]RecordKey, 0, 8)
	if n := testing.AllocsPerRun(100, func() { buf, _ = RecordKeys(buf[:0], raw, &h, "idempotency-key") }); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}

// FuzzRecordKeys: never panics; a result has one key per record.
func FuzzRecordKeys(f *testing.F) {
	raw, _ := keyedBatch(f, []string{"a", "", "b"})
	f.Add(raw)
	f.Add(raw[:len(raw)-4])
	f.Fuzz(func(t *testing.T, records []byte) {
		var h BatchHeader
		if _, err := ReadBatch(records, &h); err != nil {
			return
		}
		keys, err := RecordKeys(nil, records, &h, "idempotency-key")
		if err == nil && len(keys) != int(h.NumRecords) {
			t.Fatalf("%d keys for %d records", len(keys), h.NumRecords)
		}
		stamps, err := RecordStamps(nil, records, &h)
		if err == nil && len(stamps) != int(h.NumRecords) {
			t.Fatalf("%d stamps for %d records", len(stamps), h.NumRecords)
		}
	})
}

// stampedBatch builds an uncompressed legacy batch of values, record i
// written at absolute time ts[i] (ms), the batch's first timestamp ts[0].
func stampedBatch(tb testing.TB, values []string, ts []int64) ([]byte, BatchHeader) {
	tb.Helper()
	n := len(values)
	b := kmsg.RecordBatch{Magic: 2, ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1, NumRecords: int32(n),
		LastOffsetDelta: int32(n - 1), FirstTimestamp: ts[0], MaxTimestamp: ts[n-1]}
	for i, v := range values {
		rec := []byte{0}
		rec = binary.AppendVarint(rec, ts[i]-ts[0])
		rec = binary.AppendVarint(rec, int64(i))
		rec = binary.AppendVarint(rec, -1)
		rec = binary.AppendVarint(rec, int64(len(v)))
		rec = append(rec, v...)
		rec = binary.AppendVarint(rec, 0)
		b.Records = append(binary.AppendVarint(b.Records, int64(len(rec))), rec...)
	}
	raw := b.AppendTo(nil)
	binary.BigEndian.PutUint32(raw[8:], uint32(len(raw)-12))
	binary.BigEndian.PutUint32(raw[17:], crc32.Checksum(raw[21:], castagnoli))
	var h BatchHeader
	if _, err := ReadBatch(raw, &h); err != nil {
		tb.Fatal(err)
	}
	return raw, h
}

// TestRecordStamps: a record keeps its stamp when it is resent at another
// position of another batch (sarama re-queues failed records behind newer
// ones), stamped with another time; another value has another stamp.
func TestRecordStamps(t *testing.T) {
	orig, ho := stampedBatch(t, []string{"a", "b", "c"}, []int64{1000, 1001, 1003})
	retry, hr := stampedBatch(t, []string{"x", "y", "a", "b", "c"}, []int64{1005, 1005, 1000, 1001, 1003})
	later, hl := stampedBatch(t, []string{"a"}, []int64{1004})
	so, err := RecordStamps(nil, orig, &ho)
	if err != nil {
		t.Fatal(err)
	}
	sr, err := RecordStamps(nil, retry, &hr)
	if err != nil {
		t.Fatal(err)
	}
	if len(so) != 3 || len(sr) != 5 || sr[2] != so[0] || sr[3] != so[1] || sr[4] != so[2] {
		t.Fatalf("resent records changed stamps: %v vs %v", so, sr)
	}
	if sr[0] == sr[1] || sr[0] == so[0] {
		t.Fatal("different records share a stamp")
	}
	if sl, _ := RecordStamps(nil, later, &hl); sl[0] != so[0] {
		t.Fatal("the same record resent at another time has another stamp")
	}
	buf := make([]RecordKey, 0, 8)
	if n := testing.AllocsPerRun(100, func() { buf, _ = RecordStamps(buf[:0], retry, &hr) }); n != 0 {
		t.Fatalf("%v allocations", n)
	}
	hc := hr
	hc.Attributes |= 1 // gzip
	if _, err := RecordStamps(nil, retry, &hc); !errors.Is(err, ErrCompressed) {
		t.Fatalf("compressed: %v", err)
	}
}
