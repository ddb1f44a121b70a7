package e2e

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// maxShimFrame bounds one Kafka frame through the shim; the clients here
// send far smaller requests.
const maxShimFrame = 64 << 20

// ackShim is a TCP hop between Kafka clients and whatever serves Kafka behind
// it (kfake directly, or dedupproxy). It relays frames unchanged, except:
//
//   - Metadata, FindCoordinator and Produce v10+ (KIP-951) responses: every broker address is
//     rewritten to a shim listener that forwards to that address, created on
//     first sight. In front of kfake that points clients back at the shim;
//     in front of the proxy it maps each proxy node listener (which the
//     proxy already advertises instead of the brokers) to a shim listener.
//     Without this, clients bypass the shim after bootstrap.
//   - The response to the dropAt-th Produce request that expects one
//     (acks != 0), counted across all connections (and, after setDrops,
//     to every one its plan names): the shim waits for it
//     (so the batch has been appended upstream), drops it, and closes the
//     client's connection and its upstream connection. This is
//     docs/clients.md §3's "close" mode: the acknowledgement lost on the
//     way back, which every client sees as a broken connection and retries;
//     the proxy sees its connection reset, as when the path between it and
//     the client breaks.
//
// Responses arrive in request order on a Kafka connection (acks=0 Produce
// has none), so each connection keeps a FIFO of the requests awaiting one.
type ackShim struct {
	// dial connects to what the shim fronts: TLS for a real cluster that
	// speaks it, so the shim still reads plaintext frames.
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// drops is which Produce requests with acks != 0 lose their response
	// (newAckShim: only the dropAt-th; setDrops: more).
	drops faultPlan
	// onDrop, when set (setOnDrop), runs when the dropped response
	// arrives, before the client's connection is closed (the restart mode
	// kills the proxy there).
	onDrop atomic.Pointer[func()]
	// trace, when set (setTrace), gets a line for every Produce request
	// and response (traceProduce).
	trace atomic.Pointer[func(string)]

	mu        sync.Mutex
	closed    bool
	listeners map[string]net.Listener // upstream address -> shim listener
	conns     map[net.Conn]struct{}
	stats     shimStats
	// firstSent is the batch (partition of a Produce request, counted
	// from 1) each value first went out in.
	firstSent map[int]int64
	sentSeq   int64
	// carried lists when the planned drops whose request died unanswered
	// with a connection an earlier drop closed are due again (Produce
	// request counts, the plan's every apart), so a run loses as many
	// answers as its plan says, spread as it says.
	carried   []int64
	wg        sync.WaitGroup
	bootstrap string
}

// shimStats is what the shim saw. Read it with [ackShim.Stats].
type shimStats struct {
	Produces      int64 // Produce requests with acks != 0 forwarded
	Records       int64 // records in the batches of those requests
	Batches       int64
	LegacyBatches int64 // batches with producer id -1
	Dropped       int64 // responses dropped (and connections closed)
	// RecordsAtDrop is how many records had been forwarded, the dropped
	// request's included, when the (first) dropped request was forwarded: with
	// 0 < RecordsAtDrop < sent, the acknowledgement was lost mid-stream.
	RecordsAtDrop int64
	Listeners     int
	// Resent counts the partitions' batches that carry records sent before
	// (retries); Merged those of them whose earlier records came from two
	// batches or more: records of several failed requests batched again at
	// other boundaries (librdkafka).
	Resent, Merged int64
	// NotLeader counts partitions answered NOT_LEADER_OR_FOLLOWER; Stall is
	// the longest time between two Produce responses that acknowledged
	// something, from the first to the last: how long the client's
	// writes stood still.
	NotLeader int64
	Stall     time.Duration
	// DropTarget is where the connection whose response was dropped led.
	DropTarget string
	lastAck    time.Time
}

