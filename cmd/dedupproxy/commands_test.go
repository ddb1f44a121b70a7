package main

import (
	"context"
	"flag"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestSubcommandHelp: every subcommand answers --help, -h and "help NAME"
// with the same help on stdout, exit 0, and runs nothing: the demo starts
// no cluster, the cluster does not listen.
func TestSubcommandHelp(t *testing.T) {
	for _, sc := range subcommands {
		if sc.name == "help" {
			continue
		}
		var first string
		for _, args := range [][]string{{sc.name, "--help"}, {sc.name, "-h"}, {"help", sc.name}} {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			var stdout, stderr strings.Builder
			start := time.Now()
			code := run(ctx, args, &stdout, &stderr)
			cancel()
			out := stdout.String()
			if code != 0 || stderr.Len() > 0 || !strings.HasPrefix(out, "dedupproxy "+sc.name+": ") || !strings.Contains(out, "\nUsage:\n  dedupproxy "+sc.name) {
				t.Errorf("%v: exit %d, stderr %q, stdout:\n%s", args, code, stderr.String(), out)
			}
			if took := time.Since(start); took > 5*time.Second || strings.Contains(out, "An embedded Kafka cluster is running") || strings.Contains(out, "\nbootstrap ") {
				t.Errorf("%v ran the subcommand (%v):\n%s", args, took, out)
			}
			if first == "" {
				first = out
			} else if out != first {
				t.Errorf("%v prints other help than %s --help", args, sc.name)
			}
		}
		// Arguments a subcommand does not take are a mistake: exit 2, a
		// hint to its help.
		code, out, errOut := runOut(sc.name, "--no-such-flag", "--topic", "t")
		if code != 2 || out != "" || !strings.Contains(errOut, "dedupproxy "+sc.name+": unknown flag --no-such-flag") || !strings.Contains(errOut, "--help") {
			t.Errorf("%s --no-such-flag: exit %d, stdout %q, stderr %q", sc.name, code, out, errOut)
		}
	}
	if code, _, errOut := runOut("help", "nosuch"); code != 2 || !strings.Contains(errOut, `no subcommand "nosuch"`) {
		t.Errorf("help nosuch: exit %d, stderr %q", code, errOut)
	}
}

// TestHelpGrouped: the proxy's help lists its flags under one heading per
// concern, each flag once, none left over, and states what the replica
// flags require of each other.
func TestHelpGrouped(t *testing.T) {
	code, out, _ := runOut("--help")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	var headings []string
	count := map[string]int{}
	for _, line := range strings.Split(out, "\n") {
		if m := regexp.MustCompile(`^([A-Z][A-Za-z ]+):$`).FindStringSubmatch(line); m != nil {
			headings = append(headings, m[1])
		}
		if m := regexp.MustCompile(`^  --([a-z-]+)( \S+)?$`).FindStringSubmatch(line); m != nil {
			count[m[1]]++
		}
	}
	want := []string{"Usage", "Config", "Listeners", "Upstream", "TLS and SASL", "Dedup", "Replicas", "Admin", "Logging"}
	if strings.Join(headings, "|") != strings.Join(want, "|") {
		t.Errorf("headings %q, want %q", headings, want)
	}
	newFlags().fs.VisitAll(func(f *flag.Flag) {
		if count[f.Name] != 1 {
			t.Errorf("--%s is listed %d times", f.Name, count[f.Name])
		}
	})
	for _, want := range []string{"--replica-admin is required when replicas share a host", "--tls-client-ca needs them", "Exit codes: 0 done, 2 a configuration error"} {
		if !strings.Contains(strings.Join(strings.Fields(out), " "), want) {
			t.Errorf("help does not say %q", want)
		}
	}
}

// TestAuditHelpGrouped: dedupproxy audit's help puts every flag under a
// heading, and says where the embedded cluster stands.
func TestAuditHelpGrouped(t *testing.T) {
	code, out, _ := runOut("audit", "--help")
	if code != 0 || strings.Contains(out, "\nOther:\n") {
		t.Fatalf("exit %d; a flag in no group:\n%s", code, out)
	}
	newAuditFlags().fs.VisitAll(func(f *flag.Flag) {
		if strings.Count(out, "\n  --"+f.Name+"\n")+strings.Count(out, "\n  --"+f.Name+" ") != 1 {
			t.Errorf("--%s is not listed once", f.Name)
		}
	})
	if strings.Contains(out, `"embedded"`) || !strings.Contains(out, "dedupproxy cluster") {
		t.Errorf("audit --help offers the embedded cluster, or does not name dedupproxy cluster:\n%s", out)
	}
}

// startCluster runs dedupproxy cluster in-process on free ports and
// returns its bootstrap address; the cluster stops at the test's end.
func startCluster(t *testing.T, args ...string) string {
	t.Helper()
	stdout := newLogWatcher()
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan int, 1)
	var stderr strings.Builder
	go func() { exited <- run(ctx, append([]string{"cluster", "--port", "0"}, args...), stdout, &stderr) }()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-exited:
			if code != 0 {
				t.Errorf("dedupproxy cluster: exit %d, stderr %q", code, stderr.String())
			}
		case <-time.After(30 * time.Second):
			t.Error("dedupproxy cluster did not stop")
		}
	})
	return stdout.await(t, `^bootstrap (\S+)$`)
}

