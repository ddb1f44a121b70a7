package proxy

import (
	"encoding/binary"
	"errors"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/protocol"
)

// spliceMinFrame is the smallest Fetch response frame relayed with
// splice(2). Below it the frame is copied through the session's buffer:
// splicing costs at least two syscalls and, for a small frame, sends it in
// more TCP segments, which measured slower than one read and one write.
const spliceMinFrame = 16 << 10

// relayLarge relays a large Fetch response for p from upstream to the
// client without copying its body through user space: the bytes the
// buffered reader already holds are written first, the rest is spliced
// socket to socket (see splicer). It reports handled false, having consumed
// nothing, when the response should take the copy path instead: a small
// frame, a TLS or wrapped connection, a frame that fails the checks
// readResponse makes (which then reports them), or a version newer than the
// proxy knows. Fetch v16+, which may carry broker addresses to rewrite
// (NodeEndpoints, KIP-951), is walked as it passes (relayFetchStream).
//
// alive is false when the client could not be written to; the frame is
// still consumed whole from upstream, so the responses behind it (a
// Produce's outcome among them) are still read and committed.
func (c *session) relayLarge(upstream *connReader, p *pending) (handled, alive bool, err error) {
	if c.rawClient == nil || p.key != int16(kmsg.Fetch) || p.plan != nil {
		return false, true, nil
	}
	// v16+ may carry NodeEndpoints: walked as it passes (fetchstream.go).
	// A version newer than the proxy can walk takes the copy path, where
	// the rewrite refuses it.
	stream := p.version >= 16
	if mv, _ := protocol.MaxVersion(int16(kmsg.Fetch)); p.version > mv {
		return false, true, nil
	}
	head, err := upstream.Peek(8)
	if err != nil {
		return false, true, nil // readResponse reads it again and reports it
	}
	size, err := protocol.CheckSize(head[:4], c.s.Config.MaxFrameBytes, protocol.ResponseMinSize)
	if err != nil || 4+int(size) < spliceMinFrame || int32(binary.BigEndian.Uint32(head[4:8])) != p.corrID {
		return false, true, nil
	}
	if c.splice == nil {
		c.splice = newSplicer()
	}
	if c.splice.open() != nil {
		return false, true, nil
	}
	frameLen := 4 + int64(size)
	m := c.s.Metrics
	m.BrokerReadBytes.Add(float64(frameLen))
	c.extendClientWrite()
	if stream {
		alive, err := c.relayFetchStream(upstream, p, frameLen)
		if err == nil && alive {
			m.ClientWrittenBytes.Add(float64(frameLen))
			p.api.duration.Observe(time.Since(p.start).Seconds())
		}
		return true, alive && err == nil, err
	}
	// What the buffered reader holds goes first, in one write led by the
	// size and correlation id (requestTracker reads the id there).
	first, _ := upstream.Peek(min(upstream.Buffered(), int(frameLen)))
	_, werr := c.client.Write(first)
	upstream.Discard(len(first))
	rest := frameLen - int64(len(first))
	if werr != nil {
		return true, c.clientGone(werr), c.skip(upstream, rest)
	}
	taken, srcErr, dstErr := c.splice.move(c.rawClient, c.rawUp, rest)
	if srcErr != nil {
		// Part of the frame went to the client: the connection cannot
		// continue. responseLoop fails p and closes both sides.
		return true, false, srcErr
	}
	if dstErr != nil {
		if c.hungUpWrite(dstErr) {
			return true, true, c.skip(upstream, rest-taken)
		}
		return true, c.clientGone(dstErr), c.skip(upstream, rest-taken)
	}
	m.ClientWrittenBytes.Add(float64(frameLen))
	p.api.duration.Observe(time.Since(p.start).Seconds())
	return true, true, nil
}

// skip reads and drops the n bytes left of a frame the client will not
// get, so the responses behind it are read from their start.
func (c *session) skip(upstream *connReader, n int64) error {
	for n > 0 {
		k, err := upstream.Discard(int(min(n, 1<<30)))
		n -= int64(k)
		if err != nil {
			return err
		}
	}
	return nil
}

// hungUpWrite is requestTracker.Write's rule for the spliced part of a
// frame: a client that closed its side normally is sent nothing more, and
// that is not an error.
func (c *session) hungUpWrite(err error) bool {
	tr, ok := c.client.(*requestTracker)
	return ok && tr.hungUp.Load() && (errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET))
}

// clientGone handles a failed write to the client as writeResponse does,
// and returns false (the client is no longer written to).
func (c *session) clientGone(err error) bool {
	if !c.stopping.Load() {
		c.s.Metrics.clientError(clientWrite)
		c.log.Info("client write failed; draining broker responses", "err", err)
	}
	c.client.Close()
	return false
}
