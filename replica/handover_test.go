package replica

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/dedupproxy/dedupproxy/clock"
	"github.com/dedupproxy/dedupproxy/config"
	"github.com/dedupproxy/dedupproxy/owner"
)

// heldConn is a connection whose request the gate holds.
type heldConn struct {
	sent         int
	closed, gone chan struct{}
}

func (h *heldConn) Sent()                   { h.sent++ }
func (h *heldConn) Unsent()                 { h.sent-- }
func (h *heldConn) Closed() <-chan struct{} { return h.closed }
func (h *heldConn) Gone() <-chan struct{}   { return h.gone }

// TestHoldBoundedOnTheClock: a Produce request for a node this replica is
// still taking back waits at most its bound on the replica's clock, then
// is redirected to no replica in particular (its client retries after a
// metadata refresh); it is never counted as forwarded, and the time it was
// held is the clock's. The test moves the clock: no real time passes.
func TestHoldBoundedOnTheClock(t *testing.T) {
	t.Parallel()
	start := time.Unix(1_000_000, 0)
	clk := clock.NewManual(start)
	stop := make(chan struct{})
	defer close(stop)
	rs := New(Options{
		Layout: &config.Layout{Self: 0, Count: 2, Owners: map[int32]int{}},
		Log:    slog.New(slog.DiscardHandler), Clock: clk, Ctx: context.Background(), Stop: stop,
		DrainTimeout: time.Minute, Spawn: func(func()) bool { return false },
	})
	n := rs.Node(0) // owned here; the peer has not been heard from: taking it back
	if st := n.State(); st != owner.TakingBack {
		t.Fatalf("node 0 is %v, want taking_back", st)
	}
	c := &heldConn{closed: make(chan struct{}), gone: make(chan struct{})}
	const bound = time.Hour
	type verdict struct {
		v      Verdict
		target int
	}
	done := make(chan verdict, 1)
	go func() {
		v, target := rs.Hold(n, c, bound, start)
		done <- verdict{v, target}
	}()
	for { // until Hold has armed its timer
		changed := clk.Changed()
		if clk.Waiters() > 0 {
			break
		}
		select {
		case <-changed:
		case <-time.After(10 * time.Second):
			t.Fatal("Hold armed no timer on the replica's clock")
		}
	}
	clk.Advance(bound - time.Millisecond)
	select {
	case got := <-done:
		t.Fatalf("answered %+v before its bound", got)
	default:
	}
	clk.Advance(time.Millisecond)
	var got verdict
	select {
	case got = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("not answered once its bound passed on the replica's clock")
	}
	if got.v != Redirect || got.target != -1 || c.sent != 0 {
		t.Fatalf("past its bound: %+v, counted as forwarded %d; want a redirect to -1, never forwarded", got, c.sent)
	}
	var m dto.Metric
	if err := rs.m.Held.(prometheus.Histogram).Write(&m); err != nil {
		t.Fatal(err)
	}
	if h := m.GetHistogram(); h.GetSampleCount() != 1 || h.GetSampleSum() != bound.Seconds() {
		t.Fatalf("held_seconds: %d samples summing %vs, want 1 of %v", h.GetSampleCount(), h.GetSampleSum(), bound.Seconds())
	}
}
