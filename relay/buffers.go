package relay

import (
	"fmt"
	"io"
	"math/bits"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupproxy/dedupproxy/clock"
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
func GetFrame(n int) *[]byte {
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
func PutFrame(bp *[]byte) {
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
func ReadPooledFrame(r io.Reader, maxSize int32) (bp *[]byte, body []byte, err error) {
	var head [4]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, nil, err
	}
	size, err := protocol.CheckSize(head[:], maxSize, protocol.ResponseMinSize)
	if err != nil {
		return nil, nil, err
	}
	bp = GetFrame(4 + int(size))
	frame := append((*bp)[:0], head[:]...)
	frame = frame[:4+size]
	if _, err := io.ReadFull(r, frame[4:]); err != nil {
		PutFrame(bp)
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, nil, fmt.Errorf("read frame body of %d bytes: %w", size, err)
	}
	*bp = frame
	return bp, frame[4:], nil
}

// RequestBuffer is readLoop's read buffer. A request up to SmallRequest
// bytes is read into a buffer of the size-class pools (getFrame), taken
// when its size prefix has been read and given back once the request has
// been forwarded (release): an idle connection holds none. A larger
// request, in practice a Produce of several MB that the proxy must hold
// whole to decide it, takes a buffer from the server's RequestPool, given
// back the same way; the bytes held across connections have a budget.
type RequestBuffer struct {
	head  [4]byte // the size prefix of the request being read
	buf   []byte  // the request being handled, when it is small
	small *[]byte // buf's pooled buffer
	// lastLarge: the request read last was larger than SmallRequest.
	lastLarge bool
	// limit, when set, is the largest request size, asked once a
	// request's size has arrived (in place of read's maxSize).
	limit func() int32

	pool  *RequestPool
	large []byte // the request being handled, when it is large
	held  int    // bytes of pool's budget it holds
	// reading is when the large request's body last made progress (Unix
	// ns), 0 once read: a waiter for budget demotes a holder whose client
	// has stopped sending (RequestPool.demoteStalled).
	reading atomic.Int64
	demoted bool // its bytes no longer count in the budget (under pool.mu)

	// A Produce request may be read with holes (holes.go) when holesOK:
	// src, the client's socket, is set (produce_splice on, both legs plain
	// TCP on Linux) and no idempotency keys are read.
	src      syscall.RawConn
	direct   io.Reader // the client connection under the buffered reader
	holesOK  bool
	mover    *holeMover
	pipes    *PipePool // the server's
	tracker  *Tracker  // told of the bytes that bypass it; may be nil
	sparse   bool      // large is a mapping of the pipe pool, with holes
	dirty    int       // pages of that mapping that may hold bytes
	holes    []hole
	broken   bool // a hole could not be read back
	readBack int  // hole bytes read back, not yet counted
}

// NewRequestBuffer makes a connection's request buffer: large requests
// take budget from pool; tracker, if not nil, is the client connection the
// requests are read from, told of the bytes that bypass it.
func NewRequestBuffer(pool *RequestPool, tracker *Tracker) *RequestBuffer {
	return &RequestBuffer{pool: pool, tracker: tracker}
}

// SpliceFrom lets a Produce request be read with holes (holes.go): src is
// the client's socket, direct the connection under the buffered reader,
// pipes the server's. Holes are read only while SetHoles allows them.
func (rb *RequestBuffer) SpliceFrom(src syscall.RawConn, direct io.Reader, pipes *PipePool) {
	rb.src, rb.direct, rb.mover, rb.pipes = src, direct, newHoleMover(), pipes
}

// SetHoles allows holes in the requests read next, when SpliceFrom was
// called.
func (rb *RequestBuffer) SetHoles(ok bool) { rb.holesOK = ok && rb.src != nil }

// SetLimit makes limit, asked once a request's size has arrived, the
// largest request size in place of Read's maxSize.
func (rb *RequestBuffer) SetLimit(limit func() int32) { rb.limit = limit }

// HasHoles reports whether the request read last has record bytes in
// pipes.
func (rb *RequestBuffer) HasHoles() bool { return len(rb.holes) > 0 }

// Broken reports whether a hole of the request read last could not be
// read back: it can be neither forwarded nor answered.
func (rb *RequestBuffer) Broken() bool { return rb.broken }

// Reserve holds n bytes of pool's budget without a buffer (a request's
// copy kept until its answer is written), waiting as Read does; give them
// back with Unreserve.
func (p *RequestPool) Reserve(n int, done <-chan struct{}) *RequestBuffer {
	rb := &RequestBuffer{pool: p}
	p.reserve(rb, n, done)
	return rb
}

// Held is how many bytes of the budget requests hold now.
func (p *RequestPool) Held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
}

// BufferSize is the capacity of the large buffers made now: that of the
// largest recent request's class.
func (p *RequestPool) BufferSize() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.size
}

