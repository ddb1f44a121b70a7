package relay

import (
	"errors"
	"io"
	"syscall"

	"github.com/dedupproxy/dedupproxy/clock"
	"github.com/dedupproxy/dedupproxy/protocol"
)

// Record bytes that never enter the proxy (docs/produce-path.md).
//
// The decision core decides an idempotent batch from its 61-byte header: the
// records' fingerprint derives from the header's CRC, and it reads the
// records only to check that CRC before it answers a retry itself. So when
// both legs are plain TCP on Linux, a large Produce request is read with
// protocol.ProduceWalker: the records of each large idempotent batch (a hole)
// go from the client's socket into a pipe with splice(2), everything else
// into a mapping (pipePool.mapping) whose hole pages are not written, and so
// take no memory. The request, as the core sees it, has the right size
// and every header; its holes hold zeros or an earlier request's bytes.
//
// Forwarded as it came (the common case), the request is written upstream
// around its holes, each spliced from its pipe. Whenever the proxy needs any
// record bytes of an idempotent batch (to answer a retry, or to rebuild the
// request without some partitions), fillHoles first reads every hole back
// into place, and the request is then exactly what a whole read gives.

// MinHole is the fewest record bytes worth a pipe: below it, splicing costs
// more syscalls than the copy it saves (as for Fetch, fetch.go).
const MinHole = 16 << 10

// directRead is the largest read that bypasses the buffered reader while
// a request with holes is read: the fields before a batch's records (its
// 61-byte header, the partition's and topic's before it) in one read,
// with few record bytes after them, which are copied and touch a page of
// the mapping where spliced they would not.
const directRead = 512

// maxHoles bounds the pipes one request holds; the records of further
// batches are read.
const maxHoles = 16

// hole is record bytes of the current request that are in a pipe.
type hole struct {
	off, n int // in the frame
	p      *recordPipe
}

// readSparse reads a Produce request of n bytes with holes (see above). ok
// is false, with nothing read, when it cannot (no mapping): the caller reads
// the request whole.
func (rb *RequestBuffer) readSparse(r *ConnReader, n int, done <-chan struct{}) (body []byte, ok bool, err error) {
	buf, dirty := rb.pipes.mapping(n)
	if buf == nil {
		return nil, false, nil
	}
	rb.pool.reserve(rb, n, done)
	rb.large, rb.sparse = buf, true
	// Until the read completes, count every page as written.
	rb.dirty = dirty + pages(0, n)
	copy(buf, rb.head[:])
	body = buf[4:n]
	defer rb.reading.Store(0)
	progress := func() { rb.reading.Store(clock.Real.Now().UnixNano()) }
	var w protocol.ProduceWalker
	w.Reset(len(body), MinHole)
	have := 0
	for have < len(body) {
		progress()
		need, gap, end := w.Next(body[:have])
		switch {
		case end:
			need = len(body)
		case gap > 0:
			// What the reader already holds is read; the rest of the
			// hole goes to a pipe, up to what the pipe takes, and
			// whatever is left is read.
			need = have + gap
			k := min(r.Buffered(), gap)
			if _, err := io.ReadFull(r, body[have:have+k]); err != nil {
				return nil, true, bodyErr(err, int32(n-4))
			}
			have += k
			if rest := need - have; rest >= MinHole && len(rb.holes) < maxHoles {
				moved, err := rb.spliceIn(4+have, rest, progress)
				if err != nil {
					return nil, true, bodyErr(err, int32(n-4))
				}
				have += moved
			}
		}
		for have < need {
			var k int
			var err error
			if r.Buffered() == 0 && need-have < directRead {
				// The fields before a batch's records: read past the
				// buffered reader, which would take 32 KiB of records
				// along into memory, but in one read of up to
				// directRead when the bytes are there (the walker
				// starts the hole after whatever was read).
				k, err = io.ReadAtLeast(rb.direct, body[have:min(len(body), have+directRead)], need-have)
			} else {
				k, err = io.ReadFull(r, body[have:min(need, have+readChunk)])
			}
			have += k
			if err != nil {
				return nil, true, bodyErr(err, int32(n-4))
			}
			progress()
		}
	}
	rb.dirty = dirty + rb.pagesWritten(n)
	return body, true, nil
}

