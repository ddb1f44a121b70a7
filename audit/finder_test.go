package audit

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// rec is a record of partition p at offset off, ms milliseconds after t0.
func rec(p int32, off int64, ms int64, key, value string, headers ...string) *Record {
	r := &Record{Partition: p, Offset: off, Timestamp: t0.Add(time.Duration(ms) * time.Millisecond), ProducerID: -1}
	if key != "" {
		r.Key = []byte(key)
	}
	r.Value = []byte(value)
	for i := 0; i+1 < len(headers); i += 2 {
		r.Headers = append(r.Headers, Header{Key: headers[i], Value: []byte(headers[i+1])})
	}
	return r
}

// TestContentCopies: a record identical to an earlier one in key, value
// and headers within the window is a copy; a difference in any of them,
// or a gap beyond the window, is not.
func TestContentCopies(t *testing.T) {
	f := NewFinder(Settings{Window: time.Minute})
	for _, r := range []*Record{
		rec(0, 0, 0, "k", "v"),
		rec(0, 1, 1000, "k", "v"),              // copy of 0/0, 1 s later
		rec(0, 2, 2000, "k", "v", "h", "1"),    // a header more: new
		rec(0, 3, 2500, "k", "v", "h", "1"),    // copy of 0/2
		rec(0, 4, 3000, "k", "v", "h", "2"),    // another header value: new
		rec(0, 5, 3100, "", "v"),               // null key: new
		rec(0, 6, 3200, "k", "w"),              // another value: new
		rec(0, 7, 200_000, "k", "v"),           // 199 s after 0/1: beyond the window
		rec(0, 8, 230_000, "k", "v"),           // 30 s after 0/7: copy
		rec(0, 9, 230_001, "kv", ""),           // key and value boundaries differ: new
		rec(0, 10, 230_002, "", "v", "a", "b"), // null key with a header: new
		rec(0, 11, 230_003, "", "v", "a", "b"), // copy of 0/10
	} {
		f.Add(r)
	}
	rep := f.Report()
	if rep.Records != 12 || rep.Copies != 4 || rep.SamePartition != 4 || rep.SameProducer != 4 {
		t.Fatalf("records %d copies %d same partition %d same producer %d; want 12 4 4 4", rep.Records, rep.Copies, rep.SamePartition, rep.SameProducer)
	}
	want := []struct{ off, earlier int64 }{{1, 0}, {3, 2}, {8, 7}, {11, 10}}
	if len(rep.Examples) != DefaultExamples-1 {
		t.Fatalf("%d examples, want 4", len(rep.Examples))
	}
	for i, w := range want {
		if e := rep.Examples[i]; e.Offset != w.off || e.EarlierOffset != w.earlier || e.Kind != KindCopy {
			t.Errorf("example %d: %+v, want offset %d repeating %d", i, e, w.off, w.earlier)
		}
	}
	if g := rep.Gaps; g.Min != time.Millisecond || g.Max != 30*time.Second || g.Median < 500*time.Millisecond || g.Median > time.Second {
		t.Errorf("gaps %+v: want min 1ms, max 30s, median between 0.5 and 1 s", g)
	}
}

// TestCopiesAcrossPartitions: a copy in another partition counts, whichever
// of the two partitions the consumer reads first; a later copy is compared
// with the newest earlier one.
func TestCopiesAcrossPartitions(t *testing.T) {
	f := NewFinder(Settings{Window: time.Minute})
	f.Expect(0)
	f.Expect(1)
	f.Add(rec(1, 0, 5000, "k", "v")) // the later copy, read first
	f.Add(rec(0, 0, 1000, "k", "v")) // the original
	f.Add(rec(1, 1, 9000, "k", "v")) // 4 s after 1/0: a copy again
	rep := f.Report()
	if rep.Copies != 2 || rep.SamePartition != 1 {
		t.Fatalf("copies %d (same partition %d), want 2 (1)", rep.Copies, rep.SamePartition)
	}
	if e := rep.Examples[0]; e.Partition != 1 || e.EarlierPartition != 0 || e.Apart != 4*time.Second {
		t.Errorf("first copy %d/%d repeats %d/%d %s apart; want 1/0 repeating 0/0, 4s", e.Partition, e.Offset, e.EarlierPartition, e.EarlierOffset, e.Apart)
	}
	if e := rep.Examples[1]; e.EarlierPartition != 1 || e.EarlierOffset != 0 || e.Apart != 4*time.Second {
		t.Errorf("second copy repeats %d/%d %s apart; want 1/0, 4s", e.EarlierPartition, e.EarlierOffset, e.Apart)
	}
	if len(rep.Partitions) != 2 || rep.Partitions[0].Copies != 0 || rep.Partitions[1].Copies != 2 || rep.Partitions[0].Records != 1 {
		t.Errorf("per partition %+v", rep.Partitions)
	}
}

