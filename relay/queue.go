package relay

import "sync"

// Queue is a session's FIFO of requests awaiting their responses: the
// read loop pushes, the response loop pops, in request order. Push blocks
// while max entries are queued, which is the backpressure (max_inflight).
//
// It behaves as a channel of capacity max would, but its ring grows with
// what is queued instead of being made at max up front: a channel of 256
// pointers was 2 KiB of every connection, idle or not, and most
// connections never have more than a few requests in flight.
type Queue[T any] struct {
	mu     sync.Mutex
	ring   []T
	head   int
	n      int
	max    int
	closed bool
	// Tokens of one: a push that may have ended a pop's wait, a pop that
	// may have ended a push's wait. A stale token costs a waiter one more
	// look, never a missed wake-up.
	notEmpty, notFull chan struct{}
}

// queueStart is the ring's first size; an empty ring larger than
// queueKeep is dropped (a pipelining client, 5 Produce requests in
// flight, keeps its ring).
const (
	queueStart = 4
	queueKeep  = 16
)

// NewQueue returns an empty queue that holds at most max entries.
func NewQueue[T any](max int) *Queue[T] {
	return &Queue[T]{max: max, notEmpty: make(chan struct{}, 1), notFull: make(chan struct{}, 1)}
}

// Push queues p, waiting while the queue is full. It must not be called
// after Close.
func (q *Queue[T]) Push(p T) {
	q.mu.Lock()
	for q.n >= q.max {
		q.mu.Unlock()
		<-q.notFull
		q.mu.Lock()
	}
	if q.n == len(q.ring) {
		grown := make([]T, min(max(queueStart, 2*len(q.ring)), q.max))
		for i := range q.n {
			grown[i] = q.ring[(q.head+i)%len(q.ring)]
		}
		q.ring, q.head = grown, 0
	}
	q.ring[(q.head+q.n)%len(q.ring)] = p
	q.n++
	q.mu.Unlock()
	select {
	case q.notEmpty <- struct{}{}:
	default:
	}
}

// Pop takes the oldest entry, waiting while the queue is empty; ok is
// false once the queue is closed and empty.
func (q *Queue[T]) Pop() (p T, ok bool) {
	q.mu.Lock()
	for q.n == 0 {
		if q.closed {
			q.mu.Unlock()
			return p, false
		}
		q.mu.Unlock()
		<-q.notEmpty
		q.mu.Lock()
	}
	p = q.ring[q.head]
	var zero T
	q.ring[q.head] = zero
	q.head = (q.head + 1) % len(q.ring)
	q.n--
	if q.n == 0 && len(q.ring) > queueKeep {
		q.ring, q.head = nil, 0 // a rare burst's ring is not kept by an idle connection
	}
	q.mu.Unlock()
	select {
	case q.notFull <- struct{}{}:
	default:
	}
	return p, true
}

// Len is how many entries are queued.
func (q *Queue[T]) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}

// Close ends the queue: Pop drains what is queued, then reports !ok.
func (q *Queue[T]) Close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	select {
	case q.notEmpty <- struct{}{}:
	default:
	}
}