// pages is how many memory pages the bytes [from, to) touch.
func pages(from, to int) int {
	if to <= from {
		return 0
	}
	return (to+pageSize-1)/pageSize - from/pageSize
}

const pageSize = 4 << 10

// pagesWritten is how many pages of a request of n bytes read with holes
// hold bytes: all but the holes' insides.
func (rb *RequestBuffer) pagesWritten(n int) int {
	written, pos := 0, 0
	for _, h := range rb.holes {
		written += pages(pos, h.off)
		pos = h.off + h.n
	}
	return written + pages(pos, n)
}

// spliceIn moves up to n bytes of a hole at frame offset off from the
// client's socket into a pipe, and reports how many it moved: fewer when no
// pipe is free or the pipe filled up. The caller reads the rest.
func (rb *RequestBuffer) spliceIn(off, n int, progress func()) (int, error) {
	p := rb.pipes.get()
	if p == nil {
		return 0, nil
	}
	moved, err := rb.mover.in(rb.src, p, n, progress)
	if moved > 0 {
		rb.holes = append(rb.holes, hole{off: off, n: moved, p: p})
		if rb.tracker != nil {
			rb.tracker.passed(moved, err == io.ErrUnexpectedEOF)
		}
	} else {
		rb.pipes.put(p, err == nil)
	}
	return moved, err
}

// fillHoles reads every hole back into place. False when a pipe fails: the
// request can then be neither forwarded nor answered.
func (rb *RequestBuffer) fillHoles() bool {
	if rb.broken {
		return false
	}
	for i := range rb.holes {
		h := &rb.holes[i]
		if err := readPipe(h.p, rb.large[h.off:h.off+h.n]); err != nil {
			rb.broken = true
			return false
		}
		rb.pipes.put(h.p, true)
		h.p = nil
		rb.readBack += h.n
		rb.dirty += pages(h.off, h.off+h.n)
	}
	rb.holes = rb.holes[:0]
	return true
}

// dropHoles closes the pipes of holes neither forwarded nor read back.
func (rb *RequestBuffer) dropHoles() {
	for i := range rb.holes {
		if p := rb.holes[i].p; p != nil {
			rb.pipes.put(p, false)
		}
	}
	clear(rb.holes)
	rb.holes = rb.holes[:0]
	rb.broken = false
}

// errHolesElsewhere is a frame with holes that is not the request read: a
// bug, caught before a byte of it goes upstream.
var errHolesElsewhere = errors.New("a produce request with holes is not the frame being forwarded")

// WriteAround writes the request frame, the one read last, to up around
// its holes, splicing each from its pipe to rawUp (up's socket); send
// sends the bytes before each hole. It returns the record bytes spliced
// once every hole went (0 when one failed).
func (rb *RequestBuffer) WriteAround(up io.Writer, rawUp syscall.RawConn, send *MoreSender, frame []byte) (spliced int, err error) {
	if len(frame) == 0 || len(rb.large) == 0 || &frame[0] != &rb.large[0] {
		return 0, errHolesElsewhere
	}
	pos := 0
	for i := range rb.holes {
		h := &rb.holes[i]
		if h.off+h.n > len(frame) {
			return 0, errHolesElsewhere
		}
		// The bytes before a hole go with MSG_MORE: TCP sends them in
		// the segment of the records spliced after them.
		if err := send.sendMore(rawUp, frame[pos:h.off]); err != nil {
			return 0, err
		}
		if err := rb.mover.out(rawUp, h.p, h.n); err != nil {
			return 0, err
		}
		rb.pipes.put(h.p, true)
		h.p = nil
		pos = h.off + h.n
		spliced += h.n
	}
	rb.holes = rb.holes[:0]
	_, err = up.Write(frame[pos:])
	return spliced, err
}

// FillHoles reads back the record bytes of the request read last that are
// held in pipes, when the decision core asks (ReadRecords), and returns
// how many it read back. ok is false when the request is broken: it can
// be neither forwarded nor answered.
func (rb *RequestBuffer) FillHoles() (ok bool, readBack int) {
	if len(rb.holes) == 0 {
		return !rb.broken, 0
	}
	ok = rb.fillHoles()
	readBack, rb.readBack = rb.readBack, 0
	return ok, readBack
}
