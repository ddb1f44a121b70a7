package relay

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// Tracker wraps a client connection and follows which requests await
// a response: the request frames read (by API key and correlation id, the
// first bytes of every request header) and the response frames written
// (each in one Write, led by its correlation id). A request that gets no
// response (Produce with acks=0) stays counted: the session is then
// drained, never cut.
type Tracker struct {
	net.Conn

	// Read side, readLoop's only: the frame being read.
	head  [12]byte // size, api key, api version, correlation id
	headN int
	skip  int // body bytes of the current frame still to pass

	mu       sync.Mutex
	inflight map[int32]int16 // correlation id → api key
	nonFetch int

	hungUp atomic.Bool // the client closed its side normally (EOF)

	// With replicas: the drain of the node whose listener took the
	// connection (set before the connection is used), and the correlation
	// ids of the Produce requests forwarded on it whose answers are not yet
	// written, oldest first (answers go out in request order). Requests
	// read ahead but not yet handled are not in it, so a node's drain waits
	// only for what was really forwarded.
	Drain    Drain
	awaited  []int32 // ring, under mu
	awaitHd  int
	awaitLen int
	// gone is closed when the client connection is closed (by either
	// loop): a request held for a handover is then answered by no one.
	gone     chan struct{}
	goneOnce sync.Once
	// kick, once set (Kick), is signalled whenever a request stops
	// awaiting its response: a drain waits on it instead of polling.
	kick atomic.Pointer[chan struct{}]
}

// Kick makes t signal k (without blocking: k has room for one signal)
// whenever a request it follows stops awaiting its response.
func (t *Tracker) Kick(k chan struct{}) { t.kick.Store(&k) }

// kicked signals the channel Kick set, if any.
func (t *Tracker) kicked() {
	if k := t.kick.Load(); k != nil {
		select {
		case *k <- struct{}{}:
		default:
		}
	}
}

// Close closes the client connection and marks it gone.
func (t *Tracker) Close() error {
	t.goneOnce.Do(func() { close(t.gone) })
	return t.Conn.Close()
}

// ProduceSent records that the Produce request corr was forwarded and
// awaits its answer.
func (t *Tracker) ProduceSent(corr int32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.awaitLen == len(t.awaited) {
		grown := make([]int32, max(8, 2*len(t.awaited)))
		for i := range t.awaitLen {
			grown[i] = t.awaited[(t.awaitHd+i)%len(t.awaited)]
		}
		t.awaited, t.awaitHd = grown, 0
	}
	t.awaited[(t.awaitHd+t.awaitLen)%len(t.awaited)] = corr
	t.awaitLen++
}

// ProduceUnsent takes back the last ProduceSent: that request was not
// forwarded after all.
func (t *Tracker) ProduceUnsent() {
	t.mu.Lock()
	if t.awaitLen > 0 {
		t.awaitLen--
	}
	t.mu.Unlock()
	t.awaitedFewer()
	t.kicked()
}

// awaitedFewer follows a forwarded Produce request that no longer awaits
// its answer: a node being drained for a handover looks whether it is
// drained now.
func (t *Tracker) awaitedFewer() {
	if d := t.Drain; d != nil && d.Draining() {
		d.CheckDrained()
	}
}

// ProducesAwaited is how many forwarded Produce requests await an answer.
func (t *Tracker) ProducesAwaited() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.awaitLen
}

// NewTracker wraps c.
func NewTracker(c net.Conn) *Tracker {
	return &Tracker{Conn: c, inflight: make(map[int32]int16), gone: make(chan struct{})}
}

func (t *Tracker) Read(p []byte) (int, error) {
	n, err := t.Conn.Read(p)
	t.sawRead(p[:n], err)
	return n, err
}

// sawRead follows bytes read from the connection, and the error of that
// read: through Read, or past it on the raw socket (ConnReader).
func (t *Tracker) sawRead(b []byte, err error) {
	t.scan(b)
	if errors.Is(err, io.EOF) {
		t.hungUp.Store(true)
	}
}

