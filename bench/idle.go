package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/bench/proc"
	"github.com/dedupproxy/dedupproxy/bench/report"
)

// runIdle opens cfg.IdleConns client connections to the proxy and to the
// floor relay in front of a sink (each its own process), one ApiVersions
// each, and reads each process's RSS growth. The clients live in the bench
// process: only the measured process's memory counts.
func runIdle(ctx context.Context, cfg Config, dir string) (*report.IdleResult, error) {
	up, err := proc.StartUpstream(ctx, "sink", []string{"idle"}, 1)
	if err != nil {
		return nil, err
	}
	defer up.Close()
	res := &report.IdleResult{Conns: cfg.IdleConns, Sides: map[string]report.IdleSide{}}

	fl, err := proc.StartFloor(ctx, up.Addrs[0])
	if err != nil {
		return nil, err
	}
	side, err := measureIdle(ctx, fl.Pid, fl.Addrs[0], cfg.IdleConns)
	fl.Close()
	if err != nil {
		return nil, fmt.Errorf("floor: %w", err)
	}
	res.Sides["floor"] = side

	px, err := proc.StartProxy(ctx, cfg.ProxyBin, dir, up.Addrs, "enforce", cfg.proxyExtra()...)
	if err != nil {
		return nil, err
	}
	side, err = measureIdle(ctx, px.Pid, px.Bootstrap, cfg.IdleConns)
	px.Stop()
	if err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	res.Sides["proxy"] = side

	if cfg.PeerBin != "" {
		pe, err := proc.StartPeer(ctx, cfg.PeerBin, up.Addrs[0])
		if err != nil {
			return nil, fmt.Errorf("peer: %w", err)
		}
		side, err = measureIdle(ctx, pe.Pid, pe.Addr, cfg.IdleConns)
		pe.Stop()
		if err != nil {
			return nil, fmt.Errorf("peer: %w", err)
		}
		res.Sides["peer"] = side
	}
	return res, nil
}

// measureIdle reads pid's RSS after report.IdleWarmConns connections came and
// went, opens n connections to addr that each send one ApiVersions and read
// its answer, reads the RSS again with them open, and closes them.
func measureIdle(ctx context.Context, pid int, addr string, n int) (report.IdleSide, error) {
	var side report.IdleSide
	warm, err := openIdle(ctx, addr, report.IdleWarmConns)
	closeAll(warm)
	if err != nil {
		return side, err
	}
	before, err := proc.ReadStats(pid)
	if err != nil {
		return side, err
	}
	conns, err := openIdle(ctx, addr, n)
	defer closeAll(conns)
	if err != nil {
		return side, err
	}
	after, err := proc.ReadStats(pid)
	if err != nil {
		return side, err
	}
	side.RSSBeforeMiB = float64(before.RSS) / (1 << 20)
	side.RSSAfterMiB = float64(after.RSS) / (1 << 20)
	side.PerConnKiB = float64(after.RSS-before.RSS) / float64(n) / 1024
	return side, nil
}

// openIdle opens n connections to addr, a few at a time, each having sent
// one ApiVersions (v3, naming its software, as kgo's first request does)
// and read the whole answer.
func openIdle(ctx context.Context, addr string, n int) ([]net.Conn, error) {
	const parallel = 8
	conns := make([]net.Conn, n)
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	next := make(chan int)
	for range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				c, err := idleConn(ctx, addr, int32(i))
				if err != nil {
					once.Do(func() { first = err })
					continue
				}
				conns[i] = c
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return conns, first
}

// closeAll closes conns with a reset (linger 0): thousands of closes
// would otherwise leave as many sockets in TIME_WAIT, holding loopback
// ports a minute on a machine others share.
func closeAll(conns []net.Conn) {
	for _, c := range conns {
		if c == nil {
			continue
		}
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		c.Close()
	}
}

// idleConn dials addr and exchanges one ApiVersions.
func idleConn(ctx context.Context, addr string, corr int32) (net.Conn, error) {
	d := net.Dialer{Timeout: 10 * time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	req := kmsg.NewPtrApiVersionsRequest()
	req.SetVersion(3)
	req.ClientSoftwareName, req.ClientSoftwareVersion = "bench-idle", "1"
	frame := apiVersionsFrame(req, corr)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(frame); err != nil {
		c.Close()
		return nil, err
	}
	var head [8]byte
	if _, err := io.ReadFull(c, head[:]); err != nil {
		c.Close()
		return nil, fmt.Errorf("ApiVersions answer: %w", err)
	}
	if got := int32(binary.BigEndian.Uint32(head[4:])); got != corr {
		c.Close()
		return nil, errors.New("ApiVersions answer: wrong correlation id")
	}
	size := int64(binary.BigEndian.Uint32(head[:4]))
	if _, err := io.CopyN(io.Discard, c, size-4); err != nil {
		c.Close()
		return nil, fmt.Errorf("ApiVersions answer: %w", err)
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

// apiVersionsFrame is req as a request frame: size, header v2 (flexible:
// api key, version, correlation id, client id, no tags), body.
func apiVersionsFrame(req *kmsg.ApiVersionsRequest, corr int32) []byte {
	b := make([]byte, 4, 64)
	b = binary.BigEndian.AppendUint16(b, uint16(req.Key()))
	b = binary.BigEndian.AppendUint16(b, uint16(req.GetVersion()))
	b = binary.BigEndian.AppendUint32(b, uint32(corr))
	clientID := "bench-idle"
	b = binary.BigEndian.AppendUint16(b, uint16(len(clientID)))
	b = append(b, clientID...)
	b = append(b, 0) // no tagged fields
	b = req.AppendTo(b)
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	return b
}