// newAckShim starts a shim whose bootstrap listener forwards to target. It is
// closed, with every connection, when the test ends.
func newAckShim(t testing.TB, target string, dropAt int64, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *ackShim {
	t.Helper()
	s := &ackShim{
		dial:      dial,
		drops:     faultPlan{at: dropAt},
		listeners: make(map[string]net.Listener),
		conns:     make(map[net.Conn]struct{}),
	}
	addr, err := s.listenerFor(target)
	if err != nil {
		t.Fatalf("shim: %v", err)
	}
	s.bootstrap = addr
	t.Cleanup(s.close)
	return s
}

// Addr is the shim listener that forwards to the target given to newAckShim.
func (s *ackShim) Addr() string { return s.bootstrap }

// setOnDrop sets what runs when a dropped response arrives.
func (s *ackShim) setOnDrop(f func()) { s.onDrop.Store(&f) }

// setTrace sets where the Produce trace goes.
func (s *ackShim) setTrace(f func(string)) { s.trace.Store(&f) }

// setDrops replaces which Produce requests lose their response; call it
// before the first request.
func (s *ackShim) setDrops(p faultPlan) {
	s.mu.Lock()
	s.drops = p
	s.mu.Unlock()
}

// Stats returns a copy of the counters.
func (s *ackShim) Stats() shimStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Listeners = len(s.listeners)
	return st
}

// listenerFor returns the address of the shim listener forwarding to target,
// starting it on 127.0.0.1:0 the first time.
func (s *ackShim) listenerFor(target string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return "", errors.New("shim closed")
	}
	if ln, ok := s.listeners[target]; ok {
		return ln.Addr().String(), nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	s.listeners[target] = ln
	s.wg.Add(1)
	go s.accept(ln, target)
	return ln.Addr().String(), nil
}

func (s *ackShim) close() {
	s.mu.Lock()
	s.closed = true
	for _, ln := range s.listeners {
		ln.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// track registers c so close can end it; false if the shim is closing.
func (s *ackShim) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *ackShim) untrack(c net.Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

func (s *ackShim) accept(ln net.Listener, target string) {
	defer s.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serveConn(c, target)
	}
}

// awaiting is a request whose response the shim expects.
type awaiting struct {
	corr    int32
	key     int16
	version int16
	drop    bool
}

func (s *ackShim) serveConn(client net.Conn, target string) {
	defer s.wg.Done()
	dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	up, err := s.dial(dctx, "tcp", target)
	cancel()
	if err != nil {
		client.Close()
		return
	}
	if !s.track(client) || !s.track(up) {
		client.Close()
		up.Close()
		return
	}
	defer func() {
		client.Close()
		up.Close()
		s.untrack(client)
		s.untrack(up)
	}()

	// Bounded: a client cannot have more requests in flight than this
	// without the request side blocking until responses come back.
	fifo := make(chan awaiting, 1024)
	requestsDone := make(chan struct{})
	go func() {
		defer close(requestsDone)
		defer close(fifo)
		s.relayRequests(client, up, fifo)
		// The client closed (no Kafka client half-closes): the proxy
		// sees it at once, as it would without the shim, not once the
		// answers still due have come back. Closed with answers unread,
		// the connection is reset, as the client's own would be.
		up.Close()
	}()
	s.relayResponses(client, up, fifo, target)
	// Unblock the request side (it may be reading, writing upstream or
	// waiting on a full FIFO) and wait for it.
	client.Close()
	up.Close()
	lost := 0
	for aw := range fifo {
		if aw.drop {
			lost++
		}
	}
	<-requestsDone
	if lost > 0 {
		s.mu.Lock()
		due := s.stats.Produces
		if n := len(s.carried); n > 0 {
			due = max(due, s.carried[n-1])
		}
		for range lost {
			due += max(1, s.drops.every)
			s.carried = append(s.carried, due)
		}
		s.mu.Unlock()
	}
}

// relayRequests copies frames from the client to upstream, noting each
// request that expects a response.
func (s *ackShim) relayRequests(client, up net.Conn, fifo chan<- awaiting) {
	for {
		frame, err := readFrame(client)
		if err != nil {
			return
		}
		aw, expectResponse, err := s.inspectRequest(frame)
		if err != nil {
			return // not Kafka: the shim is a test fixture, it just hangs up
		}
		if tr := s.trace.Load(); tr != nil && aw.key == int16(kmsg.Produce) {
			(*tr)(traceProduce(client, up, frame, aw, true))
		}
		if expectResponse {
			fifo <- aw
		}
		if _, err := up.Write(frame); err != nil {
			return
		}
	}
}

// relayResponses copies frames from upstream to the client, rewriting broker
// addresses and dropping the chosen Produce response.
func (s *ackShim) relayResponses(client, up net.Conn, fifo <-chan awaiting, target string) {
	for {
		frame, err := readFrame(up)
		if err != nil {
			return
		}
		aw, ok := <-fifo
		if !ok {
			return
		}
		if len(frame) < 8 || int32(binary.BigEndian.Uint32(frame[4:8])) != aw.corr {
			return // out of order or garbage: hang up, the test will say why
		}
		if tr := s.trace.Load(); tr != nil && aw.key == int16(kmsg.Produce) {
			(*tr)(traceProduce(client, up, frame, aw, false))
		}
		if aw.drop {
			s.mu.Lock()
			s.stats.Dropped++
			s.stats.DropTarget = target
			s.mu.Unlock()
			if f := s.onDrop.Load(); f != nil {
				(*f)()
			}
			// The answer is lost on a path that broke: what the proxy
			// sees of that is a reset (or silence), never the clean
			// close of a client that read its answers
			// (docs/legacy.md, "The rule").
			resetOnClose(up)
			return // the caller closes both connections
		}
		if aw.key == int16(kmsg.Produce) {
			s.noteProduceResponse(frame, aw)
		}
		// Produce v10+ names the new leader's address in its NOT_LEADER
		// answer (KIP-951); unrewritten, a client that moves there bypasses
		// the shim.
		if aw.key == int16(kmsg.Metadata) || aw.key == int16(kmsg.FindCoordinator) ||
			aw.key == int16(kmsg.Produce) && aw.version >= 10 {
			if frame, err = s.rewriteAddresses(frame, aw); err != nil {
				return
			}
		}
		if _, err := client.Write(frame); err != nil {
			return
		}
	}
}

// noteProduceResponse counts a Produce response's NOT_LEADER_OR_FOLLOWER
// partitions and, if it acknowledged anything, how long it came after the
// previous acknowledgement.
func (s *ackShim) noteProduceResponse(frame []byte, aw awaiting) {
	resp := kmsg.NewPtrProduceResponse()
	resp.SetVersion(aw.version)
	body := frame[8:]
	if resp.IsFlexible() {
		r := kbin.Reader{Src: body}
		kmsg.SkipTags(&r)
		body = r.Src
	}
	if resp.ReadFrom(body) != nil {
		return
	}
	acked := false
	var notLeader int64
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			switch p.ErrorCode {
			case 0:
				acked = true
			case kerr.NotLeaderForPartition.Code:
				notLeader++
			}
		}
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.NotLeader += notLeader
	if acked {
		if !s.stats.lastAck.IsZero() {
			s.stats.Stall = max(s.stats.Stall, now.Sub(s.stats.lastAck))
		}
		s.stats.lastAck = now
	}
}

