package relay

import (
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/protocol/rewrite"
)

// fetchStream relays a large Fetch v16+ response while it arrives. Such a
// response may end with KIP-951 NodeEndpoints (the top-level tag 0), which
// names real brokers and must be rewritten, so unlike Fetch.Relay's v15 and
// older frames it cannot go through blind. Instead the response is walked
// as its bytes pass, by the lengths kmsg decodes it with: the fields
// between record sets are copied through a small buffer, each record set
// of 16 KiB or more is spliced, and the top-level tag section, the last
// bytes of the frame, is read whole and rewritten in place at its own size
// (rewrite.TopTagsSameSize), since the frame's size prefix left
// first. No byte of the tag section reaches the client before it is
// rewritten, so no broker address leaks.
//
// The copy path validates a whole response before sending any of it; here
// a malformed response is found part way, after its start was sent, and
// the connection is closed (the client sees it cut, as after a broker
// failure). Partition-level tags are passed by their sizes, not decoded:
// they name no address.
type fetchStream struct {
	f       *Fetch
	version int16
	r       *ConnReader
	left    int64  // frame bytes not yet consumed from r
	out     []byte // consumed, not yet written to the client
	sent    bool   // the first write (size prefix, correlation id) went out
	alive   bool   // the client can be written to
	err     error  // first broker-side error: read failure or malformed

}

// errMalformedFetch is a Fetch response whose lengths do not add up.
var errMalformedFetch = fmt.Errorf("%w: fetch lengths do not match the frame", protocol.ErrMalformedResponse)

// maxKeptOut bounds the copy buffer kept across frames.
const maxKeptOut = 1 << 20

// fetchStreamFlush is how much copied data is gathered per write.
const fetchStreamFlush = 32 << 10

// fetchWalkFill is the least a read for the walk's fields asks for: the
// fields between two record sets (a partition's tags, the next one's
// header) are about 50 bytes without aborted transactions.
const fetchWalkFill = 256

// relayFetchStream relays a Fetch response, a frame of frameLen bytes led by
// its size prefix and correlation id (already checked), as fetchStream
// describes. It reports whether the client can still be written to, and a
// broker-side error after which the connection cannot continue.
func (f *Fetch) relayFetchStream(r *ConnReader, version int16, frameLen int64) (alive bool, err error) {
	s := &f.stream
	*s = fetchStream{f: f, version: version, r: r, left: frameLen, out: s.out[:0], alive: true}
	s.pass(4 + 4) // size, correlation id
	s.skipTags()  // response header v1
	s.pass(4 + 2 + 4)
	nt := s.arrayLen(18)
	for i := int32(0); i < nt && s.err == nil; i++ {
		s.pass(16) // topic ID (v13+)
		np := s.arrayLen(37)
		for j := int32(0); j < np && s.err == nil; j++ {
			s.pass(4 + 2 + 8 + 8 + 8) // Partition, ErrorCode, HighWatermark, LastStableOffset, LogStartOffset
			na := s.arrayLen(16)
			for k := int32(0); k < na && s.err == nil; k++ {
				s.pass(8 + 8) // ProducerID, FirstOffset
				s.skipTags()
			}
			s.pass(4) // PreferredReadReplica
			if n := int64(s.uvarint()) - 1; n > 0 {
				s.records(n)
			}
			s.skipTags()
		}
		s.skipTags()
	}
	s.tail()
	if s.err != nil {
		return false, s.err
	}
	s.flush()
	if len(s.out) > maxKeptOut {
		s.out = nil
	}
	return s.alive, nil
}

// take consumes n bytes of the frame from the broker into out.
func (s *fetchStream) take(n int64) []byte {
	if s.err != nil {
		return nil
	}
	if n < 0 || n > s.left {
		s.err = errMalformedFetch
		return nil
	}
	start := len(s.out)
	s.out = append(s.out, make([]byte, n)...)[:start+int(n)]
	// A fill asks for little more than is taken: what follows may be a
	// record set to splice, whose first bytes would otherwise come
	// through user space with the fields before it (a whole buffer of
	// them per partition).
	s.r.limit = int(max(n, fetchWalkFill))
	_, err := io.ReadFull(s.r, s.out[start:])
	s.r.limit = 0
	if err != nil {
		s.err = readErr(err)
		return nil
	}
	s.left -= n
	return s.out[start:]
}

