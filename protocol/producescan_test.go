package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"testing"
	"unsafe"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// scanVersions are the Produce versions the differential tests cover: the
// oldest supported, ZSTD (v7), both sides of the flexible switch (v8, v9,
// KIP-482), the last by-name version and the newest (v13, topic IDs, KIP-516).
var scanVersions = []int16{3, 7, 8, 9, 12, 13}

// testBatch returns a valid v2 record batch (KIP-98) with n records whose
// records section is payload, with Length and CRC-32C filled in.
func testBatch(pid int64, epoch int16, seq int32, n int32, ts int64, payload []byte) []byte {
	rb := kmsg.RecordBatch{
		Magic:                2,
		PartitionLeaderEpoch: -1,
		Attributes:           2, // snappy, as kgo sends by default
		LastOffsetDelta:      n - 1,
		FirstTimestamp:       ts,
		MaxTimestamp:         ts + int64(n),
		ProducerID:           pid,
		ProducerEpoch:        epoch,
		FirstSequence:        seq,
		NumRecords:           n,
		Records:              payload,
	}
	return fixBatch(rb.AppendTo(nil))
}

// fixBatch recomputes the Length and CRC of the single batch in b.
func fixBatch(b []byte) []byte {
	binary.BigEndian.PutUint32(b[8:], uint32(len(b)-12))
	binary.BigEndian.PutUint32(b[17:], crc32.Checksum(b[21:], crc32.MakeTable(crc32.Castagnoli)))
	return b
}

// testPayload returns n deterministic bytes distinct per tag.
func testPayload(tag, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(tag*31 + i*7)
	}
	return p
}

func testTags(at string) kmsg.Tags {
	var t kmsg.Tags
	t.Set(7, []byte("unknown tag at "+at))
	t.Set(1000, []byte{1, 2, 3})
	return t
}

// testProduceRequest builds a request of nTopics × nParts with a mix of
// records fields: single batches, two-batch records, null and empty records;
// for flexible versions, unknown tags at every level; topic 1 has no
// partitions when nTopics > 2.
func testProduceRequest(version int16, txn *string, nTopics, nParts int) *kmsg.ProduceRequest {
	req := kmsg.NewPtrProduceRequest()
	req.Version = version
	req.TransactionID = txn
	req.Acks = -1
	req.TimeoutMillis = 1234
	for t := range nTopics {
		rt := kmsg.NewProduceRequestTopic()
		rt.Topic = fmt.Sprintf("topic-%d", t)
		rt.TopicID = [16]byte{byte(t + 1), 0xab, 15: byte(t)}
		if version >= 9 && t%2 == 0 {
			rt.UnknownTags = testTags("topic")
		}
		if t == 1 && nTopics > 2 {
			req.Topics = append(req.Topics, rt)
			continue
		}
		for p := range nParts {
			rp := kmsg.NewProduceRequestTopicPartition()
			rp.Partition = int32(p*3 + t)
			switch (t + p) % 7 {
			case 5:
				rp.Records = nil
			case 6:
				rp.Records = append(testBatch(int64(t), 0, int32(p), 2, 1000, testPayload(p, 50)),
					testBatch(int64(t), 0, int32(p)+2, 1, 1000, testPayload(p+1, 20))...)
			default:
				rp.Records = testBatch(int64(1000+t), 1, int32(p*10), int32(p+1), 1700000000000, testPayload(t*100+p, 40+p*13))
			}
			if t == 0 && p == 1 {
				rp.Records = []byte{}
			}
			if version >= 9 && p%2 == 1 {
				rp.UnknownTags = testTags("partition")
			}
			rt.Partitions = append(rt.Partitions, rp)
		}
		req.Topics = append(req.Topics, rt)
	}
	if version >= 9 {
		req.UnknownTags = testTags("request")
	}
	return req
}

func strPtr(s string) *string { return &s }

// scannedPartition is a copy of what the scanner reports for one partition.
type scannedPartition struct {
	ti, pi    int
	topic     string
	topicID   [16]byte
	partition int32
	records   []byte
	null      bool
}

