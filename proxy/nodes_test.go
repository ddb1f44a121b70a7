package proxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/internal/testskip"
	"github.com/dedupproxy/dedupproxy/metrics"
	"github.com/dedupproxy/dedupproxy/nodes"
	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/protocol/rewrite"
)

// fakeBroker is a hand-written upstream that answers the address-bearing
// APIs with fixed broker lists, every node's real address being its own:
// for tests that need node ids, coordinators or NodeEndpoints kfake does
// not produce.
type fakeBroker struct {
	ln       net.Listener
	nodes    []int32 // in every broker list, in this order
	ctrl     int32   // Metadata ControllerID
	metadata atomic.Int64
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
}

func newFakeBroker(t testing.TB, nodes []int32, ctrl int32) *fakeBroker {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeBroker{ln: ln, nodes: nodes, ctrl: ctrl}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.mu.Lock()
			f.conns = append(f.conns, c)
			f.mu.Unlock()
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				f.serve(c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		f.mu.Lock()
		for _, c := range f.conns {
			c.Close()
		}
		f.mu.Unlock()
		f.wg.Wait()
	})
	return f
}

func (f *fakeBroker) addr() string { return f.ln.Addr().String() }

func (f *fakeBroker) hostPort() (string, int32) {
	a := f.ln.Addr().(*net.TCPAddr)
	return a.IP.String(), int32(a.Port)
}

func (f *fakeBroker) serve(c net.Conn) {
	var buf []byte
	for {
		body, nbuf, err := protocol.ReadFrame(c, buf, 1<<20, protocol.RequestMinSize)
		buf = nbuf
		if err != nil {
			return
		}
		h, err := protocol.ParseRequestHeader(body)
		if err != nil {
			return
		}
		resp := f.answer(h.APIKey, h.APIVersion, body[h.BodyOffset:])
		if resp == nil {
			return
		}
		out := binary.BigEndian.AppendUint32(nil, uint32(h.CorrelationID))
		if resp.IsFlexible() && h.APIKey != int16(kmsg.ApiVersions) {
			out = append(out, 0) // response header tags
		}
		out = resp.AppendTo(out)
		if _, err := c.Write(protocol.AppendFrame(nil, out)); err != nil {
			return
		}
	}
}

// answer builds the response to one request: every broker list holds
// f.nodes; FindCoordinator's coordinator for key "node-N" is node N;
// Produce answers NOT_LEADER with NodeEndpoints naming every node.
func (f *fakeBroker) answer(key, version int16, body []byte) kmsg.Response {
	host, port := f.hostPort()
	req := kmsg.RequestForKey(key)
	req.SetVersion(version)
	if err := req.ReadFrom(body); err != nil {
		return nil
	}
	resp := req.ResponseKind()
	resp.SetVersion(version)
	switch r := resp.(type) {
	case *kmsg.ApiVersionsResponse:
		for _, k := range []kmsg.Key{kmsg.Produce, kmsg.Metadata, kmsg.FindCoordinator, kmsg.ApiVersions, kmsg.DescribeCluster} {
			v, _ := rewrite.MaxVersion(k.Int16())
			r.ApiKeys = append(r.ApiKeys, kmsg.ApiVersionsResponseApiKey{ApiKey: k.Int16(), MaxVersion: v})
		}
	case *kmsg.MetadataResponse:
		f.metadata.Add(1)
		r.ControllerID = f.ctrl
		for _, id := range f.nodes {
			r.Brokers = append(r.Brokers, kmsg.MetadataResponseBroker{NodeID: id, Host: host, Port: port})
		}
	case *kmsg.DescribeClusterResponse:
		for _, id := range f.nodes {
			r.Brokers = append(r.Brokers, kmsg.DescribeClusterResponseBroker{NodeID: id, Host: host, Port: port})
		}
	case *kmsg.FindCoordinatorResponse:
		coordinator := func(k string) int32 {
			n, _ := strconv.Atoi(strings.TrimPrefix(k, "node-"))
			return int32(n)
		}
		fr := req.(*kmsg.FindCoordinatorRequest)
		if version < 4 {
			r.NodeID, r.Host, r.Port = coordinator(fr.CoordinatorKey), host, port
		}
		for _, k := range fr.CoordinatorKeys {
			r.Coordinators = append(r.Coordinators, kmsg.FindCoordinatorResponseCoordinator{Key: k, NodeID: coordinator(k), Host: host, Port: port})
		}
	case *kmsg.ProduceResponse:
		for _, tp := range req.(*kmsg.ProduceRequest).Topics {
			rt := kmsg.ProduceResponseTopic{Topic: tp.Topic}
			for _, p := range tp.Partitions {
				rp := kmsg.NewProduceResponseTopicPartition()
				rp.Partition, rp.ErrorCode, rp.BaseOffset = p.Partition, kerr.NotLeaderForPartition.Code, -1
				rp.CurrentLeader.LeaderID, rp.CurrentLeader.LeaderEpoch = f.nodes[len(f.nodes)-1], 1
				rt.Partitions = append(rt.Partitions, rp)
			}
			r.Topics = append(r.Topics, rt)
		}
		for _, id := range f.nodes {
			r.Brokers = append(r.Brokers, kmsg.ProduceResponseBroker{NodeID: id, Host: host, Port: port})
		}
	default:
		return nil
	}
	return resp
}

