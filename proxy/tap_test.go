package proxy

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"sync"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/protocol"
)

// addrTap wraps a client's connections (kgo.Dialer) and decodes every
// response the client receives, collecting each broker address in it, so a
// test can assert that no real broker address ever reaches the client.
type addrTap struct {
	mu    sync.Mutex
	addrs map[string]int // host:port -> times seen
	seen  map[int16]int  // api key -> address-bearing responses decoded
	errs  []error
}

func newAddrTap() *addrTap { return &addrTap{addrs: map[string]int{}, seen: map[int16]int{}} }

func (t *addrTap) dial(ctx context.Context, network, host string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, host)
	if err != nil {
		return nil, err
	}
	return &tapConn{Conn: c, tap: t, reqs: map[int32][2]int16{}}, nil
}

func (t *addrTap) snapshot() (map[string]int, map[int16]int, []error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := make(map[string]int, len(t.addrs))
	for k, v := range t.addrs {
		a[k] = v
	}
	s := make(map[int16]int, len(t.seen))
	for k, v := range t.seen {
		s[k] = v
	}
	return a, s, append([]error(nil), t.errs...)
}

type tapConn struct {
	net.Conn
	tap        *addrTap
	mu         sync.Mutex
	reqs       map[int32][2]int16 // correlation id -> key, version
	wbuf, rbuf []byte
}

func (c *tapConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.wbuf = append(c.wbuf, p...)
	for len(c.wbuf) >= 4 {
		n := int(binary.BigEndian.Uint32(c.wbuf))
		if len(c.wbuf) < 4+n {
			break
		}
		if h, err := protocol.ParseRequestHeader(c.wbuf[4 : 4+n]); err == nil {
			c.reqs[h.CorrelationID] = [2]int16{h.APIKey, h.APIVersion}
		}
		c.wbuf = c.wbuf[4+n:]
	}
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *tapConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	c.rbuf = append(c.rbuf, p[:n]...)
	for len(c.rbuf) >= 4 {
		size := int(binary.BigEndian.Uint32(c.rbuf))
		if len(c.rbuf) < 4+size {
			break
		}
		frame := c.rbuf[4 : 4+size]
		if size < 4 {
			c.tap.record(0, nil, fmt.Errorf("response frame of %d bytes", size))
			c.rbuf = c.rbuf[4+size:]
			continue
		}
		corr := int32(binary.BigEndian.Uint32(frame))
		kv, ok := c.reqs[corr]
		delete(c.reqs, corr)
		if ok {
			c.tap.observe(kv[0], kv[1], frame)
		}
		c.rbuf = c.rbuf[4+size:]
	}
	c.mu.Unlock()
	return n, err
}

func (t *addrTap) observe(key, version int16, frame []byte) {
	var addrs []string
	add := func(host string, port int32) { addrs = append(addrs, addrString(host, port)) }
	off, err := protocol.ResponseBodyOffset(frame, key, version)
	if err != nil {
		t.record(key, nil, err)
		return
	}
	body := frame[off:]
	switch kmsg.Key(key) {
	case kmsg.Metadata:
		r := kmsg.NewPtrMetadataResponse()
		r.SetVersion(version)
		err = r.ReadFrom(body)
		for _, b := range r.Brokers {
			add(b.Host, b.Port)
		}
	case kmsg.FindCoordinator:
		r := kmsg.NewPtrFindCoordinatorResponse()
		r.SetVersion(version)
		err = r.ReadFrom(body)
		if version < 4 && r.NodeID >= 0 {
			add(r.Host, r.Port)
		}
		for _, co := range r.Coordinators {
			if co.NodeID >= 0 {
				add(co.Host, co.Port)
			}
		}
	case kmsg.DescribeCluster:
		r := kmsg.NewPtrDescribeClusterResponse()
		r.SetVersion(version)
		err = r.ReadFrom(body)
		for _, b := range r.Brokers {
			add(b.Host, b.Port)
		}
	case kmsg.Produce:
		r := kmsg.NewPtrProduceResponse()
		r.SetVersion(version)
		err = r.ReadFrom(body)
		for _, b := range r.Brokers {
			add(b.Host, b.Port)
		}
	case kmsg.Fetch:
		r := kmsg.NewPtrFetchResponse()
		r.SetVersion(version)
		err = r.ReadFrom(body)
		for _, b := range r.Brokers {
			add(b.Host, b.Port)
		}
	default:
		return
	}
	t.record(key, addrs, err)
}

func (t *addrTap) record(key int16, addrs []string, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		t.errs = append(t.errs, err)
		return
	}
	if len(addrs) > 0 {
		t.seen[key]++
	}
	for _, a := range addrs {
		t.addrs[a]++
	}
}
