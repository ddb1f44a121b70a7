package relay

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// testPoolMetrics are unregistered PoolMetrics.
func testPoolMetrics() *PoolMetrics {
	c := func() prometheus.Counter { return prometheus.NewCounter(prometheus.CounterOpts{Name: "c"}) }
	return &PoolMetrics{Held: prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"}), Stalled: c(), Fit: c(), OverBudget: c()}
}

// waitFor polls cond until it holds, at most timeout.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for i := 0; ; i++ {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s (%d checks) waiting for %s", timeout, i, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// requestFrame is a frame of n bytes, size prefix included, whose body
// starts with b.
func requestFrame(n int, b byte) []byte {
	f := make([]byte, n)
	binary.BigEndian.PutUint32(f, uint32(n-4))
	f[4] = b
	f[n-1] = b
	return f
}

func readRequest(t *testing.T, rb *RequestBuffer, frame []byte) []byte {
	t.Helper()
	body, err := rb.Read(NewConnReader(bytes.NewReader(frame), nil, nil, nil), 100<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := rb.Frame(body); !bytes.Equal(got, frame) {
		t.Fatalf("frame of %d bytes read back wrong", len(frame))
	}
	return body
}

// TestLargeRequestBufferReleased: a large request's buffer is held only
// until release, then kept for the next large request (of any connection),
// which reuses it; a small request uses the connection's own buffer and
// holds no budget.
func TestLargeRequestBufferReleased(t *testing.T) {
	p := NewRequestPool(16<<20, nil)
	a, b := RequestBuffer{pool: p}, RequestBuffer{pool: p}

	readRequest(t, &a, requestFrame(1000, 1))
	if a.large != nil || p.held != 0 {
		t.Fatalf("a small request took a pooled buffer (held %d)", p.held)
	}
	body := readRequest(t, &a, requestFrame(3<<20, 2))
	if a.large == nil || p.held < 3<<20 {
		t.Fatalf("a 3 MiB request holds %d bytes of budget", p.held)
	}
	first := unsafe.SliceData(body)
	a.Release()
	if a.large != nil || p.held != 0 || len(p.idle) != 1 {
		t.Fatalf("after release: large %v, held %d, %d idle", a.large != nil, p.held, len(p.idle))
	}
	body = readRequest(t, &b, requestFrame(3<<20-100, 3))
	if unsafe.SliceData(body) != first {
		t.Fatal("the next large request did not reuse the idle buffer")
	}
	b.Release()
	if p.held != 0 {
		t.Fatalf("held %d after every release", p.held)
	}
}

// TestLargeRequestBufferFreedBeyondBudget: a buffer that would take the
// idle ones beyond the budget is not kept.
func TestLargeRequestBufferFreedBeyondBudget(t *testing.T) {
	p := NewRequestPool(1<<20, nil)
	rb := RequestBuffer{pool: p}
	readRequest(t, &rb, requestFrame(2<<20, 1)) // larger than the budget: alone
	rb.Release()
	if len(p.idle) != 0 || p.held != 0 || p.idleBytes != 0 {
		t.Fatalf("kept %d idle buffers (%d bytes), held %d", len(p.idle), p.idleBytes, p.held)
	}
	if p.overBudget != 0 {
		t.Fatal("a request alone counted as over budget")
	}
}

// TestLargeRequestTruncated: a large request cut short fails like a small
// one, and its buffer still goes back.
func TestLargeRequestTruncated(t *testing.T) {
	p := NewRequestPool(16<<20, nil)
	rb := RequestBuffer{pool: p}
	frame := requestFrame(1<<20, 1)
	_, err := rb.Read(NewConnReader(bytes.NewReader(frame[:1000]), nil, nil, nil), 100<<20, nil)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("err %v, want ErrUnexpectedEOF", err)
	}
	rb.Release()
	if p.held != 0 {
		t.Fatalf("held %d after a failed read", p.held)
	}
}

// waiting reports whether some get waits on p for budget.
func (p *RequestPool) waiting() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.released != nil
}