// scanAll scans body and returns every partition, or the error.
func scanAll(body []byte, version int16) (*ProduceScanner, []scannedPartition, error) {
	var s ProduceScanner
	if err := s.Reset(body, version); err != nil {
		return &s, nil, err
	}
	var out []scannedPartition
	for s.Next() {
		p := s.Partition()
		if p.start < 0 || p.end > len(body) || p.start > p.end || p.topicStart > p.partsOff || p.partsOff > p.start {
			return &s, nil, fmt.Errorf("offsets out of order: %+v", p)
		}
		out = append(out, scannedPartition{p.TopicIndex, p.PartitionIndex, string(p.Topic), p.TopicID, p.Partition, p.Records, p.Records == nil})
	}
	return &s, out, s.Err()
}

// kmsgPartitions flattens a decoded request the way the scanner walks it.
func kmsgPartitions(req *kmsg.ProduceRequest) []scannedPartition {
	var out []scannedPartition
	for ti, t := range req.Topics {
		for pi, p := range t.Partitions {
			sp := scannedPartition{ti, pi, t.Topic, t.TopicID, p.Partition, p.Records, p.Records == nil}
			if req.Version >= 13 {
				sp.topic = ""
			} else {
				sp.topicID = [16]byte{}
			}
			out = append(out, sp)
		}
	}
	return out
}

