package clock

import (
	"testing"
	"time"
)

// TestManual: timers fire once their time has come on the clock, in the
// order of their times, tickers every period, stopped ones never; a timer
// of no duration fires at once; AfterFunc runs its function.
func TestManual(t *testing.T) {
	t.Parallel()
	start := time.Unix(1000, 0)
	m := NewManual(start)
	late, early := m.NewTimer(2*time.Second), m.NewTimer(time.Second)
	stopped := m.NewTimer(time.Second)
	tick := m.NewTicker(500 * time.Millisecond)
	ran := 0
	m.AfterFunc(1500*time.Millisecond, func() { ran++ })
	if !stopped.Stop() || stopped.Stop() {
		t.Fatal("Stop reports whether the timer waited")
	}
	now := m.NewTimer(0)
	select {
	case at := <-now.C:
		if !at.Equal(start) {
			t.Fatalf("a timer of 0 fired at %v", at)
		}
	default:
		t.Fatal("a timer of 0 did not fire at once")
	}
	m.Advance(999 * time.Millisecond)
	select {
	case <-early.C:
		t.Fatal("fired before its time")
	default:
	}
	if at := <-tick.C; !at.Equal(start.Add(500 * time.Millisecond)) {
		t.Fatalf("tick at %v", at)
	}
	m.Advance(time.Millisecond)
	if at := <-early.C; !at.Equal(start.Add(time.Second)) {
		t.Fatalf("the 1s timer fired at %v", at)
	}
	m.Advance(time.Second)
	if at := <-late.C; !at.Equal(start.Add(2 * time.Second)) {
		t.Fatalf("the 2s timer fired at %v", at)
	}
	if ran != 1 {
		t.Fatalf("AfterFunc ran %d times", ran)
	}
	select {
	case <-stopped.C:
		t.Fatal("a stopped timer fired")
	default:
	}
	// The tick at 1s waits in the channel; those after it, not taken,
	// were dropped, as the time package's are.
	if at := <-tick.C; !at.Equal(start.Add(time.Second)) {
		t.Fatalf("tick at %v", at)
	}
	select {
	case at := <-tick.C:
		t.Fatalf("a dropped tick at %v", at)
	default:
	}
	tick.Stop()
	if n := m.Waiters(); n != 0 {
		t.Fatalf("%d waiters left", n)
	}
	early.Reset(time.Second)
	m.Advance(time.Second)
	if at := <-early.C; !at.Equal(start.Add(3 * time.Second)) {
		t.Fatalf("reset timer fired at %v", at)
	}
}