// TestRequestPoolBudget: a request that does not fit the budget waits
// until one held is given back; the wait ends early when the connection
// closes, or after maxWait, then over budget.
func TestRequestPoolBudget(t *testing.T) {
	const mb = 1 << 20
	m := testPoolMetrics()
	p := NewRequestPool(3*mb, m)
	p.maxWait = time.Hour
	a := &RequestBuffer{pool: p}
	buf, size := p.get(a, 2*mb, nil)
	if buf != nil || a.held != 2*mb || size != 2*mb {
		t.Fatalf("first get: buf %v, held %d, size %d", buf != nil, a.held, size)
	}
	b := &RequestBuffer{pool: p}
	got := make(chan struct{})
	go func() {
		p.get(b, 2*mb, nil)
		got <- struct{}{}
	}()
	waitFor(t, 10*time.Second, "the second request to wait", p.waiting)
	select {
	case <-got:
		t.Fatal("the second request went beyond the budget")
	default:
	}
	p.put(a, newLarge(size))
	<-got
	if p.held != b.held || p.overBudget != 0 {
		t.Fatalf("held %d, want %d; over budget %d", p.held, b.held, p.overBudget)
	}

	// The connection closes while it waits.
	c := &RequestBuffer{pool: p}
	done := make(chan struct{})
	go func() {
		p.get(c, 2*mb, done)
		got <- struct{}{}
	}()
	waitFor(t, 10*time.Second, "the third request to wait", p.waiting)
	close(done)
	<-got
	if p.overBudget != 1 || p.held != b.held+c.held {
		t.Fatalf("after close: over budget %d, held %d", p.overBudget, p.held)
	}
	p.put(c, nil)

	// A request waits at most maxWait.
	d := &RequestBuffer{pool: p}
	p.maxWait = time.Nanosecond
	p.get(d, 2*mb, nil)
	if p.overBudget != 2 || p.held != b.held+d.held {
		t.Fatalf("after maxWait: over budget %d, held %d", p.overBudget, p.held)
	}
	fit, over := testutil.ToFloat64(m.Fit), testutil.ToFloat64(m.OverBudget)
	if fit != 1 || over != 2 || testutil.ToFloat64(m.Held) != float64(p.held) {
		t.Fatalf("metrics: waits fit %v, over budget %v, held %v; want 1, 2, %d", fit, over, testutil.ToFloat64(m.Held), p.held)
	}
}

// TestRequestPoolDemotesStalledReader: a client that sends half of a large
// request and stops does not hold up the others: a waiter demotes its
// buffer's holder (its bytes stop counting) instead of waiting; when the
// stalled request completes after all, the budget is not given back twice.
func TestRequestPoolDemotesStalledReader(t *testing.T) {
	const mb = 1 << 20
	m := testPoolMetrics()
	p := NewRequestPool(3*mb, m)
	p.maxWait, p.stallAfter = time.Hour, time.Millisecond
	frame := requestFrame(2*mb, 1)
	cr, cw := io.Pipe()
	stalled := RequestBuffer{pool: p}
	read := make(chan error, 1)
	go func() {
		_, err := stalled.Read(NewConnReader(cr, nil, nil, nil), 100<<20, nil)
		read <- err
	}()
	if _, err := cw.Write(frame[:mb]); err != nil { // then nothing
		t.Fatal(err)
	}
	other := &RequestBuffer{pool: p}
	p.get(other, 2*mb, nil) // would wait for ever without the demotion
	if p.overBudget != 0 || p.demotions != 1 || p.held != other.held {
		t.Fatalf("over budget %d, demotions %d, held %d (want %d)", p.overBudget, p.demotions, p.held, other.held)
	}
	if _, err := cw.Write(frame[mb:]); err != nil {
		t.Fatal(err)
	}
	if err := <-read; err != nil {
		t.Fatal(err)
	}
	stalled.Release()
	p.put(other, nil)
	if p.held != 0 {
		t.Fatalf("held %d once both are given back", p.held)
	}
	if n, held := testutil.ToFloat64(m.Stalled), testutil.ToFloat64(m.Held); n != 1 || held != 0 {
		t.Fatalf("metrics: stalled %v, held %v; want 1, 0", n, held)
	}
}

// TestRequestPoolSizeWindow: buffers are made the size of the largest
// recent request, and one outsized request stops counting after
// sizeWindow others.
func TestRequestPoolSizeWindow(t *testing.T) {
	p := NewRequestPool(256<<20, nil)
	rb := &RequestBuffer{pool: p}
	_, size := p.get(rb, 64<<20, nil)
	p.put(rb, nil)
	if size < 64<<20 {
		t.Fatalf("size %d for a 64 MiB request", size)
	}
	for range 2 * sizeWindow {
		_, size = p.get(rb, 100<<10, nil)
		p.put(rb, nil)
	}
	if size != largeClass(100<<10) {
		t.Fatalf("size %d after many 100 KiB requests, want %d", size, largeClass(100<<10))
	}
}

func TestLargeClass(t *testing.T) {
	for _, n := range []int{SmallRequest + 1, 100 << 10, 1 << 20, 1<<20 + 1, 5_000_000, 100 << 20} {
		c := largeClass(n)
		if c < n || c > n+n/4+1 {
			t.Errorf("largeClass(%d) = %d", n, c)
		}
	}
}

// TestFrameClasses: a frame buffer holds what it was asked for, and one
// above the largest class is not pooled.
func TestFrameClasses(t *testing.T) {
	for _, n := range []int{1, 16 << 10, 16<<10 + 1, 64 << 10, 64<<10 + 1, 1 << 20, 64 << 20} {
		bp := GetFrame(n)
		if cap(*bp) < n || len(*bp) != 0 {
			t.Fatalf("GetFrame(%d): len %d cap %d", n, len(*bp), cap(*bp))
		}
		PutFrame(bp)
	}
	if frameClass(64<<20+1) != -1 {
		t.Fatal("a frame above the largest class must not be pooled")
	}
}