// Unreserve gives back what Reserve held.
func (rb *RequestBuffer) Unreserve() { rb.pool.put(rb, nil) }

// SmallRequest is the largest request read into a buffer of the
// size-class pools: every request but a big Produce.
const SmallRequest = 64 << 10

// requestHeadFill is the most the read of a request's size prefix asks
// for after a large request.
const requestHeadFill = 4 << 10

// Read reads one request frame and returns its body; the whole frame is
// Frame(body). Call Release once the request's bytes are no longer needed.
// done is closed when the connection closes: a wait for budget ends.
func (rb *RequestBuffer) Read(r *ConnReader, maxSize int32, done <-chan struct{}) ([]byte, error) {
	if rb.lastLarge {
		// The client sends large requests: the read that brings the
		// next one's first bytes asks for a few KiB, not a whole
		// buffer, which would take up to 32 KiB of its records along,
		// to be copied (into a mapping's fresh pages, with holes)
		// where they could be spliced. Smaller requests are read in one
		// read, as before.
		r.limit = requestHeadFill
	}
	_, err := io.ReadFull(r, rb.head[:])
	r.limit = 0
	if err != nil {
		return nil, err
	}
	if rb.limit != nil {
		maxSize = rb.limit()
	}
	size, err := protocol.CheckSize(rb.head[:], maxSize, protocol.RequestMinSize)
	if err != nil {
		return nil, err
	}
	n := 4 + int(size)
	rb.lastLarge = n > SmallRequest
	if rb.lastLarge {
		return rb.readLarge(r, n, done)
	}
	// n is at most SmallRequest here: a size prefix alone cannot make
	// it pin much.
	rb.small = GetFrame(n)
	rb.buf = (*rb.small)[:n]
	copy(rb.buf, rb.head[:])
	if _, err := io.ReadFull(r, rb.buf[4:n]); err != nil {
		return nil, bodyErr(err, size)
	}
	return rb.buf[4:n], nil
}

// Frame returns the whole frame, size prefix included, of the request
// whose body Read returned.
func (rb *RequestBuffer) Frame(body []byte) []byte {
	if rb.large != nil {
		return rb.large[:4+len(body)]
	}
	return rb.buf[:4+len(body)]
}

func bodyErr(err error, size int32) error {
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("read frame body of %d bytes: %w", size, err)
}

// readLarge reads a request of n bytes, its size prefix already in rb.head,
// into a buffer of the pool.
func (rb *RequestBuffer) readLarge(r *ConnReader, n int, done <-chan struct{}) ([]byte, error) {
	if rb.holesOK {
		// A Produce (API key 0) may leave its records in pipes.
		if key, err := r.Peek(2); err == nil && key[0] == 0 && key[1] == 0 {
			if body, ok, err := rb.readSparse(r, n, done); ok {
				return body, err
			}
		}
	}
	buf, size := rb.pool.get(rb, n, done)
	if buf == nil {
		buf = newLarge(size)
	}
	rb.large = buf
	buf = buf[:cap(buf)]
	copy(buf, rb.head[:])
	have := 4
	defer rb.reading.Store(0)
	for {
		// A buffer grows only as bytes arrive (its pages, for a mapped
		// one): a peer that declares 100 MiB and sends 1 KiB pins little.
		// Read in chunks, so that progress shows.
		end := min(n, len(buf), have+readChunk)
		rb.reading.Store(clock.Real.Now().UnixNano())
		k, err := io.ReadFull(r, buf[have:end])
		have += k
		if err != nil {
			return nil, bodyErr(err, int32(n-4))
		}
		if have == n {
			return buf[4:n], nil
		}
		if have < len(buf) {
			continue
		}
		grown := make([]byte, min(2*len(buf), size)) // size >= n
		copy(grown, buf[:have])
		buf = grown
		rb.large = buf
	}
}

// readChunk is how much of a large request's body readLarge reads before it
// notes progress.
const readChunk = 1 << 20

// largeClass rounds a large request's size up to a quarter power of two
// (at most 25% more), so that buffers fit requests of about the same size.
func largeClass(n int) int {
	step := 1 << (bits.Len(uint(n-1)) - 3)
	return (n + step - 1) &^ (step - 1)
}

