// Package proc runs and measures the bench's processes: the proxy (built
// as released), the peer proxy, and the bench's own children (upstream,
// floor relay, load generator: the bench binary re-executed in a role), and
// reads what /proc and /metrics say about them. It decides no figure; the
// orchestrator (package main) does.
package proc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// BuildProxy compiles ./cmd/dedupproxy once into dir, with the release
// build's script (deploy/build.sh: static, no cgo), so the bench measures
// the binary that ships. A default go build links libc dynamically where
// cgo is available, and its mapped pages added about 2 MiB to the proxy's
// RSS. The proxy runs as its own process so its CPU time and peak RSS can
// be read from /proc without the load generator's (or kfake's) share mixed
// in.
func BuildProxy(ctx context.Context, dir string) (string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "dedupproxy")
	cmd := exec.CommandContext(ctx, "bash", filepath.Join("deploy", "build.sh"), out)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("deploy/build.sh: %w\n%s", err, b)
	}
	return out, nil
}

// ModuleRoot finds the directory holding go.mod, from the working directory
// up (go run ./bench runs in the root; go test runs in bench/).
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for range 32 {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	return "", errors.New("go.mod not found above the working directory")
}

// Proxy is a running dedupproxy process.
type Proxy struct {
	cmd       *exec.Cmd
	Pid       int
	Bootstrap string // bootstrap listener
	Admin     string // /metrics host:port
	done      chan struct{}

	mu   sync.Mutex
	tail []string // last stderr lines, for errors
}

var (
	reBootstrap = regexp.MustCompile(`msg=listening listener=bootstrap addr=(\S+)`)
	reAdmin     = regexp.MustCompile(`msg="admin listening" addr=(\S+)`)
)

// StartProxy runs bin against upstream with the given dedup mode, every
// address on 127.0.0.1:0, and waits for it to log its bootstrap and admin
// addresses. extra is appended to its config file (top-level YAML keys).
func StartProxy(ctx context.Context, bin, dir string, upstream []string, mode string, extra ...string) (*Proxy, error) {
	cfgPath := filepath.Join(dir, fmt.Sprintf("proxy-%d.yaml", time.Now().UnixNano()))
	// log_level info: the two address lines are logged at info, and the
	// proxy logs nothing per request at info, so it costs nothing here.
	cfg := fmt.Sprintf("upstream: [%s]\nlisten: 127.0.0.1:0\nadmin: 127.0.0.1:0\nlog_level: info\ndedup:\n  mode: %s\n",
		strings.Join(upstream, ", "), mode) + strings.Join(extra, "")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--config", cfgPath)
	// Killed with the bench, even if the bench itself is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Proxy{cmd: cmd, Pid: cmd.Process.Pid, done: make(chan struct{})}
	found := make(chan struct{})
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		signalled := false
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			if m := reBootstrap.FindStringSubmatch(line); m != nil && p.Bootstrap == "" {
				p.Bootstrap = m[1]
			}
			if m := reAdmin.FindStringSubmatch(line); m != nil && p.Admin == "" {
				p.Admin = m[1]
			}
			if len(p.tail) == 50 {
				p.tail = p.tail[1:]
			}
			p.tail = append(p.tail, line)
			ready := p.Bootstrap != "" && p.Admin != ""
			p.mu.Unlock()
			if ready && !signalled {
				signalled = true
				close(found)
			}
		}
		io.Copy(io.Discard, stderr)
		cmd.Wait()
	}()
	select {
	case <-found:
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("proxy exited before listening:\n%s", p.LastLines())
	case <-time.After(15 * time.Second):
		p.Stop()
		return nil, fmt.Errorf("proxy did not log its addresses within 15s:\n%s", p.LastLines())
	case <-ctx.Done():
		p.Stop()
		return nil, ctx.Err()
	}
}

// LastLines is the end of the proxy's log, for errors.
func (p *Proxy) LastLines() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.tail, "\n")
}

// Stop sends SIGTERM (the proxy drains and exits) and kills it after 10s.
func (p *Proxy) Stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// Stats is what /proc says about the proxy process.
type Stats struct {
	CPU   time.Duration // utime + stime
	Sys   time.Duration // stime alone: time in the kernel (syscalls, page faults)
	RSS   int64         // VmRSS, bytes
	HWM   int64         // VmHWM (peak RSS since start or the last ResetPeak), bytes
	valid bool
}

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat.
// It is 100 on every Linux architecture Go supports (getconf CLK_TCK); Go
// has no sysconf without cgo.
const clockTicks = 100

// ReadStats reads the CPU time and memory of process pid.
func ReadStats(pid int) (Stats, error) {
	var st Stats
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return st, err
	}
	// comm (field 2) may contain spaces: fields resume after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return st, errors.New("bad /proc stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return st, errors.New("short /proc stat")
	}
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	st.CPU = time.Duration(ut+stime) * time.Second / clockTicks
	st.Sys = time.Duration(stime) * time.Second / clockTicks
	if ns, ok := schedCPU(pid); ok {
		st.CPU = ns
	}
	b, err = os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return st, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			st.RSS = kb << 10
		case "VmHWM":
			st.HWM = kb << 10
		}
	}
	st.valid = true
	return st, nil
}

// schedCPU is the CPU time of pid's threads in nanoseconds, the sum of the
// first field of each /proc/<pid>/task/<tid>/schedstat (time on a CPU).
// /proc/<pid>/stat counts in 10 ms ticks: a consume phase of the proxy is
// a few ticks, so its CPU per MB moved by a sixth from one tick more or
// less. A thread that has exited is no longer counted: the measured
// processes are Go programs, whose threads live as long as they do.
func schedCPU(pid int) (time.Duration, bool) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil || len(ents) == 0 {
		return 0, false
	}
	var total int64
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "schedstat"))
		if err != nil {
			continue // the thread ended meanwhile
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return 0, false
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, false
		}
		total += ns
	}
	return time.Duration(total), true
}

// ResetPeak resets VmHWM to the current RSS (Linux 4.0+, "5" to
// clear_refs), so the peak of each measured phase is read on its own rather
// than the process's lifetime peak. If the kernel refuses, the lifetime
// peak is what gets reported.
func ResetPeak(pid int) {
	os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
}

// Scrape fetches the proxy's /metrics text.
func Scrape(ctx context.Context, admin string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+"/metrics", nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("/metrics: %s", resp.Status)
	}
	return string(b), nil
}

// MetricValue sums the samples of name whose labels contain every one of
// labels (each like `outcome="duplicate"`) in Prometheus text format.
// A missing series is 0: a counter that never moved may not be exported.
func MetricValue(text, name string, labels ...string) float64 {
	var sum float64
	for line := range strings.SplitSeq(text, "\n") {
		if line == "" || line[0] == '#' || !strings.HasPrefix(line, name) {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		series := line[:sp]
		n := series
		if i := strings.IndexByte(series, '{'); i >= 0 {
			n = series[:i]
		}
		if n != name {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(series, l) {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		if v, err := strconv.ParseFloat(line[sp+1:], 64); err == nil {
			sum += v
		}
	}
	return sum
}
