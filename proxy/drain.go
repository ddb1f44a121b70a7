package proxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/replica"
)

// ErrDraining is Ready's answer once Shutdown has begun.
var ErrDraining = errors.New("proxy: draining for shutdown")

// Draining reports whether Shutdown has begun.
func (s *Server) Draining() bool { return s.closing.Load() }

// Ready is /readyz: nil when the proxy should get traffic. It is not ready
// once draining (or, with replicas, handing over) has begun, while a
// replica has not yet taken back every node it owns from the peers that
// covered them, while a broker node's listener failed to bind (clients
// sent to that node would find nothing), or when no upstream broker
// answers (Probe).
func (s *Server) Ready(ctx context.Context) error {
	if s.Draining() {
		return ErrDraining
	}
	if rs := s.replicas; rs != nil {
		if err := replicasReady(rs); err != nil {
			return err
		}
	}
	if unbound := s.nodes.unbound(); len(unbound) > 0 {
		return fmt.Errorf("broker node listeners not bound: %s", strings.Join(unbound, "; "))
	}
	return s.Probe(ctx)
}

// NodeListeners lists the broker node listeners bound now, as
// "node=ID addr=HOST:PORT", by node id.
func (s *Server) NodeListeners() []string {
	r := &s.nodes
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make([]int32, 0, len(r.nodes))
	for id, n := range r.nodes {
		if n.bound != "" {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = fmt.Sprintf("node=%d addr=%s", id, r.nodes[id].bound)
	}
	return out
}

// unbound describes the nodes whose listener failed to bind (and is being
// retried). Nodes left out by design (a port outside 1..65535) are not
// listed: they never get a listener.
func (r *nodeRegistry) unbound() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, n := range r.nodes {
		if n.bound == "" && n.err != nil && n.err.reason == listenerBind {
			out = append(out, n.err.Error())
		}
	}
	sort.Strings(out)
	return out
}

// drainPoll is how often Shutdown looks for sessions that hold only
// long-poll Fetches.
const drainPoll = 5 * time.Millisecond

// cutFetchOnly closes, until done is closed, every session of sessions
// whose tracker cut accepts; Shutdown's cut accepts those whose requests
// awaiting a response are all Fetches (or none): a Fetch commits nothing,
// and a consumer's long poll would hold the drain for its
// fetch.max.wait.ms (5s with franz-go). Sessions with a Produce (or any
// other request) in flight are left to drain, until deadline. Nothing new is read once
// Shutdown stopped reading, so a session found Fetch-only stays so.
func (s *Server) cutFetchOnly(sessions map[*session]*requestTracker, cut func(*requestTracker) bool, done, deadline <-chan struct{}) {
	t := time.NewTicker(drainPoll)
	defer t.Stop()
	for len(sessions) > 0 {
		for sess, tr := range sessions {
			if tr == nil || !cut(tr) {
				continue
			}
			delete(sessions, sess)
			if tr.onlyFetch() {
				sess.log.Debug("shutdown: closing a connection whose in-flight requests are only Fetch", "fetches", tr.fetches())
			} else {
				sess.log.Debug("shutdown: closing a connection: every node was handed over, so nothing it waits for holds state")
			}
			sess.closeAll()
		}
		select {
		case <-done:
			return
		case <-deadline: // Shutdown closes everything
			return
		case <-t.C:
		}
	}
}

// requestTracker wraps a client connection and follows which requests await
// a response: the request frames read (by API key and correlation id, the
// first bytes of every request header) and the response frames written
// (each in one Write, led by its correlation id). A request that gets no
// response (Produce with acks=0) stays counted: the session is then
// drained, never cut.
type requestTracker struct {
	net.Conn

	// Read side, readLoop's only: the frame being read.
	head  [12]byte // size, api key, api version, correlation id
	headN int
	skip  int // body bytes of the current frame still to pass

	mu       sync.Mutex
	inflight map[int32]int16 // correlation id → api key
	nonFetch int

	hungUp atomic.Bool // the client closed its side normally (EOF)

	// With replicas (replicas.go): the node whose listener took the
	// connection, and the correlation ids of the Produce requests forwarded
	// on it whose answers are not yet written, oldest first (answers go out
	// in request order). Requests read ahead but not yet handled are not
	// in it, so a node's drain waits only for what was really forwarded.
	rnode    *replica.Node
	awaited  []int32 // ring, under mu
	awaitHd  int
	awaitLen int
	// gone is closed when the client connection is closed (by either
	// loop): a request held for a handover is then answered by no one.
	gone     chan struct{}
	goneOnce sync.Once
}

// Close closes the client connection and marks it gone.
func (t *requestTracker) Close() error {
	t.goneOnce.Do(func() { close(t.gone) })
	return t.Conn.Close()
}

// produceSent records that the Produce request corr was forwarded and
// awaits its answer.
func (t *requestTracker) produceSent(corr int32) {
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

// produceUnsent takes back the last produceSent: that request was not
// forwarded after all.
func (t *requestTracker) produceUnsent() {
	t.mu.Lock()
	if t.awaitLen > 0 {
		t.awaitLen--
	}
	t.mu.Unlock()
	t.awaitedFewer()
}

// awaitedFewer follows a forwarded Produce request that no longer awaits
// its answer: a node being drained for a handover looks whether it is
// drained now.
func (t *requestTracker) awaitedFewer() {
	if n := t.rnode; n != nil && n.Draining() {
		n.CheckDrained()
	}
}

// ProducesAwaited is how many forwarded Produce requests await an answer.
func (t *requestTracker) ProducesAwaited() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.awaitLen
}

func newRequestTracker(c net.Conn) *requestTracker {
	return &requestTracker{Conn: c, inflight: make(map[int32]int16), gone: make(chan struct{})}
}

func (t *requestTracker) Read(p []byte) (int, error) {
	n, err := t.Conn.Read(p)
	t.sawRead(p[:n], err)
	return n, err
}

// sawRead follows bytes read from the connection, and the error of that
// read: through Read, or past it on the raw socket (connReader).
func (t *requestTracker) sawRead(b []byte, err error) {
	t.scan(b)
	if errors.Is(err, io.EOF) {
		t.hungUp.Store(true)
	}
}

// passed accounts for n body bytes of the frame being read that went past
// the tracker (spliced, holes.go); eof reports that the client closed.
func (t *requestTracker) passed(n int, eof bool) {
	t.skip = max(t.skip-n, 0)
	if eof {
		t.hungUp.Store(true)
	}
}

func (t *requestTracker) scan(b []byte) {
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
func (t *requestTracker) Write(b []byte) (int, error) {
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
	}
	return n, err
}

// onlyFetch reports whether every request awaiting a response is a Fetch.
func (t *requestTracker) onlyFetch() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.nonFetch == 0
}

func (t *requestTracker) fetches() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.inflight) - t.nonFetch
}
