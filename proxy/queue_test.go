package proxy

import (
	"testing"
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
