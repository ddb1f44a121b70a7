package main

import (
	"bufio"
	"context"
	"flag"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/config"
)

// runOut runs the command in-process and returns its exit code, stdout and
// stderr.
func runOut(args ...string) (int, string, string) {
	var stdout, stderr strings.Builder
	code := run(context.Background(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// TestHelp: --help, -h and help print the subcommands and every flag to
// stdout and exit 0.
func TestHelp(t *testing.T) {
	var first string
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		code, out, errOut := runOut(args...)
		if code != 0 || errOut != "" {
			t.Fatalf("%v: exit %d, stderr %q", args, code, errOut)
		}
		for _, want := range []string{"dedupproxy cluster", "dedupproxy demo", "dedupproxy audit", "dedupproxy version", "dedupproxy help", "embedded"} {
			if !strings.Contains(out, want) {
				t.Errorf("%v: help lacks %q:\n%s", args, want, out)
			}
		}
		newFlags().fs.VisitAll(func(f *flag.Flag) {
			if !strings.Contains(out, "\n  --"+f.Name+" ") && !strings.Contains(out, "\n  --"+f.Name+"\n") {
				t.Errorf("%v: help lacks the flag --%s", args, f.Name)
			}
		})
		if first == "" {
			first = out
		} else if out != first {
			t.Errorf("%v prints other help than --help", args)
		}
	}
}

// TestVersion: "version" and --version print the version and the VCS
// revision from the build.
func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, out, errOut := runOut(args...)
		if code != 0 || errOut != "" || !strings.HasPrefix(out, "dedupproxy ") || !strings.Contains(out, "revision ") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
}

// TestUnknownFlag: one error line naming the nearest flag (as unknown
// config keys get theirs) and a hint, on stderr; exit 2.
func TestUnknownFlag(t *testing.T) {
	for _, tc := range []struct{ flag, line string }{
		{"--listne", "dedupproxy: unknown flag --listne; did you mean --listen?"},
		{"-upstraem", "dedupproxy: unknown flag --upstraem; did you mean --upstream?"},
		{"--tls-cetr", "dedupproxy: unknown flag --tls-cetr; did you mean --tls-cert?"},
		{"--zzzzzz", "dedupproxy: unknown flag --zzzzzz"},
	} {
		code, out, errOut := runOut(tc.flag, "127.0.0.1:0")
		want := tc.line + "\nRun 'dedupproxy --help' for the subcommands and flags.\n"
		if code != 2 || out != "" || errOut != want {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit 2 and stderr %q", tc.flag, code, out, errOut, want)
		}
	}
}

// TestConfigErrors: mistakes in the config file are told in its own terms.
func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"upstream: embedded\nlistne: 127.0.0.1:9092\n", "line 2: listne: unknown key; did you mean listen?"},
		{"upstream: embedded\ndrain_timeout: 30\n", "line 2: drain_timeout: 30 is not a duration; write 30s"},
		{"upstream: embedded\ndedup:\n  legacy:\n    window: two minutes\n", `dedup.legacy.window: "two minutes" is not a duration`},
		{"upstream: embedded\ndedup:\n  mdoe: observe\n", "dedup.mdoe: unknown key; did you mean mode?"},
		{"upstream: embedded\ndedup:\n  topics:\n    t:\n      legacy_mach: exact\n", "dedup.topics.t.legacy_mach: unknown key; did you mean legacy_match?"},
		{"upstream: embedded\nzzz: 1\n", "zzz: unknown key; known keys here: admin, admin_pprof, admin_tls,"},
		{"listen: 127.0.0.1:9092\n", "upstream is not set"},
		{"", "upstream is not set"},
		{"upstream: embedded\nlog_format: xml\n", `log_format "xml": want text or json`},
		{"upstream: [embedded, a:1]\n", "cannot be combined"},
	} {
		path := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(path, []byte(tc.yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := loadConfig([]string{"--config", path})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want it to contain %q", tc.yaml, err, tc.want)
		}
	}
}

// TestConfigUpstreamForms: upstream takes a list or the flag's comma
// string; --upstream stands in for a file that omits it.
func TestConfigUpstreamForms(t *testing.T) {
	want := []string{"a:1", "b:2"}
	for _, y := range []string{"upstream: a:1, b:2\n", "upstream: [a:1, b:2]\n", "upstream:\n  - a:1\n  - b:2\n", "listen: 127.0.0.1:9092\n"} {
		path := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := loadConfig([]string{"--config", path, "--upstream", "a:1,b:2"})
		if err != nil || !reflect.DeepEqual(cfg.Upstream, want) {
			t.Errorf("%q with --upstream: %v %v", y, cfg.Upstream, err)
		}
		if strings.HasPrefix(y, "listen") {
			continue
		}
		if cfg, err = loadConfig([]string{"--config", path}); err != nil || !reflect.DeepEqual(cfg.Upstream, want) {
			t.Errorf("%q: %v %v", y, cfg.Upstream, err)
		}
	}
}

// TestLogFlags: --log-level, --log-format and --dedup-mode set their keys.
func TestLogFlags(t *testing.T) {
	cfg, err := loadConfig([]string{"--log-level", "debug", "--log-format", "json", "--dedup-mode", "observe"})
	if err != nil || cfg.LogLevel != "debug" || cfg.LogFormat != config.LogJSON || cfg.Dedup.Mode != config.DedupObserve {
		t.Fatalf("%s %s %s %v", cfg.LogLevel, cfg.LogFormat, cfg.Dedup.Mode, err)
	}
	if _, err := loadConfig([]string{"--dedup-mode", "strict"}); err == nil || !strings.Contains(err.Error(), "want enforce, observe or off") {
		t.Fatalf("bad --dedup-mode: %v", err)
	}
	logs := newLogWatcher()
	ctx, cancel := context.WithCancel(context.Background())
	exit := make(chan int, 1)
	go func() {
		exit <- run(ctx, []string{"--listen", "127.0.0.1:0", "--admin", "off", "--log-format", "json"}, io.Discard, logs)
	}()
	logs.await(t, `^\{"time":.*"msg":"started"`)
	cancel()
	if code := <-exit; code != 0 {
		t.Fatalf("exit %d", code)
	}
}

