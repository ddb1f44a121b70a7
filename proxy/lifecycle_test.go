package proxy

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// silentBroker accepts connections and reads whatever arrives, but never
// answers: a broker stuck mid-request.
type silentBroker struct {
	ln    net.Listener
	read  atomic.Int64 // bytes received, all connections
	mu    sync.Mutex
	conns []net.Conn
	done  chan struct{}
}

func newSilentBroker(t testing.TB) *silentBroker {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &silentBroker{ln: ln, done: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.mu.Lock()
			b.conns = append(b.conns, c)
			b.mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := make([]byte, 32<<10)
				for {
					n, err := c.Read(buf)
					b.read.Add(int64(n))
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		b.mu.Lock()
		for _, c := range b.conns {
			c.Close()
		}
		b.mu.Unlock()
		wg.Wait()
	})
	return b
}

func (b *silentBroker) addr() string { return b.ln.Addr().String() }

// startSilentProxy starts a proxy whose only upstream never answers, after
// mod (if not nil) adjusts it. Start's probe gives up after 200 ms.
func startSilentProxy(t *testing.T, b *silentBroker, mod func(*Server)) (*Server, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	s := &Server{
		Config:  Config{Upstream: []string{b.addr()}, Listen: "127.0.0.1:0", Admin: "off"},
		Logger:  slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Metrics: NewMetrics(nil),
	}
	if mod != nil {
		mod(s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		s.Shutdown(ctx)
		if n := testutil.ToFloat64(s.Metrics.Panics); n != 0 {
			t.Errorf("%v panics recovered; logs:\n%s", n, logs.String())
		}
		if t.Failed() {
			t.Logf("proxy logs:\n%s", logs.String())
		}
	})
	return s, logs
}

// TestShutdownContextIsFinal: draining cannot finish — a Produce is in
// flight to a broker that never answers, or a new connection is dialing a
// broker that does not answer the SYN, or dialing with a Dial that ignores
// its context. Shutdown with a 300 ms context returns promptly (well within
// 2 s) and the client's connection is closed: the context bounds Shutdown,
// as in net/http. A dial that honours its context is abandoned at once (a
// connection that sent nothing has nothing to drain), so that Shutdown
// returns nil; the others return context.DeadlineExceeded.
func TestShutdownContextIsFinal(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		dial func(release <-chan struct{}) func(ctx context.Context, network, addr string) (net.Conn, error)
		want error
	}{
		{"produce in flight to a silent broker", nil, context.DeadlineExceeded},
		{"dial to a blackholed broker", func(<-chan struct{}) func(ctx context.Context, network, addr string) (net.Conn, error) {
			return func(ctx context.Context, _, _ string) (net.Conn, error) {
				<-ctx.Done() // a SYN nobody answers: only the context ends it
				return nil, ctx.Err()
			}
		}, nil},
		{"dial ignoring its context", func(release <-chan struct{}) func(ctx context.Context, network, addr string) (net.Conn, error) {
			return func(context.Context, string, string) (net.Conn, error) {
				<-release // stuck until the test ends
				return nil, errors.New("released")
			}
		}, context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newSilentBroker(t)
			// The stuck dial is armed once the proxy has started, so
			// that Start's probe dials normally.
			var armed, dialing atomic.Bool
			release := make(chan struct{})
			s, _ := startSilentProxy(t, b, func(s *Server) {
				if tc.dial == nil {
					return
				}
				stuck, d := tc.dial(release), &net.Dialer{}
				s.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
					if !armed.Load() {
						return d.DialContext(ctx, network, addr)
					}
					dialing.Store(true)
					return stuck(ctx, network, addr)
				}
			})
			t.Cleanup(func() { close(release) }) // before the proxy's cleanup
			var raw *rawConn
			if tc.dial != nil {
				armed.Store(true)
				raw = dialRaw(t, s.Addr().String())
				waitFor(t, 10*time.Second, "the proxy to dial the broker", dialing.Load)
			} else {
				raw = dialRaw(t, s.Addr().String())
				before := b.read.Load() // the probe's Metadata request
				// An idempotent batch, so the request goes through the
				// dedup planner too, then a plain one behind it.
				raw.send(produceRequest("stuck", -1, recordBatch(t, 1, 0, 0, 1, "x")))
				raw.send(produceRequest("stuck", -1, oneRecordBatch(t)))
				waitFor(t, 10*time.Second, "the produce to reach the broker", func() bool { return b.read.Load() > before })
			}

			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			start := time.Now()
			done := make(chan error, 1)
			go func() { done <- s.Shutdown(ctx) }()
			select {
			case err := <-done:
				if !errors.Is(err, tc.want) {
					t.Fatalf("Shutdown = %v, want %v", err, tc.want)
				}
				t.Logf("Shutdown returned after %s", time.Since(start).Round(time.Millisecond))
			case <-time.After(2 * time.Second):
				t.Fatal("Shutdown did not return within 2s of a 300ms context")
			}
			raw.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := readFrame(raw.conn); !errors.Is(err, io.EOF) && !isReset(err) {
				t.Fatalf("after Shutdown the client connection should be closed; read gave %v", err)
			}
		})
	}
}

