package proxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// requestFrame is a frame of n bytes, size prefix included, whose body
// starts with b.
func requestFrame(n int, b byte) []byte {
	f := make([]byte, n)
	binary.BigEndian.PutUint32(f, uint32(n-4))
	f[4] = b
	f[n-1] = b
	return f
}

func readRequest(t *testing.T, rb *requestBuffer, frame []byte) []byte {
	t.Helper()
	body, err := rb.read(newConnReader(bytes.NewReader(frame), nil, nil), 100<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := rb.frame(body); !bytes.Equal(got, frame) {
		t.Fatalf("frame of %d bytes read back wrong", len(frame))
	}
	return body
}

// TestLargeRequestBufferReleased: a large request's buffer is held only
// until release, then kept for the next large request (of any connection),
// which reuses it; a small request uses the connection's own buffer and
// holds no budget.
func TestLargeRequestBufferReleased(t *testing.T) {
	p := newRequestPool(16<<20, nil)
	a, b := requestBuffer{pool: p}, requestBuffer{pool: p}

	readRequest(t, &a, requestFrame(1000, 1))
	if a.large != nil || p.held != 0 {
		t.Fatalf("a small request took a pooled buffer (held %d)", p.held)
	}
	body := readRequest(t, &a, requestFrame(3<<20, 2))
	if a.large == nil || p.held < 3<<20 {
		t.Fatalf("a 3 MiB request holds %d bytes of budget", p.held)
	}
	first := unsafe.SliceData(body)
	a.release()
	if a.large != nil || p.held != 0 || len(p.idle) != 1 {
		t.Fatalf("after release: large %v, held %d, %d idle", a.large != nil, p.held, len(p.idle))
	}
	body = readRequest(t, &b, requestFrame(3<<20-100, 3))
	if unsafe.SliceData(body) != first {
		t.Fatal("the next large request did not reuse the idle buffer")
	}
	b.release()
	if p.held != 0 {
		t.Fatalf("held %d after every release", p.held)
	}
}

// TestLargeRequestBufferFreedBeyondBudget: a buffer that would take the
// idle ones beyond the budget is not kept.
func TestLargeRequestBufferFreedBeyondBudget(t *testing.T) {
	p := newRequestPool(1<<20, nil)
	rb := requestBuffer{pool: p}
	readRequest(t, &rb, requestFrame(2<<20, 1)) // larger than the budget: alone
	rb.release()
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
	p := newRequestPool(16<<20, nil)
	rb := requestBuffer{pool: p}
	frame := requestFrame(1<<20, 1)
	_, err := rb.read(newConnReader(bytes.NewReader(frame[:1000]), nil, nil), 100<<20, nil)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("err %v, want ErrUnexpectedEOF", err)
	}
	rb.release()
	if p.held != 0 {
		t.Fatalf("held %d after a failed read", p.held)
	}
}

// waiting reports whether some get waits on p for budget.
func (p *requestPool) waiting() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.released != nil
}

// TestRequestPoolBudget: a request that does not fit the budget waits
// until one held is given back; the wait ends early when the connection
// closes, or after maxWait, then over budget.
func TestRequestPoolBudget(t *testing.T) {
	const mb = 1 << 20
	m := NewMetrics(nil)
	p := newRequestPool(3*mb, m)
	p.maxWait = time.Hour
	a := &requestBuffer{pool: p}
	buf, size := p.get(a, 2*mb, nil)
	if buf != nil || a.held != 2*mb || size != 2*mb {
		t.Fatalf("first get: buf %v, held %d, size %d", buf != nil, a.held, size)
	}
	b := &requestBuffer{pool: p}
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
	c := &requestBuffer{pool: p}
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
	d := &requestBuffer{pool: p}
	p.maxWait = time.Nanosecond
	p.get(d, 2*mb, nil)
	if p.overBudget != 2 || p.held != b.held+d.held {
		t.Fatalf("after maxWait: over budget %d, held %d", p.overBudget, p.held)
	}
	fit, over := testutil.ToFloat64(m.reqMemWaits[reqMemFit]), testutil.ToFloat64(m.reqMemWaits[reqMemOverBudget])
	if fit != 1 || over != 2 || testutil.ToFloat64(m.reqMemHeld) != float64(p.held) {
		t.Fatalf("metrics: waits fit %v, over budget %v, held %v; want 1, 2, %d", fit, over, testutil.ToFloat64(m.reqMemHeld), p.held)
	}
}