// compareScan checks that the scanner agrees with kmsg.ProduceRequest.ReadFrom
// on body; kmsgErr reports that kmsg failed (the scanner may be stricter,
// never looser).
func compareScan(body []byte, version int16) (scanErr error, mismatch error) {
	s, got, err := scanAll(body, version)
	req := kmsg.NewPtrProduceRequest()
	req.Version = version
	kErr := req.ReadFrom(body)
	if err != nil {
		if !errors.Is(err, ErrMalformedProduce) {
			return err, fmt.Errorf("error %v does not wrap ErrMalformedProduce", err)
		}
		return err, nil
	}
	if kErr != nil {
		return nil, fmt.Errorf("scanner accepted what kmsg refuses (%v)", kErr)
	}
	if (s.TransactionalID == nil) != (req.TransactionID == nil) || (req.TransactionID != nil && string(s.TransactionalID) != *req.TransactionID) {
		return nil, fmt.Errorf("transactional id %q, kmsg %v", s.TransactionalID, req.TransactionID)
	}
	if s.Acks != req.Acks || s.TimeoutMillis != req.TimeoutMillis {
		return nil, fmt.Errorf("acks/timeout %d/%d, kmsg %d/%d", s.Acks, s.TimeoutMillis, req.Acks, req.TimeoutMillis)
	}
	want := kmsgPartitions(req)
	if len(got) != len(want) {
		return nil, fmt.Errorf("%d partitions, kmsg %d", len(got), len(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.ti != w.ti || g.pi != w.pi || g.topic != w.topic || g.topicID != w.topicID || g.partition != w.partition || g.null != w.null || !bytes.Equal(g.records, w.records) {
			return nil, fmt.Errorf("partition %d: got %+v, kmsg %+v", i, g, w)
		}
		if len(g.records) > 0 && !within(body, g.records) {
			return nil, fmt.Errorf("partition %d records do not alias the body", i)
		}
	}
	if len(s.TransactionalID) > 0 && !within(body, s.TransactionalID) {
		return nil, errors.New("transactional id does not alias the body")
	}
	return nil, nil
}

// within reports whether sub lies inside b (same backing array, in range) and
// its capacity is clipped so an append cannot write into b.
func within(b, sub []byte) bool {
	if len(sub) == 0 {
		return true
	}
	if len(b) == 0 {
		return false
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	at := uintptr(unsafe.Pointer(unsafe.SliceData(sub)))
	return at >= start && at+uintptr(len(sub)) <= start+uintptr(len(b)) && cap(sub) == len(sub)
}

// TestProduceScannerMatchesKmsg is the differential test: the scanner agrees
// with kmsg.ProduceRequest.ReadFrom on every field, at versions on both sides
// of the flexible switch (KIP-482) and with topic IDs (KIP-516), for null,
// empty and set transactional ids, null, empty and multi-batch records and
// unknown tags at every level.
func TestProduceScannerMatchesKmsg(t *testing.T) {
	t.Parallel()
	for _, v := range scanVersions {
		for _, txn := range []*string{nil, strPtr(""), strPtr("txn-1")} {
			for _, shape := range [][2]int{{0, 0}, {1, 1}, {3, 2}, {4, 8}} {
				name := fmt.Sprintf("v%d/txn=%v/%dx%d", v, txn != nil, shape[0], shape[1])
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					req := testProduceRequest(v, txn, shape[0], shape[1])
					body := req.AppendTo(nil)
					scanErr, mismatch := compareScan(body, v)
					if scanErr != nil || mismatch != nil {
						t.Fatalf("scan error %v, mismatch %v", scanErr, mismatch)
					}
					_, parts, _ := scanAll(body, v)
					if want := len(kmsgPartitions(req)); len(parts) != want || (shape[0] > 0 && want == 0) {
						t.Fatalf("scanned %d partitions, want %d", len(parts), want)
					}
				})
			}
		}
	}
}

// TestReadBatchMatchesKmsg checks every header field ReadBatch decodes against
// kmsg.RecordBatch.ReadFrom, and the batch count against the batches built.
func TestReadBatchMatchesKmsg(t *testing.T) {
	t.Parallel()
	one := testBatch(77, 3, 2147483000, 5, 1700000000123, testPayload(1, 333))
	two := append(bytes.Clone(one), testBatch(77, 3, 5, 1, 1, testPayload(2, 10))...)
	for _, tc := range []struct {
		name    string
		records []byte
		batches int
	}{
		{"one", one, 1},
		{"two", two, 2},
		{"partial tail", append(bytes.Clone(one), 1, 2, 3), 2},
		{"header only", testBatch(-1, -1, -1, 1, 0, nil), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h BatchHeader
			n, err := ReadBatch(tc.records, &h)
			if err != nil || n != tc.batches {
				t.Fatalf("ReadBatch = %d, %v; want %d batches", n, err, tc.batches)
			}
			var rb kmsg.RecordBatch
			if err := rb.ReadFrom(tc.records); err != nil {
				t.Fatal(err)
			}
			want := BatchHeader{rb.FirstOffset, rb.Length, rb.PartitionLeaderEpoch, rb.Magic, uint32(rb.CRC), rb.Attributes,
				rb.LastOffsetDelta, rb.FirstTimestamp, rb.MaxTimestamp, rb.ProducerID, rb.ProducerEpoch, rb.FirstSequence, rb.NumRecords}
			if h != want {
				t.Fatalf("header\n got %+v\nwant %+v", h, want)
			}
		})
	}
	t.Run("errors", func(t *testing.T) {
		var h BatchHeader
		for _, b := range [][]byte{nil, one[:60], append(bytes.Clone(one), make([]byte, 12)...)} {
			if _, err := ReadBatch(b, &h); !errors.Is(err, ErrMalformedBatch) {
				t.Errorf("ReadBatch(%d bytes) error %v, want ErrMalformedBatch", len(b), err)
			}
		}
	})
}

