package proc

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The peer is another Kafka proxy measured beside ours in the same run,
// when -peer-bin names its binary: grepplabs/kafka-proxy, the Go proxy of
// the same shape (a goroutine pair per connection, byte copies, Metadata
// and FindCoordinator rewritten; bench/README.md, "The peer"). Nothing of
// it is in this repository: the bench runs a binary built from its own
// source.

// Peer is a running peer proxy.
type Peer struct {
	cmd  *exec.Cmd
	Pid  int
	Addr string
	done chan struct{}
}

// StartPeer runs kafka-proxy's server in front of the single broker at
// upstream, on a local port of its own, every address on 127.0.0.1, with
// its HTTP endpoints off and its dynamic listeners on 127.0.0.1 (a
// single-broker upstream needs none), and waits until it accepts
// connections.
func StartPeer(ctx context.Context, bin, upstream string) (*Peer, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	cmd := exec.Command(bin, "server",
		"--bootstrap-server-mapping", upstream+","+addr,
		"--default-listener-ip", "127.0.0.1",
		"--http-disable",
		"--log-level", "warning")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var out tailWriter
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Peer{cmd: cmd, Pid: cmd.Process.Pid, Addr: addr, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(p.done)
	}()
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return p, nil
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("peer exited before listening:\n%s", out.String())
		case <-ctx.Done():
			p.Stop()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.Stop()
			return nil, fmt.Errorf("peer did not listen on %s within 15s:\n%s", addr, out.String())
		}
	}
}

// Stop sends SIGTERM and kills it after 10s.
func (p *Peer) Stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// freePort returns a loopback port nothing listens on now (the peer takes
// its listen address as a flag and cannot report one it chose).
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// tailWriter keeps the last 8 KiB written to it, for errors.
type tailWriter struct {
	mu  sync.Mutex
	buf []byte
}

func (w *tailWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, b...)
	if len(w.buf) > 8<<10 {
		w.buf = w.buf[len(w.buf)-8<<10:]
	}
	return len(b), nil
}

func (w *tailWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.TrimSpace(string(w.buf))
}
