package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// newCluster starts a 3-broker kfake cluster on random loopback ports.
func newCluster(t testing.TB, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(3)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// syncBuffer is a goroutine-safe log sink that tests can search.
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

type testProxy struct {
	*Server
	reg  *prometheus.Registry
	logs *syncBuffer
	// expectPanics is how many recovered panics the test injects on purpose.
	expectPanics atomic.Int64
}

// startProxy runs a proxy on 127.0.0.1:0 in front of c. On cleanup it shuts
// down and fails the test if any connection goroutine panicked.
func startProxy(t testing.TB, c *kfake.Cluster, mod func(*Config)) *testProxy {
	t.Helper()
	return startProxyWith(t, c, mod, nil)
}

// startProxyWith is startProxy with setup run on the Server before Start
// (to inject Dial or Listen).
func startProxyWith(t testing.TB, c *kfake.Cluster, mod func(*Config), setup func(*Server)) *testProxy {
	t.Helper()
	logs := &syncBuffer{}
	reg := prometheus.NewRegistry()
	cfg := Config{Listen: "127.0.0.1:0", Admin: "off", DrainTimeout: 10 * time.Second}
	if c != nil { // nil: mod sets the upstream
		cfg.Upstream = c.ListenAddrs()
	}
	if mod != nil {
		mod(&cfg)
	}
	s := &Server{
		Config:  cfg,
		Logger:  slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Metrics: NewMetrics(reg),
	}
	if setup != nil {
		setup(s)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	tp := &testProxy{Server: s, reg: reg, logs: logs}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if n := testutil.ToFloat64(s.Metrics.Panics); n != float64(tp.expectPanics.Load()) {
			t.Errorf("%v panics recovered; logs:\n%s", n, logs.String())
		}
		if t.Failed() {
			t.Logf("proxy logs:\n%s", logs.String())
		}
	})
	return tp
}

func (p *testProxy) addr() string { return p.Addr().String() }

// waitingRequests is how many Produce requests wait for an outcome now.
func (p *testProxy) waitingRequests() int64 { return int64(testutil.ToFloat64(p.Metrics.Waiting)) }

// rawConn is a hand-driven Kafka connection for crafted requests.
type rawConn struct {
	t    testing.TB
	conn net.Conn
	corr int32
	// clientID is the client id its requests carry; "" means "raw".
	clientID string
}

func dialRaw(t testing.TB, addr string) *rawConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return &rawConn{t: t, conn: c}
}

// send writes req and returns its correlation id.
func (r *rawConn) send(req kmsg.Request) int32 {
	r.t.Helper()
	r.corr++
	id := r.clientID
	if id == "" {
		id = "raw"
	}
	frame := kmsg.NewRequestFormatter(kmsg.FormatterClientID(id)).AppendRequest(nil, req, r.corr)
	if _, err := r.conn.Write(frame); err != nil {
		r.t.Fatal(err)
	}
	return r.corr
}

// recv reads one response to req (sent with corr) and decodes it.
func (r *rawConn) recv(req kmsg.Request, corr int32) kmsg.Response {
	r.t.Helper()
	body, err := readFrame(r.conn)
	if err != nil {
		r.t.Fatalf("read response to %s: %v", kmsg.NameForKey(req.Key()), err)
	}
	if got := int32(binary.BigEndian.Uint32(body)); got != corr {
		r.t.Fatalf("correlation id %d, want %d", got, corr)
	}
	resp := req.ResponseKind()
	off := 4
	if resp.IsFlexible() && req.Key() != int16(kmsg.ApiVersions) {
		off++ // empty header tag section
	}
	if err := resp.ReadFrom(body[off:]); err != nil {
		r.t.Fatalf("decode %s: %v", kmsg.NameForKey(req.Key()), err)
	}
	return resp
}

// abort closes the connection with a reset, as a client's kernel does when
// it closes a socket with answers left unread (a lost acknowledgement).
func (r *rawConn) abort() {
	conn := r.conn
	if tc, ok := conn.(*tls.Conn); ok {
		conn = tc.NetConn() // no close_notify: the connection breaks
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	conn.Close()
}

func (r *rawConn) roundTrip(req kmsg.Request) kmsg.Response {
	r.t.Helper()
	return r.recv(req, r.send(req))
}

// logEnd returns the end offset of partition 0 of topic, asked of the
// broker at addr directly: how many records the log holds.
func logEnd(t testing.TB, addr, topic string) int64 {
	t.Helper()
	return partitionEnd(t, addr, topic, 0)
}

// partitionEnd is logEnd for any partition.
func partitionEnd(t testing.TB, addr, topic string, partition int32) int64 {
	t.Helper()
	req := kmsg.NewPtrListOffsetsRequest()
	req.SetVersion(4)
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewListOffsetsRequestTopicPartition()
	rp.Partition, rp.Timestamp = partition, -1
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	p := dialRaw(t, addr).roundTrip(req).(*kmsg.ListOffsetsResponse).Topics[0].Partitions[0]
	if p.ErrorCode != 0 {
		t.Fatalf("end offset of %s: error %d", topic, p.ErrorCode)
	}
	return p.Offset
}

func readFrame(c io.Reader) ([]byte, error) {
	var head [4]byte
	if _, err := io.ReadFull(c, head[:]); err != nil {
		return nil, err
	}
	body := make([]byte, binary.BigEndian.Uint32(head[:]))
	_, err := io.ReadFull(c, body)
	return body, err
}

// waitFor polls cond every few milliseconds, at most until timeout.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for i := 0; ; i++ {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s (%d checks) waiting for %s", timeout, i, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// realAddrs returns the set of the cluster's real broker addresses.
func realAddrs(c *kfake.Cluster) map[string]bool {
	m := map[string]bool{}
	for _, a := range c.ListenAddrs() {
		m[a] = true
	}
	return m
}

func addrString(host string, port int32) string {
	return net.JoinHostPort(host, fmt.Sprint(port))
}

// learnTopics sends a Metadata request for topics through raw, as every
// client does before producing: the proxy keys batches only for topics it
// has seen in a Metadata response.
func (r *rawConn) learnTopics(topics ...string) *kmsg.MetadataResponse {
	r.t.Helper()
	req := kmsg.NewPtrMetadataRequest()
	req.SetVersion(12)
	for _, tp := range topics {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(tp)
		req.Topics = append(req.Topics, rt)
	}
	resp := r.roundTrip(req).(*kmsg.MetadataResponse)
	for _, t := range resp.Topics {
		if t.ErrorCode != 0 {
			r.t.Fatalf("metadata for %v: error %d", t.Topic, t.ErrorCode)
		}
	}
	return resp
}
