package protocol

import (
	"encoding/binary"
	"fmt"
	"testing"
	"unsafe"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// walkFrameBody returns a Produce request's frame body (request header
// included) for req, with a client id and, when flexible, header tags.
func walkFrameBody(req *kmsg.ProduceRequest) []byte {
	b := binary.BigEndian.AppendUint16(nil, 0)
	b = binary.BigEndian.AppendUint16(b, uint16(req.Version))
	b = binary.BigEndian.AppendUint32(b, 77)
	b = binary.BigEndian.AppendUint16(b, 5)
	b = append(b, "walky"...)
	if req.Version >= 9 {
		b = append(b, 1, 3, 2, 0xaa, 0xbb) // one unknown header tag
	}
	return req.AppendTo(b)
}

// holeyRequest is testProduceRequest with large batches added: per topic an
// idempotent one (a hole), a legacy one and one of two batches (read).
func holeyRequest(version int16, minHole int) *kmsg.ProduceRequest {
	req := testProduceRequest(version, strPtr("txn"), 3, 4)
	for t := range req.Topics {
		for i, pid := range []int64{42, -1, 43} {
			rp := kmsg.NewProduceRequestTopicPartition()
			rp.Partition = int32(100 + i)
			rp.Records = testBatch(pid, 0, 0, 3, 1000, testPayload(t+i, minHole+100*i))
			if i == 2 {
				rp.Records = append(rp.Records, testBatch(pid, 0, 3, 1, 1000, testPayload(9, 10))...)
			}
			req.Topics[t].Partitions = append(req.Topics[t].Partitions, rp)
		}
	}
	return req
}

// walkHole is one hole a walk found: body offsets.
type walkHole struct{ start, end int }

// walk drives w over body as a caller would, reading ahead up to extra(i)
// bytes beyond what each step asks, and returns the holes it was offered. It
// fails t when a step breaks the contract or the walk does not end.
func walk(t testing.TB, body []byte, minHole int, extra func(step int) int) []walkHole {
	var w ProduceWalker
	w.Reset(len(body), minHole)
	var holes []walkHole
	have := 0
	for step := 0; ; step++ {
		if step > len(body)+16 {
			t.Fatalf("walk of %d bytes did not end after %d steps", len(body), step)
		}
		need, hole, done := w.Next(body[:have])
		switch {
		case done:
			if need != 0 || hole != 0 {
				t.Fatalf("done with need %d hole %d", need, hole)
			}
			return holes
		case hole > 0:
			if need != 0 || have+hole > len(body) || hole < minHole {
				t.Fatalf("hole %d at %d (need %d) in %d bytes, min %d", hole, have, need, len(body), minHole)
			}
			holes = append(holes, walkHole{have, have + hole})
			have += hole
		default:
			if need <= have || need > len(body) {
				t.Fatalf("need %d with %d of %d bytes", need, have, len(body))
			}
			have = min(len(body), need+max(extra(step), 0))
		}
	}
}

// eligible returns, for a body the scanner accepts, the records fields that
// may be holes: one v2 batch of a producer id >= 0, as body offsets.
func eligible(t testing.TB, body []byte, version int16, bodyOff, minHole int) (fields []walkHole, ok bool) {
	var s ProduceScanner
	if s.Reset(body[bodyOff:], version) != nil {
		return nil, false
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(body)))
	for s.Next() {
		p := s.Partition()
		var h BatchHeader
		if n, err := ReadBatch(p.Records, &h); err != nil || n != 1 || h.Magic != 2 || h.ProducerID < 0 ||
			int(h.Length)+batchLogOverhead != len(p.Records) || len(p.Records) < batchHeaderSize+minHole {
			continue
		}
		start := int(uintptr(unsafe.Pointer(unsafe.SliceData(p.Records))) - base)
		fields = append(fields, walkHole{start, start + len(p.Records)})
	}
	return fields, s.Err() == nil
}