// freePorts returns the first port p in [lo, hi] such that p..p+n-1 can all
// be bound on 127.0.0.1 now, trying a bounded number of candidates.
func freePorts(t testing.TB, lo, hi, n int) int {
	t.Helper()
	for p, tries := lo, 0; p+n-1 <= hi && tries < 200; p, tries = p+n, tries+1 {
		var held []net.Listener
		for i := range n {
			ln, err := net.Listen("tcp", hostPort("127.0.0.1", p+i))
			if err != nil {
				break
			}
			held = append(held, ln)
		}
		for _, ln := range held {
			ln.Close()
		}
		if len(held) == n {
			return p
		}
	}
	testskip.Skipf(t, "no %d consecutive free ports in %d..%d", n, lo, hi)
	return 0
}

// startNodeProxy runs a proxy on listen in front of upstream, with mod
// applied; its logs and registry are returned for the test to inspect.
func startNodeProxy(t *testing.T, upstream []string, listen string, mod func(*Server)) *testProxy {
	t.Helper()
	logs := &syncBuffer{}
	reg := prometheus.NewRegistry()
	s := &Server{
		Config:  Config{Upstream: upstream, Listen: listen, Admin: "off"},
		Logger:  slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Metrics: NewMetrics(reg),
	}
	if mod != nil {
		mod(s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if n := testutil.ToFloat64(s.Metrics.Panics); n != 0 {
			t.Errorf("%v panics recovered", n)
		}
		if t.Failed() {
			t.Logf("proxy logs:\n%s", logs.String())
		}
	})
	return &testProxy{Server: s, reg: reg, logs: logs}
}