// TestBatchValidKafkaChecks pins each check Kafka makes before its duplicate
// check (docs/kafka-rules.md §2.1 rows 4, 11, 12) to the error code the
// broker returns.
func TestBatchValidKafkaChecks(t *testing.T) {
	t.Parallel()
	good := func() []byte { return testBatch(9, 0, 0, 3, 1000, testPayload(3, 100)) }
	set := func(off int, v any) func([]byte) []byte {
		return func(b []byte) []byte {
			var buf bytes.Buffer
			_ = binary.Write(&buf, binary.BigEndian, v)
			copy(b[off:], buf.Bytes())
			return fixBatch(b)
		}
	}
	invalid, corrupt := kerr.InvalidRecord.Code, kerr.CorruptMessage.Code
	for _, tc := range []struct {
		name string
		edit func([]byte) []byte
		want int16
	}{
		{"valid", func(b []byte) []byte { return b }, 0},
		{"valid non-idempotent seq -1", func(b []byte) []byte { return set(53, int32(-1))(set(43, int64(-1))(b)) }, 0},
		{"valid kafkajs pid -1 epoch 0 seq 0", set(43, int64(-1)), 0},
		{"empty records", func([]byte) []byte { return []byte{} }, invalid},
		{"null records", func([]byte) []byte { return nil }, invalid},
		{"length below 14 (nextBatchSize)", func(b []byte) []byte { binary.BigEndian.PutUint32(b[8:], 13); return b }, corrupt},
		{"magic 3", func(b []byte) []byte { b[16] = 3; return b }, corrupt},
		{"magic 1", func(b []byte) []byte { b[16] = 1; return b }, invalid},
		{"truncated", func(b []byte) []byte { return b[:len(b)-1] }, invalid},
		{"two batches", func(b []byte) []byte { return append(b, good()...) }, invalid},
		{"trailing byte", func(b []byte) []byte { return append(b, 0) }, invalid},
		{"base offset 5", func(b []byte) []byte { b[7] = 5; return b }, invalid},
		{"bad crc", func(b []byte) []byte { b[len(b)-1] ^= 1; return b }, corrupt},
		{"length below 61", func(b []byte) []byte { b = b[:40]; binary.BigEndian.PutUint32(b[8:], 28); return b }, corrupt},
		{"compression 5", set(21, int16(5)), kerr.UnknownServerError.Code},
		{"lastOffsetDelta -1", set(23, int32(-1)), invalid},
		{"zero records", func(b []byte) []byte { return set(23, int32(-1))(set(57, int32(0))(b)) }, invalid},
		{"count mismatch", set(57, int32(4)), invalid},
		{"control batch", set(21, int16(0x20)), invalid},
		{"pid with seq -1", set(53, int32(-1)), invalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.edit(good())
			var h BatchHeader
			_, _ = ReadBatch(b, &h)
			if got := BatchValid(b, &h); got != tc.want {
				t.Fatalf("BatchValid = %d (%v), want %d (%v)", got, kerr.ErrorForCode(got), tc.want, kerr.ErrorForCode(tc.want))
			}
		})
	}
}

// TestRecordsFingerprintIgnoresRestamp: kafkajs and kafka-go retries carry
// new timestamps and so a new CRC, but the same records (docs/clients.md §3);
// they must match. kafkajs also reuses sequence numbers for different
// records; those must not.
func TestRecordsFingerprintIgnoresRestamp(t *testing.T) {
	t.Parallel()
	fp := func(b []byte) uint32 {
		var h BatchHeader
		if _, err := ReadBatch(b, &h); err != nil {
			t.Fatal(err)
		}
		return RecordsFingerprint(b, &h)
	}
	payload := testPayload(4, 500)
	orig := fp(testBatch(1, 0, 10, 5, 1000, payload))
	if got := fp(testBatch(1, 0, 10, 5, 99999, payload)); got != orig {
		t.Errorf("restamped batch fingerprint %x, want %x", got, orig)
	}
	if got := fp(testBatch(1, 0, 10, 5, 1000, testPayload(5, 500))); got == orig {
		t.Error("different records with the same sequences share a fingerprint")
	}
	if got := fp(testBatch(1, 0, 10, 6, 1000, payload)); got == orig {
		t.Error("different record count shares a fingerprint")
	}
	if got := fp(append(testBatch(1, 0, 10, 5, 1000, payload), 9, 9, 9)); got != orig {
		t.Error("bytes past the batch changed the fingerprint")
	}
}

