// Package clock is the proxy's one source of time. Every reading of the
// clock, timer and ticker of the proxy's packages goes through a [Clock]:
// the [Real] one in production, a [Manual] one in tests that drive time
// instead of sleeping. A test (proxy's TestClockInjected) keeps the time
// package's clock functions out of every other package of the proxy.
//
// Which clock a caller takes says what the time is for. Decisions and what
// is counted about them (a request's read time, waits for an outcome,
// windows, expiries, the replicas' deadlines, latencies) take the clock
// the proxy was given (proxy.Server.Clock). Bounds on I/O take [Real]:
// socket deadlines are the kernel's, which runs on the real clock, and a
// wait for memory or for a peer's close_notify bounds a socket's progress,
// not a decision.
package clock

import (
	"sync"
	"time"
)

// Clock reads the time and makes timers on it.
type Clock interface {
	Now() time.Time
	// NewTimer, NewTicker and AfterFunc are the time package's, on this
	// clock.
	NewTimer(d time.Duration) *Timer
	NewTicker(d time.Duration) *Ticker
	AfterFunc(d time.Duration, f func()) *Timer
}

// Timer is a time.Timer on a Clock: C receives the clock's time once the
// duration has passed on it (nil for AfterFunc's).
type Timer struct {
	C     <-chan time.Time
	stop  func() bool
	reset func(time.Duration) bool
}

// Stop is time.Timer.Stop.
func (t *Timer) Stop() bool { return t.stop() }

// Reset is time.Timer.Reset.
func (t *Timer) Reset(d time.Duration) bool { return t.reset(d) }

// Ticker is a time.Ticker on a Clock.
type Ticker struct {
	C    <-chan time.Time
	stop func()
}

// Stop is time.Ticker.Stop.
func (t *Ticker) Stop() { t.stop() }

// Real is the real clock: the time package's.
var Real Clock = realClock{}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) NewTimer(d time.Duration) *Timer {
	t := time.NewTimer(d)
	return &Timer{C: t.C, stop: t.Stop, reset: t.Reset}
}

func (realClock) NewTicker(d time.Duration) *Ticker {
	t := time.NewTicker(d)
	return &Ticker{C: t.C, stop: t.Stop}
}

func (realClock) AfterFunc(d time.Duration, f func()) *Timer {
	t := time.AfterFunc(d, f)
	return &Timer{stop: t.Stop, reset: t.Reset}
}

// Since is the time elapsed on c since t.
func Since(c Clock, t time.Time) time.Duration { return c.Now().Sub(t) }

// Until is the time on c until t.
func Until(c Clock, t time.Time) time.Duration { return t.Sub(c.Now()) }

// Manual is a clock that moves only when told: Advance and Set fire the
// timers and tickers whose time has come, in the order of their times.
// For tests.
type Manual struct {
	mu      sync.Mutex
	now     time.Time
	waiters []*waiter
	changed chan struct{} // closed and replaced when a timer is made or stopped
}

type waiter struct {
	at     time.Time
	period time.Duration // a ticker's; 0 for a timer
	c      chan time.Time
	f      func()
	live   bool
}

// NewManual returns a Manual clock reading start.
func NewManual(start time.Time) *Manual {
	return &Manual{now: start, changed: make(chan struct{})}
}

// Now reads the clock.
func (m *Manual) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now
}

// Advance moves the clock forward by d.
func (m *Manual) Advance(d time.Duration) { m.Set(m.Now().Add(d)) }

// Set moves the clock to t (never back) and fires what is due by then.
func (m *Manual) Set(t time.Time) {
	for {
		m.mu.Lock()
		if t.Before(m.now) {
			t = m.now
		}
		var next *waiter
		for _, w := range m.waiters {
			if w.live && !w.at.After(t) && (next == nil || w.at.Before(next.at)) {
				next = w
			}
		}
		if next == nil {
			m.now = t
			m.mu.Unlock()
			return
		}
		m.now = next.at
		at := next.at
		if next.period > 0 {
			next.at = next.at.Add(next.period)
		} else {
			next.live = false
			m.prune()
		}
		c, f := next.c, next.f
		m.mu.Unlock()
		if f != nil {
			f()
			continue
		}
		select { // as the time package's: a tick no one took is dropped
		case c <- at:
		default:
		}
	}
}

// Waiters reports how many timers and tickers wait on the clock: a test
// advances it once the code under test has armed what it waits on.
func (m *Manual) Waiters() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.waiters)
}

// Changed returns a channel closed when a timer or ticker is next made or
// stopped.
func (m *Manual) Changed() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.changed
}

func (m *Manual) add(w *waiter) {
	m.mu.Lock()
	defer m.mu.Unlock()
	w.live = true
	m.waiters = append(m.waiters, w)
	m.broadcast()
}

// prune drops the waiters no longer live; with mu held.
func (m *Manual) prune() {
	live := m.waiters[:0]
	for _, w := range m.waiters {
		if w.live {
			live = append(live, w)
		}
	}
	clear(m.waiters[len(live):])
	m.waiters = live
}

func (m *Manual) broadcast() {
	close(m.changed)
	m.changed = make(chan struct{})
}

// stop stops w and reports whether it was waiting.
func (m *Manual) stop(w *waiter) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	was := w.live
	w.live = false
	m.prune()
	m.broadcast()
	return was
}

// reset waits w for d from now, and reports whether it was waiting.
func (m *Manual) reset(w *waiter, d time.Duration) bool {
	m.mu.Lock()
	was := w.live
	w.live = false
	m.prune()
	w.at = m.now.Add(d)
	m.mu.Unlock()
	m.add(w)
	return was
}

// NewTimer is time.NewTimer on m.
func (m *Manual) NewTimer(d time.Duration) *Timer {
	c := make(chan time.Time, 1)
	w := &waiter{at: m.Now().Add(d), c: c}
	m.add(w)
	m.Set(m.Now()) // a timer of 0 or less fires at once
	return &Timer{C: c, stop: func() bool { return m.stop(w) }, reset: func(d time.Duration) bool {
		was := m.reset(w, d)
		m.Set(m.Now())
		return was
	}}
}

// NewTicker is time.NewTicker on m.
func (m *Manual) NewTicker(d time.Duration) *Ticker {
	if d <= 0 {
		panic("clock: non-positive interval for NewTicker")
	}
	c := make(chan time.Time, 1)
	w := &waiter{at: m.Now().Add(d), period: d, c: c}
	m.add(w)
	return &Ticker{C: c, stop: func() { m.stop(w) }}
}

// AfterFunc is time.AfterFunc on m: f runs on the goroutine that moves the
// clock.
func (m *Manual) AfterFunc(d time.Duration, f func()) *Timer {
	w := &waiter{at: m.Now().Add(d), f: f}
	m.add(w)
	m.Set(m.Now())
	return &Timer{stop: func() bool { return m.stop(w) }, reset: func(d time.Duration) bool {
		was := m.reset(w, d)
		m.Set(m.Now())
		return was
	}}
}
