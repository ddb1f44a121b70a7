package proxy

import (
	"fmt"
	"io"
	"math/bits"
	"sync"

	"github.com/dedupproxy/dedupproxy/protocol"
)

// Response frames may wait in the queue behind the proxy's own answers, and
// merged Produce responses are built beside them, so each needs its own
// buffer. They come from size-class pools (powers of four from
// 16 KiB to 64 MiB, like nats' and kgo's buffer pools), so a consumer's
// multi-megabyte Fetch responses reuse buffers instead of allocating and
// zeroing a new one each time. Larger frames are allocated and dropped.
const (
	minFrameClass  = 14 // 16 KiB
	maxFrameClass  = 26 // 64 MiB
	frameClassStep = 2
	numFrameClass  = (maxFrameClass-minFrameClass)/frameClassStep + 1
)

var framePools [numFrameClass]sync.Pool

// frameClass returns the pool index for a buffer of capacity n, or -1 when
// n is larger than the largest class.
func frameClass(n int) int {
	if n <= 1<<minFrameClass {
		return 0
	}
	c := (bits.Len(uint(n-1)) - minFrameClass + frameClassStep - 1) / frameClassStep
	if c >= numFrameClass {
		return -1
	}
	return c
}

// getFrame returns a buffer of length 0 and capacity at least n.
func getFrame(n int) *[]byte {
	c := frameClass(n)
	if c < 0 {
		b := make([]byte, 0, n)
		return &b
	}
	if bp, ok := framePools[c].Get().(*[]byte); ok {
		return bp
	}
	b := make([]byte, 0, 1<<(minFrameClass+c*frameClassStep))
	return &b
}

// putFrame returns a buffer from getFrame to its pool.
func putFrame(bp *[]byte) {
	if bp == nil {
		return
	}
	// Only buffers exactly the size of their class go back, so a pool
	// never hands out one smaller than its class promises.
	c := frameClass(cap(*bp))
	if c < 0 || cap(*bp) != 1<<(minFrameClass+c*frameClassStep) {
		return
	}
	*bp = (*bp)[:0]
	framePools[c].Put(bp)
}

// readPooledFrame reads one response frame into a pooled buffer: the whole
// frame with its size prefix is (*bp)[:4+len(body)].
func readPooledFrame(r io.Reader, maxSize int32) (bp *[]byte, body []byte, err error) {
	var head [4]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, nil, err
	}
	size, err := protocol.CheckSize(head[:], maxSize, protocol.ResponseMinSize)
	if err != nil {
		return nil, nil, err
	}
	bp = getFrame(4 + int(size))
	frame := append((*bp)[:0], head[:]...)
	frame = frame[:4+size]
	if _, err := io.ReadFull(r, frame[4:]); err != nil {
		putFrame(bp)
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, nil, fmt.Errorf("read frame body of %d bytes: %w", size, err)
	}
	*bp = frame
	return bp, frame[4:], nil
}

// requestBuffer is readLoop's one reused read buffer. It grows to the
// largest request and shrinks back once requests have been much smaller for
// a while (nats' readLoop does the same), so a producer sending large
// batches does not allocate and zero a new buffer per request, and one
// outsized request does not pin memory for the connection's life.
type requestBuffer struct {
	buf   []byte
	small int // consecutive requests under a quarter of cap(buf)
}

const (
	requestBufferStart = 4 << 10
	shrinkAfter        = 64
)

func (rb *requestBuffer) read(r io.Reader, maxSize int32) ([]byte, error) {
	if rb.buf == nil {
		rb.buf = make([]byte, requestBufferStart)
	}
	body, buf, err := protocol.ReadFrame(r, rb.buf, maxSize, protocol.RequestMinSize)
	rb.buf = buf
	if err != nil {
		return nil, err
	}
	if cap(rb.buf) > requestBufferStart {
		if 4+len(body) < cap(rb.buf)/4 {
			rb.small++
		} else {
			rb.small = 0
		}
	}
	return body, nil
}

// maybeShrink drops an oversized buffer after many small requests. Call it
// only once the previous request's bytes are no longer needed.
func (rb *requestBuffer) maybeShrink() {
	if rb.small >= shrinkAfter {
		rb.buf, rb.small = make([]byte, requestBufferStart), 0
	}
}