// TestKeyRepeats: the same idempotency key within the key window counts,
// whatever the rest of the record; records without the header are counted
// apart.
func TestKeyRepeats(t *testing.T) {
	f := NewFinder(Settings{Window: time.Second, KeyHeader: "idempotency-key", KeyWindow: time.Hour})
	f.Add(rec(0, 0, 0, "", "a", "idempotency-key", "op-1"))
	f.Add(rec(0, 1, 10_000, "", "b", "idempotency-key", "op-1"))    // same key, other value: a repeat
	f.Add(rec(0, 2, 20_000, "", "a", "idempotency-key", "op-2"))    // new key
	f.Add(rec(0, 3, 30_000, "", "c"))                               // no header
	f.Add(rec(0, 4, 4_000_000, "", "d", "idempotency-key", "op-1")) // beyond the key window
	f.Add(rec(0, 5, 4_000_500, "", "d", "idempotency-key", "op-1")) // a copy and a key repeat
	rep := f.Report()
	if rep.KeyRepeats != 2 || rep.WithoutKey != 1 || rep.Copies != 1 {
		t.Fatalf("key repeats %d, without key %d, copies %d; want 2, 1, 1", rep.KeyRepeats, rep.WithoutKey, rep.Copies)
	}
	if e := rep.Examples[0]; e.Kind != KindKeyRepeat || e.KeyHeader != "op-1" || e.Offset != 1 {
		t.Errorf("first example %+v", e)
	}
}

// TestProducerCounts: copies are counted per producer id, most first, and
// the producers beyond maxProducers together.
func TestProducerCounts(t *testing.T) {
	f := NewFinder(Settings{Window: time.Minute})
	var off int64
	add := func(pid int64, value string) {
		r := rec(0, off, off, "", value)
		r.ProducerID = pid
		f.Add(r)
		off++
	}
	for pid := int64(0); pid < maxProducers+10; pid++ {
		add(pid, fmt.Sprint(pid))
		add(pid, fmt.Sprint(pid))
	}
	add(-1, "0") // a legacy producer repeating producer 0's record
	rep := f.Report()
	if rep.Copies != maxProducers+11 || rep.SameProducer != maxProducers+10 {
		t.Fatalf("copies %d same producer %d", rep.Copies, rep.SameProducer)
	}
	last := rep.Producers[len(rep.Producers)-1]
	if len(rep.Producers) != maxProducers+1 || !last.Others || last.Copies != 11 {
		t.Fatalf("%d producer rows, last %+v; want %d rows, the last others with 11", len(rep.Producers), last, maxProducers+1)
	}
}

// TestMemoryBound: at most MaxTracked records are remembered per table;
// those let go inside their window are counted, and a copy of one is
// missed (the counts become a lower bound). Records older than the window
// behind every partition are let go without counting.
func TestMemoryBound(t *testing.T) {
	f := NewFinder(Settings{Window: time.Hour, MaxTracked: 100})
	for i := int64(0); i < 150; i++ {
		f.Add(rec(0, i, i, "", fmt.Sprint(i)))
	}
	f.Add(rec(0, 150, 150, "", "0"))   // its original was forgotten: missed
	f.Add(rec(0, 151, 151, "", "149")) // remembered: a copy
	rep := f.Report()
	// 50 let go while the first 150 came, one more for each of the last two.
	if rep.Copies != 1 || rep.Forgotten != 52 || rep.Tracked != 100 {
		t.Fatalf("copies %d forgotten %d tracked %d; want 1 52 100", rep.Copies, rep.Forgotten, rep.Tracked)
	}

	g := NewFinder(Settings{Window: time.Second, MaxTracked: 100})
	for i := int64(0); i < 1000; i++ {
		g.Add(rec(0, i, i*100, "", fmt.Sprint(i))) // 10 a second
	}
	if rep := g.Report(); rep.Forgotten != 0 || rep.Tracked > 100 {
		t.Fatalf("forgotten %d tracked %d; want none forgotten inside the window, at most 100 tracked", rep.Forgotten, rep.Tracked)
	}
}

// TestBytesPerTracked measures what a remembered record costs on the heap
// and holds it to BytesPerTracked, the figure docs/audit.md states.
func TestBytesPerTracked(t *testing.T) {
	const n = 1 << 17
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f := NewFinder(Settings{Window: time.Hour, MaxTracked: n, KeyHeader: "id"})
	for i := int64(0); i < n; i++ {
		id := fmt.Sprint(i)
		f.Add(rec(0, i, i, "", id, "id", id))
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(f)
	per := float64(after.HeapAlloc-before.HeapAlloc) / (2 * n) // two tables
	t.Logf("%.1f B per tracked record (%d records in each of two tables)", per, n)
	if per > BytesPerTracked {
		t.Errorf("%.1f B per tracked record, more than BytesPerTracked (%d)", per, BytesPerTracked)
	}
}

// BenchmarkFinderAdd: one 100-byte record with two headers, a tenth of
// them copies, key header on.
func BenchmarkFinderAdd(b *testing.B) {
	f := NewFinder(Settings{Window: time.Minute, KeyHeader: "id", MaxTracked: 1 << 16})
	value := make([]byte, 100)
	r := &Record{Value: value, ProducerID: -1, Headers: []Header{{Key: "source", Value: []byte("billing")}, {Key: "id", Value: make([]byte, 8)}}}
	b.SetBytes(int64(len(value)))
	b.ReportAllocs()
	var i int64
	for b.Loop() {
		n := i - i%10/9 // every tenth record repeats the one before
		binary.BigEndian.PutUint64(value, uint64(n))
		binary.BigEndian.PutUint64(r.Headers[1].Value, uint64(n))
		r.Offset, r.Timestamp = i, t0.Add(time.Duration(i)*time.Millisecond)
		f.Add(r)
		i++
	}
	b.ReportMetric(float64(f.Report().Copies)/float64(i), "copies/record")
}