// TestNodePortOutOfRangeIsOmitted is the ZooKeeper-era cluster behind a
// proxy listening near the top of the port range: node 1001 would listen on
// listen port + 1002, beyond 65535. It gets one clear error line and a
// counter — not one per Metadata response — and is left out of every
// response: not in Metadata (nor as its controller) or DescribeCluster
// brokers, COORDINATOR_NOT_AVAILABLE for a coordinator on it, dropped from
// KIP-951 NodeEndpoints. It is never advertised at another address (the
// bootstrap's, which made clients loop on NOT_LEADER, or its real one).
// Nodes 0 and 1 work through their own listeners.
func TestNodePortOutOfRangeIsOmitted(t *testing.T) {
	t.Parallel()
	fb := newFakeBroker(t, []int32{0, 1001, 1}, 1001)
	listen := freePorts(t, 64600, 65400, 3)
	p := startNodeProxy(t, []string{fb.addr()}, hostPort("127.0.0.1", listen), nil)
	bootstrap := p.addr()
	wantNodes := map[int32]string{0: hostPort("127.0.0.1", listen+1), 1: hostPort("127.0.0.1", listen+2)}

	raw := dialRaw(t, bootstrap)
	var frames [][]byte // every response body, to search for leaks
	roundTrip := func(req kmsg.Request) kmsg.Response {
		t.Helper()
		corr := raw.send(req)
		body, err := readFrame(raw.conn)
		if err != nil {
			t.Fatal(err)
		}
		frames = append(frames, body)
		if got := int32(binary.BigEndian.Uint32(body)); got != corr {
			t.Fatalf("correlation %d, want %d", got, corr)
		}
		resp := req.ResponseKind()
		off := 4
		if resp.IsFlexible() {
			off++
		}
		if err := resp.ReadFrom(body[off:]); err != nil {
			t.Fatal(err)
		}
		return resp
	}
	checkBrokers := func(what string, ids []int32, addrs []string) {
		t.Helper()
		got := map[int32]string{}
		for i, id := range ids {
			got[id] = addrs[i]
		}
		if fmt.Sprint(got) != fmt.Sprint(wantNodes) {
			t.Errorf("%s brokers %v, want %v (node 1001 left out)", what, got, wantNodes)
		}
	}

	for v := range []int{0, 1, 2, 3, 4} { // several Metadata responses, one error line
		mreq := kmsg.NewPtrMetadataRequest()
		mreq.SetVersion(int16(1 + 4*v)) // v1 (first with a controller) .. v17
		if mv, _ := rewrite.MaxVersion(int16(kmsg.Metadata)); mreq.Version > mv {
			mreq.Version = mv
		}
		m := roundTrip(mreq).(*kmsg.MetadataResponse)
		var ids []int32
		var addrs []string
		for _, b := range m.Brokers {
			ids, addrs = append(ids, b.NodeID), append(addrs, addrString(b.Host, b.Port))
		}
		checkBrokers(fmt.Sprintf("Metadata v%d", mreq.Version), ids, addrs)
		if m.ControllerID != -1 {
			t.Errorf("Metadata v%d: controller %d, want -1 (node 1001 has no listener)", mreq.Version, m.ControllerID)
		}
	}

	dc := roundTrip(kmsg.NewPtrDescribeClusterRequest()).(*kmsg.DescribeClusterResponse)
	var ids []int32
	var addrs []string
	for _, b := range dc.Brokers {
		ids, addrs = append(ids, b.NodeID), append(addrs, addrString(b.Host, b.Port))
	}
	checkBrokers("DescribeCluster", ids, addrs)

	fc := kmsg.NewPtrFindCoordinatorRequest()
	fc.SetVersion(3)
	fc.CoordinatorKey = "node-1001"
	if r := roundTrip(fc).(*kmsg.FindCoordinatorResponse); r.ErrorCode != kerr.CoordinatorNotAvailable.Code || r.NodeID != -1 || r.Host != "" || r.Port != -1 {
		t.Errorf("FindCoordinator v3 on node 1001: error %d node %d at %s:%d; want COORDINATOR_NOT_AVAILABLE and no node", r.ErrorCode, r.NodeID, r.Host, r.Port)
	}
	fc4 := kmsg.NewPtrFindCoordinatorRequest()
	fc4.SetVersion(4)
	fc4.CoordinatorKeys = []string{"node-0", "node-1001"}
	r4 := roundTrip(fc4).(*kmsg.FindCoordinatorResponse)
	if c := r4.Coordinators[0]; c.ErrorCode != 0 || addrString(c.Host, c.Port) != wantNodes[0] {
		t.Errorf("FindCoordinator v4 node-0: %+v, want node 0 at %s", c, wantNodes[0])
	}
	if c := r4.Coordinators[1]; c.ErrorCode != kerr.CoordinatorNotAvailable.Code || c.NodeID != -1 || c.Host != "" {
		t.Errorf("FindCoordinator v4 node-1001: %+v, want COORDINATOR_NOT_AVAILABLE and no node", c)
	}

	preq := produceRequest("t", -1, oneRecordBatch(t))
	preq.SetVersion(10) // KIP-951 NodeEndpoints
	pr := roundTrip(preq).(*kmsg.ProduceResponse)
	ids, addrs = nil, nil
	for _, b := range pr.Brokers {
		ids, addrs = append(ids, b.NodeID), append(addrs, addrString(b.Host, b.Port))
	}
	checkBrokers("Produce v10 NodeEndpoints", ids, addrs)

	for _, leak := range []string{fb.addr(), bootstrap} {
		h, port, _ := net.SplitHostPort(leak)
		pn, _ := strconv.Atoi(port)
		needle := binary.BigEndian.AppendUint32(nil, uint32(pn)) // a port follows its host in every broker entry
		for i, body := range frames {
			if bytes.Contains(body, needle) && bytes.Contains(body, []byte(h)) {
				t.Errorf("response %d carries %s as a broker address", i, leak)
			}
		}
	}

	// One error line and one count, however many responses named it.
	if n := strings.Count(p.logs.String(), "broker node has no listener"); n != 1 {
		t.Errorf("%d error lines for node 1001, want 1", n)
	}
	if !strings.Contains(p.logs.String(), "node 1001 would listen on port") {
		t.Errorf("the error line does not say why:\n%s", p.logs.String())
	}
	if n := testutil.ToFloat64(p.Metrics.ListenerErrors.WithLabelValues(metrics.ListenerPortRange)); n != 1 {
		t.Errorf("listener_errors_total{reason=port_range} = %v, want 1", n)
	}

	// The other nodes work through their own listeners.
	for id, addr := range wantNodes {
		m := dialRaw(t, addr).roundTrip(kmsg.NewPtrMetadataRequest()).(*kmsg.MetadataResponse)
		if len(m.Brokers) != 2 {
			t.Errorf("through node %d's listener: %d brokers, want 2", id, len(m.Brokers))
		}
	}
}

