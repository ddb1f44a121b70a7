package protocol

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestRecordIDs: a record keeps its hash when it is resent at another
// position of another batch (sarama re-queues failed records behind newer
// ones, librdkafka splits them at other boundaries), and its timestamp is
// absolute; another value has another hash. The IDs agree with kmsg's
// decoding of the same batch.
func TestRecordIDs(t *testing.T) {
	orig, ho := stampedBatch(t, []string{"a", "b", "c"}, []int64{1000, 1001, 1003})
	retry, hr := stampedBatch(t, []string{"x", "y", "a", "b", "c"}, []int64{1005, 1005, 1000, 1001, 1003})
	io, err := AppendRecordIDs(nil, orig, &ho)
	if err != nil {
		t.Fatal(err)
	}
	ir, err := AppendRecordIDs(nil, retry, &hr)
	if err != nil {
		t.Fatal(err)
	}
	for i := range io {
		if io[i] != ir[i+2] {
			t.Errorf("record %d: %+v in the original, %+v resent", i, io[i], ir[i+2])
		}
	}
	if ir[0].Hash == io[0].Hash || ir[0].Hash == ir[1].Hash {
		t.Error("different values share a hash")
	}
	var b kmsg.RecordBatch
	if err := b.ReadFrom(retry); err != nil {
		t.Fatal(err)
	}
	recs := readRawRecords(int(b.NumRecords), b.Records)
	for i, r := range recs {
		if ir[i].Timestamp != b.FirstTimestamp+r.TimestampDelta64 {
			t.Errorf("record %d timestamp %d, kmsg says %d", i, ir[i].Timestamp, b.FirstTimestamp+r.TimestampDelta64)
		}
	}
	if _, err := AppendRecordIDs(nil, retry[:len(retry)-2], &hr); err == nil {
		t.Error("a truncated batch gave IDs")
	}
}

// readRawRecords decodes n records with kmsg.
func readRawRecords(n int, in []byte) []kmsg.Record {
	rs := make([]kmsg.Record, n)
	for i := range rs {
		length, used := varint(in)
		total := used + int(length)
		if used == 0 || length < 0 || len(in) < total {
			return rs[:i]
		}
		if err := (&rs[i]).ReadFrom(in[:total]); err != nil {
			return rs[:i]
		}
		in = in[total:]
	}
	return rs
}

func varint(b []byte) (int64, int) {
	var ux uint64
	for i, c := range b {
		if i == 10 {
			return 0, 0
		}
		ux |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			x := int64(ux >> 1)
			if ux&1 != 0 {
				x = ^x
			}
			return x, i + 1
		}
	}
	return 0, 0
}

// FuzzRecordIDs: never panics; on success one ID per record the header
// counts, each with a non-zero hash; on failure dst is returned as it came.
func FuzzRecordIDs(f *testing.F) {
	raw, _ := stampedBatch(f, []string{"a", "bb", ""}, []int64{5, 7, 7})
	f.Add(raw)
	f.Add(raw[:len(raw)-3])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, records []byte) {
		var h BatchHeader
		if _, err := ReadBatch(records, &h); err != nil {
			return
		}
		prefix := []RecordID{{Hash: 9}}
		ids, err := AppendRecordIDs(prefix, records, &h)
		if err != nil {
			if len(ids) != 1 {
				t.Fatalf("failed with %d IDs appended", len(ids)-1)
			}
			return
		}
		if len(ids)-1 != int(h.NumRecords) {
			t.Fatalf("%d IDs for %d records", len(ids)-1, h.NumRecords)
		}
		for _, id := range ids[1:] {
			if id.Hash == 0 {
				t.Fatal("a zero hash")
			}
		}
	})
}
