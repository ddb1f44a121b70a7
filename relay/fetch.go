package relay

import (
	"encoding/binary"
	"errors"
	"net"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/protocol/rewrite"
)

// SpliceMinFrame is the smallest Fetch response frame relayed with
// splice(2). Below it the frame is copied through the connection's buffer:
// splicing costs at least two syscalls and, for a small frame, sends it in
// more TCP segments, which measured slower than one read and one write.
const SpliceMinFrame = 16 << 10

// Fetch relays large Fetch responses from a broker connection to its
// client without copying their bodies through user space: one session's
// (its responseLoop's).
type Fetch struct {
	Client           net.Conn        // the client connection (a *Tracker, if it has one)
	RawClient, RawUp syscall.RawConn // both legs' sockets when both are plain TCP; nil: no splicing
	MaxFrame         int32           // max_frame_bytes
	// Mapper rewrites the broker addresses of Fetch v16+ (NodeEndpoints);
	// set once, it is not allocated per frame.
	Mapper  rewrite.AddrMapper
	Metrics FetchMetrics
	// Now reads the clock the caller's start times are on.
	Now func() time.Time
	// ExtendWrite sets the client's write deadline for one response;
	// WriteFailed is told of a failed write to the client, which it
	// closes.
	ExtendWrite func()
	WriteFailed func(error)

	splice *splicer
	stream fetchStream
}

// FetchMetrics is where a Fetch counts the bytes it relays.
type FetchMetrics struct {
	BrokerRead, ClientWritten prometheus.Counter
}

// Close releases the pipe, if one was made.
func (f *Fetch) Close() {
	if f.splice != nil {
		f.splice.close()
	}
}

// Relay relays a large Fetch response of the given version and
// correlation id from upstream to the client: the bytes the buffered
// reader already holds are written first, the rest is spliced socket to
// socket (see splicer); duration is told the time since start once it is
// written whole. It reports handled false, having consumed nothing, when
// the response should take the copy path instead: no splicing, a small
// frame, a frame that fails the checks the copy path makes (which then
// reports them), or a version newer than the proxy knows. Fetch v16+,
// which may carry broker addresses to rewrite (NodeEndpoints, KIP-951), is
// walked as it passes (fetchstream.go).
//
// alive is false when the client could not be written to; the frame is
// still consumed whole from upstream, so the responses behind it (a
// Produce's outcome among them) are still read and committed.
func (f *Fetch) Relay(upstream *ConnReader, version int16, corrID int32, start time.Time, duration prometheus.Observer) (handled, alive bool, err error) {
	if f.RawClient == nil {
		return false, true, nil
	}
	// v16+ may carry NodeEndpoints: walked as it passes (fetchstream.go).
	// A version newer than the proxy can walk takes the copy path, where
	// the rewrite refuses it.
	stream := version >= 16
	if mv, _ := rewrite.MaxVersion(int16(kmsg.Fetch)); version > mv {
		return false, true, nil
	}
	head, err := upstream.Peek(8)
	if err != nil {
		return false, true, nil // readResponse reads it again and reports it
	}
	size, err := protocol.CheckSize(head[:4], f.MaxFrame, protocol.ResponseMinSize)
	if err != nil || 4+int(size) < SpliceMinFrame || int32(binary.BigEndian.Uint32(head[4:8])) != corrID {
		return false, true, nil
	}
	if f.splice == nil {
		f.splice = newSplicer()
	}
	if f.splice.open() != nil {
		return false, true, nil
	}
	frameLen := 4 + int64(size)
	m := &f.Metrics
	m.BrokerRead.Add(float64(frameLen))
	f.ExtendWrite()
	if stream {
		alive, err := f.relayFetchStream(upstream, version, frameLen)
		if err == nil && alive {
			m.ClientWritten.Add(float64(frameLen))
			duration.Observe(f.Now().Sub(start).Seconds())
		}
		return true, alive && err == nil, err
	}
	// What the buffered reader holds goes first, in one write led by the
	// size and correlation id (the Tracker reads the id there).
	first, _ := upstream.Peek(min(upstream.Buffered(), int(frameLen)))
	_, werr := f.Client.Write(first)
	upstream.Discard(len(first))
	rest := frameLen - int64(len(first))
	if werr != nil {
		return true, f.clientGone(werr), skip(upstream, rest)
	}
	taken, srcErr, dstErr := f.splice.move(f.RawClient, f.RawUp, rest)
	if srcErr != nil {
		// Part of the frame went to the client: the connection cannot
		// continue. responseLoop fails p and closes both sides.
		return true, false, srcErr
	}
	if dstErr != nil {
		if f.hungUpWrite(dstErr) {
			return true, true, skip(upstream, rest-taken)
		}
		return true, f.clientGone(dstErr), skip(upstream, rest-taken)
	}
	m.ClientWritten.Add(float64(frameLen))
	duration.Observe(f.Now().Sub(start).Seconds())
	return true, true, nil
}

// skip reads and drops the n bytes left of a frame the client will not
// get, so the responses behind it are read from their start.
func skip(upstream *ConnReader, n int64) error {
	for n > 0 {
		k, err := upstream.Discard(int(min(n, 1<<30)))
		n -= int64(k)
		if err != nil {
			return err
		}
	}
	return nil
}

// hungUpWrite is Tracker.Write's rule for the spliced part of a frame: a
// client that closed its side normally is sent nothing more, and that is
// not an error.
func (f *Fetch) hungUpWrite(err error) bool {
	tr, ok := f.Client.(*Tracker)
	return ok && tr.hungUp.Load() && (errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET))
}

// clientGone hands a failed write to the client to WriteFailed, and
// returns false (the client is no longer written to).
func (f *Fetch) clientGone(err error) bool {
	f.WriteFailed(err)
	return false
}
