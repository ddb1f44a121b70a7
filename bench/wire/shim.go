package wire

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// Shim is the fault injector behind the retry rate: a TCP hop between the
// clients and whatever they connect to (the proxy's listeners, or the
// upstream broker directly), which drops a fixed fraction of Produce
// acknowledgements and cuts the connection, as a lost acknowledgement does.
// The client then really retries: franz-go reconnects and resends the
// batch, which an idempotent upstream (or the proxy in enforce mode) must
// recognise as a duplicate.
//
// Clients reach it through [Shim.Dial], given to kgo.Dialer: every address
// the client dials (bootstrap or an advertised broker) gets its own hop, so
// neither the proxy's advertised addresses nor Metadata need rewriting, and
// the direct and proxied paths pay the same extra hop.
type Shim struct {
	rate float64
	// Upstream, when set, connects a hop to its target (TLS to a real
	// cluster that speaks it: the hop reads plaintext frames and the
	// client speaks plaintext to it); nil dials plain TCP.
	Upstream func(ctx context.Context, network, addr string) (net.Conn, error)

	mu     sync.Mutex
	hops   map[string]net.Listener
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup

	produces atomic.Int64 // Produce responses seen (acks != 0)
	dropped  atomic.Int64 // of which dropped
}

// NewShim drops the fraction rate (0..1) of Produce acknowledgements.
func NewShim(rate float64) *Shim {
	return &Shim{rate: rate, hops: map[string]net.Listener{}, conns: map[net.Conn]struct{}{}}
}

// Dial is a kgo.Dialer: it connects to the hop in front of host.
func (s *Shim) Dial(ctx context.Context, _, host string) (net.Conn, error) {
	ln, err := s.hop(host)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", ln.Addr().String())
}

// Counts returns the Produce acknowledgements seen and dropped so far.
func (s *Shim) Counts() (produces, dropped int64) { return s.produces.Load(), s.dropped.Load() }

// Close stops every hop and connection and waits for their goroutines.
func (s *Shim) Close() {
	s.mu.Lock()
	s.closed = true
	for _, ln := range s.hops {
		ln.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *Shim) hop(target string) (net.Listener, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ln := s.hops[target]; ln != nil {
		return ln, nil
	}
	if s.closed {
		return nil, net.ErrClosed
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s.hops[target] = ln
	s.wg.Add(1)
	go s.accept(ln, target)
	return ln, nil
}

func (s *Shim) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Shim) untrack(c net.Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	c.Close()
}

func (s *Shim) accept(ln net.Listener, target string) {
	defer s.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		if !s.track(c) {
			c.Close()
			return
		}
		s.wg.Add(1)
		go s.relay(c, target)
	}
}

// drop decides whether the n-th Produce acknowledgement is lost: exactly
// floor(n*rate) of the first n are, spread evenly, so runs are repeatable.
func (s *Shim) drop() bool {
	n := float64(s.produces.Add(1))
	if math.Floor(n*s.rate) > math.Floor((n-1)*s.rate) {
		s.dropped.Add(1)
		return true
	}
	return false
}

// relay copies frames both ways. Requests are parsed only far enough to
// note which correlation ids are Produce requests that expect a response.
func (s *Shim) relay(client net.Conn, target string) {
	defer s.wg.Done()
	defer s.untrack(client)
	dial := s.Upstream
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	up, err := dial(ctx, "tcp", target)
	cancel()
	if err != nil {
		return
	}
	if !s.track(up) {
		up.Close()
		return
	}
	defer s.untrack(up)

	var mu sync.Mutex
	produce := map[uint32]struct{}{}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer up.Close() // unblocks the response side
		copyFrames(client, up, func(frame []byte) {
			if corr, ok := produceWithResponse(frame[4:]); ok {
				mu.Lock()
				produce[corr] = struct{}{}
				mu.Unlock()
			}
		}, nil)
	}()
	copyFrames(up, client, nil, func(frame []byte) bool {
		if len(frame) < 8 {
			return true
		}
		corr := binary.BigEndian.Uint32(frame[4:])
		mu.Lock()
		_, isProduce := produce[corr]
		delete(produce, corr)
		mu.Unlock()
		return !(isProduce && s.drop())
	})
}

// copyFrames copies size-prefixed frames from src to dst, flushing when no
// further frame is already buffered. inspect sees each frame; pass, if set,
// may veto one, which ends the copy (the caller then cuts both sides).
func copyFrames(src io.Reader, dst io.Writer, inspect func([]byte), pass func([]byte) bool) {
	br := bufio.NewReaderSize(src, 256<<10)
	bw := bufio.NewWriterSize(dst, 256<<10)
	var frame []byte
	for {
		hdr, err := br.Peek(4)
		if err != nil {
			return
		}
		n := int(int32(binary.BigEndian.Uint32(hdr))) + 4
		if n < 4 || n > 128<<20 {
			return
		}
		if cap(frame) < n {
			frame = make([]byte, n)
		}
		frame = frame[:n]
		if _, err := io.ReadFull(br, frame); err != nil {
			return
		}
		if inspect != nil {
			inspect(frame)
		}
		if pass != nil && !pass(frame) {
			bw.Flush() // deliver what came before: only this acknowledgement (and later ones) is lost
			return
		}
		if _, err := bw.Write(frame); err != nil {
			return
		}
		if br.Buffered() == 0 {
			if err := bw.Flush(); err != nil {
				return
			}
		}
	}
}

// produceWithResponse reports the correlation id of a Produce request with
// acks != 0 (acks=0 Produce has no response to drop).
func produceWithResponse(body []byte) (uint32, bool) {
	if len(body) < 10 || int16(binary.BigEndian.Uint16(body)) != int16(kmsg.Produce) {
		return 0, false
	}
	version := int16(binary.BigEndian.Uint16(body[2:]))
	corr := binary.BigEndian.Uint32(body[4:])
	flexible := version >= 9 // Produce v9+ is flexible (KIP-482)
	b, err := skipRequestHeader(body, flexible)
	if err != nil {
		return corr, true // unparseable: treat as one that has a response
	}
	// transactional_id: nullable string, compact in flexible versions.
	if flexible {
		l, k := binary.Uvarint(b)
		if k <= 0 || l > uint64(len(b)-k)+1 {
			return corr, true
		}
		if l > 0 {
			b = b[k+int(l-1):]
		} else {
			b = b[k:]
		}
	} else {
		if len(b) < 2 {
			return corr, true
		}
		l := int(int16(binary.BigEndian.Uint16(b)))
		b = b[2:]
		if l > 0 && l <= len(b) {
			b = b[l:]
		}
	}
	if len(b) < 2 {
		return corr, true
	}
	return corr, int16(binary.BigEndian.Uint16(b)) != 0
}
