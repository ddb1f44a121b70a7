package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dedupproxy/dedupproxy/internal/testskip"
	"github.com/dedupproxy/dedupproxy/proxy"
)

// newCluster is the one-broker cluster a test runs against (kfake, or the
// real cluster of DEDUPPROXY_TEST_UPSTREAM) with topic at 3 partitions.
func newCluster(t testing.TB, topic string) *testCluster {
	t.Helper()
	return newTestCluster(t, 1, topic)
}

// legacyPartitions is how many partitions the clusters' topic has.
const legacyPartitions = 3

// newClusterOf is newCluster with brokers brokers (kfake; a real cluster
// has what it has).
func newClusterOf(t testing.TB, brokers int, topic string) *testCluster {
	t.Helper()
	return newTestCluster(t, brokers, topic)
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testProxy is an in-process dedupproxy in front of a kfake cluster.
type testProxy struct {
	srv  *proxy.Server
	reg  *prometheus.Registry
	logs *syncBuffer // its log, for the caller to print or search
}

// startProxy runs the proxy on 127.0.0.1:0 in front of c. On cleanup it shuts
// down, fails the test if a connection goroutine panicked, and prints the
// proxy's log if the test failed.
func startProxy(t testing.TB, c *testCluster) *testProxy {
	t.Helper()
	return startProxyOn(t, c, "127.0.0.1:0")
}

// startProxyOn is startProxy with the bootstrap listener at listen (node N
// at its port + 1 + N).
func startProxyOn(t testing.TB, c *testCluster, listen string) *testProxy {
	t.Helper()
	return startProxyWith(t, c, listen, nil)
}

// startProxyDial is startProxy with dial as the proxy's upstream dialer.
func startProxyDial(t testing.TB, c *testCluster, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *testProxy {
	t.Helper()
	return startProxyWith(t, c, "127.0.0.1:0", dial)
}

func startProxyWith(t testing.TB, c *testCluster, listen string, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *testProxy {
	t.Helper()
	logs := &syncBuffer{}
	reg := prometheus.NewRegistry()
	srv := &proxy.Server{
		Dial:    dial,
		Config:  c.proxyConfig(listen),
		Logger:  slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: e2eLogLevel()})),
		Metrics: proxy.NewMetrics(reg),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	p := &testProxy{srv: srv, reg: reg, logs: logs}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("proxy shutdown: %v", err)
		}
		if n := p.metric("dedupproxy_panics_total", ""); n > 0 {
			t.Errorf("proxy recovered %v panics", n)
		}
		if t.Failed() {
			t.Logf("proxy log:\n%s", logs.String())
		}
	})
	return p
}

// addr is the proxy's bootstrap listener.
func (p *testProxy) addr() string { return p.srv.Addr().String() }

// metric sums the samples of the named counter or gauge whose labels include
// label (as name=value), or all of them when label is empty.
func (p *testProxy) metric(name, label string) float64 {
	mfs, err := p.reg.Gather()
	if err != nil {
		return -1
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label != "" && !hasLabel(m, label) {
				continue
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

func hasLabel(m *dto.Metric, label string) bool {
	for _, lp := range m.GetLabel() {
		if lp.GetName()+"="+lp.GetValue() == label {
			return true
		}
	}
	return false
}

// storedValues reads every record of topic straight from the cluster
// (never through the proxy or the shim) and returns how many copies of
// each value the log holds, and the total.
func storedValues(t testing.TB, c *testCluster, topic string) (map[string]int, int) {
	t.Helper()
	copies := map[string]int{}
	got := eachStored(t, c, topic, func(r *kgo.Record) { copies[string(r.Value)]++ })
	return copies, got
}

// eachStored calls fn once for every record topic holds, read straight
// from the cluster from each partition's start to its end offset as listed
// first, and returns how many there were.
func eachStored(t testing.TB, c *testCluster, topic string, fn func(*kgo.Record)) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	adm, err := kgo.NewClient(c.clientOpts(t)...)
	if err != nil {
		t.Fatal(err)
	}
	ends, err := kadm.NewClient(adm).ListEndOffsets(ctx, topic)
	adm.Close()
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		t.Fatalf("list end offsets: %v", err)
	}
	want := map[int32]int64{}
	offsets := map[int32]kgo.Offset{}
	total := 0
	ends.Each(func(o kadm.ListedOffset) {
		want[o.Partition] = o.Offset
		offsets[o.Partition] = kgo.NewOffset().AtStart()
		total += int(o.Offset)
	})

	cl, err := kgo.NewClient(append(c.clientOpts(t),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: offsets}),
		kgo.FetchMaxWait(100*time.Millisecond),
	)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	next := map[int32]int64{} // next offset expected per partition
	got := 0
	done := func() bool {
		for p, end := range want {
			if next[p] < end {
				return false
			}
		}
		return true
	}
	// Each poll returns at least one record or waits FetchMaxWait, so the
	// bound is generous; the context is the real deadline.
	for i := 0; i < 100000 && !done(); i++ {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d of %d records of %s before the deadline", got, total, topic)
		}
		fs.EachError(func(_ string, p int32, err error) { t.Fatalf("fetch partition %d: %v", p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset < want[r.Partition] && r.Offset >= next[r.Partition] {
				fn(r)
				next[r.Partition] = r.Offset + 1
				got++
			}
		})
	}
	if !done() {
		t.Fatalf("consumed %d of %d records of %s", got, total, topic)
	}
	return got
}

