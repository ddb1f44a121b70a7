package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/internal/testports"
	"github.com/dedupproxy/dedupproxy/internal/testskip"
)

// processFleet is three dedupproxy processes (this test binary run as the
// command) on loopback, each with its own --replica-index, ports and
// advertised address, in front of one three-broker kfake cluster.
type processFleet struct {
	t      *testing.T
	args   [][]string
	listen []string
	admin  []string

	mu    sync.Mutex
	cmds  []*exec.Cmd
	logs  []*logWatcher
	exits []chan error
}

func newProcessFleet(t *testing.T, c *kfake.Cluster) *processFleet {
	f := &processFleet{t: t, cmds: make([]*exec.Cmd, 3), logs: make([]*logWatcher, 3), exits: make([]chan error, 3)}
	taken := map[int]bool{}
	for range 3 {
		p := testports.Block(t, 5, taken) // bootstrap, nodes 0..2, admin
		f.listen = append(f.listen, "127.0.0.1:"+strconv.Itoa(p))
		f.admin = append(f.admin, "127.0.0.1:"+strconv.Itoa(p+4))
	}
	for i := range 3 {
		f.args = append(f.args, []string{"--upstream", strings.Join(c.ListenAddrs(), ","),
			"--listen", f.listen[i], "--admin", f.admin[i],
			"--replicas", strings.Join(f.listen, ","), "--replica-index", strconv.Itoa(i),
			"--replica-admin", strings.Join(f.admin, ","), "--log-level", "info"})
	}
	for i := range 3 {
		f.start(i)
	}
	for i := range 3 {
		f.waitReady(i)
	}
	return f
}

func (f *processFleet) start(i int) {
	f.t.Helper()
	cmd, logs, exited := startChild(f.t, f.args[i]...)
	f.mu.Lock()
	f.cmds[i], f.logs[i], f.exits[i] = cmd, logs, exited
	f.mu.Unlock()
	logs.await(f.t, `msg=started`)
}

