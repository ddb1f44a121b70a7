package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
	"testing/iotest"
)

// TestReadFrameGrowsOnlyWithData: a size prefix is free to send, so the
// buffer must grow with the bytes that arrive, not with the size declared.
// A peer declaring 100 MiB and sending 1 KiB leaves the buffer at its
// starting size.
func TestReadFrameGrowsOnlyWithData(t *testing.T) {
	t.Parallel()
	for _, sent := range []int{0, 1 << 10, 64 << 10, 1 << 20} {
		in := binary.BigEndian.AppendUint32(nil, DefaultMaxFrameSize)
		in = append(in, make([]byte, sent)...)
		_, buf, err := ReadFrame(bytes.NewReader(in), nil, DefaultMaxFrameSize, RequestMinSize)
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("sent %d of a declared %d: err = %v, want ErrUnexpectedEOF", sent, DefaultMaxFrameSize, err)
		}
		// Twice what arrived, plus the starting 4 KiB: doubling growth.
		if limit := 2*(4+sent) + 4096; cap(buf) > limit {
			t.Errorf("sent %d bytes of a declared 100 MiB frame: buffer grew to %d bytes, want at most %d", sent, cap(buf), limit)
		}
	}
}

// TestReadFrameTrickled: a frame arriving one byte at a time, across many
// growth steps, reads back exactly; the final buffer is at most twice the
// frame.
func TestReadFrameTrickled(t *testing.T) {
	t.Parallel()
	body := make([]byte, 300_000)
	for i := range body {
		body[i] = byte(i * 7)
	}
	frame := AppendFrame(nil, body)
	next := AppendFrame(nil, []byte("0123456789ab"))
	r := iotest.OneByteReader(bytes.NewReader(append(append([]byte{}, frame...), next...)))
	got, buf, err := ReadFrame(r, make([]byte, 0, 16), DefaultMaxFrameSize, RequestMinSize)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf[:4+len(got)], frame) {
		t.Fatal("trickled frame does not read back as sent")
	}
	if cap(buf) > 2*len(frame) {
		t.Errorf("buffer %d bytes for a frame of %d", cap(buf), len(frame))
	}
	got, _, err = ReadFrame(r, buf, DefaultMaxFrameSize, RequestMinSize)
	if err != nil || string(got) != "0123456789ab" {
		t.Fatalf("next frame: %q, %v (the first read consumed past its frame?)", got, err)
	}
}

// TestReadFrameGrowthCappedAtMax: doubling never goes past the largest
// frame allowed.
func TestReadFrameGrowthCappedAtMax(t *testing.T) {
	t.Parallel()
	const maxSize = 10_000
	frame := AppendFrame(nil, make([]byte, maxSize))
	_, buf, err := ReadFrame(bytes.NewReader(frame), make([]byte, 0, 4096), maxSize, RequestMinSize)
	if err != nil {
		t.Fatal(err)
	}
	if cap(buf) != 4+maxSize {
		t.Errorf("buffer %d bytes, want %d (4096 doubled once, then capped at 4+max)", cap(buf), 4+maxSize)
	}
}

var sinkBody []byte

// TestReadFrameNoAllocsWhenBufferFits pins the steady state: a reused
// buffer already large enough costs no allocation per frame.
func TestReadFrameNoAllocsWhenBufferFits(t *testing.T) {
	frame := AppendFrame(nil, make([]byte, 100_000))
	r := bytes.NewReader(frame)
	buf := make([]byte, 128<<10)
	allocs := testing.AllocsPerRun(1000, func() {
		r.Reset(frame)
		body, nbuf, err := ReadFrame(r, buf, DefaultMaxFrameSize, RequestMinSize)
		if err != nil || len(body) != 100_000 {
			panic(err)
		}
		sinkBody, buf = body, nbuf
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per frame, want 0", allocs)
	}
}
