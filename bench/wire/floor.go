package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/protocol/rewrite"
)

// Floor is the bare relay the bench measures the proxy against: the least a
// Kafka proxy on this machine must cost. It decides nothing. It reads each
// frame's header (requests: size, api key, version, correlation id;
// responses: size, correlation id), rewrites only the broker addresses of
// Metadata, FindCoordinator and DescribeCluster responses (so clients stay
// behind it), and otherwise copies bytes:
//
//   - frames up to floorSmall go through one buffer per direction, several
//     frames per read and one write for all the complete frames read;
//   - the rest of a larger frame moves with (*net.TCPConn).ReadFrom of an
//     io.LimitedReader over the source *net.TCPConn, which Go turns into
//     splice(2) on Linux (net/splice_linux.go), so those bytes never enter
//     user space. Splicing small frames too costs more syscalls per frame
//     and adds latency.
//
// Every distinct upstream broker address gets a listener of its own on
// 127.0.0.1:0, created the first time a response names it, so a
// multi-broker upstream works: clients reach broker N through the floor
// listener advertised for N. Not rewritten: the KIP-951 NodeEndpoints of
// Produce v10+ and Fetch v16+ responses, present only with leader-change
// errors, which a single-node bench upstream never sends.
type Floor struct {
	mu        sync.Mutex
	listeners map[string]net.Listener // upstream host:port -> ours
	conns     map[net.Conn]struct{}
	closed    bool
	wg        sync.WaitGroup
	boot      string
}

// floorSmall is the largest frame copied through user space; the rest of a
// larger frame is spliced. floorBuf holds a whole small frame plus the
// start of the next.
const (
	floorSmall    = 16 << 10
	floorBuf      = floorSmall + 4<<10
	floorMaxFrame = 256 << 20
)

// errFloorFrame is a size prefix no Kafka peer sends.
var errFloorFrame = errors.New("floor: bad frame size")

// StartFloor listens on 127.0.0.1:0 in front of the broker at seed.
func StartFloor(seed string) (*Floor, error) {
	f := &Floor{listeners: map[string]net.Listener{}, conns: map[net.Conn]struct{}{}}
	addr, err := f.listen(seed)
	if err != nil {
		return nil, err
	}
	f.boot = addr
	return f, nil
}

// Addr is the bootstrap listener's address (the one in front of seed).
func (f *Floor) Addr() string { return f.boot }

// Close stops every listener and connection and waits for their goroutines.
func (f *Floor) Close() {
	f.mu.Lock()
	f.closed = true
	for _, ln := range f.listeners {
		ln.Close()
	}
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// listen returns the address of the listener in front of target, starting
// it if there is none yet.
func (f *Floor) listen(target string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ln := f.listeners[target]; ln != nil {
		return ln.Addr().String(), nil
	}
	if f.closed {
		return "", net.ErrClosed
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	f.listeners[target] = ln
	f.wg.Add(1)
	go f.accept(ln, target)
	return ln.Addr().String(), nil
}

// MapBroker implements rewrite.AddrMapper: each upstream broker address is
// advertised as the floor listener in front of it.
func (f *Floor) MapBroker(_ int32, host string, port int32) (string, int32) {
	addr, err := f.listen(net.JoinHostPort(host, strconv.Itoa(int(port))))
	if err != nil {
		return host, rewrite.OmitBroker
	}
	h, p, _ := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(p)
	return h, int32(n)
}

func (f *Floor) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *Floor) untrack(c net.Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
	c.Close()
}

func (f *Floor) accept(ln net.Listener, target string) {
	defer f.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		if !f.track(c) {
			c.Close()
			return
		}
		f.wg.Add(1)
		go f.serve(c.(*net.TCPConn), target)
	}
}

// serve relays one client connection to target until either side closes.
func (f *Floor) serve(client *net.TCPConn, target string) {
	defer f.wg.Done()
	defer f.untrack(client)
	c, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		return
	}
	if !f.track(c) {
		c.Close()
		return
	}
	up := c.(*net.TCPConn)
	defer f.untrack(up)
	var pend floorPending
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		defer up.Close() // ends the response direction too
		relayDir(client, up, true /* request */, &pend, f)
	}()
	relayDir(up, client, false /* request */, &pend, f)
}