// TestConfigExampleServes: config.example.yaml as is does not start: its
// upstream is a placeholder, and the error says so and names the way to a
// trial (exit 2). With --upstream pointing at dedupproxy cluster, as its
// header says, it starts the proxy (on free ports instead of its fixed
// ones, which other tests may hold) and a client produces through it.
func TestConfigExampleServes(t *testing.T) {
	code, _, errOut := runOut("--config", "../../config.example.yaml")
	if code != 2 || !strings.Contains(errOut, "upstream kafka-1.example.invalid:9092 is a placeholder") || !strings.Contains(errOut, "dedupproxy cluster") {
		t.Errorf("config.example.yaml as is: exit %d, stderr %q; want exit 2 naming the placeholder", code, errOut)
	}

	cluster := startCluster(t)
	logs := newLogWatcher()
	ctx, cancel := context.WithCancel(context.Background())
	exit := make(chan int, 1)
	go func() {
		exit <- run(ctx, []string{"--config", "../../config.example.yaml", "--upstream", cluster, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"}, io.Discard, logs)
	}()
	defer func() {
		cancel()
		if code := <-exit; code != 0 {
			t.Errorf("exit %d", code)
		}
	}()
	logs.await(t, `msg="dedupproxy starting" version=\S+ revision=\S+ go=\S+ config=../../config.example.yaml dedup_mode=enforce`)
	started := logs.await(t, `(msg=started .*)`)
	for _, want := range []string{"bootstrap=127.0.0.1:", "nodes=\"node=0 addr=127.0.0.1:", "admin=http://127.0.0.1:", "embedded=false", "upstream=" + cluster} {
		if !strings.Contains(started, want) {
			t.Errorf("start-up line lacks %q: %s", want, started)
		}
	}
	addr := logs.await(t, `listener=bootstrap addr=(\S+)`)
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DefaultProduceTopic("example"), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	pctx, pcancel := context.WithTimeout(ctx, 30*time.Second)
	defer pcancel()
	if err := cl.ProduceSync(pctx, &kgo.Record{Value: []byte("works as is")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// startChild runs the command as a real process (see TestMain) and returns
// its log watcher and a channel that yields its exit.
func startChild(t *testing.T, args ...string) (*exec.Cmd, *logWatcher, chan error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	// GORACE: the race detector otherwise sleeps 1s at exit, which
	// TestSIGTERMIdleConsumer would measure.
	cmd.Env = append(os.Environ(), "DEDUPPROXY_RUN_MAIN=1", "GORACE=atexit_sleep_ms=0")
	logs := newLogWatcher()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			logs.Write([]byte(sc.Text() + "\n"))
		}
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() { cmd.Process.Kill() })
	return cmd, logs, exited
}

// TestSIGHUPReload: SIGHUP applies a new log level and a new dedup mode
// to the running process, and names a key it cannot apply live (the legacy
// window) as needing a restart.
func TestSIGHUPReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("upstream: embedded\nlisten: 127.0.0.1:0\nadmin: \"off\"\nlog_level: info\n")
	cmd, logs, _ := startChild(t, "--config", path)
	addr := logs.await(t, `listener=bootstrap addr=(\S+)`)
	logs.await(t, `msg=started`)
	write("upstream: embedded\nlisten: 127.0.0.1:0\nadmin: \"off\"\nlog_level: debug\ndedup:\n  mode: observe\n  legacy:\n    window: 1m\n")
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	logs.await(t, `msg="SIGHUP: log level changed" from=info to=debug`)
	logs.await(t, `msg="SIGHUP: dedup settings changed" keys=dedup.mode mode=observe`)
	logs.await(t, `msg="SIGHUP: these keys changed but need a restart; the running values stay" keys=dedup.legacy`)
	// Debug lines now appear: a client that connects and leaves.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	logs.await(t, `level=DEBUG msg="client closed connection"`)
}

// TestSIGTERMIdleConsumer: a consumer long-polling an empty topic does not
// hold the process's exit.
func TestSIGTERMIdleConsumer(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "quiet"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The broker tells when the consumer's first Fetch reaches it: from
	// then on the long poll is held there.
	fetched := make(chan struct{})
	var once sync.Once
	c.ControlKey(int16(kmsg.Fetch), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		once.Do(func() { close(fetched) })
		return nil, nil, false
	})
	cmd, logs, exited := startChild(t, "--upstream", strings.Join(c.ListenAddrs(), ","), "--listen", "127.0.0.1:0")
	addr := logs.await(t, `listener=bootstrap addr=(\S+)`)
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics("quiet"), kgo.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	go func() {
		for !cl.PollFetches(context.Background()).IsClientClosed() {
		}
	}()
	select {
	case <-fetched:
	case <-time.After(30 * time.Second):
		t.Fatal("the consumer never fetched")
	}
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no exit 10s after SIGTERM")
	}
	took := time.Since(start)
	t.Logf("SIGTERM to exit with an idle consumer: %v", took)
	if took > 500*time.Millisecond {
		logs.mu.Lock()
		defer logs.mu.Unlock()
		t.Fatalf("SIGTERM with an idle consumer took %v; logs:\n%s", took, strings.Join(logs.lines, "\n"))
	}
}