// TestNodeBindRetryBackoff: a node whose listener fails to bind (the port
// is taken) is logged once and left out; the bind is retried at most once
// per nodes.BindRetryInterval, not on every response that names the node, and
// once it succeeds the node is advertised again.
func TestNodeBindRetryBackoff(t *testing.T) {
	t.Parallel()
	b := newSilentBroker(t)
	var (
		mu       sync.Mutex
		now      = time.Unix(1_700_000_000, 0)
		attempts int
		taken    = true
	)
	s, logs := startSilentProxy(t, b, func(s *Server) {
		s.Now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
		s.Listen = func(network, addr string) (net.Listener, error) {
			if strings.HasSuffix(addr, ":0") && s.Addr() == nil {
				return net.Listen(network, addr) // bootstrap
			}
			mu.Lock()
			attempts++
			fail := taken
			mu.Unlock()
			if fail {
				return nil, &net.OpError{Op: "listen", Net: network, Err: errors.New("bind: address already in use")}
			}
			return net.Listen(network, addr)
		}
	})
	mapped := func() (string, int32) { return s.nodes.MapBroker(5, "10.0.0.5", 9092) }
	for i := 0; i < 100; i++ {
		if _, port := mapped(); port != rewrite.OmitBroker {
			t.Fatalf("response %d: node 5 advertised at port %d without a listener", i, port)
		}
	}
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	count := func() int { mu.Lock(); defer mu.Unlock(); return attempts }
	if n := count(); n != 1 {
		t.Fatalf("%d bind attempts for 100 responses, want 1", n)
	}
	advance(nodes.BindRetryInterval - time.Second)
	mapped()
	if n := count(); n != 1 {
		t.Fatalf("%d bind attempts before the retry interval, want 1", n)
	}
	advance(2 * time.Second)
	mapped()
	mapped()
	if n := count(); n != 2 {
		t.Fatalf("%d bind attempts just after the retry interval, want 2", n)
	}
	if n := strings.Count(logs.String(), "broker node has no listener"); n != 1 {
		t.Errorf("%d error lines, want 1", n)
	}
	if n := testutil.ToFloat64(s.Metrics.ListenerErrors.WithLabelValues(metrics.ListenerBind)); n != 2 {
		t.Errorf("listener_errors_total{reason=bind} = %v, want 2 (one per failed attempt)", n)
	}

	mu.Lock()
	taken = false
	mu.Unlock()
	advance(nodes.BindRetryInterval)
	host, port := mapped()
	if port <= 0 {
		t.Fatalf("node 5 still left out after its bind succeeded")
	}
	if addr, ok := s.nodes.ListenAddr(5); !ok || addrString(host, port) != addr {
		t.Fatalf("node 5 advertised at %s, listening on %s", addrString(host, port), addr)
	}
}

