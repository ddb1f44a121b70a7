package proc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/dedupproxy/dedupproxy/bench/load"
	"github.com/dedupproxy/dedupproxy/bench/wire"
)

// The bench runs every party in its own OS process: upstream, floor relay,
// proxy and load generator, so no garbage collector or scheduler is shared
// between what is measured and what measures. The bench binary re-executes
// itself (os.Executable; under go test, the test binary, whose TestMain
// dispatches the same way) with a hidden role as its first argument and
// childEnv set:
//
//	upstream -kind kfake|kfake-store|sink -partitions N -topics a,b
//	floor -seed host:port
//	load                  (reads a load.Spec as JSON on stdin)
//
// upstream and floor print one JSON line with their addresses on stdout
// and serve until stdin closes (the parent exits or stops them) or
// SIGTERM. load warms up, prints {"ready":true}, waits for a "go" line,
// runs one phase and prints its result. Every child gets SIGKILL when the
// parent dies (Pdeathsig), so an interrupted run leaks no processes.
const childEnv = "DEDUPPROXY_BENCH_CHILD"

// IsChild reports whether this process was started as a bench child.
func IsChild() bool { return os.Getenv(childEnv) == "1" }

// ChildMain runs a child role and returns its exit code.
func ChildMain(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "bench child: no role")
		return 2
	}
	var err error
	switch args[0] {
	case "upstream":
		err = upstreamChild(args[1:])
	case "floor":
		err = floorChild(args[1:])
	case "load":
		err = loadChild()
	default:
		err = fmt.Errorf("unknown role %q", args[0])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

// upstreamAddrs is what an upstream or floor child prints.
type upstreamAddrs struct {
	Addrs []string `json:"addrs"`
}

func upstreamChild(args []string) error {
	fs := flag.NewFlagSet("upstream", flag.ContinueOnError)
	kind := fs.String("kind", "kfake", "kfake (produce blackholed), kfake-store (keeps records) or sink")
	partitions := fs.Int("partitions", 6, "partitions per topic")
	topics := fs.String("topics", "bench-0", "topics, comma-separated")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var addrs []string
	var closeFn func()
	switch *kind {
	case "kfake", "kfake-store":
		opts := []kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(int32(*partitions), strings.Split(*topics, ",")...)}
		if *kind == "kfake" {
			// Produce is acknowledged and dropped: kfake neither stores
			// nor indexes records, so the upstream's cost stays flat.
			opts = append(opts, kfake.BlackholeProduce())
		}
		c, err := kfake.NewCluster(opts...)
		if err != nil {
			return err
		}
		addrs, closeFn = c.ListenAddrs(), c.Close
	case "sink":
		s, err := wire.StartSink("127.0.0.1:0", int32(*partitions))
		if err != nil {
			return err
		}
		addrs, closeFn = []string{s.Addr()}, s.Close
	default:
		return fmt.Errorf("-kind %q", *kind)
	}
	defer closeFn()
	return serveUntilStdinCloses(upstreamAddrs{addrs})
}

func floorChild(args []string) error {
	fs := flag.NewFlagSet("floor", flag.ContinueOnError)
	seed := fs.String("seed", "", "upstream bootstrap host:port")
	if err := fs.Parse(args); err != nil {
		return err
	}
	f, err := wire.StartFloor(*seed)
	if err != nil {
		return err
	}
	defer f.Close()
	return serveUntilStdinCloses(upstreamAddrs{[]string{f.Addr()}})
}

func serveUntilStdinCloses(v any) error {
	if err := json.NewEncoder(os.Stdout).Encode(v); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(done)
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	select {
	case <-done:
	case <-sig:
	}
	return nil
}

// loadReport is what a load child prints after its phase.
type loadReport struct {
	Sent, Acked, Failed int64
	Bytes               int64 // record value bytes acknowledged or consumed
	AckedInWindow       int64
	ElapsedNs           int64
	Hist                [][2]uint64 // sparse histogram: bucket index, count
	FirstErr            string
	AcksDropped         int64
}

func loadChild() error {
	in := bufio.NewReader(os.Stdin)
	line, err := in.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("read spec: %w", err)
	}
	var spec load.Spec
	if err := json.Unmarshal(line, &spec); err != nil {
		return fmt.Errorf("decode spec: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	out := json.NewEncoder(os.Stdout)
	var goErr error
	spec.OnStart = func() {
		if goErr = out.Encode(map[string]bool{"ready": true}); goErr != nil {
			return
		}
		l, err := in.ReadString('\n')
		if err != nil || strings.TrimSpace(l) != "go" {
			goErr = fmt.Errorf("waiting for go: %q %v", l, err)
		}
	}
	var shim *wire.Shim
	var dial func(context.Context, string, string) (net.Conn, error)
	if spec.RetryRate > 0 {
		shim = wire.NewShim(spec.RetryRate)
		defer shim.Close()
		dial = shim.Dial
		if spec.Cluster {
			// The shim reads frames: it speaks TLS to the real cluster,
			// the producers plaintext (and SASL) to it.
			c, err := load.ClusterFromEnv()
			if err != nil {
				return err
			}
			shim.Upstream = c.Dial
			spec.Cluster, spec.SASL = false, true
		}
	}
	res, err := load.Run(ctx, spec.Seeds, dial, spec)
	if goErr != nil {
		return goErr
	}
	if err != nil {
		return err
	}
	rep := loadReport{Sent: res.Sent, Acked: res.Acked, Failed: res.Failed, Bytes: res.Bytes, AckedInWindow: res.AckedInWindow,
		ElapsedNs: int64(res.Elapsed)}
	if res.FirstErr != nil {
		rep.FirstErr = res.FirstErr.Error()
	}
	if shim != nil {
		_, rep.AcksDropped = shim.Counts()
	}
	rep.Hist = res.Hist.Sparse()
	return out.Encode(rep)
}

// child is a running bench child process.
type child struct {
	cmd   *exec.Cmd
	pid   int
	stdin io.WriteCloser
	out   *bufio.Reader
	done  chan struct{}
	mu    sync.Mutex
	tail  []string // last stderr lines, for errors
}

// startChild starts the bench binary in role with args. stdin stays open
// until stop, which is how long-lived children know to keep serving.
func startChild(role string, args ...string) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, append([]string{role}, args...)...)
	// A -race build sleeps 1s at exit by default (atexit_sleep_ms) to let
	// reports flush; each phase's load child exits, so that would add a
	// second per phase under go test -race. Reports still reach stderr.
	cmd.Env = append(os.Environ(), childEnv+"=1", "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, pid: cmd.Process.Pid, stdin: stdin, out: bufio.NewReaderSize(stdout, 1<<20), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			c.mu.Lock()
			if len(c.tail) == 20 {
				c.tail = c.tail[1:]
			}
			c.tail = append(c.tail, sc.Text())
			c.mu.Unlock()
		}
		cmd.Wait()
	}()
	return c, nil
}