// Release gives the request's buffer back. Call it once the request read
// last has been forwarded and nothing refers to its bytes.
func (rb *RequestBuffer) Release() {
	switch {
	case rb.sparse:
		rb.dropHoles()
		rb.pipes.keepMapping(rb.large, rb.dirty)
		rb.pool.put(rb, nil)
		rb.large, rb.held, rb.sparse, rb.dirty = nil, 0, false, 0
	case rb.large != nil:
		rb.pool.put(rb, rb.large)
		rb.large, rb.held = nil, 0
	}
	if rb.small != nil {
		*rb.small = (*rb.small)[:0]
		PutFrame(rb.small)
		rb.small, rb.buf = nil, nil
	}
}

// RequestPool holds the buffers of large requests (see RequestBuffer) for
// all of a server's connections, within a budget of bytes (Config
// RequestMemory): those of requests being read or forwarded, plus idle
// buffers kept for the next ones.
//
// A request that does not fit waits until others give bytes back; its
// bytes stay in the kernel's socket buffers meanwhile, and TCP slows its
// client. One larger than the whole budget goes when nothing else is held.
// A client that stalls halfway through a request must not stall every other
// one: a holder whose body has made no progress for stallAfter is demoted,
// its bytes no longer counted, and the waiters go on. Holders that are
// forwarding are waited for, since a slow broker is backpressure, but for
// at most maxBudgetWait: past it the request is read over budget, as it
// would have been without one.
//
// Where the platform allows (buffers_unix.go) the buffers are anonymous
// memory mappings, outside the Go heap: the garbage collector neither scans
// them nor counts them in its heap goal, which would otherwise let the heap
// grow by as much again as the buffers held (GOGC=100), and a buffer's
// pages cost memory only once bytes have been written to them.
type RequestPool struct {
	budget     int           // bytes
	maxWait    time.Duration // maxBudgetWait; tests change it
	stallAfter time.Duration // stallAfter; tests change it

	mu        sync.Mutex
	held      int      // budget held by requests
	idle      [][]byte // buffers given back, for the next requests
	idleBytes int
	released  chan struct{}    // closed, and replaced, when bytes are given back
	holders   []*RequestBuffer // holding budget, for demoteStalled

	size      int // capacity of the buffers made now
	recentMax int // largest class of the requests since the window began
	recent    int // requests since the window began

	overBudget int // requests that stopped waiting and went over budget (tests)
	demotions  int // holders demoted (tests)

	metrics *PoolMetrics // nil in tests
}

// PoolMetrics is where a RequestPool counts (dedupproxy_request_memory_*).
type PoolMetrics struct {
	Held    prometheus.Gauge   // bytes of the budget held
	Stalled prometheus.Counter // holders demoted: their client stopped sending
	// Fit and OverBudget count the waits for budget, by how they ended:
	// others gave bytes back, or the request was read over the budget.
	Fit, OverBudget prometheus.Counter
}

// sizeWindow is how many large requests the size of new buffers follows:
// one outsized request makes them larger only for this many.
const sizeWindow = 64

// maxBudgetWait bounds a request's wait for budget: many times what the
// largest requests take to be forwarded on a loaded machine.
const maxBudgetWait = 500 * time.Millisecond

// stallAfter is how long a holder's client may send nothing of its request
// before the holder is demoted; a waiter checks as often.
const stallAfter = 100 * time.Millisecond

// NewRequestPool makes a pool of large request buffers within budget
// bytes (request_memory); m may be nil.
func NewRequestPool(budget int, m *PoolMetrics) *RequestPool {
	return &RequestPool{budget: budget, maxWait: maxBudgetWait, stallAfter: stallAfter, metrics: m}
}

// heldChanged reports p.held; call with mu held.
func (p *RequestPool) heldChanged() {
	if p.metrics != nil {
		p.metrics.Held.Set(float64(p.held))
	}
}