// checkHoles asserts every hole ends an eligible records field and starts
// after its batch header; with exact true (no read-ahead) every eligible
// field is a hole starting right after its header.
func checkHoles(t testing.TB, holes, fields []walkHole, exact bool) {
	t.Helper()
	j := 0
	for _, h := range holes {
		for j < len(fields) && fields[j].end < h.end {
			if exact {
				t.Fatalf("records at %v were not offered as a hole", fields[j])
			}
			j++
		}
		if j == len(fields) || fields[j].end != h.end || h.start < fields[j].start+batchHeaderSize {
			t.Fatalf("hole %v is not the records of an idempotent batch %v", h, fields)
		}
		if exact && h.start != fields[j].start+batchHeaderSize {
			t.Fatalf("hole %v does not start after its header (%v)", h, fields[j])
		}
		j++
	}
	if exact && j != len(fields) {
		t.Fatalf("%d holes for %d idempotent batches", len(holes), len(fields))
	}
}

// TestProduceWalkerFindsIdempotentRecords walks real requests at every
// covered version: exactly the records of the large single idempotent
// batches are holes, whatever the caller reads ahead.
func TestProduceWalkerFindsIdempotentRecords(t *testing.T) {
	const minHole = 2000
	for _, v := range scanVersions {
		body := walkFrameBody(holeyRequest(v, minHole))
		h, err := ParseRequestHeader(body)
		if err != nil {
			t.Fatal(err)
		}
		fields, ok := eligible(t, body, v, h.BodyOffset, minHole)
		if !ok || len(fields) != 3 {
			t.Fatalf("v%d: %d eligible records fields (scan ok %v), want 3", v, len(fields), ok)
		}
		for _, ahead := range []int{0, 1, 60, 700, 5000} {
			t.Run(fmt.Sprintf("v%d/ahead=%d", v, ahead), func(t *testing.T) {
				holes := walk(t, body, minHole, func(int) int { return ahead })
				checkHoles(t, holes, fields, ahead == 0)
				if ahead == 0 && len(holes) != 3 {
					t.Fatalf("%d holes, want 3", len(holes))
				}
			})
		}
	}
}

// TestProduceWalkerStops: requests it does not walk end it at once.
func TestProduceWalkerStops(t *testing.T) {
	body := walkFrameBody(holeyRequest(9, 100))
	for name, mutate := range map[string]func(b []byte){
		"not produce": func(b []byte) { b[1] = 1 },
		"version 2":   func(b []byte) { b[3] = 2 },
		"version 99":  func(b []byte) { b[3] = 99 },
	} {
		b := append([]byte(nil), body...)
		mutate(b)
		var w ProduceWalker
		w.Reset(len(b), 100)
		need, _, done := w.Next(b[:8])
		if !done {
			t.Errorf("%s: need %d, not done", name, need)
		}
	}
	// A records length past the end: done, not a hole beyond the body.
	b := walkFrameBody(holeyRequest(3, 100))
	holes := walk(t, b[:len(b)-50], 100, func(int) int { return 0 })
	for _, h := range holes {
		if h.end > len(b)-50 {
			t.Fatalf("hole %v past the body", h)
		}
	}
}

// FuzzProduceWalker feeds arbitrary bodies (and mutated real ones) to the
// walker with a read-ahead pattern from ahead. Invariants: every step keeps
// the contract (need beyond what is held and within the body, holes within
// the body and at least minHole), the walk ends within a step per byte, and
// when the scanner accepts the request every hole is the records of a single
// idempotent v2 batch, after its header; without read-ahead, every such
// batch is offered.
func FuzzProduceWalker(f *testing.F) {
	for _, v := range scanVersions {
		body := walkFrameBody(holeyRequest(v, 300))
		f.Add(uint16(300), uint64(0), body)
		f.Add(uint16(300), uint64(0x0102030405060708), body)
		f.Add(uint16(1), uint64(7), body[:len(body)/2])
	}
	f.Fuzz(func(t *testing.T, minHole uint16, ahead uint64, body []byte) {
		mh := int(minHole%4096) + 1
		extra := func(step int) int { return int(ahead>>(uint(step)%8*8)) & 0xff }
		if ahead%3 == 0 {
			extra = func(int) int { return 0 }
		}
		holes := walk(t, body, mh, extra)
		h, err := ParseRequestHeader(body)
		if err != nil || h.APIKey != 0 {
			if len(holes) > 0 && (len(body) < 4 || body[0] != 0 || body[1] != 0) {
				t.Fatalf("holes in a request that is not a Produce: %v", holes)
			}
			return
		}
		if fields, ok := eligible(t, body, h.APIVersion, h.BodyOffset, mh); ok {
			checkHoles(t, holes, fields, ahead%3 == 0)
		}
	})
}