// passed accounts for n body bytes of the frame being read that went past
// the tracker (spliced, holes.go); eof reports that the client closed.
func (t *Tracker) passed(n int, eof bool) {
	t.skip = max(t.skip-n, 0)
	if eof {
		t.hungUp.Store(true)
	}
}

func (t *Tracker) scan(b []byte) {
	for len(b) > 0 {
		if t.skip > 0 {
			k := min(t.skip, len(b))
			t.skip -= k
			b = b[k:]
			continue
		}
		k := copy(t.head[t.headN:], b)
		t.headN += k
		b = b[k:]
		if t.headN < len(t.head) {
			return
		}
		t.headN = 0
		size := int(int32(binary.BigEndian.Uint32(t.head[0:4])))
		key := int16(binary.BigEndian.Uint16(t.head[4:6]))
		corr := int32(binary.BigEndian.Uint32(t.head[8:12]))
		t.skip = max(size-8, 0)
		t.mu.Lock()
		if old, dup := t.inflight[corr]; dup && old != int16(kmsg.Fetch) {
			t.nonFetch-- // a reused correlation id: count the request once
		}
		t.inflight[corr] = key
		if key != int16(kmsg.Fetch) {
			t.nonFetch++
		}
		t.mu.Unlock()
	}
}

// Write writes one response frame. A client that closed its side normally
// (a consumer closing with a long poll in flight) does not read what it is
// still sent: its kernel answers the first response with RST and the next
// write fails. That failure is the client's goodbye, not an error, so the
// response is dropped as sent and nothing counts it in
// client_errors_total{reason="write"}.
func (t *Tracker) Write(b []byte) (int, error) {
	n, err := t.Conn.Write(b)
	if err != nil && t.hungUp.Load() && (errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)) {
		n, err = len(b), nil
	}
	if len(b) >= 8 {
		corr := int32(binary.BigEndian.Uint32(b[4:8]))
		t.mu.Lock()
		if key, ok := t.inflight[corr]; ok {
			delete(t.inflight, corr)
			if key != int16(kmsg.Fetch) {
				t.nonFetch--
			}
		}
		answered := t.awaitLen > 0 && t.awaited[t.awaitHd] == corr
		if answered {
			t.awaitHd = (t.awaitHd + 1) % len(t.awaited)
			t.awaitLen--
		}
		t.mu.Unlock()
		if answered {
			t.awaitedFewer()
		}
		t.kicked()
	}
	return n, err
}

// OnlyFetch reports whether every request awaiting a response is a Fetch.
func (t *Tracker) OnlyFetch() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.nonFetch == 0
}

// Fetches is how many Fetch requests await a response.
func (t *Tracker) Fetches() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.inflight) - t.nonFetch
}

// Gone is closed when the client connection is closed (by either loop).
func (t *Tracker) Gone() <-chan struct{} { return t.gone }

// HungUp reports whether the client closed its side normally (EOF).
func (t *Tracker) HungUp() bool { return t.hungUp.Load() }

// Drain is a node's drain for a handover (replica.Node): told whenever a
// forwarded Produce request stops awaiting its answer, while it drains.
type Drain interface {
	Draining() bool
	CheckDrained()
}

// Held is a Produce request on the tracker's connection as a replica's
// gate holds it (replica.Held): Sent and Unsent count it as forwarded or
// not, Closed is the session's closing, Gone the client's leaving.
type Held struct {
	tr     *Tracker
	corr   int32
	closed <-chan struct{}
}

// Held returns the request of correlation id corr on t's connection as a
// gate holds it; closed is closed when the session closes.
func (t *Tracker) Held(corr int32, closed <-chan struct{}) *Held {
	return &Held{tr: t, corr: corr, closed: closed}
}

func (h *Held) Sent()                   { h.tr.ProduceSent(h.corr) }
func (h *Held) Unsent()                 { h.tr.ProduceUnsent() }
func (h *Held) Closed() <-chan struct{} { return h.closed }
func (h *Held) Gone() <-chan struct{}   { return h.tr.Gone() }