// inCI reports whether the test runs under CI (CI=true), where a missing
// client is a failure whatever E2E_SKIP_MISSING says.
func inCI() bool { return os.Getenv("CI") == "true" }

// skipMissingEnv names the clients a run may skip when they are not
// installed: a comma-separated list of client names (as in the results
// table: kafkajs, kcat, ...) or "all". Unset, a missing client fails its
// test: a green run has run every client.
const skipMissingEnv = "E2E_SKIP_MISSING"

// skipMissing reports whether E2E_SKIP_MISSING lets client be skipped
// ("kafka-python" covers its "kafka-python retries=0" run too).
func skipMissing(client string) bool {
	for _, name := range strings.Split(os.Getenv(skipMissingEnv), ",") {
		if name = strings.TrimSpace(name); name == "all" || name == client || name == strings.Fields(client)[0] {
			return true
		}
	}
	return false
}

// notRun collects the clients a run did not drive, and why, for the
// summary TestMain prints.
var notRun struct {
	sync.Mutex
	why map[string]string
}

// requireClient fails the test when client is not installed (err says
// why), naming what installs it, unless E2E_SKIP_MISSING names it outside
// CI: then it skips. Either way TestMain's summary names the client.
func requireClient(t testing.TB, client string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	notRun.Lock()
	if notRun.why == nil {
		notRun.why = map[string]string{}
	}
	notRun.why[client] = err.Error()
	notRun.Unlock()
	switch {
	case inCI():
		t.Fatalf("%s not installed (CI=true: .ci/deps should have installed it): %v", client, err)
	case skipMissing(client):
		testskip.Skipf(t, "%s not installed, skipped (%s=%s): %v", client, skipMissingEnv, os.Getenv(skipMissingEnv), err)
	default:
		t.Fatalf("%s not installed: %v\n\tbash .ci/deps installs every client the tests drive (kcat, python3-confluent-kafka, python3-kafka, node, npm, then kafkajs with npm ci in e2e/);\n\tor run with %s=%s (or =all) to skip it", client, err, skipMissingEnv, client)
	}
}

// TestMain runs the tests and lists the skipped ones (testskip.Run), then
// names every client that did not run and why: with -v, and in the output
// of a failed run.
func TestMain(m *testing.M) {
	code := testskip.Run(m)
	notRun.Lock()
	names := make([]string, 0, len(notRun.why))
	for name := range notRun.why {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Printf("e2e: client %s did not run: %s\n", name, strings.ReplaceAll(notRun.why[name], "\n", "; "))
	}
	notRun.Unlock()
	if dir, err := runDir(); err == nil {
		os.RemoveAll(dir)
	}
	os.Exit(code)
}

