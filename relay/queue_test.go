package relay

import (
	"testing"
	"time"
)

// entry stands for a session's pending request.
type entry struct{ corrID int32 }

// TestQueue: entries leave in the order they came, push waits while
// max are queued (the backpressure of max_inflight) and goes on when one
// leaves, and close lets pop drain what is queued before it reports the end.
func TestQueue(t *testing.T) {
	q := NewQueue[*entry](3)
	ps := make([]*entry, 5)
	for i := range ps {
		ps[i] = &entry{corrID: int32(i)}
	}
	for _, p := range ps[:3] {
		q.Push(p)
	}
	pushed := make(chan struct{})
	go func() {
		q.Push(ps[3])
		close(pushed)
	}()
	select {
	case <-pushed:
		t.Fatal("push did not wait with the queue full")
	case <-time.After(50 * time.Millisecond):
	}
	if p, ok := q.Pop(); !ok || p != ps[0] {
		t.Fatalf("pop = %v, %v; want the first", p, ok)
	}
	<-pushed
	if p, ok := q.Pop(); !ok || p != ps[1] {
		t.Fatalf("pop = %v, %v; want the second", p, ok)
	}
	q.Push(ps[4]) // wraps the ring
	if q.Len() != 3 {
		t.Fatalf("len %d, want 3", q.Len())
	}
	q.Close()
	for _, want := range ps[2:] {
		if p, ok := q.Pop(); !ok || p != want {
			t.Fatalf("pop = %v, %v; want corr %d", p, ok, want.corrID)
		}
	}
	if _, ok := q.Pop(); ok {
		t.Fatal("pop after close and drain reported an entry")
	}
}

// TestQueueNoAllocs: a connection pipelining a few requests pushes
// and pops without allocating once its ring has grown.
func TestQueueNoAllocs(t *testing.T) {
	q := NewQueue[*entry](256)
	p := &entry{}
	allocs := testing.AllocsPerRun(1000, func() {
		for range 5 {
			q.Push(p)
		}
		for range 5 {
			q.Pop()
		}
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per burst of 5, want 0", allocs)
	}
}