// readyz returns replica i's /readyz status and body.
func (f *processFleet) readyz(i int) (int, string) {
	resp, err := http.Get("http://" + f.admin[i] + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (f *processFleet) waitReady(i int) {
	f.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, body := f.readyz(i)
		if code == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("replica %d not ready: %d %s", i, code, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// signal sends sig to replica i and waits for its exit.
func (f *processFleet) signal(i int, sig syscall.Signal) error {
	f.mu.Lock()
	cmd, exited := f.cmds[i], f.exits[i]
	f.mu.Unlock()
	if err := cmd.Process.Signal(sig); err != nil {
		return err
	}
	select {
	case err := <-exited:
		return err
	case <-time.After(30 * time.Second):
		return fmt.Errorf("replica %d did not exit 30 s after %v", i, sig)
	}
}

// TestReplicaProcesses runs three replicas as real processes, configured by
// their flags, in front of a three-broker kfake. A legacy and an idempotent
// franz-go producer, bootstrapped through all three, write without pause
// while every replica in turn gets SIGTERM (it hands its nodes over, exits
// 0, is started again and becomes ready on /readyz), and then one is
// SIGKILLed and started again. /replica publishes the protocol's status,
// and at the end nothing was written twice or lost.
func TestReplicaProcesses(t *testing.T) {
	if testing.Short() {
		testskip.Skip(t, "runs three proxy processes")
	}
	const topic = "processes"
	c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(6, topic))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Every Produce takes the broker 5 ms: requests are in flight at every
	// stop.
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		c.SleepControl(func() { time.Sleep(5 * time.Millisecond) }) // the slow broker is the fault under test
		return nil, nil, false
	})
	f := newProcessFleet(t, c)

	// The status names the replica, its phase and the nodes it serves.
	resp, err := http.Get("http://" + f.admin[1] + "/replica")
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Index   int
		Phase   string
		Serving []int32
	}
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || st.Index != 1 || st.Phase != "serving" || len(st.Serving) != 1 || st.Serving[0] != 1 {
		t.Fatalf("GET /replica of replica 1: %+v %v; want index 1, serving, node 1", st, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var (
		mu     sync.Mutex
		acked  = map[string]bool{}
		errs   []error
		wg     sync.WaitGroup
		stop   = make(chan struct{})
		sent   int
		stalls = map[string]time.Duration{}
	)
	for _, idem := range []bool{false, true} {
		name := "idempotent"
		opts := []kgo.Opt{kgo.SeedBrokers(f.listen...), kgo.DefaultProduceTopic(topic), kgo.RequiredAcks(kgo.AllISRAcks()),
			kgo.MetadataMinAge(250 * time.Millisecond), kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond }),
			kgo.RecordPartitioner(kgo.RoundRobinPartitioner())}
		if !idem {
			name = "legacy"
			opts = append(opts, kgo.DisableIdempotentWrite())
		}
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			last := time.Now()
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-stop:
					cl.Flush(ctx)
					return
				case <-tick.C:
				}
				v := fmt.Sprintf("%s-%06d", name, i)
				mu.Lock()
				sent++
				mu.Unlock()
				cl.Produce(ctx, &kgo.Record{Value: []byte(v)}, func(r *kgo.Record, err error) {
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						errs = append(errs, err)
						return
					}
					now := time.Now()
					stalls[name] = max(stalls[name], now.Sub(last))
					last = now
					acked[string(r.Value)] = true
				})
			}
		}()
	}
	waitAcked := func(n int) {
		deadline := time.Now().Add(20 * time.Second)
		for {
			mu.Lock()
			got := len(acked)
			mu.Unlock()
			if got >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("only %d records acknowledged, want %d", got, n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitAcked(200)
	for i := range 3 {
		start := time.Now()
		if err := f.signal(i, syscall.SIGTERM); err != nil {
			t.Fatalf("replica %d after SIGTERM: %v", i, err)
		}
		f.logs[i].await(t, `msg="handed nodes over"`)
		stopped := time.Since(start)
		f.start(i)
		f.waitReady(i)
		t.Logf("replica %d: SIGTERM to exit %v, serving its nodes again %v after SIGTERM", i, stopped.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
		mu.Lock()
		n := len(acked)
		mu.Unlock()
		waitAcked(n + 100)
	}
	// SIGKILL: nothing handed over; its nodes wait for it.
	start := time.Now()
	if err := f.signal(2, syscall.SIGKILL); err == nil {
		t.Errorf("replica 2 exited cleanly after SIGKILL")
	}
	f.start(2)
	f.waitReady(2)
	t.Logf("replica 2: SIGKILL to serving its nodes again %v", time.Since(start).Round(time.Millisecond))
	mu.Lock()
	n := len(acked)
	mu.Unlock()
	waitAcked(n + 100)
	close(stop)
	wg.Wait()

	copies := map[string]int{}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	mu.Lock()
	want := len(acked)
	mu.Unlock()
	got := 0
	for polls := 0; got < want && polls < 2000 && ctx.Err() == nil; polls++ {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			copies[string(r.Value)]++
			got++
		})
	}
	// A duplicate would come in the same polls as the rest, or at most a
	// poll later: PollFetches waits for records until its context ends.
	for polls := 0; polls < 5; polls++ {
		pctx, pcancel := context.WithTimeout(ctx, 200*time.Millisecond)
		cl.PollFetches(pctx).EachRecord(func(r *kgo.Record) { copies[string(r.Value)]++ })
		pcancel()
	}
	mu.Lock()
	defer mu.Unlock()
	dups, lost := 0, 0
	for _, k := range copies {
		dups += k - 1
	}
	for v := range acked {
		if copies[v] == 0 {
			lost++
		}
	}
	t.Logf("sent %d, acknowledged %d, stored %d distinct, %d written twice, %d lost; produce errors %d; longest stall %v", sent, len(acked), len(copies), dups, lost, len(errs), stalls)
	if dups > 0 || lost > 0 {
		t.Errorf("%d records written twice, %d acknowledged records lost", dups, lost)
	}
	if len(errs) > 0 {
		t.Errorf("%d produce errors, the first: %v", len(errs), errs[0])
	}
}

// TestReplicaFlags: the replica flags and their config keys, the {i}
// template, and their mistakes told in the flags' terms (exit 2).
func TestReplicaFlags(t *testing.T) {
	cfg, err := loadConfig([]string{"--upstream", "k:9092", "--listen", "0.0.0.0:9092", "--admin", "0.0.0.0:9080",
		"--replicas", "dedupproxy-{i}.dedupproxy-headless.kafka.svc:9092", "--replica-count", "3", "--replica-index", "2",
		"--replica-owners", "7=0, 8=1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Replicas) != 1 || cfg.ReplicaCount != 3 || cfg.ReplicaIndex == nil || *cfg.ReplicaIndex != 2 ||
		cfg.ReplicaOwners[7] != 0 || cfg.ReplicaOwners[8] != 1 {
		t.Errorf("config from flags: %+v", cfg)
	}
	path := t.TempDir() + "/c.yaml"
	if err := writeFile(path, "upstream: k:9092\nlisten: 0.0.0.0:9092\nadmin: 0.0.0.0:9080\nreplicas: a.example:9092, b.example:9092\nreplica_index: 1\nreplica_owners: {5: 0}\n"); err != nil {
		t.Fatal(err)
	}
	if cfg, err = loadConfig([]string{"--config", path}); err != nil || len(cfg.Replicas) != 2 || *cfg.ReplicaIndex != 1 || cfg.ReplicaOwners[5] != 0 {
		t.Errorf("config file: %+v %v", cfg, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--replicas", "p-{i}.h:9092"}, "replica_count (--replica-count) must say how many"},
		{[]string{"--replicas", "a:9092,b:9092", "--replica-index", "two"}, "replica_index -1: there are 2 replicas, so want 0..1"},
		{[]string{"--replicas", "a:9092,b:9092", "--replica-index", "0", "--admin", "off"}, "replicas need the admin listener"},
		{[]string{"--replicas", "a:9092,b:9092", "--replica-index", "0", "--replica-owners", "3=4"}, "replica_owners[3]: replica 4 does not exist"},
	} {
		code, _, stderr := runOut(append([]string{"--upstream", "k:9092", "--listen", "127.0.0.1:9092"}, tc.args...)...)
		if code != 2 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 and %q", tc.args, code, stderr, tc.want)
		}
	}
}

func writeFile(path, s string) error { return os.WriteFile(path, []byte(s), 0o600) }

// TestReplicasOneHostWithoutAdminRefused: three replicas on one host, each
// with its own ports and --admin, but no --replica-admin. Each would take
// its own admin address for every peer's (this replica's admin port on
// their host), read its own state as theirs and, on SIGTERM, hand nothing
// over. Each refuses to start: exit 2, naming --replica-admin. A listen
// port that is not the replica's own entry in --replicas (it would
// advertise its nodes where nothing serves them) is refused too, naming
// --listen.
func TestReplicasOneHostWithoutAdminRefused(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(3))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var listen, admin []string
	taken := map[int]bool{}
	for range 3 {
		p := testports.Block(t, 5, taken)
		listen = append(listen, "127.0.0.1:"+strconv.Itoa(p))
		admin = append(admin, "127.0.0.1:"+strconv.Itoa(p+4))
	}
	exitOf := func(exited chan error) int {
		select {
		case err := <-exited:
			if ee, ok := err.(*exec.ExitError); ok {
				return ee.ExitCode()
			}
			if err == nil {
				return 0
			}
			t.Fatal(err)
		case <-time.After(20 * time.Second):
			t.Fatal("still running 20 s after its start: it was not refused")
		}
		return -1
	}
	base := func(i int) []string {
		return []string{"--upstream", strings.Join(c.ListenAddrs(), ","), "--listen", listen[i], "--admin", admin[i],
			"--replicas", strings.Join(listen, ","), "--replica-index", strconv.Itoa(i)}
	}
	type child struct {
		logs   *logWatcher
		exited chan error
	}
	var children []child
	for i := range 3 {
		_, logs, exited := startChild(t, base(i)...)
		children = append(children, child{logs, exited})
	}
	for i, ch := range children {
		if code := exitOf(ch.exited); code != 2 {
			t.Errorf("replica %d: exit %d, want 2", i, code)
		}
		ch.logs.await(t, `both on host "127.0.0.1".*--replica-admin`)
	}
	// Given --replica-admin, but listening on another port than its entry.
	args := base(1)
	args = append(args, "--replica-admin", strings.Join(admin, ","))
	args[3] = "127.0.0.1:" + strconv.Itoa(testports.Block(t, 1, taken))
	_, logs, exited := startChild(t, args...)
	if code := exitOf(exited); code != 2 {
		t.Errorf("listen %s for replicas[1] %s: exit %d, want 2", args[3], listen[1], code)
	}
	logs.await(t, `cannot serve replicas\[1\].*--listen`)
}
