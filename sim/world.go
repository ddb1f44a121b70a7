package sim

import (
	"container/heap"
	"math/rand/v2"
	"time"
)

// base is the virtual clock's zero: the decide scripts' base time, so
// that a script's at= and ts= read the same as the run's.
var base = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// world is one run: a seeded random source, a virtual clock and the
// events scheduled on it, the broker, the proxy's replicas, the clients,
// and everything the checks need afterwards. One goroutine runs it; the
// same seed gives the same run.
type world struct {
	seed     uint64
	rng      *rand.Rand
	now      time.Duration
	events   eventHeap
	seq      uint64
	steps    int
	maxSteps int

	cfg      coreConfig
	broker   Broker
	nodes    int
	replicas []*replica
	owner    []int // node → replica serving it
	clients  []*Client

	recs     []Record // by lid
	reqs     []*Request
	conns    []*Conn
	script   *recorder
	faults   []string // what the scenario injected, for the report
	tailFail float64  // the chance a tail read fails
	// restarts and handovers: when each happened.
	restarts, handovers  []time.Duration
	idemFailures         []string
	idemSent             map[idemKey][]*Request
	idemResent           int            // idempotent resends decided (invariant 6)
	idemForwarded        map[string]int // of them, forwarded, per shape
	rewarms              int
	tailFails, tailReads []tailFail
	// endAt: no new records, faults or reconnects after it; the run then
	// drains until every client is done.
	endAt time.Duration
}

// Record is what the simulation knows of one logical record.
type Record struct {
	Client   *Client
	Name     string
	fresh    time.Duration // when the client made it
	Acked    bool          // the client was told it is written
	GaveUp   string        // why the client gave up on it, "" if it did not
	Lost     string        // acks=0: lost where the client cannot know (the network, the broker)
	Sends    []int         // requests that carried it
	Written  []int         // requests whose batch put it in the log
	Upstream bool          // the proxy forwarded it at least once
	// keyless: kafkajs partitions it afresh on each attempt.
}

type tailFail struct {
	core string
	p    int32
	at   time.Duration
}

// lostAcks0 marks the records of an acks=0 request lost on the way: its
// client cannot know, and no one claims they are written.
func (w *world) lostAcks0(req *Request, why string) {
	if req.Acks != 0 {
		return
	}
	for _, b := range req.Parts {
		for _, r := range b.Recs {
			if w.recs[r.Lid].Lost == "" {
				w.recs[r.Lid].Lost = why
			}
		}
	}
}

type event struct {
	at  time.Duration
	seq uint64
	fn  func()
}

type eventHeap []event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// at schedules fn at virtual time t (not before now).
func (w *world) at(t time.Duration, fn func()) {
	if t < w.now {
		t = w.now
	}
	w.seq++
	heap.Push(&w.events, event{at: t, seq: w.seq, fn: fn})
}

// after schedules fn d from now.
func (w *world) after(d time.Duration, fn func()) { w.at(w.now+d, fn) }

// wall is the virtual clock as the core takes it.
func (w *world) wall() time.Time { return base.Add(w.now) }

// run processes events until none is left or the step bound is reached
// (reported as false: a run that does not end is a finding too).
func (w *world) run() bool {
	for w.events.Len() > 0 {
		if w.steps++; w.steps > w.maxSteps {
			return false
		}
		e := heap.Pop(&w.events).(event)
		w.now = e.at
		e.fn()
	}
	return true
}

// Random helpers.

func (w *world) chance(p float64) bool { return w.rng.Float64() < p }

func (w *world) between(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(w.rng.Int64N(int64(hi-lo)))
}

func (w *world) intn(n int) int { return w.rng.IntN(n) }

// latency is one hop on the network.
func (w *world) latency() time.Duration { return w.between(100*time.Microsecond, 2*time.Millisecond) }

func (w *world) newLid(c *Client, name string) Lid {
	w.recs = append(w.recs, Record{Client: c, Name: name, fresh: w.now})
	return Lid(len(w.recs) - 1)
}