// TestClusterCommand: dedupproxy cluster serves a Kafka cluster a client
// produces to and consumes from, at the address it prints; its brokers are
// on consecutive ports from --port; a port already taken exits 2.
func TestClusterCommand(t *testing.T) {
	addr := startCluster(t, "--brokers", "2", "--partitions", "4")
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DefaultProduceTopic("trial"), kgo.AllowAutoTopicCreation(),
		kgo.ConsumeTopics("trial"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("one")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if fs := cl.PollFetches(ctx); fs.NumRecords() != 1 {
		t.Fatalf("consumed %d records: %v", fs.NumRecords(), fs.Errors())
	}
	meta, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if len(meta.Brokers) != 2 || len(meta.Topics) != 1 || len(meta.Topics[0].Partitions) != 4 {
		t.Errorf("metadata: %d brokers, topics %+v; want 2 brokers, one topic of 4 partitions", len(meta.Brokers), meta.Topics)
	}

	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	port := taken.Addr().(*net.TCPAddr).Port
	code, out, errOut := runOut("cluster", "--port", strconv.Itoa(port), "--brokers", "1")
	if code != 2 || out != "" || !strings.Contains(errOut, "address already in use") || !strings.Contains(errOut, "--port") {
		t.Errorf("cluster on a taken port: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// TestAuditNeedsACluster: dedupproxy audit against the embedded cluster
// (which lives inside a proxy process) says so and names dedupproxy
// cluster, exit 2; against dedupproxy cluster it reads the topic.
func TestAuditNeedsACluster(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte("upstream: embedded\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"--upstream", "embedded"}, {"--config", path}, {}} {
		code, _, errOut := runOut(append([]string{"audit", "--topic", "t"}, args...)...)
		if code != 2 || !strings.Contains(errOut, "the embedded cluster lives inside a proxy process") || !strings.Contains(errOut, "dedupproxy cluster") {
			t.Errorf("audit %v: exit %d, stderr %q", args, code, errOut)
		}
	}
	addr := startCluster(t)
	produce(t, []kgo.Opt{kgo.SeedBrokers(addr), kgo.AllowAutoTopicCreation()}, "audited", []*kgo.Record{{Value: []byte("a")}, {Value: []byte("a")}})
	rep := runAuditJSON(t, "--upstream", addr, "--topic", "audited")
	if rep.Records != 2 || rep.Copies != 1 {
		t.Errorf("audit of dedupproxy cluster: %d records, %d copies; want 2, 1", rep.Records, rep.Copies)
	}
	// A replica's config file, whose index the replica takes from its
	// host name or a flag: the audit reads the cluster it names.
	replicaCfg := filepath.Join(t.TempDir(), "replica.yaml")
	if err := os.WriteFile(replicaCfg, []byte("upstream: "+addr+"\nreplicas: [127.0.0.1:9092, 127.0.0.1:9192]\nreplica_admin: [127.0.0.1:9080, 127.0.0.1:9180]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if rep := runAuditJSON(t, "--config", replicaCfg, "--topic", "audited"); rep.Copies != 1 {
		t.Errorf("audit with a replica's config file: %d copies, want 1", rep.Copies)
	}
}

// TestExitCodes: a configuration error exits 2 whether the flag parser,
// the config file, a file it names or a port finds it (nothing started);
// a failure at run time, a drain that timed out, exits 1
// (docs/operations.md, "Exit codes").
func TestExitCodes(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "held"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	upstream := strings.Join(c.ListenAddrs(), ",")
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.pem")
	for _, tc := range []struct {
		name string
		args []string
		want string // in stderr
	}{
		{"missing TLS file", []string{"--tls-cert", missing, "--tls-key", missing}, "no such file"},
		{"missing SASL password file", []string{"--upstream-sasl-mechanism", "PLAIN", "--upstream-sasl-user", "u", "--upstream-sasl-password-file", missing}, "no such file"},
		{"admin port taken", []string{"--admin", taken.Addr().String()}, "cannot start the admin listener"},
		{"listen port taken", []string{"--admin", "off", "--listen", taken.Addr().String()}, "bootstrap listener"},
		{"placeholder upstream", []string{"--config", "../../config.example.yaml"}, "is a placeholder"},
	} {
		args := append([]string{"--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"}, tc.args...)
		if tc.args[0] != "--config" {
			args = append(args, "--upstream", upstream)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var stderr strings.Builder
		start := time.Now()
		code := run(ctx, args, io.Discard, &stderr)
		cancel()
		t.Logf("%s: exit %d after %v", tc.name, code, time.Since(start))
		if code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%s: exit %d, want 2; stderr lacks %q:\n%s", tc.name, code, tc.want, stderr.String())
		}
	}

	// At run time: a Produce the broker holds past drain_timeout.
	entered, release := make(chan struct{}, 1), make(chan struct{})
	defer close(release)
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
		return nil, nil, false
	})
	cfg := filepath.Join(dir, "drain.yaml")
	if err := os.WriteFile(cfg, []byte("upstream: "+upstream+"\nlisten: 127.0.0.1:0\nadmin: \"off\"\ndrain_timeout: 300ms\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	logs := newLogWatcher()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exited := make(chan int, 1)
	go func() { exited <- run(ctx, []string{"--config", cfg}, io.Discard, logs) }()
	addr := logs.await(t, `listener=bootstrap addr=(\S+)`)
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	if err := askMetadata(conn, "held"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(produceFrame("held", minimalBatch())); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the Produce never reached the broker")
	}
	cancel()
	select {
	case code := <-exited:
		if code != 1 {
			t.Errorf("drain timed out: exit %d, want 1", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no exit 30 s after the signal")
	}
	logs.await(t, `drain timed out`)
}

// TestClusterTimeOutOnce: with --time-out-once every write is stored and
// its first send answered REQUEST_TIMED_OUT, so a producer without
// idempotence that retries has written it twice, while an idempotent one's
// retry is deduplicated by the broker, as Kafka does.
func TestClusterTimeOutOnce(t *testing.T) {
	addr := startCluster(t, "--time-out-once")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		topic string
		opts  []kgo.Opt
		want  int
	}{
		{"legacy", []kgo.Opt{kgo.DisableIdempotentWrite()}, 2},
		{"idempotent", nil, 1},
	} {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addr), kgo.DefaultProduceTopic(tc.topic), kgo.AllowAutoTopicCreation()}, tc.opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("once")}).FirstErr(); err != nil {
			t.Fatalf("%s: %v", tc.topic, err)
		}
		ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, tc.topic)
		cl.Close()
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		ends.Each(func(o kadm.ListedOffset) { got += int(o.Offset) })
		if got != tc.want {
			t.Errorf("%s producer: the topic holds %d records, want %d", tc.topic, got, tc.want)
		}
	}
}
