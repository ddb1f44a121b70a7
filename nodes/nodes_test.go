package nodes

import (
	"errors"
	"log/slog"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/dedupproxy/dedupproxy/config"
	"github.com/dedupproxy/dedupproxy/metrics"
	"github.com/dedupproxy/dedupproxy/protocol/rewrite"
	"github.com/dedupproxy/dedupproxy/replica"
)

// fixture is a registry whose listeners bind on 127.0.0.1 unless taken is
// set, on a clock the test moves.
type fixture struct {
	r        Registry
	now      time.Time
	taken    bool // the next binds fail: address in use
	closing  bool
	attempts int
	served   []net.Listener
	m        *metrics.Metrics
}

func newFixture(t *testing.T, admin net.Addr) *fixture {
	f := &fixture{now: time.Unix(1_700_000_000, 0), m: metrics.New(nil, metrics.Build{})}
	cfg := &config.Config{Listen: "127.0.0.1:0"}
	f.r.Init(Options{
		Config: cfg, Log: slog.New(slog.DiscardHandler), Now: func() time.Time { return f.now }, Metrics: f.m,
		Listen: func(network, addr string) (net.Listener, error) {
			f.attempts++
			if f.taken {
				return nil, &net.OpError{Op: "listen", Net: network, Err: syscall.EADDRINUSE}
			}
			return net.Listen(network, addr)
		},
		Serve:     func(ln net.Listener, _ int32) bool { f.served = append(f.served, ln); return true },
		Closing:   func() bool { return f.closing },
		AdminAddr: admin,
		Replicas:  func() *replica.Set { return nil },
	})
	t.Cleanup(func() {
		for _, ln := range f.served {
			ln.Close()
		}
	})
	return f
}

// TestBindRetry: a node whose listener cannot bind is left out of
// responses and listed as unbound; the bind is tried again only after
// BindRetryInterval, whatever the number of responses naming the node, and
// once it binds the node is advertised at its listener.
func TestBindRetry(t *testing.T) {
	f := newFixture(t, nil)
	f.taken = true
	for range 50 {
		if _, port := f.r.MapBroker(3, "10.0.0.3", 9092); port != rewrite.OmitBroker {
			t.Fatalf("node 3 advertised at port %d without a listener", port)
		}
	}
	if f.attempts != 1 {
		t.Fatalf("%d bind attempts for 50 responses, want 1", f.attempts)
	}
	if u := f.r.Unbound(); len(u) != 1 {
		t.Fatalf("unbound = %q, want node 3's error", u)
	}
	if n := testutil.ToFloat64(f.m.ListenerErrors.WithLabelValues(metrics.ListenerBind)); n != 1 {
		t.Fatalf("listener_errors_total{reason=bind} = %v, want 1", n)
	}
	f.taken = false
	f.now = f.now.Add(BindRetryInterval - time.Second)
	f.r.MapBroker(3, "10.0.0.3", 9092)
	if f.attempts != 1 {
		t.Fatalf("bind tried again before the retry interval (%d attempts)", f.attempts)
	}
	f.now = f.now.Add(time.Second)
	host, port := f.r.MapBroker(3, "10.0.0.3", 9092)
	if port <= 0 {
		t.Fatalf("node 3 left out after its bind succeeded (port %d)", port)
	}
	bound, ok := f.r.ListenAddr(3)
	if want := net.JoinHostPort(host, strconv.Itoa(int(port))); !ok || bound != want {
		t.Fatalf("node 3 advertised at %s, listening on %q", want, bound)
	}
	if up, _ := f.r.Upstream(3); up != "10.0.0.3:9092" {
		t.Fatalf("upstream of node 3 = %q", up)
	}
	if l := f.r.Listeners(); len(l) != 1 || len(f.r.Unbound()) != 0 {
		t.Fatalf("listeners %q, unbound %q after the bind", l, f.r.Unbound())
	}
}

// TestNoListenerWhileClosing: once the proxy stops, a node seen for the
// first time gets no listener and is left out.
func TestNoListenerWhileClosing(t *testing.T) {
	f := newFixture(t, nil)
	f.closing = true
	if _, port := f.r.MapBroker(1, "10.0.0.1", 9092); port != rewrite.OmitBroker || f.attempts != 0 {
		t.Fatalf("port %d after %d binds while closing; want the node left out, no bind", port, f.attempts)
	}
}

// TestAdminPortCollision: a node whose port is the admin listener's is
// left out for good (never retried), and AdminCollision says so.
func TestAdminPortCollision(t *testing.T) {
	admin, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	f := newFixture(t, admin.Addr())
	port := admin.Addr().(*net.TCPAddr).Port
	f.r.o.Config.Nodes = map[int32]config.NodeConfig{2: {Listen: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}}
	f.r.o.Listen = func(network, addr string) (net.Listener, error) { f.attempts++; return net.Listen(network, addr) }
	f.r.MapBroker(2, "10.0.0.2", 9092)
	f.now = f.now.Add(10 * BindRetryInterval)
	if _, p := f.r.MapBroker(2, "10.0.0.2", 9092); p != rewrite.OmitBroker {
		t.Fatalf("node 2 advertised at port %d on the admin listener's port", p)
	}
	if f.attempts != 1 {
		t.Fatalf("%d binds, want 1: an admin port collision is not retried", f.attempts)
	}
	if err := f.r.AdminCollision(); !errors.Is(err, ErrAdminPortTaken) {
		t.Fatalf("AdminCollision = %v, want ErrAdminPortTaken", err)
	}
}