// moduleVersion is the version of a Go module the tests are built with, as
// go.mod requires it. (debug.ReadBuildInfo lists no dependencies in a test
// binary.)
func moduleVersion(path string) string {
	mod, err := os.ReadFile(filepath.Join("..", "go.mod"))
	if err != nil {
		return "unknown"
	}
	for _, line := range strings.Split(string(mod), "\n") {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require "))
		if len(f) >= 2 && f[0] == path {
			return f[1]
		}
	}
	return "unknown"
}

// runChild runs a client program to completion, killed if ctx ends first
// (exec.CommandContext kills it; WaitDelay bounds the wait for its pipes),
// with env added to its environment. It returns stdout; stderr is logged.
func runChild(ctx context.Context, t testing.TB, stdin io.Reader, env []string, name string, args ...string) ([]byte, string, error) {
	t.Helper()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.WaitDelay = 2 * time.Second
	cmd.Env = append(append(os.Environ(), "KAFKAJS_NO_PARTITIONER_WARNING=1", "PYTHONUNBUFFERED=1"), env...)
	cmd.Stdin = stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		err = errors.Join(err, fmt.Errorf("%s killed: %w", name, ctx.Err()))
	}
	return stdout.Bytes(), stderr.String(), err
}

// firstLines returns at most n lines of s, for logs.
func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = append(lines[:n], "…")
	}
	return strings.Join(lines, "\n")
}

// kill stops the proxy at once, as SIGKILL would as far as clients and its
// state are concerned: every connection is cut, nothing is drained, and
// the tables are gone with the Server.
func (p *testProxy) kill() {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	p.srv.Shutdown(ctx)
}

// drain stops the proxy as SIGTERM does: stop accepting and reading,
// let in-flight responses reach their clients (up to 10 s), then close.
func (p *testProxy) drain() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p.srv.Shutdown(ctx)
}

// freeListenPair returns 127.0.0.1:P where P and P+1 (the proxy's bootstrap
// and node 0 listeners) were both free a moment ago, for a proxy that must
// come back on the same ports.
func freeListenPair(t testing.TB) string {
	t.Helper()
	for i := 0; i < 50; i++ {
		a, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := a.Addr().(*net.TCPAddr).Port
		b, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port+1))
		a.Close()
		if err == nil {
			b.Close()
			return fmt.Sprintf("127.0.0.1:%d", port)
		}
	}
	t.Fatal("no two adjacent free ports in 50 tries")
	return ""
}

// startProxyOnErr starts a proxy at listen without a testing.TB, for the
// shim's goroutine (the restart mode); the caller kills it.
func startProxyOnErr(c *testCluster, listen string) (*testProxy, error) {
	reg := prometheus.NewRegistry()
	logs := &syncBuffer{}
	srv := &proxy.Server{
		Config:  c.proxyConfig(listen),
		Logger:  slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: e2eLogLevel()})),
		Metrics: proxy.NewMetrics(reg),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Start(ctx); err != nil {
		return nil, err
	}
	return &testProxy{srv: srv, reg: reg, logs: logs}, nil
}

// cutAfterProduce is a dialer whose connections break right after each
// Produce request the plan names (counted across connections) is written
// to the broker: the broker gets it, the proxy never reads an answer. fired
// counts the cuts.
func cutAfterProduce(plan faultPlan, fired *atomic.Int64) func(ctx context.Context, network, addr string) (net.Conn, error) {
	var produces atomic.Int64
	var d net.Dialer
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &cutConn{Conn: conn, produces: &produces, plan: plan, fired: fired}, nil
	}
}

type cutConn struct {
	net.Conn
	produces *atomic.Int64
	plan     faultPlan
	fired    *atomic.Int64
}

// Write sees whole frames: the proxy writes one request per call.
func (c *cutConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if err == nil && len(p) >= 6 && p[4] == 0 && p[5] == 0 && c.plan.hits(c.produces.Add(1)) { // api key 0: Produce
		c.fired.Add(1)
		c.Conn.Close()
	}
	return n, err
}

// e2eLogLevel is the in-process proxies' log level: info, or debug with
// E2E_DEBUG=1 (every decided batch is logged then).
func e2eLogLevel() slog.Level {
	if os.Getenv("E2E_DEBUG") == "1" {
		return slog.LevelDebug
	}
	return slog.LevelInfo
}