// inspectRequest reads the request header (and a Produce body) of frame,
// which includes its 4-byte size.
func (s *ackShim) inspectRequest(frame []byte) (awaiting, bool, error) {
	r := kbin.Reader{Src: frame[4:]}
	key, version, corr := r.Int16(), r.Int16(), r.Int32()
	r.NullableString() // client id
	if !r.Ok() {
		return awaiting{}, false, errors.New("short request header")
	}
	aw := awaiting{corr: corr, key: key, version: version}
	req := kmsg.RequestForKey(key)
	if req == nil {
		return awaiting{}, false, fmt.Errorf("unknown request key %d", key)
	}
	req.SetVersion(version)
	if req.IsFlexible() {
		kmsg.SkipTags(&r)
	}
	if key != int16(kmsg.Produce) {
		return aw, true, nil
	}
	preq := req.(*kmsg.ProduceRequest)
	if err := preq.ReadFrom(r.Src); err != nil {
		return awaiting{}, false, fmt.Errorf("produce request: %w", err)
	}
	if preq.Acks == 0 {
		return aw, false, nil
	}
	var records, batches, legacy int64
	var sent [][]int // per partition, the values' indices
	for _, tp := range preq.Topics {
		for _, p := range tp.Partitions {
			n, b, l := countBatches(p.Records)
			records, batches, legacy = records+n, batches+b, legacy+l
			if idx, _, err := batchIndices(p.Records); err == nil {
				sent = append(sent, idx)
			}
		}
	}
	s.mu.Lock()
	for _, idx := range sent {
		s.noteResent(idx)
	}
	s.stats.Produces++
	s.stats.Records += records
	s.stats.Batches += batches
	s.stats.LegacyBatches += legacy
	if s.drops.hits(s.stats.Produces) {
		aw.drop = true
		if s.stats.Produces == s.drops.at {
			s.stats.RecordsAtDrop = s.stats.Records
		}
	} else if len(s.carried) > 0 && s.stats.Produces >= s.carried[0] {
		s.carried = s.carried[1:]
		aw.drop = true
	}
	s.mu.Unlock()
	return aw, true, nil
}

