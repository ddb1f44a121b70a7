package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// FuzzProduceHeader feeds arbitrary Produce request bodies, at a version
// chosen by sel (3 + sel%11, i.e. v3-v13), to the scanner and everything
// built on it. keepBits picks which partitions ReduceProduce keeps.
//
// Invariants:
//   - Nothing panics: the scanner, ReadBatch, BatchValid, RecordsFingerprint,
//     ReduceProduce and MergeProduceResponse all return errors instead.
//   - Every slice the scanner returns lies within the input, with its
//     capacity clipped.
//   - On success the scanner agrees with kmsg ProduceRequest.ReadFrom on the
//     request fields, topics, partitions and records (it may refuse more:
//     lengths below -1 and trailing bytes); on failure the error wraps
//     ErrMalformedProduce.
//   - ReadBatch, when it and kmsg RecordBatch.ReadFrom both succeed, agrees
//     with kmsg on every header field.
//   - ReduceProduce succeeds exactly when the scan does, and its output
//     re-scans and decodes with kmsg to exactly the kept partitions.
//   - MergeProduceResponse with every partition answered locally succeeds and
//     decodes with kmsg at the request version.
//
// Real kgo requests (v7, v9, v13, snappy/gzip/none) captured through kfake
// live in testdata/fuzz/FuzzProduceHeader.
func FuzzProduceHeader(f *testing.F) {
	for _, v := range scanVersions {
		valid := testProduceRequest(v, strPtr("txn"), 3, 3).AppendTo(nil)
		sel := uint8(v - ProduceMinVersion)
		for _, body := range [][]byte{
			valid,
			nil,
			{0xff, 0xff},
			valid[:len(valid)/2],
			valid[:len(valid)-1],
			append(bytes.Clone(valid), 0xde, 0xad, 0xbe, 0xef),
			// Null transactional id, acks -1, and a topics array of -1 / huge.
			{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff},
			{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1, 0x7f, 0xff, 0xff, 0xff},
			{0, 0xff, 0xff, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff, 0x0f},
			{0, 0xff, 0xff, 0, 0, 0, 1, 0, 0},
		} {
			f.Add(sel, uint64(0x5555555555555555), body)
		}
	}
	f.Fuzz(func(t *testing.T, sel uint8, keepBits uint64, body []byte) {
		version := ProduceMinVersion + int16(sel%11)
		body = body[:len(body):len(body)]
		scanErr, mismatch := compareScan(body, version)
		if mismatch != nil {
			t.Fatal(mismatch)
		}
		var s ProduceScanner
		var h BatchHeader
		if err := s.Reset(body, version); err == nil {
			for s.Next() {
				p := s.Partition()
				if !within(body, p.Topic) || !within(body, p.Records) {
					t.Fatal("slice outside the input")
				}
				fuzzBatch(t, p.Records, &h)
			}
		}
		fuzzBatch(t, body, &h) // arbitrary bytes as records too

		keep := func(ti, pi int) bool { return keepBits>>uint((ti*7+pi)%64)&1 == 1 }
		out, n, err := ReduceProduce(nil, body, version, keep)
		if (err == nil) != (scanErr == nil) {
			t.Fatalf("ReduceProduce error %v, scan error %v", err, scanErr)
		}
		if err != nil {
			return
		}
		if _, mismatch := compareScan(out, version); mismatch != nil {
			t.Fatalf("reduced request: %v", mismatch)
		}
		got := decodeRequest(t, out, version)
		want := filterRequest(t, body, version, keep)
		if !reflect.DeepEqual(got, want) || n != len(kmsgPartitions(want)) {
			t.Fatalf("reduced request kept %d\n got %+v\nwant %+v", n, got, want)
		}

		local := func(ti, pi int) (LocalPartitionResult, bool) {
			return LocalPartitionResult{BaseOffset: int64(ti), LogAppendTime: int64(pi), LogStartOffset: -1}, true
		}
		resp, err := MergeProduceResponse(nil, version, body, nil, local)
		if err != nil {
			t.Fatalf("all-local merge: %v", err)
		}
		kr := kmsg.NewPtrProduceResponse()
		kr.Version = version
		if err := kr.ReadFrom(resp); err != nil {
			t.Fatalf("merged response does not decode: %v", err)
		}
	})
}

// fuzzBatch runs the batch functions on records and checks ReadBatch against
// kmsg.RecordBatch.ReadFrom.
func fuzzBatch(t *testing.T, records []byte, h *BatchHeader) {
	n, err := ReadBatch(records, h)
	code := BatchValid(records, h)
	if err != nil {
		if !errors.Is(err, ErrMalformedBatch) {
			t.Fatalf("ReadBatch error %v does not wrap ErrMalformedBatch", err)
		}
		if code == 0 && len(records) >= batchHeaderSize {
			t.Fatalf("BatchValid accepted records ReadBatch refused: %v", err)
		}
		return
	}
	_ = RecordsFingerprint(records, h)
	if code == 0 && n != 1 {
		t.Fatalf("BatchValid accepted %d batches", n)
	}
	var rb kmsg.RecordBatch
	if rb.ReadFrom(records) != nil {
		if code == 0 {
			t.Fatal("BatchValid accepted a batch kmsg cannot read")
		}
		return
	}
	want := BatchHeader{rb.FirstOffset, rb.Length, rb.PartitionLeaderEpoch, rb.Magic, uint32(rb.CRC), rb.Attributes,
		rb.LastOffsetDelta, rb.FirstTimestamp, rb.MaxTimestamp, rb.ProducerID, rb.ProducerEpoch, rb.FirstSequence, rb.NumRecords}
	if *h != want {
		t.Fatalf("ReadBatch header\n got %+v\nkmsg %+v", *h, want)
	}
	if code == 0 && int(binary.BigEndian.Uint32(records[8:]))+12 != len(records) {
		t.Fatal("BatchValid accepted a size mismatch")
	}
}