// TestRequestPoolDemotesStalledReader: a client that sends half of a large
// request and stops does not hold up the others: a waiter demotes its
// buffer's holder (its bytes stop counting) instead of waiting; when the
// stalled request completes after all, the budget is not given back twice.
func TestRequestPoolDemotesStalledReader(t *testing.T) {
	const mb = 1 << 20
	m := NewMetrics(nil)
	p := newRequestPool(3*mb, m)
	p.maxWait, p.stallAfter = time.Hour, time.Millisecond
	frame := requestFrame(2*mb, 1)
	cr, cw := io.Pipe()
	stalled := requestBuffer{pool: p}
	read := make(chan error, 1)
	go func() {
		_, err := stalled.read(newConnReader(cr, nil, nil), 100<<20, nil)
		read <- err
	}()
	if _, err := cw.Write(frame[:mb]); err != nil { // then nothing
		t.Fatal(err)
	}
	other := &requestBuffer{pool: p}
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
	stalled.release()
	p.put(other, nil)
	if p.held != 0 {
		t.Fatalf("held %d once both are given back", p.held)
	}
	if n, held := testutil.ToFloat64(m.reqMemStalled), testutil.ToFloat64(m.reqMemHeld); n != 1 || held != 0 {
		t.Fatalf("metrics: stalled %v, held %v; want 1, 0", n, held)
	}
}

// TestRequestPoolSizeWindow: buffers are made the size of the largest
// recent request, and one outsized request stops counting after
// sizeWindow others.
func TestRequestPoolSizeWindow(t *testing.T) {
	p := newRequestPool(256<<20, nil)
	rb := &requestBuffer{pool: p}
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
	for _, n := range []int{smallRequest + 1, 100 << 10, 1 << 20, 1<<20 + 1, 5_000_000, 100 << 20} {
		c := largeClass(n)
		if c < n || c > n+n/4+1 {
			t.Errorf("largeClass(%d) = %d", n, c)
		}
	}
}

// TestLargeProducesWithinBudget: franz-go producers whose requests each
// take most of the budget, or more, write every record once through the
// proxy, byte for byte; the budget is all given back once they are done.
// With holes (both legs plain TCP, on Linux) the records of their batches
// go socket to socket (holes.go); without, through pooled buffers.
func TestLargeProducesWithinBudget(t *testing.T) {
	for _, holes := range []bool{holesSupported, false} {
		t.Run(fmt.Sprintf("holes=%v", holes), func(t *testing.T) { testLargeProducesWithinBudget(t, holes) })
		if !holesSupported {
			break
		}
	}
}

func testLargeProducesWithinBudget(t *testing.T, holes bool) {
	const topic, producers, perProducer, size = "large", 3, 12, 300 << 10
	c := newCluster(t, kfake.SeedTopics(3, topic))
	p := startProxyWith(t, c, func(cfg *Config) { cfg.RequestMemory, cfg.ProduceSplice = 1<<20, &holes }, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	for i := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl, err := kgo.NewClient(kgo.SeedBrokers(p.addr()), kgo.DefaultProduceTopic(topic),
				kgo.ProducerLinger(20*time.Millisecond), kgo.ProducerBatchMaxBytes(1_000_000),
				kgo.ProducerBatchCompression(kgo.NoCompression()))
			if err != nil {
				errs <- err
				return
			}
			defer cl.Close()
			recs := make([]*kgo.Record, perProducer)
			for j := range recs {
				v := bytes.Repeat([]byte{byte(i)}, size)
				binary.BigEndian.PutUint32(v, uint32(j))
				recs[j] = &kgo.Record{Value: v}
			}
			errs <- cl.ProduceSync(ctx, recs...).FirstErr()
		}()
	}
	wg.Wait()
	for range producers {
		if err := <-errs; err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	seen := make(map[[2]uint32]bool)
	for polls := 0; len(seen) < producers*perProducer && polls < 1000; polls++ {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of %d: %v", len(seen), producers*perProducer, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			key := [2]uint32{uint32(r.Value[size-1]), binary.BigEndian.Uint32(r.Value)}
			if len(r.Value) != size || !bytes.Equal(r.Value[4:], bytes.Repeat(r.Value[size-1:], size-4)) || seen[key] {
				t.Fatalf("record %v: %d bytes, seen before %v", key, len(r.Value), seen[key])
			}
			seen[key] = true
		})
	}
	if len(seen) != producers*perProducer {
		t.Fatalf("consumed %d of %d", len(seen), producers*perProducer)
	}
	pool := p.requestPool()
	waitFor(t, 10*time.Second, "the budget to be given back", func() bool {
		pool.mu.Lock()
		defer pool.mu.Unlock()
		return pool.held == 0
	})
	spliced := testutil.ToFloat64(p.Metrics.produceSpliced)
	if holes {
		// Every record but the few bytes each read took along with a
		// batch header (the reader's buffer) went through a pipe.
		if total := float64(producers * perProducer * size); spliced < total/2 {
			t.Fatalf("%.0f of %.0f record bytes spliced", spliced, total)
		}
		waitFor(t, 10*time.Second, "the pipes to be given back", func() bool { return p.pipes.inUseNow() == 0 })
		return
	}
	if spliced != 0 {
		t.Fatalf("%.0f bytes spliced with a leg that cannot", spliced)
	}
	if pool.size < size {
		t.Fatalf("the buffers of the last requests are %d bytes: the records did not take the large path", pool.size)
	}
}