// TestProduceScannerMalformed: every truncation of a valid request, huge and
// negative lengths, and trailing bytes give an error wrapping
// ErrMalformedProduce, never a panic, at every version.
func TestProduceScannerMalformed(t *testing.T) {
	t.Parallel()
	for _, v := range scanVersions {
		t.Run(fmt.Sprintf("v%d", v), func(t *testing.T) {
			t.Parallel()
			body := testProduceRequest(v, strPtr("tx"), 3, 3).AppendTo(nil)
			for i := range len(body) {
				if _, _, err := scanAll(body[:i:i], v); !errors.Is(err, ErrMalformedProduce) {
					t.Fatalf("truncated at %d of %d: error %v", i, len(body), err)
				}
				if _, mismatch := compareScan(body[:i:i], v); mismatch != nil {
					t.Fatalf("truncated at %d: %v", i, mismatch)
				}
			}
			if _, _, err := scanAll(append(bytes.Clone(body), 0), v); !errors.Is(err, ErrMalformedProduce) {
				t.Fatalf("trailing byte: error %v", err)
			}
		})
	}
	header := func(v int16) []byte {
		if v >= 9 {
			return []byte{0, 0xff, 0xff, 0, 0, 0, 1}
		}
		return []byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1}
	}
	for _, tc := range []struct {
		name string
		v    int16
		body []byte
	}{
		{"huge topics", 8, append(header(8), 0x7f, 0xff, 0xff, 0xff)},
		{"negative topics", 8, append(header(8), 0xff, 0xff, 0xff, 0xfe)},
		{"huge compact topics", 9, append(header(9), 0xff, 0xff, 0xff, 0xff, 0x07)},
		{"varint overflow", 9, append(header(9), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)},
		{"txn id -2", 8, []byte{0xff, 0xfe, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0}},
		{"txn id huge", 8, []byte{0x7f, 0xff, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0}},
		{"null topic name", 8, append(header(8), 0, 0, 0, 1, 0xff, 0xff, 0, 0, 0, 0)},
		{"huge partitions", 8, append(header(8), 0, 0, 0, 1, 0, 1, 'a', 0x7f, 0xff, 0xff, 0xff)},
		{"records -2", 8, append(header(8), 0, 0, 0, 1, 0, 1, 'a', 0, 0, 0, 1, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xfe)},
		{"records huge", 8, append(header(8), 0, 0, 0, 1, 0, 1, 'a', 0, 0, 0, 1, 0, 0, 0, 0, 0x7f, 0xff, 0xff, 0xff)},
		{"version 2", 2, header(8)},
		{"version 14", 14, header(9)},
		{"empty", 9, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := scanAll(tc.body, tc.v); !errors.Is(err, ErrMalformedProduce) {
				t.Fatalf("error %v, want ErrMalformedProduce", err)
			}
			if _, mismatch := compareScan(tc.body, tc.v); mismatch != nil {
				t.Fatal(mismatch)
			}
		})
	}
}

// TestProduceScannerNullArrays: a null (-1) topics or partitions array reads
// as empty, as kmsg and Kafka read it.
func TestProduceScannerNullArrays(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		v    int16
		body []byte
	}{
		{8, []byte{0xff, 0xff, 0, 1, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff}},
		{9, []byte{0, 0, 1, 0, 0, 0, 1, 0, 0}},
		{8, []byte{0xff, 0xff, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 1, 'a', 0xff, 0xff, 0xff, 0xff}},
	} {
		_, parts, err := scanAll(tc.body, tc.v)
		if err != nil || len(parts) != 0 {
			t.Errorf("v%d %x: %d partitions, %v", tc.v, tc.body, len(parts), err)
		}
		if _, mismatch := compareScan(tc.body, tc.v); mismatch != nil {
			t.Error(mismatch)
		}
	}
}

var (
	sinkInt     int
	sinkInt16   int16
	sinkUint32  uint32
	sinkReduced []byte
	sinkErr     error
)