func (c *child) lastLines() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.tail, "\n")
}

// readJSON reads the child's next stdout line into v, giving up at ctx or
// after timeout (the child is then killed).
func (c *child) readJSON(ctx context.Context, timeout time.Duration, v any) error {
	type line struct {
		b   []byte
		err error
	}
	ch := make(chan line, 1)
	go func() {
		b, err := c.out.ReadBytes('\n')
		ch <- line{b, err}
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case l := <-ch:
		if l.err != nil {
			<-c.done
			return fmt.Errorf("child %s: %w\n%s", c.cmd.Args[1], l.err, c.lastLines())
		}
		return json.Unmarshal(l.b, v)
	case <-t.C:
		c.kill()
		return fmt.Errorf("child %s: no answer within %s\n%s", c.cmd.Args[1], timeout, c.lastLines())
	case <-ctx.Done():
		c.kill()
		return ctx.Err()
	}
}

func (c *child) kill() {
	c.cmd.Process.Kill()
	<-c.done
}

// stop closes stdin (a serving child then exits) and kills the child if it
// has not exited within 5s.
func (c *child) stop() {
	c.stdin.Close()
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
		c.kill()
	}
}

// Upstream is a running upstream (kfake, kfake-store or sink) process.
type Upstream struct {
	Addrs []string
	Pid   int
	Close func()
}

// StartUpstream starts an upstream child of kind serving topics.
func StartUpstream(ctx context.Context, kind string, topics []string, partitions int) (*Upstream, error) {
	c, err := startChild("upstream", "-kind", kind, "-partitions", fmt.Sprint(partitions), "-topics", strings.Join(topics, ","))
	if err != nil {
		return nil, err
	}
	var a upstreamAddrs
	if err := c.readJSON(ctx, 15*time.Second, &a); err != nil {
		c.kill()
		return nil, err
	}
	if len(a.Addrs) == 0 {
		c.stop()
		return nil, errors.New("upstream child printed no address")
	}
	return &Upstream{Addrs: a.Addrs, Pid: c.pid, Close: c.stop}, nil
}

// StartFloor starts a floor relay child in front of seed.
func StartFloor(ctx context.Context, seed string) (*Upstream, error) {
	c, err := startChild("floor", "-seed", seed)
	if err != nil {
		return nil, err
	}
	var a upstreamAddrs
	if err := c.readJSON(ctx, 15*time.Second, &a); err != nil {
		c.kill()
		return nil, err
	}
	return &Upstream{Addrs: a.Addrs, Pid: c.pid, Close: c.stop}, nil
}

// LoadPhase is a load child that has warmed up and waits for go.
type LoadPhase struct{ c *child }

// StartLoad starts a load child for spec and waits until it has warmed up.
func StartLoad(ctx context.Context, spec load.Spec) (*LoadPhase, error) {
	c, err := startChild("load")
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(spec)
	if err != nil {
		c.kill()
		return nil, err
	}
	if _, err := c.stdin.Write(append(b, '\n')); err != nil {
		c.kill()
		return nil, err
	}
	var ready struct{ Ready bool }
	if err := c.readJSON(ctx, 60*time.Second, &ready); err != nil {
		return nil, fmt.Errorf("load warm-up: %w", err)
	}
	return &LoadPhase{c}, nil
}

// Kill ends a phase that will not run.
func (l *LoadPhase) Kill() { l.c.kill() }

// Run starts the timed phase and returns its result.
func (l *LoadPhase) Run(ctx context.Context, timeout time.Duration) (load.Result, int64, error) {
	defer l.c.stop()
	if _, err := io.WriteString(l.c.stdin, "go\n"); err != nil {
		l.c.kill()
		return load.Result{}, 0, err
	}
	var rep loadReport
	if err := l.c.readJSON(ctx, timeout, &rep); err != nil {
		return load.Result{}, 0, err
	}
	res := load.Result{Sent: rep.Sent, Acked: rep.Acked, Failed: rep.Failed, Bytes: rep.Bytes, AckedInWindow: rep.AckedInWindow,
		Elapsed: time.Duration(rep.ElapsedNs), Hist: load.FromSparse(rep.Hist)}
	if rep.FirstErr != "" {
		res.FirstErr = errors.New(rep.FirstErr)
	}
	return res, rep.AcksDropped, nil
}
