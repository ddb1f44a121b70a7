package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"net/http"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"gopkg.in/yaml.v3"

	"github.com/dedupproxy/dedupproxy/internal/testskip"
	"github.com/dedupproxy/dedupproxy/proxy"
)

// TestMain lets a test run this binary as the real command (re-executing
// the test binary with DEDUPPROXY_RUN_MAIN=1), so signal handling and the
// exit code are tested in a real process without building anything.
func TestMain(m *testing.M) {
	if os.Getenv("DEDUPPROXY_RUN_MAIN") == "1" {
		main()
		return
	}
	os.Exit(testskip.Run(m))
}

// TestConfigExample keeps config.example.yaml and proxy.Config in step:
// the file parses with unknown keys rejected, validates, names every field,
// and the defaults it states are the code's.
func TestConfigExample(t *testing.T) {
	const path = "../../config.example.yaml"
	cfg, err := readConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("config.example.yaml does not validate: %v", err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var keys map[string]any
	if err := yaml.Unmarshal(raw, &keys); err != nil {
		t.Fatal(err)
	}
	var check func(typ reflect.Type, keys map[string]any, where string)
	check = func(typ reflect.Type, keys map[string]any, where string) {
		for i := range typ.NumField() {
			f := typ.Field(i)
			tag := strings.Split(f.Tag.Get("yaml"), ",")[0]
			v, ok := keys[tag]
			if !ok {
				t.Errorf("config.example.yaml does not document %s%q", where, tag)
				continue
			}
			if sub, isMap := v.(map[string]any); isMap && f.Type.Kind() == reflect.Struct {
				check(f.Type, sub, where+tag+".")
			}
		}
	}
	check(reflect.TypeFor[proxy.Config](), keys, "")
	// Apart from the example values (upstream, nodes, dedup.topics), the file states
	// the defaults.
	var defaults proxy.Config
	defaults.EnsureDefaults()
	cfg.Upstream, cfg.Nodes, cfg.Dedup.Topics = nil, nil, nil
	if !reflect.DeepEqual(cfg, defaults) {
		t.Errorf("config.example.yaml states other defaults than the code:\nfile: %+v\ncode: %+v", cfg, defaults)
	}
}

func TestFlagsWinOverFile(t *testing.T) {
	path := t.TempDir() + "/c.yaml"
	if err := os.WriteFile(path, []byte("listen: 127.0.0.1:7000\nupstream: [a:1]\nmax_inflight: 9\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig([]string{"--config", path, "--listen", "127.0.0.1:8000", "--upstream", "b:1, c:2"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:8000" || !reflect.DeepEqual(cfg.Upstream, []string{"b:1", "c:2"}) || cfg.MaxInflight != 9 {
		t.Fatalf("got listen=%s upstream=%v max_inflight=%d", cfg.Listen, cfg.Upstream, cfg.MaxInflight)
	}
	if err := os.WriteFile(path, []byte("lisen: 127.0.0.1:7000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loadConfig([]string{"--config", path}); err == nil || !strings.Contains(err.Error(), "lisen") {
		t.Fatalf("a misspelt key must be an error naming it, got %v", err)
	}
	if _, err := loadConfig([]string{"--listen", "0.0.0.0:9092"}); err == nil || !strings.Contains(err.Error(), "advertise") {
		t.Fatalf("listening on every interface without advertise must be an error, got %v", err)
	}
}

// logWatcher collects a child's or run's log lines and finds values in them.
type logWatcher struct {
	mu    sync.Mutex
	lines []string
	cond  chan struct{}
}

func newLogWatcher() *logWatcher { return &logWatcher{cond: make(chan struct{}, 1)} }

func (w *logWatcher) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.lines = append(w.lines, strings.Split(strings.TrimRight(string(p), "\n"), "\n")...)
	w.mu.Unlock()
	select {
	case w.cond <- struct{}{}:
	default:
	}
	return len(p), nil
}

// await returns the first submatch of re in a log line, waiting up to 30s.
func (w *logWatcher) await(t *testing.T, re string) string {
	t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.After(30 * time.Second)
	for {
		w.mu.Lock()
		for _, l := range w.lines {
			if m := rx.FindStringSubmatch(l); m != nil {
				w.mu.Unlock()
				if len(m) > 1 {
					return m[1]
				}
				return m[0]
			}
		}
		all := strings.Join(w.lines, "\n")
		w.mu.Unlock()
		select {
		case <-w.cond:
		case <-deadline:
			t.Fatalf("no log line matching %q in:\n%s", re, all)
		}
	}
}

// TestEmbeddedClusterOutOfTheBox runs the command with no upstream, as the
// README's first command does: it starts its own cluster, a client produces
// and consumes through it, and the admin endpoints answer.
func TestEmbeddedClusterOutOfTheBox(t *testing.T) {
	logs := newLogWatcher()
	ctx, cancel := context.WithCancel(context.Background())
	exit := make(chan int, 1)
	go func() {
		exit <- run(ctx, []string{"--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"}, io.Discard, logs)
	}()
	defer func() {
		cancel()
		select {
		case code := <-exit:
			if code != 0 {
				t.Errorf("exit code %d", code)
			}
		case <-time.After(30 * time.Second):
			t.Error("run did not return after cancel")
		}
	}()
	logs.await(t, `embedded in-memory 3-broker`)
	addr := logs.await(t, `listener=bootstrap addr=(\S+)`)
	admin := logs.await(t, `admin listening" addr=(\S+)`)

	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DefaultProduceTopic("newcomer"), kgo.AllowAutoTopicCreation(),
		kgo.ConsumeTopics("newcomer"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	pctx, pcancel := context.WithTimeout(ctx, 30*time.Second)
	defer pcancel()
	if err := cl.ProduceSync(pctx, &kgo.Record{Value: []byte("hello")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	fs := cl.PollFetches(pctx)
	if fs.NumRecords() != 1 || string(fs.Records()[0].Value) != "hello" {
		t.Fatalf("consumed %d records (%v)", fs.NumRecords(), fs.Errors())
	}
	for path, want := range map[string]string{"/healthz": "ok", "/readyz": "ok", "/metrics": `dedupproxy_requests_total{api="Produce"} 1`} {
		resp, err := http.Get("http://" + admin + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), want) {
			t.Errorf("GET %s: %d, body lacks %q:\n%.2000s", path, resp.StatusCode, want, body)
		}
	}
}

// TestSIGTERMDrainsInflight runs the command as a real process, holds a
// Produce inside the broker, sends SIGTERM: the proxy stops accepting, the
// Produce completes and is acknowledged, and the process exits 0.
func TestSIGTERMDrainsInflight(t *testing.T) {
	const topic = "sigterm"
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		once.Do(func() { close(entered) })
		<-release
		return nil, nil, false
	})
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()

	cmd, logs, exited := startChild(t, "--upstream", strings.Join(c.ListenAddrs(), ","), "--listen", "127.0.0.1:0", "--admin", "off")
	addr := logs.await(t, `listener=bootstrap addr=(\S+)`)

	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	req := kmsg.NewPtrProduceRequest()
	req.SetVersion(9)
	req.Acks, req.TimeoutMillis = -1, 5000
	pt := kmsg.NewProduceRequestTopic()
	pt.Topic = topic
	pp := kmsg.NewProduceRequestTopicPartition()
	pp.Records = minimalBatch()
	pt.Partitions = append(pt.Partitions, pp)
	req.Topics = append(req.Topics, pt)
	if _, err := conn.Write(kmsg.NewRequestFormatter().AppendRequest(nil, req, 1)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("produce never reached the broker")
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	logs.await(t, `shutting down`)
	close(release)

	var head [4]byte
	if _, err := io.ReadFull(conn, head[:]); err != nil {
		t.Fatalf("no acknowledgement for the in-flight produce: %v", err)
	}
	body := make([]byte, binary.BigEndian.Uint32(head[:]))
	if _, err := io.ReadFull(conn, body); err != nil {
		t.Fatal(err)
	}
	resp := kmsg.NewPtrProduceResponse()
	resp.SetVersion(9)
	if err := resp.ReadFrom(body[5:]); err != nil {
		t.Fatal(err)
	}
	if code := resp.Topics[0].Partitions[0].ErrorCode; code != 0 {
		t.Fatalf("in-flight produce answered with error %d", code)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("process exit: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("process did not exit after SIGTERM")
	}
	logs.await(t, `msg=stopped`)
}

// minimalBatch is a valid v2 record batch holding one record with value "x",
// hand-encoded so this test needs no client library.
func minimalBatch() []byte {
	b := kmsg.RecordBatch{Magic: 2, ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1, NumRecords: 1}
	// record: length, attributes, ts delta, offset delta, key -1, value len 1, "x", 0 headers (zigzag varints)
	b.Records = []byte{0x10, 0x00, 0x00, 0x00, 0x01, 0x02, 'x', 0x00}
	raw := b.AppendTo(nil)
	binary.BigEndian.PutUint32(raw[8:], uint32(len(raw)-12))
	binary.BigEndian.PutUint32(raw[17:], crc32c(raw[21:]))
	return raw
}

func crc32c(b []byte) uint32 { return crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)) }

// TestDemo runs `dedupproxy demo` and checks the story it tells: a legacy
// producer's retry is stored twice straight and once through the proxy; an
// idempotent retry reaches the cluster straight but not through the proxy;
// a reused sequence is silently swallowed by Kafka but refused by the proxy.
func TestDemo(t *testing.T) {
	var out strings.Builder
	if err := runDemo(context.Background(), &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"straight to the cluster: retry answered success; account 7 charged $84 in 2 record(s)\n",
		"through dedupproxy     : retry answered success; account 7 charged $42 in 1 record(s)\n",
		"straight to the cluster: retry answered success; account 7 charged $42 in 1 record(s); writes that reached the cluster: 2",
		"through dedupproxy     : retry answered success; account 7 charged $42 in 1 record(s); writes that reached the cluster: 1",
		"straight to the cluster: the $17 payment was answered success; the log holds 1 record(s), $42",
		"through dedupproxy     : the $17 payment was answered OUT_OF_ORDER_SEQUENCE_NUMBER; the log holds 1 record(s), $42",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
}

// TestAdminPortCheck: the admin port is checked against the listeners the
// proxy actually binds, not a fixed window. Two set-ups the old 1024-port
// window refused are valid; a real collision — node 0's listener (listen
// port + 1) on the admin port — is found when the node's listener binds
// during start, and the command exits 2 (a configuration error) saying
// whose port it is.
func TestAdminPortCheck(t *testing.T) {
	for _, args := range [][]string{
		{"--listen", "127.0.0.1:29092", "--admin", "127.0.0.1:29644"},
		{"--listen", "0.0.0.0:9000", "--advertise", "proxy.example:9000", "--admin", ":9500"},
	} {
		if _, err := loadConfig(args); err != nil {
			t.Errorf("%v: %v; want valid", args, err)
		}
	}
	if _, err := loadConfig([]string{"--listen", "127.0.0.1:9092", "--admin", "127.0.0.1:9092"}); err == nil || !strings.Contains(err.Error(), "same port") {
		t.Errorf("admin on the listen port: %v; want an error", err)
	}

	// The real collision, on free ports: admin localhost:P+1 with listen
	// 127.0.0.1:P, and a one-broker cluster whose node 0 takes P+1.
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	port := 0
	for p := 33000; p < 34000 && port == 0; p += 2 {
		a, errA := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		b, errB := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p+1)))
		if errA == nil && errB == nil {
			port = p
		}
		for _, ln := range []net.Listener{a, b} {
			if ln != nil {
				ln.Close()
			}
		}
	}
	if port == 0 {
		testskip.Skip(t, "no two consecutive free ports")
	}
	logs := newLogWatcher()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code := run(ctx, []string{"--upstream", strings.Join(c.ListenAddrs(), ","),
		"--listen", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		"--admin", net.JoinHostPort("localhost", strconv.Itoa(port+1))}, io.Discard, logs)
	if code != 2 {
		t.Fatalf("exit code %d, want 2", code)
	}
	logs.await(t, fmt.Sprintf(`cannot start.*port %d for node 0 is the admin listener's`, port+1))
}