// floorPending remembers the requests whose responses carry broker
// addresses, by correlation id. Most requests are not among them, so the
// response side looks only when n > 0.
type floorPending struct {
	n  atomic.Int32
	mu sync.Mutex
	m  map[int32][2]int16 // correlation id -> api key, version
}

func (p *floorPending) add(corr int32, key, version int16) {
	p.mu.Lock()
	if p.m == nil {
		p.m = map[int32][2]int16{}
	}
	p.m[corr] = [2]int16{key, version}
	p.n.Store(int32(len(p.m)))
	p.mu.Unlock()
}

func (p *floorPending) take(corr int32) (key, version int16, ok bool) {
	if p.n.Load() == 0 {
		return 0, 0, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	kv, ok := p.m[corr]
	if ok {
		delete(p.m, corr)
		p.n.Store(int32(len(p.m)))
	}
	return kv[0], kv[1], ok
}

func floorRewrites(key int16) bool {
	switch kmsg.Key(key) {
	case kmsg.Metadata, kmsg.FindCoordinator, kmsg.DescribeCluster:
		return true
	}
	return false
}

// relayDir copies frames from src to dst until an error. buf[out:r] holds
// complete frames not yet written, buf[r:w] the start of the next.
func relayDir(src, dst *net.TCPConn, request bool, pend *floorPending, m rewrite.AddrMapper) error {
	hdrLen := 8 // size, correlation id
	if request {
		hdrLen = 12 // size, api key, version, correlation id
	}
	buf := make([]byte, floorBuf)
	out, r, w := 0, 0, 0
	for {
		for w-r >= hdrLen {
			n := int(int32(binary.BigEndian.Uint32(buf[r:])))
			if n < hdrLen-4 || n > floorMaxFrame {
				return fmt.Errorf("%w: %d", errFloorFrame, n)
			}
			total := 4 + n
			if request {
				if key := int16(binary.BigEndian.Uint16(buf[r+4:])); floorRewrites(key) {
					pend.add(int32(binary.BigEndian.Uint32(buf[r+8:])), key, int16(binary.BigEndian.Uint16(buf[r+6:])))
				}
			} else if key, version, ok := pend.take(int32(binary.BigEndian.Uint32(buf[r+4:]))); ok {
				if _, err := dst.Write(buf[out:r]); err != nil {
					return err
				}
				frame := make([]byte, total)
				c := copy(frame, buf[r:w])
				if _, err := io.ReadFull(src, frame[c:]); err != nil {
					return err
				}
				frame, err := rewriteFrame(frame, key, version, m)
				if err != nil {
					return err // fail closed: never relay a real broker address
				}
				if _, err := dst.Write(frame); err != nil {
					return err
				}
				r += c
				out = r
				continue
			}
			if w-r >= total {
				r += total // whole frame buffered, small or not
				continue
			}
			if total <= floorSmall {
				break // read the rest into the buffer
			}
			// A large frame: write what is buffered, splice the rest.
			if _, err := dst.Write(buf[out:w]); err != nil {
				return err
			}
			rest := int64(total - (w - r))
			moved, err := dst.ReadFrom(&io.LimitedReader{R: src, N: rest})
			if err == nil && moved < rest {
				err = io.ErrUnexpectedEOF
			}
			if err != nil {
				return err
			}
			out, r, w = 0, 0, 0
		}
		if r > out {
			if _, err := dst.Write(buf[out:r]); err != nil {
				return err
			}
		}
		w = copy(buf, buf[r:w])
		out, r = 0, 0
		nr, err := src.Read(buf[w:])
		w += nr
		if err != nil && nr == 0 {
			return err
		}
	}
}

// rewriteFrame maps the broker addresses of a whole response frame (size
// prefix included) of api key/version.
func rewriteFrame(frame []byte, key, version int16, m rewrite.AddrMapper) ([]byte, error) {
	off, err := protocol.ResponseBodyOffset(frame[4:], key, version)
	if err != nil {
		return nil, err
	}
	hdr := frame[4 : 4+off]
	body, changed, err := rewrite.Addresses(nil, key, version, frame[4+off:], m)
	if err != nil || !changed {
		return frame, err
	}
	out := make([]byte, 4, 4+len(hdr)+len(body))
	binary.BigEndian.PutUint32(out, uint32(len(hdr)+len(body)))
	out = append(out, hdr...)
	return append(out, body...), nil
}
