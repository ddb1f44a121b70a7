package sim

import (
	"container/heap"
	"math/rand/v2"
	"time"

	"github.com/dedupproxy/dedupproxy/sim/check"
	"github.com/dedupproxy/dedupproxy/sim/client"
	"github.com/dedupproxy/dedupproxy/sim/kafka"
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
	broker   kafka.Broker
	nodes    int
	replicas []*replica
	owner    []int // node → replica serving it
	clients  []*client.Client

	// led: every record the clients made and every request they sent.
	led    client.Ledger
	conns  []*client.Conn
	script *recorder
	faults []string // what the scenario injected, for the report
	// brokerFaults: windows of broker trouble (scenario.go).
	brokerFaults []brokerFault
	tailFail     float64 // the chance a tail read fails
	// restarts and handovers: when each happened.
	restarts, handovers  []time.Duration
	idem                 check.Idem
	rewarms              int
	tailFails, tailReads []check.TailRead
	// endAt: no new records, faults or reconnects after it; the run then
	// drains until every client is done.
	endAt time.Duration
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

// At schedules fn At virtual time t (not before now).
func (w *world) At(t time.Duration, fn func()) {
	if t < w.now {
		t = w.now
	}
	w.seq++
	heap.Push(&w.events, event{at: t, seq: w.seq, fn: fn})
}

// After schedules fn d from now.
func (w *world) After(d time.Duration, fn func()) { w.At(w.now+d, fn) }

// Wall is the virtual clock as the core takes it.
func (w *world) Wall() time.Time { return base.Add(w.now) }

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

func (w *world) Between(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(w.rng.Int64N(int64(hi-lo)))
}

func (w *world) Intn(n int) int { return w.rng.IntN(n) }

// Latency is one hop on the network.
func (w *world) Latency() time.Duration { return w.Between(100*time.Microsecond, 2*time.Millisecond) }

// The world as the client models see it (client.Env).

// Now is the virtual clock.
func (w *world) Now() time.Duration { return w.now }

// Nodes is the number of broker nodes.
func (w *world) Nodes() int { return w.nodes }

// Leaders says which node leads each partition, as metadata tells it.
func (w *world) Leaders() [kafka.MaxPartitions]int { return w.broker.Leader }

// Serving is the replica serving node.
func (w *world) Serving(node int) int { return w.owner[node] }

// Dial opens a connection of c to node at the replica serving it, nil
// while that replica is down.
func (w *world) Dial(c *client.Client, node int) *client.Conn {
	r := w.replicas[w.owner[node]]
	if r.down {
		return nil
	}
	cn := client.NewConn(c, len(w.conns), node, r.id)
	w.conns = append(w.conns, cn)
	r.newSession(cn)
	return cn
}

// newClient adds a client process to the run.
func (w *world) newClient(name string, info client.Info, lib client.Library, acks int16, workload string) *client.Client {
	c := client.New(w, &w.led, len(w.clients), name, info, lib, acks, workload)
	w.clients = append(w.clients, c)
	return c
}

// sessionOf is the session at the proxy's end of cn.
func sessionOf(cn *client.Conn) *session {
	s, _ := cn.Proxy.(*session)
	return s
}
