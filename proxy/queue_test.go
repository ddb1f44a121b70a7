package proxy

import (
	"bytes"
	"io"
	"math/rand/v2"
	"testing"
	"testing/iotest"
	"time"
)

// TestPendingQueue: entries leave in the order they came, push waits while
// max are queued (the backpressure of max_inflight) and goes on when one
// leaves, and close lets pop drain what is queued before it reports the end.
func TestPendingQueue(t *testing.T) {
	q := newPendingQueue(3)
	ps := make([]*pending, 5)
	for i := range ps {
		ps[i] = &pending{corrID: int32(i)}
	}
	for _, p := range ps[:3] {
		q.push(p)
	}
	pushed := make(chan struct{})
	go func() {
		q.push(ps[3])
		close(pushed)
	}()
	select {
	case <-pushed:
		t.Fatal("push did not wait with the queue full")
	case <-time.After(50 * time.Millisecond):
	}
	if p, ok := q.pop(); !ok || p != ps[0] {
		t.Fatalf("pop = %v, %v; want the first", p, ok)
	}
	<-pushed
	if p, ok := q.pop(); !ok || p != ps[1] {
		t.Fatalf("pop = %v, %v; want the second", p, ok)
	}
	q.push(ps[4]) // wraps the ring
	if q.len() != 3 {
		t.Fatalf("len %d, want 3", q.len())
	}
	q.close()
	for _, want := range ps[2:] {
		if p, ok := q.pop(); !ok || p != want {
			t.Fatalf("pop = %v, %v; want corr %d", p, ok, want.corrID)
		}
	}
	if _, ok := q.pop(); ok {
		t.Fatal("pop after close and drain reported an entry")
	}
}

// TestPendingQueueNoAllocs: a connection pipelining a few requests pushes
// and pops without allocating once its ring has grown.
func TestPendingQueueNoAllocs(t *testing.T) {
	q := newPendingQueue(256)
	p := &pending{}
	allocs := testing.AllocsPerRun(1000, func() {
		for range 5 {
			q.push(p)
		}
		for range 5 {
			q.pop()
		}
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per burst of 5, want 0", allocs)
	}
}

// TestConnReaderMatchesStream: whatever the mix of Read, Peek and Discard
// and however the source splits its bytes, a connReader returns the
// stream's bytes in order, and holds no buffer once it has handed out all
// it read.
func TestConnReaderMatchesStream(t *testing.T) {
	data := make([]byte, 300<<10)
	for i := range data {
		data[i] = byte(i * 7)
	}
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 1))
		var src io.Reader = bytes.NewReader(data)
		if seed%2 == 1 {
			src = iotest.HalfReader(src)
		}
		cr := newConnReader(src, nil, nil)
		pos := 0
		for pos < len(data) {
			n := 1 + rng.IntN(40<<10)
			switch rng.IntN(3) {
			case 0:
				buf := make([]byte, n)
				k, err := io.ReadFull(cr, buf[:min(n, len(data)-pos)])
				if err != nil || !bytes.Equal(buf[:k], data[pos:pos+k]) {
					t.Fatalf("seed %d: read at %d: %v", seed, pos, err)
				}
				pos += k
			case 1:
				n = min(n, readBufferSize, len(data)-pos)
				b, err := cr.Peek(n)
				if err != nil || !bytes.Equal(b, data[pos:pos+n]) {
					t.Fatalf("seed %d: peek %d at %d: %v", seed, n, pos, err)
				}
			case 2:
				n = min(n, len(data)-pos)
				if k, err := cr.Discard(n); err != nil || k != n {
					t.Fatalf("seed %d: discard %d at %d: %d, %v", seed, n, pos, k, err)
				}
				pos += n
			}
			if cr.Buffered() == 0 && cr.buf != nil {
				t.Fatalf("seed %d: an empty reader holds its buffer", seed)
			}
		}
		if _, err := cr.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("seed %d: read at the end: %v, want EOF", seed, err)
		}
	}
}
