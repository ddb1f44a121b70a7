package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/dedupproxy/dedupproxy/internal/testports"
	"github.com/dedupproxy/dedupproxy/owner"
)

// fleet is R replicas of the proxy on loopback, each its own Server with
// its own ports (bootstrap, one per broker node, admin), index and
// advertised address, in front of one kfake cluster. A replica can be
// stopped as SIGTERM does (Shutdown, which hands its nodes over), killed
// as SIGKILL does (every connection cut, nothing handed over) and started
// again on the same ports, as a new process with empty tables.
type fleet struct {
	t       testing.TB
	cluster *kfake.Cluster
	brokers int
	listen  []string // bootstrap address, by index
	admin   []string // admin address, by index
	mod     func(i int, c *Config)

	mu       sync.Mutex
	replicas []*fleetReplica // running, by index
	all      []*fleetReplica // every incarnation started, for the logs
}

// fleetReplica is one running incarnation of a replica.
type fleetReplica struct {
	*testProxy
	index int
	http  *http.Server
	wakes atomic.Int64 // POST /replica/wake received: a peer asked it to poll now
}

// newFleet starts count replicas in front of c, whose brokers are numbered
// 0..brokers-1, and waits until each serves its nodes. mod, if set,
// changes replica i's config before each start.
func newFleet(t testing.TB, c *kfake.Cluster, count, brokers int, mod func(i int, cfg *Config)) *fleet {
	t.Helper()
	f := &fleet{t: t, cluster: c, mod: mod, brokers: brokers, replicas: make([]*fleetReplica, count)}
	avoid := map[int]bool{}
	for range count {
		p := testports.Block(t, 2+brokers, avoid) // bootstrap, nodes, admin
		f.listen = append(f.listen, "127.0.0.1:"+strconv.Itoa(p))
		f.admin = append(f.admin, "127.0.0.1:"+strconv.Itoa(p+1+brokers))
	}
	t.Cleanup(func() {
		for i := range count {
			f.kill(i)
		}
		if t.Failed() {
			f.mu.Lock()
			defer f.mu.Unlock()
			for _, r := range f.all {
				t.Logf("replica %d log:\n%s", r.index, r.logs.String())
			}
		}
	})
	for i := range count {
		f.start(i)
	}
	for i := range count {
		f.waitReady(i)
	}
	return f
}

// config is replica i's configuration.
func (f *fleet) config(i int) Config {
	idx := i
	cfg := Config{
		Upstream: f.cluster.ListenAddrs(), Listen: f.listen[i], Admin: "off",
		Replicas: f.listen, ReplicaIndex: &idx, ReplicaAdmin: f.admin,
		DrainTimeout: 10 * time.Second,
	}
	if f.mod != nil {
		f.mod(i, &cfg)
	}
	return cfg
}

// start starts replica i (again), on its ports, with its status served on
// its admin address. Its ports are bound here first and handed to the
// Server (Listen), so no parallel test takes one between the choice of the
// ports and the start; a previous incarnation's may take a moment to be
// free again.
func (f *fleet) start(i int) *fleetReplica {
	f.t.Helper()
	cfg := f.config(i)
	host, ps, _ := net.SplitHostPort(f.listen[i])
	base, _ := strconv.Atoi(ps)
	held := map[string]net.Listener{}
	var admin net.Listener
	deadline := time.Now().Add(5 * time.Second)
	for p := base; p <= base+f.brokers; p++ {
		addr := net.JoinHostPort(host, strconv.Itoa(p))
		for {
			ln, err := net.Listen("tcp", addr)
			if err == nil {
				held[addr] = ln
				break
			}
			if time.Now().After(deadline) {
				f.t.Fatalf("replica %d: %v", i, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	for {
		ln, err := net.Listen("tcp", f.admin[i])
		if err == nil {
			admin = ln
			break
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("replica %d admin: %v", i, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	var mu sync.Mutex
	logs, reg := &syncBuffer{}, prometheus.NewRegistry()
	s := &Server{
		Config:  cfg,
		Logger:  slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Metrics: NewMetrics(reg),
		Listen: func(network, addr string) (net.Listener, error) {
			mu.Lock()
			ln, ok := held[addr]
			delete(held, addr)
			mu.Unlock()
			if ok {
				return ln, nil
			}
			return net.Listen(network, addr)
		},
	}
	if err := s.Start(context.Background()); err != nil {
		f.t.Fatalf("replica %d: %v\n%s", i, err, logs.String())
	}
	mu.Lock()
	for _, ln := range held { // ports of nodes the cluster does not have
		ln.Close()
	}
	held = map[string]net.Listener{}
	mu.Unlock()
	r := &fleetReplica{testProxy: &testProxy{Server: s, reg: reg, logs: logs}, index: i}
	status := s.ReplicaHandler()
	r.http = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method == http.MethodPost && req.URL.Path == "/replica/wake" {
			r.wakes.Add(1)
		}
		status.ServeHTTP(w, req)
	}), ReadHeaderTimeout: time.Second}
	go r.http.Serve(admin)
	f.mu.Lock()
	f.replicas[i] = r
	f.all = append(f.all, r)
	f.mu.Unlock()
	return r
}

// replica returns replica i's current incarnation (nil once stopped).
func (f *fleet) replica(i int) *fleetReplica {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.replicas[i]
}

// waitReady waits until replica i serves every node it owns.
func (f *fleet) waitReady(i int) {
	f.t.Helper()
	r := f.replica(i)
	waitFor(f.t, 15*time.Second, fmt.Sprintf("replica %d ready", i), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return r.Ready(ctx) == nil
	})
}

// stop stops replica i as SIGTERM does: it hands its nodes over, drains
// and closes (Shutdown within drain_timeout), then its status goes.
func (f *fleet) stop(i int) error {
	r := f.replica(i)
	if r == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.Config.DrainTimeout)
	defer cancel()
	err := r.Shutdown(ctx)
	f.finish(r)
	return err
}

// kill stops replica i as SIGKILL does: connections cut, nothing handed
// over or drained, the status gone at once.
func (f *fleet) kill(i int) {
	r := f.replica(i)
	if r == nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r.http.Close()
	r.Shutdown(ctx)
	f.finish(r)
}

func (f *fleet) finish(r *fleetReplica) {
	r.http.Close()
	f.mu.Lock()
	if f.replicas[r.index] == r {
		f.replicas[r.index] = nil
	}
	f.mu.Unlock()
	if n := testutil.ToFloat64(r.Metrics.Panics); n != 0 {
		f.t.Errorf("replica %d recovered %v panics", r.index, n)
	}
}

// nodeAddr is where replica i serves node id: its bootstrap port + 1 + id.
func (f *fleet) nodeAddr(i int, id int32) string {
	host, port, _ := net.SplitHostPort(f.listen[i])
	p, _ := strconv.Atoi(port)
	return net.JoinHostPort(host, strconv.Itoa(p+1+int(id)))
}

// bootstrap lists every replica's bootstrap address.
func (f *fleet) bootstrap() []string { return append([]string(nil), f.listen...) }

// nodeReleased is a node's state at a replica that handed it over (tests
// name a node's owner "owner").
const nodeReleased = owner.Released
