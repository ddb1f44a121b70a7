package e2e

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/internal/testports"
	"github.com/dedupproxy/dedupproxy/internal/testskip"
	"github.com/dedupproxy/dedupproxy/proxy"
)

// replicaFleet is three replicas of the proxy on loopback (docs/replicas.md),
// each its own Server with its own index, ports, advertised address and
// admin listener serving its status, in front of one kfake cluster. Their
// ports are fixed for the test, so a replica stopped or killed comes back on
// the same ones, as a new process with empty tables would.
type replicaFleet struct {
	t       *testing.T
	cluster *kfake.Cluster
	listen  []string
	admin   []string
	dial    func(ctx context.Context, network, addr string) (net.Conn, error) // the replicas' to the brokers; nil: direct

	mu      sync.Mutex
	running []*fleetMember
	all     []*fleetMember
}

type fleetMember struct {
	*testProxy
	index int
	http  *http.Server
	logs  *syncBuffer
}

// fleetSize is how many replicas and brokers the replica tests run.
const fleetSize = 3

func newReplicaFleet(t *testing.T, c *kfake.Cluster, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *replicaFleet {
	t.Helper()
	f := &replicaFleet{t: t, cluster: c, dial: dial, running: make([]*fleetMember, fleetSize)}
	taken := map[int]bool{}
	for range fleetSize {
		p := testports.Block(t, fleetSize+2, taken) // bootstrap, nodes 0..2, admin
		f.listen = append(f.listen, "127.0.0.1:"+strconv.Itoa(p))
		f.admin = append(f.admin, "127.0.0.1:"+strconv.Itoa(p+fleetSize+1))
	}
	t.Cleanup(func() {
		for i := range fleetSize {
			f.kill(i)
		}
		if t.Failed() {
			f.mu.Lock()
			defer f.mu.Unlock()
			for _, m := range f.all {
				t.Logf("replica %d log:\n%s", m.index, m.logs.String())
			}
		}
	})
	for i := range fleetSize {
		if err := f.start(i); err != nil {
			t.Fatal(err)
		}
	}
	for i := range fleetSize {
		if err := f.waitReady(i); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// start runs replica i on its ports, its status on its admin address. It
// binds the ports first and hands them to the Server (Listen), so nothing
// else takes one between their choice and the start; a previous
// incarnation's may take a moment to be free again. It returns an error
// rather than failing the test: the driver calls it from its own goroutine.
func (f *replicaFleet) start(i int) error {
	host, ps, _ := net.SplitHostPort(f.listen[i])
	base, _ := strconv.Atoi(ps)
	held := map[string]net.Listener{}
	bind := func(addr string) (net.Listener, error) {
		deadline := time.Now().Add(5 * time.Second)
		for {
			ln, err := net.Listen("tcp", addr)
			if err == nil || time.Now().After(deadline) {
				return ln, err
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	closeHeld := func() {
		for _, ln := range held {
			ln.Close()
		}
	}
	for p := base; p <= base+fleetSize; p++ {
		addr := net.JoinHostPort(host, strconv.Itoa(p))
		ln, err := bind(addr)
		if err != nil {
			closeHeld()
			return fmt.Errorf("replica %d: %w", i, err)
		}
		held[addr] = ln
	}
	admin, err := bind(f.admin[i])
	if err != nil {
		closeHeld()
		return fmt.Errorf("replica %d admin: %w", i, err)
	}
	var mu sync.Mutex
	idx := i
	logs, reg := &syncBuffer{}, prometheus.NewRegistry()
	srv := &proxy.Server{
		Config: proxy.Config{Upstream: f.cluster.ListenAddrs(), Listen: f.listen[i], Admin: "off",
			Replicas: f.listen, ReplicaIndex: &idx, ReplicaAdmin: f.admin, DrainTimeout: 10 * time.Second},
		Logger:  slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: e2eLogLevel()})),
		Metrics: proxy.NewMetrics(reg),
		Dial:    f.dial,
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
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err = srv.Start(ctx)
	cancel()
	mu.Lock()
	closeHeld()
	mu.Unlock()
	if err != nil {
		admin.Close()
		return fmt.Errorf("start replica %d: %w", i, err)
	}
	hs := &http.Server{Handler: srv.ReplicaHandler(), ReadHeaderTimeout: time.Second}
	go hs.Serve(admin)
	m := &fleetMember{testProxy: &testProxy{srv: srv, reg: reg, logs: logs}, index: i, http: hs, logs: logs}
	f.mu.Lock()
	f.running[i], f.all = m, append(f.all, m)
	f.mu.Unlock()
	return nil
}

func (f *replicaFleet) member(i int) *fleetMember {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.running[i]
}

// waitReady waits until replica i serves every node it owns.
func (f *replicaFleet) waitReady(i int) error {
	m := f.member(i)
	if m == nil {
		return fmt.Errorf("replica %d is not running", i)
	}
	ok := eventually(15*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return m.srv.Ready(ctx) == nil
	})
	if !ok {
		return fmt.Errorf("replica %d not ready 15 s after its start", i)
	}
	return nil
}

// stop stops replica i as SIGTERM does (its nodes handed over, then
// drained and closed); kill as SIGKILL does (everything cut at once).
func (f *replicaFleet) stop(i int) error {
	m := f.member(i)
	if m == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := m.srv.Shutdown(ctx)
	f.gone(m)
	return err
}

func (f *replicaFleet) kill(i int) {
	m := f.member(i)
	if m == nil {
		return
	}
	m.http.Close()
	m.kill()
	f.gone(m)
}

func (f *replicaFleet) gone(m *fleetMember) {
	m.http.Close()
	if n := m.metric("dedupproxy_panics_total", ""); n > 0 {
		f.t.Errorf("replica %d recovered %v panics", m.index, n)
	}
	f.mu.Lock()
	if f.running[m.index] == m {
		f.running[m.index] = nil
	}
	f.mu.Unlock()
}

// sum adds a metric over every incarnation of every replica.
func (f *replicaFleet) sum(name, label string) float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	total := 0.0
	for _, m := range f.all {
		total += m.metric(name, label)
	}
	return total
}

// replicaOf is the index of the replica whose listener addr is (its
// bootstrap, or a node's), or -1.
func (f *replicaFleet) replicaOf(addr string) int {
	_, ps, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(ps)
	for i, l := range f.listen {
		_, bs, _ := net.SplitHostPort(l)
		b, _ := strconv.Atoi(bs)
		if p >= b && p <= b+fleetSize {
			return i
		}
	}
	return -1
}

// slowBroker stands between the replicas and kfake (the replicas' Dial):
// a loopback relay per broker answers every Produce request that wants an
// answer delay after the answer before it on its connection (a busy
// broker: the clients' requests pile up, so many are in flight), and holds
// for hold the answer to the next one that node armNode receives once
// armed: so a request is in flight through the replica that serves that
// node when it stops. kfake appends at once; what is late is the answer,
// which is what makes a request in flight to the proxy. (kfake's
// SleepControl did this inside the broker, but two of its goroutines can
// serve one connection's sleeps at once, and the race detector stopped
// runs.)
type slowBroker struct {
	delay, hold time.Duration
	relays      map[string]string // kfake address -> its relay's

	mu     sync.Mutex
	node   int32 // armed for this node, anyNode, or -1
	heldAt int32
	fired  chan struct{}
}

// anyNode arms a slowBroker for whichever node gets the next request.
const anyNode = -2

func newSlowBroker(t *testing.T, c *kfake.Cluster, delay, hold time.Duration) *slowBroker {
	sb := &slowBroker{delay: delay, hold: hold, relays: map[string]string{}, node: -1}
	for node, addr := range c.ListenAddrs() {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		sb.relays[addr] = ln.Addr().String()
		go func() {
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				go sb.relay(conn, addr, int32(node))
			}
		}()
	}
	return sb
}

// dial is the replicas' Dial: a connection to a broker goes through its
// relay.
func (sb *slowBroker) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if r, ok := sb.relays[addr]; ok {
		addr = r
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// slowAnswer is a request the relay expects an answer to.
type slowAnswer struct {
	produce, held bool
}

// relay copies one replica connection to broker addr (node) and back,
// delaying the answers to Produce requests.
func (sb *slowBroker) relay(client net.Conn, addr string, node int32) {
	up, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		client.Close()
		return
	}
	// Bounded: past 4096 requests awaiting answers the request side waits.
	fifo := make(chan slowAnswer, 4096)
	defer func() {
		client.Close()
		up.Close()
		for range fifo { // until the request side has stopped
		}
	}()
	go func() {
		defer close(fifo)
		defer up.Close()
		for {
			frame, err := readFrame(client)
			if err != nil {
				return
			}
			aw, ok := sb.inspect(frame, node)
			if ok {
				fifo <- aw
			}
			if _, err := up.Write(frame); err != nil {
				return
			}
		}
	}()
	var last time.Time
	for {
		frame, err := readFrame(up)
		if err != nil {
			return
		}
		aw, ok := <-fifo
		if !ok {
			return
		}
		if aw.produce {
			wait := sb.delay
			if aw.held {
				wait = sb.hold
			}
			// The broker's own slowness, the fault under test: it answers
			// one request at a time per connection.
			last = maxTime(last, time.Now()).Add(wait)
			time.Sleep(time.Until(last))
		}
		if _, err := client.Write(frame); err != nil {
			return
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// inspect reads the header of a request frame (its size included), and a
// Produce request's acks: whether an answer comes, whether it is a Produce
// request, and whether it is the one held.
func (sb *slowBroker) inspect(frame []byte, node int32) (slowAnswer, bool) {
	r := kbin.Reader{Src: frame[4:]}
	key, version := r.Int16(), r.Int16()
	r.Int32()          // correlation id: answers come in request order
	r.NullableString() // client id
	if key != int16(kmsg.Produce) || !r.Ok() {
		return slowAnswer{}, true
	}
	req := kmsg.NewPtrProduceRequest()
	req.SetVersion(version)
	switch {
	case req.IsFlexible():
		kmsg.SkipTags(&r)
		r.CompactNullableString() // transactional id
	case version >= 3:
		r.NullableString()
	}
	acks := r.Int16()
	switch {
	case !r.Ok():
		return slowAnswer{}, true // the broker answers what it makes of it
	case acks == 0:
		return slowAnswer{}, false // no answer
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	aw := slowAnswer{produce: true}
	if sb.node != -1 && (sb.node == anyNode || sb.node == node) {
		sb.heldAt, sb.node, aw.held = node, -1, true
		close(sb.fired)
	}
	return aw, true
}

// arm makes the next Produce request node receives the held one; the
// channel is closed when it arrives.
func (sb *slowBroker) arm(node int32) <-chan struct{} {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	sb.node, sb.fired = node, make(chan struct{})
	return sb.fired
}

// rearm arms for node again if the last arming has not fired; false if
// it has.
func (sb *slowBroker) rearm(node int32) bool {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	select {
	case <-sb.fired:
		return false
	default:
	}
	sb.node = node
	return true
}

// held is the node of the last held request.
func (sb *slowBroker) held() int32 {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.heldAt
}

// Runs of TestReplicasLostAck.
const (
	// replicaRolling: a rolling upgrade: the replicas are stopped as
	// SIGTERM does, one after another, each while the broker holds a
	// Produce request of a node it serves, restarted, and waited for until
	// it serves its nodes again, before the next.
	replicaRolling = "rolling"
	// replicaKill: at the lost acknowledgement the replica the request went
	// through is killed as SIGKILL does and started again.
	replicaKill = "kill"
	// replicaLeader: at the lost acknowledgement every partition's leader
	// moves to the next broker, which another replica owns.
	replicaLeader = "leader"
)

// replicaRecords is how many records each client writes in the replica
// runs: against a broker that takes replicaDelay over each Produce, enough
// for the rolling restart to happen while they are written. librdkafka
// keeps every batch it has in flight, so each of its handovers waits for
// hundreds of requests (about 2 s), and its rolling restart took 7 to 10 s:
// with 120,000 records the fastest clients were done in 3.5 s, librdkafka's
// in 5 to 7, and some runs ended before the last replica was stopped; with
// 320,000 the tightest run went on 2.7 s past the rolling restart.
const (
	replicaRecords = 320000
	replicaDelay   = 5 * time.Millisecond
	replicaHold    = 250 * time.Millisecond
)

// TestReplicasLostAck is TestLegacyLostAck through three replicas in front
// of a three-broker cluster (docs/replicas.md): each real client writes
// with acks=all, the shim drops one acknowledgement after the broker
// appended it and closes the connection, and meanwhile
//
//   - rolling: the three replicas are restarted one after another, each
//     stopped (its nodes handed over) while the broker holds a Produce
//     request of one of its nodes, started again and waited for;
//   - kill: the replica the dropped acknowledgement came through is
//     killed at once and started again;
//   - leader: every partition's leader moves to a broker another replica
//     owns.
//
// Nothing may be written twice, nothing acknowledged lost, and (rolling,
// leader) the client must report no error. The longest produce stall each
// client saw is logged.
func TestReplicasLostAck(t *testing.T) {
	for k, c := range legacyClients() {
		t.Run(c.name, func(t *testing.T) {
			requireClient(t, c.name, c.available())
			if !c.retries {
				// It never retries: any leader change, Kafka's own
				// included, fails its records; nothing for the proxy to
				// hand over without an error.
				testskip.Skip(t, "never retries (retries=0): a moving node fails its records with or without replicas")
			}
			for _, mode := range []string{replicaRolling, replicaKill, replicaLeader} {
				t.Run(mode, func(t *testing.T) { runReplicaLostAck(t, c, mode, k%fleetSize) })
			}
		})
	}
}

func runReplicaLostAck(t *testing.T, c legacyClient, mode string, via int) {
	topic := "replicas-" + strings.NewReplacer(" ", "-", "=", "-").Replace(c.name)
	tc := newClusterOf(t, fleetSize, topic)
	cluster := tc.kfake(t, "leader moves, held requests and in-process replicas")
	var sb *slowBroker
	records := recordsPerRun
	if mode == replicaRolling {
		sb = newSlowBroker(t, cluster, replicaDelay, replicaHold)
		records = replicaRecords
	}
	var dial func(ctx context.Context, network, addr string) (net.Conn, error)
	if sb != nil {
		dial = sb.dial
	}
	f := newReplicaFleet(t, cluster, dial)
	shim := newAckShim(t, f.listen[via], c.dropAt, tc.dial)
	if os.Getenv("E2E_DEBUG") == "1" {
		shim.setTrace(func(line string) { t.Log("shim: " + line) })
	}

	var faultErr atomic.Pointer[error]
	fail := func(err error) { faultErr.CompareAndSwap(nil, &err) }
	var faults atomic.Int64
	switch mode {
	case replicaKill:
		shim.setOnDrop(func() {
			i := f.replicaOf(shim.Stats().DropTarget)
			if i < 0 {
				fail(fmt.Errorf("the dropped request went to %s, no replica's", shim.Stats().DropTarget))
				return
			}
			f.kill(i)
			if err := f.start(i); err != nil {
				fail(err)
			}
			faults.Add(1)
		})
	case replicaLeader:
		shim.setOnDrop(func() {
			for p := int32(0); p < legacyPartitions; p++ {
				if err := cluster.MoveTopicPartition(topic, p, (cluster.LeaderFor(topic, p)+1)%fleetSize); err != nil {
					fail(err)
					return
				}
			}
			faults.Add(1)
		})
	}

	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	clientDone := make(chan struct{})
	rolled := make(chan time.Time, 1)
	if mode == replicaRolling {
		go func() {
			// Once the acknowledgement is lost (the client in its stride,
			// resending what it had in flight), restart each replica in
			// turn, each stopped with a request of its node in flight.
			// Not before: a request pipelined behind one a stopping replica
			// redirects is never answered (the connection closes), and the
			// shim would have no answer to drop.
			if !eventually(20*time.Second, func() bool { return shim.Stats().Dropped >= 1 }) {
				fail(fmt.Errorf("no acknowledgement was lost: the client sent %d Produce requests", shim.Stats().Produces))
				return
			}
			for i := range fleetSize {
				// Node i is replica i's. A client that writes to one
				// partition at a time (franz-go's default partitioner
				// sticks to one for 64 KiB) may write none of node i's
				// for a while, and kfake may have given node i no
				// partition: then any request in flight will do.
				leads := false
				for p := int32(0); p < legacyPartitions; p++ {
					leads = leads || cluster.LeaderFor(topic, p) == int32(i)
				}
				var held <-chan struct{}
				if leads {
					held = sb.arm(int32(i))
					select {
					case <-held:
					case <-time.After(time.Second):
						if sb.rearm(anyNode) {
							t.Logf("no request for node %d within 1s: replica %d is stopped with a request of another node held", i, i)
						}
					}
				} else {
					held = sb.arm(anyNode)
					t.Logf("node %d leads no partition: replica %d is stopped with a request of another node held", i, i)
				}
				select {
				case <-held:
				case <-clientDone:
					fail(fmt.Errorf("the client finished before replica %d was stopped: it must write for longer", i))
					return
				case <-time.After(20 * time.Second):
					fail(errors.New("no Produce request reached the broker in 20 s"))
					return
				}
				start := time.Now()
				if err := f.stop(i); err != nil {
					fail(fmt.Errorf("stop replica %d: %w", i, err))
				}
				stopped := time.Since(start)
				if err := f.start(i); err != nil {
					fail(err)
					return
				}
				if err := f.waitReady(i); err != nil {
					fail(err)
					return
				}
				t.Logf("replica %d: stopped with a request of node %d held %v, in %v; serving its nodes again %v after its stop began",
					i, sb.held(), replicaHold, stopped.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
				faults.Add(1)
			}
			rolled <- time.Now()
		}()
	}

	start := time.Now()
	res, err := c.produce(ctx, t, shim.Addr(), tc.topic(topic), produceOpts{n: records, auth: tc.sasl()})
	elapsed := time.Since(start)
	close(clientDone)
	if err != nil {
		t.Fatalf("%s: %v", c.name, err)
	}
	if mode == replicaRolling {
		select {
		case at := <-rolled:
			t.Logf("the rolling restart ended %v before the client finished", time.Since(at).Round(time.Millisecond))
		default:
			if faultErr.Load() == nil {
				t.Errorf("the client finished before the rolling restart did (%d of %d replicas restarted)", faults.Load(), fleetSize)
			}
		}
	}
	if p := faultErr.Load(); p != nil {
		t.Errorf("%s run: %v", mode, *p)
	}
	copies, stored := storedValues(t, tc, topic)
	st := shim.Stats()
	sent := make(map[string]bool, records)
	for i := 0; i < records; i++ {
		sent[value(i)] = true
	}
	duplicated, foreign := 0, 0
	for v, n := range copies {
		if !sent[v] {
			foreign += n
			continue
		}
		duplicated += n - 1
	}
	lost := 0
	var lostVals, dupVals []string
	for v, n := range copies {
		if n > 1 && len(dupVals) < 400 {
			dupVals = append(dupVals, v)
		}
	}
	if res.perValue {
		for _, i := range res.acked {
			if copies[value(i)] == 0 {
				lost++
				if len(lostVals) < 400 {
					lostVals = append(lostVals, value(i))
				}
			}
		}
	} else {
		distinct := 0
		for v := range sent {
			if copies[v] > 0 {
				distinct++
			}
		}
		lost = max(0, res.ackedCount-distinct)
	}
	t.Logf("%s (%s) %s via replica %d: sent %d, acknowledged %d, failed %d, stored %d, duplicated %d, lost %d; %d Produce requests, "+
		"%d partitions answered NOT_LEADER_OR_FOLLOWER, longest produce stall %v; replicas: %v redirected, %v nodes covered, %v reclaimed, %v partitions to warm again, %v Produce requests relayed for a node another replica serves; %v",
		c.name, res.version, mode, via, records, res.ackedCount, res.failed, stored, duplicated, lost, st.Produces,
		st.NotLeader, st.Stall.Round(time.Millisecond),
		f.sum("dedupproxy_replica_redirected_requests_total", ""), f.sum("dedupproxy_replica_handovers_total", "event=covered"),
		f.sum("dedupproxy_replica_handovers_total", "event=reclaimed"), f.sum("dedupproxy_replica_rewarm_partitions_total", ""),
		f.sum("dedupproxy_replica_foreign_produce_requests_total", ""), elapsed.Round(time.Millisecond))
	if len(res.errors) > 0 {
		t.Logf("%s reported errors, the first ones: %s", c.name, strings.Join(res.errors, "; "))
	}
	if st.Dropped != 1 {
		t.Errorf("the shim dropped %d responses, want 1 (%d Produce requests)", st.Dropped, st.Produces)
	}
	if want := map[string]int64{replicaRolling: fleetSize, replicaKill: 1, replicaLeader: 1}[mode]; faults.Load() != want {
		t.Errorf("the %s fault happened %d times, want %d", mode, faults.Load(), want)
	}
	if foreign > 0 {
		t.Errorf("%d stored records carry values the client never sent", foreign)
	}
	sort.Strings(dupVals)
	sort.Strings(lostVals)
	if len(dupVals) > 0 && os.Getenv("E2E_DEBUG") == "1" {
		where := make(map[string]bool, len(dupVals))
		for _, v := range dupVals {
			where[v] = true
		}
		logWhereStored(t, tc, topic, where, stored)
	}
	switch {
	case c.repartitionsRetries && mode == replicaRolling:
		// kafkajs loses and duplicates records on any partial failure of
		// a send; the control below shows it does so without the proxy.
		t.Logf("known client bug: %s re-partitions a send it retries after NOT_LEADER_OR_FOLLOWER from one broker: %d written twice, %d lost", c.name, duplicated, lost)
		if duplicated == 0 && lost == 0 {
			break
		}
		// The bug does not show in every run: up to three controls.
		shown := false
		for try := 1; try <= 3 && !shown; try++ {
			ctlDup, ctlLost := notLeaderControl(t, c)
			t.Logf("control %d: %s directly against kfake with one NOT_LEADER_OR_FOLLOWER on one broker: %d written twice, %d lost", try, c.name, ctlDup, ctlLost)
			shown = ctlDup > 0 || ctlLost > 0
		}
		if !shown {
			t.Errorf("control: %s directly against kfake, one NOT_LEADER_OR_FOLLOWER, three runs: nothing lost or written twice; the known-bug exemption no longer holds", c.name)
		}
	case c.repartitionsRetries:
		// Its retry carries records to partitions another replica serves,
		// which never saw their originals (docs/replicas.md, "Limits").
		if lost > 0 {
			t.Errorf("%d acknowledged records are not in the log: %s", lost, strings.Join(lostVals, " "))
		}
		// At most one send's records: the one whose answer was lost.
		switch bound := c.recordsPerRequest; {
		case duplicated > bound:
			t.Errorf("through three replicas (%s), %d records were written twice, more than the %d documented (docs/replicas.md, \"Why nothing is written twice or lost\": "+
				"%s assigns its retry to partitions anew, and the copies sent to partitions another replica serves meet no original there)", mode, duplicated, bound, c.name)
		case duplicated > 0:
			t.Logf("not caught, as documented, within its bound: %d written twice, at most %d (docs/replicas.md, \"Why nothing is written twice or lost\": "+
				"%s assigns its retry to partitions anew, and the copies sent to partitions another replica serves meet no original there)", duplicated, bound, c.name)
		}
	case c.restampsResends && (mode == replicaKill || mode == replicaLeader) && duplicated > 0:
		// A retry that reaches a replica which knows the original only
		// from the log (the killed one's new incarnation: a kill hands no
		// state over; or, after a leader move, the new leader's owner when
		// the client's retry goes there first: docs/replicas.md, "Leader
		// moves") is matched with its timestamp (docs/legacy.md, "After a
		// restart"), and this client stamps its resends anew. Copies with
		// the same timestamp are not that miss.
		if lost > 0 {
			t.Errorf("%d acknowledged records are not in the log: %s", lost, strings.Join(lostVals, " "))
		}
		twice := make(map[string]bool, len(dupVals))
		for _, v := range dupVals {
			twice[v] = true
		}
		restamped, same := copiesByTimestamp(t, tc, topic, twice)
		if same > 0 || restamped == 0 {
			t.Errorf("through three replicas (%s), %d records were written twice, %d of those listed with the same timestamp (a restamped resend would carry a new one): %s",
				mode, duplicated, same, strings.Join(dupVals, " "))
			break
		}
		// At most the records it had in flight when the replica died or
		// the leaders moved.
		if duplicated > c.inFlight {
			t.Errorf("through three replicas (%s), %d records were written twice, more than the %d %s can have in flight (docs/legacy.md, \"After a restart\")",
				mode, duplicated, c.inFlight, c.name)
			break
		}
		t.Logf("not caught, as documented, within its bound (docs/legacy.md, \"After a restart\"): %s stamps a resend anew, and a replica that knows the original only from the log "+
			"matches it only with its timestamp; %d written twice (each copy with its own timestamp), at most %d, the first ones: %s",
			c.name, duplicated, c.inFlight, strings.Join(dupVals[:min(20, len(dupVals))], " "))
	default:
		if duplicated > 0 {
			t.Errorf("through three replicas (%s), %d records were written twice: %s", mode, duplicated, strings.Join(dupVals, " "))
		}
		if lost > 0 {
			t.Errorf("%d acknowledged records are not in the log: %s", lost, strings.Join(lostVals, " "))
		}
	}
	if mode != replicaKill && (res.failed > 0 || res.ackedCount != records) && !c.repartitionsRetries {
		t.Errorf("%s acknowledged %d of %d records (%d failed): a handover must cost no client error", c.name, res.ackedCount, records, res.failed)
	}
	if mode == replicaRolling && f.sum("dedupproxy_replica_handovers_total", "event=covered") < fleetSize {
		t.Errorf("only %v nodes were taken over during the rolling restart, want at least %d", f.sum("dedupproxy_replica_handovers_total", "event=covered"), fleetSize)
	}
}

// copiesByTimestamp reads topic back and counts, of the values in twice,
// those whose copies all carry timestamps of their own (restamped: each
// write a resend stamped anew) and those with two copies of one timestamp.
func copiesByTimestamp(t *testing.T, c *testCluster, topic string, twice map[string]bool) (restamped, same int) {
	t.Helper()
	stamps := make(map[string][]int64, len(twice))
	eachStored(t, c, topic, func(r *kgo.Record) {
		if twice[string(r.Value)] {
			stamps[string(r.Value)] = append(stamps[string(r.Value)], r.Timestamp.UnixMilli())
		}
	})
	for _, ts := range stamps {
		sort.Slice(ts, func(i, j int) bool { return ts[i] < ts[j] })
		dup := false
		for i := 1; i < len(ts); i++ {
			dup = dup || ts[i] == ts[i-1]
		}
		if dup {
			same++
		} else if len(ts) > 1 {
			restamped++
		}
	}
	return restamped, same
}

// notLeaderControl runs client c straight against a three-broker kfake that
// answers one Produce request NOT_LEADER_OR_FOLLOWER, with no proxy, and
// returns how many records were written twice and how many acknowledged
// ones are missing.
func notLeaderControl(t *testing.T, c legacyClient) (duplicated, lost int) {
	t.Helper()
	const topic = "control-not-leader"
	tc := newClusterOf(t, fleetSize, topic)
	cluster := tc.kfake(t, "fault injection")
	var n atomic.Int64
	cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.NotLeaderForPartition, Count: 1,
		When: func(kmsg.Request) bool { return n.Add(1) == 10 }})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := c.produce(ctx, t, cluster.ListenAddrs()[0], tc.topic(topic), produceOpts{n: recordsPerRun, auth: tc.sasl()})
	if err != nil {
		t.Fatalf("control: %v", err)
	}
	copies, _ := storedValues(t, tc, topic)
	for _, k := range copies {
		duplicated += k - 1
	}
	for _, i := range res.acked {
		if copies[value(i)] == 0 {
			lost++
		}
	}
	return duplicated, lost
}