// noteResent counts idx, the values of one partition's batch, into the
// Resent and Merged figures; call it with s.mu held.
func (s *ackShim) noteResent(idx []int) {
	if s.firstSent == nil {
		s.firstSent = make(map[int]int64)
	}
	s.sentSeq++
	var from int64 // the first earlier batch a record of this one came from
	resent, merged := false, false
	for _, v := range idx {
		first, ok := s.firstSent[v]
		if !ok {
			s.firstSent[v] = s.sentSeq
			continue
		}
		if resent && first != from {
			merged = true
		}
		resent, from = true, first
	}
	if resent {
		s.stats.Resent++
	}
	if merged {
		s.stats.Merged++
	}
}

// countBatches walks concatenated v2 record batches: their record count,
// how many there are, and how many have producer id -1. The offsets are
// those of the RecordBatch header (Kafka's DefaultRecordBatch):
// baseOffset 0, batchLength 8, producerId 43, recordCount 57.
func countBatches(b []byte) (records, batches, legacy int64) {
	for len(b) >= 61 {
		length := int(int32(binary.BigEndian.Uint32(b[8:12])))
		if length < 49 || 12+length > len(b) {
			break
		}
		batches++
		records += int64(int32(binary.BigEndian.Uint32(b[57:61])))
		if int64(binary.BigEndian.Uint64(b[43:51])) == -1 {
			legacy++
		}
		b = b[12+length:]
	}
	return records, batches, legacy
}

// rewriteAddresses points every broker address in a Metadata,
// FindCoordinator or Produce (v10+) response at a shim listener.
func (s *ackShim) rewriteAddresses(frame []byte, aw awaiting) ([]byte, error) {
	resp := kmsg.ResponseForKey(aw.key)
	resp.SetVersion(aw.version)
	body := frame[8:] // size, correlation id
	if resp.IsFlexible() {
		// Response header v1: tagged fields after the correlation id (the
		// exception, ApiVersions, is never rewritten here).
		r := kbin.Reader{Src: body}
		kmsg.SkipTags(&r)
		if !r.Ok() {
			return nil, errors.New("short response header")
		}
		body = r.Src
	}
	if err := resp.ReadFrom(body); err != nil {
		return nil, fmt.Errorf("decode %s response: %w", kmsg.NameForKey(aw.key), err)
	}
	var err error
	remap := func(host *string, port *int32) {
		if err != nil || *port <= 0 {
			return
		}
		var addr string
		addr, err = s.listenerFor(net.JoinHostPort(*host, strconv.Itoa(int(*port))))
		if err != nil {
			return
		}
		h, p, _ := net.SplitHostPort(addr)
		pn, _ := strconv.Atoi(p)
		*host, *port = h, int32(pn)
	}
	switch r := resp.(type) {
	case *kmsg.MetadataResponse:
		for i := range r.Brokers {
			remap(&r.Brokers[i].Host, &r.Brokers[i].Port)
		}
	case *kmsg.ProduceResponse:
		for i := range r.Brokers {
			remap(&r.Brokers[i].Host, &r.Brokers[i].Port)
		}
	case *kmsg.FindCoordinatorResponse:
		remap(&r.Host, &r.Port)
		for i := range r.Coordinators {
			remap(&r.Coordinators[i].Host, &r.Coordinators[i].Port)
		}
	}
	if err != nil {
		return nil, err
	}
	out := make([]byte, 8, len(frame)+64)
	copy(out[4:8], frame[4:8])
	if resp.IsFlexible() {
		out = append(out, 0) // no header tags
	}
	out = resp.AppendTo(out)
	binary.BigEndian.PutUint32(out[:4], uint32(len(out)-4))
	return out, nil
}

// resetOnClose makes c's Close send a reset instead of an end of stream.
func resetOnClose(c net.Conn) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
}

// readFrame reads one size-prefixed Kafka frame, the prefix included.
func readFrame(r io.Reader) ([]byte, error) {
	var size [4]byte
	if _, err := io.ReadFull(r, size[:]); err != nil {
		return nil, err
	}
	n := int32(binary.BigEndian.Uint32(size[:]))
	if n < 0 || n > maxShimFrame {
		return nil, fmt.Errorf("frame size %d", n)
	}
	frame := make([]byte, 4+n)
	copy(frame, size[:])
	if _, err := io.ReadFull(r, frame[4:]); err != nil {
		return nil, err
	}
	return frame, nil
}