// get reserves budget for rb's request of n bytes (rb.held) and returns an
// idle buffer of capacity at least n, or nil and the capacity to make one
// with. Give both back with put.
func (p *RequestPool) get(rb *RequestBuffer, n int, done <-chan struct{}) (buf []byte, size int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// Buffers are made the size of the largest recent request, so that
	// each one kept fits the next request whatever its size; buffers sized
	// to each request would seldom fit the next one, and be made again.
	c := largeClass(n)
	p.size, p.recentMax = max(p.size, c), max(p.recentMax, c)
	if p.recent++; p.recent == sizeWindow {
		p.size, p.recentMax, p.recent = p.recentMax, 0, 0
	}
	p.waitFor(p.size, done)
	// The smallest idle buffer that fits the request, and the budget: one
	// kept from larger requests may not.
	best := -1
	for i, b := range p.idle {
		fits := cap(b) >= n && (p.held == 0 || p.held+cap(b) <= p.budget)
		if fits && (best < 0 || cap(b) < cap(p.idle[best])) {
			best = i
		}
	}
	held := p.size
	if best >= 0 {
		buf = p.idle[best]
		p.removeIdle(best)
		held = cap(buf)
	}
	p.hold(rb, held)
	return buf, p.size
}

// reserve reserves budget for rb's request of n bytes without a buffer: a
// request with holes (holes.go) has a mapping of its own. Give it back with
// put(rb, nil).
func (p *RequestPool) reserve(rb *RequestBuffer, n int, done <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.waitFor(n, done)
	p.hold(rb, n)
}

// waitFor waits, with mu held, until want bytes fit the budget, or until
// the wait must end (see RequestPool).
func (p *RequestPool) waitFor(want int, done <-chan struct{}) {
	var timer, tick *clock.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
			tick.Stop()
		}
	}()
	for p.held > 0 && p.held+want > p.budget {
		if p.released == nil {
			p.released = make(chan struct{})
		}
		wake := p.released
		p.mu.Unlock()
		if timer == nil {
			timer, tick = clock.Real.NewTimer(p.maxWait), clock.Real.NewTimer(p.stallAfter)
		}
		over, check := false, false
		select {
		case <-wake:
		case <-tick.C:
			check = true
			tick.Reset(p.stallAfter)
		case <-timer.C:
			over = true
		case <-done:
			over = true
		}
		p.mu.Lock()
		if over {
			p.overBudget++
			break
		}
		if check {
			p.demoteStalled(clock.Real.Now().UnixNano())
		}
	}
	if timer != nil && p.metrics != nil { // it waited
		if p.held > 0 && p.held+want > p.budget {
			p.metrics.OverBudget.Inc()
		} else {
			p.metrics.Fit.Inc()
		}
	}
}

// hold counts held bytes for rb, with mu held.
func (p *RequestPool) hold(rb *RequestBuffer, held int) {
	p.held += held
	p.heldChanged()
	rb.held, rb.demoted = held, false
	p.holders = append(p.holders, rb)
	// Idle buffers beyond the budget go, the smallest (the least likely
	// to fit) first.
	for len(p.idle) > 0 && p.held+p.idleBytes > p.budget {
		small := 0
		for i, b := range p.idle {
			if cap(b) < cap(p.idle[small]) {
				small = i
			}
		}
		freeLarge(p.removeIdle(small))
	}
}

// demoteStalled stops counting the bytes of holders whose client has sent
// nothing of their request since stallAfter before now.
func (p *RequestPool) demoteStalled(now int64) {
	for _, h := range p.holders {
		if at := h.reading.Load(); at != 0 && !h.demoted && now-at >= int64(p.stallAfter) {
			h.demoted = true
			p.held -= h.held
			p.demotions++
			p.heldChanged()
			if p.metrics != nil {
				p.metrics.Stalled.Inc()
			}
		}
	}
}

// put gives back rb's budget and buf, which is kept for reuse if it fits
// the budget and is not smaller than the buffers made now.
func (p *RequestPool) put(rb *RequestBuffer, buf []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !rb.demoted {
		p.held -= rb.held
		p.heldChanged()
	}
	rb.demoted = false
	for i, h := range p.holders {
		if h == rb {
			p.holders[i] = p.holders[len(p.holders)-1]
			p.holders[len(p.holders)-1] = nil
			p.holders = p.holders[:len(p.holders)-1]
			break
		}
	}
	switch {
	case buf == nil: // reserve's
	case cap(buf) >= p.size && p.held+p.idleBytes+cap(buf) <= p.budget:
		p.idle = append(p.idle, buf[:0])
		p.idleBytes += cap(buf)
	default:
		freeLarge(buf)
	}
	if p.released != nil {
		close(p.released)
		p.released = nil
	}
}

func (p *RequestPool) removeIdle(i int) []byte {
	b := p.idle[i]
	p.idleBytes -= cap(b)
	p.idle[i] = p.idle[len(p.idle)-1]
	p.idle[len(p.idle)-1] = nil
	p.idle = p.idle[:len(p.idle)-1]
	return b
}