// TestProduceFastPathNoAllocs pins the per-request hot path at zero
// allocations: Reset, the Next loop, ReadBatch, BatchValid and
// RecordsFingerprint on a 4-topic × 8-partition request.
func TestProduceFastPathNoAllocs(t *testing.T) {
	for _, v := range []int16{8, 13} {
		body := testProduceRequest(v, strPtr("tx"), 4, 8).AppendTo(nil)
		var s ProduceScanner
		var h BatchHeader
		var n int
		allocs := testing.AllocsPerRun(1000, func() {
			if err := s.Reset(body, v); err != nil {
				panic(err)
			}
			n = 0
			for s.Next() {
				p := s.Partition()
				nb, err := ReadBatch(p.Records, &h)
				sinkInt += nb
				sinkErr = err
				sinkInt16 += BatchValid(p.Records, &h)
				if err == nil {
					sinkUint32 ^= RecordsFingerprint(p.Records, &h)
				}
				n++
			}
			if s.Err() != nil {
				panic(s.Err())
			}
		})
		if allocs != 0 {
			t.Errorf("v%d: %v allocs per request, want 0", v, allocs)
		}
		if n < 20 {
			t.Errorf("v%d: scanned %d partitions", v, n)
		}
	}
}

// TestReduceProduceNoAllocs: with room in dst, reducing does not allocate.
func TestReduceProduceNoAllocs(t *testing.T) {
	body := testProduceRequest(13, nil, 4, 8).AppendTo(nil)
	dst := make([]byte, 0, len(body))
	keep := func(ti, pi int) bool { return (ti+pi)%2 == 0 }
	allocs := testing.AllocsPerRun(1000, func() {
		out, n, err := ReduceProduce(dst[:0], body, 13, keep)
		if err != nil || n == 0 {
			panic(err)
		}
		sinkReduced = out
	})
	if allocs != 0 {
		t.Errorf("%v allocs, want 0", allocs)
	}
}

func BenchmarkProduceScan(b *testing.B) {
	for _, shape := range [][2]int{{1, 1}, {4, 8}} {
		for _, v := range []int16{8, 13} {
			body := testProduceRequest(v, nil, shape[0], shape[1]).AppendTo(nil)
			b.Run(fmt.Sprintf("v%d/topics=%d/partitions=%d", v, shape[0], shape[1]), func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(body)))
				var s ProduceScanner
				var h BatchHeader
				parts := 0
				for b.Loop() {
					_ = s.Reset(body, v)
					for s.Next() {
						p := s.Partition()
						if n, err := ReadBatch(p.Records, &h); err == nil && n == 1 {
							sinkInt16 += BatchValid(p.Records, &h)
						}
						parts++
					}
				}
				b.ReportMetric(float64(parts)/float64(b.N), "partitions/op")
			})
		}
	}
}

// BenchmarkProduceScanKmsg is the baseline the scanner replaces.
func BenchmarkProduceScanKmsg(b *testing.B) {
	body := testProduceRequest(13, nil, 4, 8).AppendTo(nil)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	req := kmsg.NewPtrProduceRequest()
	for b.Loop() {
		req.Version = 13
		sinkErr = req.ReadFrom(body)
	}
}

func BenchmarkRecordsFingerprint(b *testing.B) {
	for _, size := range []int{1 << 10, 16 << 10, 1 << 20} {
		batch := testBatch(1, 0, 0, 100, 1000, testPayload(size, size))
		var h BatchHeader
		if _, err := ReadBatch(batch, &h); err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("size=%dKiB", size>>10), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(batch)))
			for b.Loop() {
				sinkUint32 ^= RecordsFingerprint(batch, &h)
			}
		})
	}
}

// BenchmarkBatchValid includes the CRC-32C over the whole batch, which is
// what it costs per batch.
func BenchmarkBatchValid(b *testing.B) {
	for _, size := range []int{1 << 10, 1 << 20} {
		batch := testBatch(1, 0, 0, 100, 1000, testPayload(size, size))
		var h BatchHeader
		if _, err := ReadBatch(batch, &h); err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("size=%dKiB", size>>10), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(batch)))
			for b.Loop() {
				sinkInt16 += BatchValid(batch, &h)
			}
		})
	}
}
