package protocol

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

func legacyBatch(tb testing.TB, n int, value string, ts int64) ([]byte, BatchHeader) {
	tb.Helper()
	b := kmsg.RecordBatch{Magic: 2, ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1, NumRecords: int32(n),
		LastOffsetDelta: int32(n - 1), FirstTimestamp: ts, MaxTimestamp: ts}
	for i := 0; i < n; i++ {
		r := kmsg.Record{OffsetDelta: int32(i), Value: []byte(fmt.Sprintf("%s-%d", value, i))}
		b.Records = r.AppendTo(b.Records)
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
	if MixIdentity(id, 1) == MixIdentity(id, 2) {
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