// TestNodeIDOffsetEndToEnd: a cluster whose brokers are 1001..1003, as
// ZooKeeper-era clusters number them, behind a proxy with node_id_offset
// 1000 on fixed ports: node N listens on listen port + 1 + (N − 1000), and
// a franz-go client produces and consumes through it.
func TestNodeIDOffsetEndToEnd(t *testing.T) {
	t.Parallel()
	const topic, partitions = "zk-era", 3
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	var upstream []string
	for id := int32(1001); id <= 1003; id++ {
		_, port, err := c.AddNode(id, 0)
		if err != nil {
			t.Fatal(err)
		}
		upstream = append(upstream, hostPort("127.0.0.1", port))
	}
	if err := c.RemoveNode(0); err != nil { // leaders move to 1001..1003
		t.Fatal(err)
	}

	listen := freePorts(t, 20000, 30000, 5) // bootstrap, (node 1000), 1001..1003
	p := startNodeProxy(t, upstream, hostPort("127.0.0.1", listen), func(s *Server) { s.Config.NodeIDOffset = 1000 })
	for id := int32(1001); id <= 1003; id++ {
		want := hostPort("127.0.0.1", listen+1+int(id-1000))
		if got, ok := p.nodes.Advertised(id); !ok || got != want {
			t.Errorf("node %d advertised at %q, want %s", id, got, want)
		}
	}

	tap := newAddrTap()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(p.addr()), kgo.Dialer(tap.dial), kgo.DefaultProduceTopic(topic),
		kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	const total = 300
	recs := make([]*kgo.Record, total)
	for i := range recs {
		recs[i] = &kgo.Record{Value: []byte(strconv.Itoa(i))}
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
	got := 0
	for polls := 0; got < total && polls < 1000; polls++ {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of %d: %v", got, total, err)
		}
		fs.EachError(func(_ string, _ int32, err error) { t.Errorf("fetch: %v", err) })
		got += fs.NumRecords()
	}
	if got != total {
		t.Fatalf("consumed %d, want %d", got, total)
	}
	addrs, _, _ := tap.snapshot()
	for a := range addrs {
		if a != p.addr() && !strings.HasPrefix(a, "127.0.0.1:") {
			t.Errorf("client told %s", a)
		}
		for _, u := range upstream {
			if a == u {
				t.Errorf("real broker address %s leaked", a)
			}
		}
	}
	if n := testutil.ToFloat64(p.Metrics.ListenerErrors.WithLabelValues(metrics.ListenerPortRange)); n != 0 {
		t.Errorf("%v port_range errors", n)
	}
}

// TestNodeListenerOnAdminPortFailsStart: the admin listener is bound first;
// when Start's probe learns node 0, whose port (listen port + 1) the admin
// listener holds, Start fails saying so — the proxy would otherwise run
// with broker 0 unreachable for good.
func TestNodeListenerOnAdminPortFailsStart(t *testing.T) {
	t.Parallel()
	fb := newFakeBroker(t, []int32{0}, 0)
	listen := freePorts(t, 30000, 32000, 2)
	admin, err := net.Listen("tcp", hostPort("127.0.0.1", listen+1))
	if err != nil {
		testskip.Skipf(t, "port %d taken meanwhile: %v", listen+1, err)
	}
	defer admin.Close()
	s := &Server{
		Config:    Config{Upstream: []string{fb.addr()}, Listen: hostPort("127.0.0.1", listen), Admin: admin.Addr().String()},
		Logger:    slog.New(slog.DiscardHandler),
		AdminAddr: admin.Addr(),
	}
	err = s.Start(context.Background())
	defer s.Shutdown(context.Background())
	want := fmt.Sprintf("port %d for node 0 is the admin listener's", listen+1)
	if !errors.Is(err, ErrAdminPortTaken) || !strings.Contains(err.Error(), want) {
		t.Fatalf("Start = %v, want ErrAdminPortTaken saying %q", err, want)
	}
	if c, err := net.DialTimeout("tcp", hostPort("127.0.0.1", listen), time.Second); err == nil {
		c.Close()
		t.Error("the bootstrap listener still accepts after Start failed")
	}
}

// hostPort joins a host and a port.
func hostPort(host string, port int) string { return net.JoinHostPort(host, strconv.Itoa(port)) }