// TestShutdownConcurrent: Shutdowns racing each other (and a second one
// after the first returned) all return, none panics closing what another
// closed, and the listener is gone.
func TestShutdownConcurrent(t *testing.T) {
	t.Parallel()
	b := newSilentBroker(t)
	s, _ := startSilentProxy(t, b, nil)
	addr := s.Addr().String()
	raw := dialRaw(t, addr)
	raw.send(produceRequest("stuck", -1, oneRecordBatch(t)))

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	const n = 8
	errs := make(chan error, n)
	for range n {
		go func() { errs <- s.Shutdown(ctx) }()
	}
	deadline := time.After(5 * time.Second)
	for range n {
		select {
		case err := <-errs:
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Shutdown = %v", err)
			}
		case <-deadline:
			t.Fatal("concurrent Shutdowns did not all return")
		}
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown after Shutdown = %v, want nil", err)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Error("the bootstrap listener still accepts after Shutdown")
	}
}

// TestStartAfterShutdown: like net/http's Serve, Start after Shutdown
// returns ErrServerClosed, whether or not the server ever started.
func TestStartAfterShutdown(t *testing.T) {
	t.Parallel()
	b := newSilentBroker(t)
	s, _ := startSilentProxy(t, b, nil)
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Start after Shutdown = %v, want ErrServerClosed", err)
	}

	fresh := &Server{Config: Config{Upstream: []string{b.addr()}, Listen: "127.0.0.1:0", Admin: "off"}, Logger: slog.New(slog.DiscardHandler)}
	if err := fresh.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown of a server never started = %v", err)
	}
	if err := fresh.Start(context.Background()); !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Start after Shutdown of a never-started server = %v, want ErrServerClosed", err)
	}
	if fresh.Addr() != nil {
		t.Fatalf("a closed server bound %v", fresh.Addr())
	}
}

// TestNodeListenerAfterShutdownIsClosed: a broker learned after Shutdown
// took the listener list (a response still in flight names a new node)
// gets no listener that would outlive Shutdown, and is left out of the
// response rather than advertised elsewhere.
func TestNodeListenerAfterShutdownIsClosed(t *testing.T) {
	t.Parallel()
	b := newSilentBroker(t)
	var opened []net.Listener
	var mu sync.Mutex
	s, _ := startSilentProxy(t, b, func(s *Server) {
		s.Listen = func(network, addr string) (net.Listener, error) {
			ln, err := net.Listen(network, addr)
			if err == nil {
				mu.Lock()
				opened = append(opened, ln)
				mu.Unlock()
			}
			return ln, err
		}
	})
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if h, p := s.nodes.MapBroker(7, "10.0.0.7", 9092); p >= 0 {
		t.Fatalf("node 7, learned after Shutdown, advertised at %s:%d; want it left out", h, p)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, ln := range opened {
		if c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
			c.Close()
			t.Errorf("listener %s opened after Shutdown still accepts", ln.Addr())
		}
	}
}