func readErr(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// pass copies n bytes of the frame toward the client.
func (s *fetchStream) pass(n int64) {
	for n > 0 && s.err == nil {
		k := min(n, fetchStreamFlush)
		s.take(k)
		n -= k
		if len(s.out) >= fetchStreamFlush {
			s.flush()
		}
	}
}

func (s *fetchStream) uvarint() uint32 {
	var x uint32
	for shift := uint(0); shift < 35 && s.err == nil; shift += 7 {
		b := s.take(1)
		if b == nil {
			return 0
		}
		x |= uint32(b[0]&0x7f) << shift
		if b[0] < 0x80 {
			return x
		}
	}
	if s.err == nil {
		s.err = errMalformedFetch
	}
	return 0
}

// arrayLen reads a compact array length; like kmsg, null is empty, and a
// length the rest of the frame cannot hold at minSize bytes per element
// is malformed.
func (s *fetchStream) arrayLen(minSize int64) int32 {
	n := int64(s.uvarint()) - 1
	if n < 0 {
		return 0
	}
	if n*minSize > s.left {
		s.err = errMalformedFetch
		return 0
	}
	return int32(n)
}

func (s *fetchStream) skipTags() {
	for n := s.uvarint(); n > 0 && s.err == nil; n-- {
		s.uvarint() // key
		s.pass(int64(s.uvarint()))
	}
}

// records relays one partition's record set of n bytes: spliced when large
// and the legs allow it, else copied.
func (s *fetchStream) records(n int64) {
	if n > s.left {
		s.err = errMalformedFetch
		return
	}
	f := s.f
	if n < SpliceMinFrame || f.RawClient == nil || !s.alive {
		if !s.alive {
			s.discard(n)
			return
		}
		s.pass(n)
		return
	}
	// What the buffered reader holds goes with the fields before it, in
	// one write that tells TCP the spliced records follow.
	if b := s.r.Buffered(); b > 0 {
		head, _ := s.r.Peek(int(min(int64(b), n)))
		s.out = append(s.out, head...)
		s.r.Discard(len(head))
		s.left -= int64(len(head))
		n -= int64(len(head))
	}
	s.flushMore()
	if !s.alive {
		s.discard(n)
		return
	}
	taken, srcErr, dstErr := f.splice.move(f.RawClient, f.RawUp, n)
	s.left -= taken
	switch {
	case srcErr != nil:
		s.err = srcErr
	case dstErr != nil:
		if !f.hungUpWrite(dstErr) {
			f.clientGone(dstErr)
		}
		s.alive = false
		s.discard(n - taken)
	}
}

// discard consumes n bytes of the frame without relaying them.
func (s *fetchStream) discard(n int64) {
	if s.err != nil {
		return
	}
	if err := skip(s.r, n); err != nil {
		s.err = readErr(err)
		return
	}
	s.left -= n
}

// tail reads the top-level tag section, the rest of the frame, and
// rewrites its broker addresses at its own size.
func (s *fetchStream) tail() {
	if s.err != nil {
		return
	}
	if s.left > int64(s.f.MaxFrame) {
		s.err = errMalformedFetch
		return
	}
	start := len(s.out)
	tags := s.take(s.left)
	if s.err != nil {
		return
	}
	out, changed, err := rewrite.TopTagsSameSize(nil, tags, s.f.Mapper)
	if err != nil {
		s.err = fmt.Errorf("rewrite fetch v%d: %w", s.version, err)
		return
	}
	if changed {
		copy(s.out[start:], out)
	}
}

// flushMore is flush for bytes a splice follows: past the frame's first
// write, they go with MSG_MORE.
func (s *fetchStream) flushMore() {
	if len(s.out) > 0 && s.alive && s.sent {
		if err := s.f.splice.sendMore(s.f.RawClient, s.out); err != nil {
			if !s.f.hungUpWrite(err) {
				s.f.clientGone(err)
			}
			s.alive = false
		}
		s.out = s.out[:0]
		return
	}
	s.flush()
}

// flush writes what out holds to the client.
func (s *fetchStream) flush() {
	if len(s.out) > 0 && s.alive {
		s.write(s.out)
	}
	s.out = s.out[:0]
}

// write sends b to the client. The first write, led by the size prefix and
// correlation id, goes through the Tracker (which reads the id there);
// the rest of the frame goes to the connection beneath it.
func (s *fetchStream) write(b []byte) {
	f := s.f
	var err error
	first := !s.sent
	s.sent = true
	if first {
		_, err = f.Client.Write(b) // Tracker forgives a hung-up client itself
	} else {
		_, err = f.clientConn().Write(b)
	}
	if err != nil {
		if first || !f.hungUpWrite(err) {
			f.clientGone(err)
		}
		s.alive = false
	}
}

// clientConn is the client connection beneath its Tracker.
func (f *Fetch) clientConn() net.Conn {
	if tr, ok := f.Client.(*Tracker); ok {
		return tr.Conn
	}
	return f.Client
}
