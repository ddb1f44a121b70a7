package proxy

import (
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/auth"
	"github.com/dedupproxy/dedupproxy/clock"
	"github.com/dedupproxy/dedupproxy/config"
	"github.com/dedupproxy/dedupproxy/decide"
	"github.com/dedupproxy/dedupproxy/metrics"
	"github.com/dedupproxy/dedupproxy/nodes"
	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/protocol/rewrite"
	"github.com/dedupproxy/dedupproxy/relay"
	"github.com/dedupproxy/dedupproxy/replica"
)

// session is one client connection and its own upstream connection.
//
// Two goroutines, each a named loop so stacks read well:
//   - readLoop reads client requests, queues a pending entry for each one that
//     gets a response, and forwards the frame upstream as it came;
//   - responseLoop takes the entries in request order: for each forwarded one
//     it reads the broker's response (which arrives in request order too),
//     rewrites broker addresses and commits Produce decisions; for each the
//     proxy answers itself it waits until that answer is built; then it writes
//     the response to the client.
//
// queue is bounded by MaxInflight: when it is full readLoop blocks, which is
// the backpressure. Reading and writing in one goroutine costs no hand-off
// per response; the proxy's own answers wait in the queue like the others,
// so responses leave strictly in request order.
type session struct {
	s        *Server
	id       uint64
	client   net.Conn
	upstream net.Conn
	log      *slog.Logger
	in       *relay.ConnReader // readLoop's reader of client

	queue *relay.Queue[*pending]

	stopping   atomic.Bool // Shutdown: stop reading, drain, close
	clientLeft atomic.Bool // readLoop has ended: answers from now on reach no one
	closeOnce  sync.Once
	closed     chan struct{} // closed by closeAll: waits give up

	// Authentication (package auth): the SASL exchange as readLoop and
	// responseLoop see it, the TLS client certificate's principal, and
	// whether the proxy can scope the connection's state.
	auth auth.Client

	warmSlots chan struct{} // one per warm-up this connection runs (connWarmups)

	clientID string    // from the first request: with the principal and host, the client instance
	joined   bool      // readLoop's: clientID is set
	software string    // readLoop's: the client software name of its ApiVersions (v3+)
	readErr  error     // readLoop's: what ended it, nil for the proxy's own reasons
	readAt   time.Time // readLoop's: when the request being handled was read
	// outstanding counts the requests taken in for an answer and not yet
	// done with (newPending, release).
	outstanding atomic.Int64
	// writeMu is held by responseLoop from telling the core an answer is
	// delivered until it is written, and by howClosed while it looks at
	// the socket: an answer the core was told of is written by then.
	writeMu   sync.Mutex
	scan      protocol.ProduceScanner         // readLoop's, reused
	dreq      decide.Request                  // readLoop's, reused
	reduceBuf []byte                          // readLoop's, for rewritten Produce requests
	unqueued  *producePlan                    // readLoop's: decided, not yet queued
	respScan  protocol.ProduceResponseScanner // responseLoop's, reused
	current   *pending                        // responseLoop's: taken from the queue, not yet released
	wakeBuf   []decide.ConnID                 // responseLoop's, reused

	// The core's state of this connection (produce.go), made at its first
	// decided Produce: readLoop's, and Disconnect'ed when readLoop ends.
	dconn          *decide.Conn
	dconnPrincipal auth.PrincipalID
	// sharedConn is dconn for responseLoop, which tells the core the
	// moment the client can no longer be written to.
	sharedConn atomic.Pointer[decide.Conn]
	// wake receives when the core wakes this connection's waiting request.
	wake chan struct{}

	// Large Fetch responses are spliced socket to socket (relay.Fetch)
	// when both legs are plain TCP; nil otherwise.
	rawClient, rawUp syscall.RawConn
	// The legs' own RawConns when each is plain TCP, whether or not the
	// other is: relay.ConnReader reads them without holding a buffer idle.
	readRawClient, readRawUp syscall.RawConn

	tracker *relay.Tracker       // the client connection's, when it has one
	rnode   *replica.Node        // with replicas: the node whose listener took the connection
	req     *relay.RequestBuffer // readLoop's: the request being handled
	reqSend relay.MoreSender     // readLoop's: the bytes of a request between its holes
	fetch   relay.Fetch          // responseLoop's: large Fetch responses

	// waitUpstream's hand-shake with readLoop, under upMu.
	upMu        sync.Mutex
	upWaiting   bool      // responseLoop waits on the broker with nothing queued
	upKicked    bool      // readLoop set a past read deadline to wake it
	upRestore   time.Time // the broker read deadline to put back (the drain deadline, or none)
	queueClosed bool      // readLoop closed the queue
}

// pending is one request awaiting its response.
type pending struct {
	key, version int16
	corrID       int32
	start        time.Time
	api          *metrics.API
	resp         *[]byte      // the whole response frame, from relay.GetFrame; set early when the proxy answers alone
	failed       bool         // no response will come; the connection closes
	plan         *producePlan // Produce decided by the core, else nil
	initTxn      bool         // InitProducerId for a transactional id: feeds fencing
	relayed      bool         // the response went to the client as it was read (relay.Fetch)
	sasl         *auth.Step   // SaslHandshake, SaslAuthenticate: what the request means (package auth)
}

var pendingPool = sync.Pool{New: func() any { return &pending{} }}

// maxPooledFrame bounds the buffers kept for reuse outside the size-class
// pools (a Produce plan's copy of its request).
const maxPooledFrame = 1 << 20

func newSession(s *Server, id uint64, client, upstream net.Conn, log *slog.Logger) *session {
	c := &session{
		s: s, id: id, client: client, upstream: upstream, log: log,
		queue:     relay.NewQueue[*pending](s.Config.MaxInflight),
		closed:    make(chan struct{}),
		warmSlots: make(chan struct{}, connWarmups),
		wake:      make(chan struct{}, 1),
	}
	inner := client
	if tr, ok := client.(*relay.Tracker); ok {
		inner, c.tracker = tr.Conn, tr
	}
	c.readRawClient, c.readRawUp = relay.TCPRawConn(inner), relay.TCPRawConn(upstream)
	if !s.copyOnly {
		c.rawClient, c.rawUp, _ = relay.RawConns(inner, upstream)
	}
	c.fetch = relay.Fetch{
		Client: client, RawClient: c.rawClient, RawUp: c.rawUp, MaxFrame: s.Config.MaxFrameBytes,
		Mapper:      &nodes.Mapper{Registry: &s.nodes, Table: s.table},
		Metrics:     relay.FetchMetrics{BrokerRead: s.Metrics.BrokerReadBytes, ClientWritten: s.Metrics.ClientWrittenBytes},
		Now:         s.now,
		ExtendWrite: c.extendClientWrite,
		WriteFailed: c.clientWriteFailed,
	}
	return c
}

func (c *session) run() {
	done := make(chan struct{})
	go func() { defer close(done); c.responseLoop() }()
	c.readLoop()
	c.clientLeft.Store(true)
	// The client is gone: what it was acknowledged here it may not have
	// read, and it can retry elsewhere at once, on a connection it already
	// has to another broker, before the responses still due drain
	// (docs/legacy.md, "The rule").
	if c.dconn != nil {
		c.s.step(&decide.Event{Kind: decide.EvClose, Conn: c.dconn, How: c.howClosed(c.readErr)}, c.s.now(), nil)
	}
	<-done
	c.closeAll()
}

// howClosed says how the client's connection ended, readErr being what
// ended readLoop (docs/legacy.md, "The rule", 1): Clean when its client
// closed it with nothing outstanding and every answer written on it
// acknowledged by the client's TCP stack and no reset — a client that
// closes with answers unread resets the connection —; Broken otherwise, or when the proxy cannot tell, or is
// told not to trust a clean close (dedup.legacy.clean_close: ignore). A
// close of the proxy's own (idle, draining) is never clean: closing a
// socket with requests of the client left unread sends a reset, and a reset
// makes the client's kernel drop the answers it had not yet handed to the
// client.
func (c *session) howClosed(readErr error) decide.Close {
	if c.s.Config.Dedup.Legacy.CleanClose == config.CleanCloseIgnore || !errors.Is(readErr, io.EOF) {
		return decide.Broken
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if c.outstanding.Load() != 0 {
		// It left with requests unanswered: it gave up on them (a
		// timeout, a broker it moved away from), and a client tearing a
		// connection down may drop answers it has read but not taken.
		return decide.Broken
	}
	if n, ok := relay.Unacked(c.client); !ok || n != 0 || relay.PeerReset(c.client) {
		return decide.Broken
	}
	return decide.Clean
}

// stopReading makes readLoop end at its next read; what was already
// forwarded still gets its response.
func (c *session) stopReading() {
	c.stopping.Store(true)
	c.client.SetReadDeadline(clock.Real.Now())
}

func (c *session) closeAll() {
	c.closeOnce.Do(func() {
		close(c.closed)
		c.client.Close()
		c.upstream.Close()
	})
}

// recoverPanic keeps a panic inside one connection: log it with the stack,
// count it and close the connection (like net/http's conn.serve). What the
// panic interrupted is settled by the loop's own deferred cleanup.
func (c *session) recoverPanic(where string) {
	if r := recover(); r != nil {
		c.s.Metrics.Panics.Inc()
		c.log.Error("panic in connection; closing it", "loop", where, "panic", r, "stack", string(debug.Stack()))
		c.closeAll()
	}
}

func (c *session) readLoop() {
	defer func() {
		// No more requests: let responseLoop drain what was forwarded, but
		// not forever. A client that disconnected never abandons its
		// in-flight requests (docs/produce-path.md).
		drainAt := clock.Real.Now().Add(c.s.Config.DrainTimeout)
		c.upMu.Lock()
		c.upRestore, c.queueClosed = drainAt, true
		if !c.upKicked { // else responseLoop sets upRestore when it wakes
			c.upstream.SetReadDeadline(drainAt)
		}
		c.upMu.Unlock()
		c.queue.Close()
		c.kickResponseLoop()
	}()
	defer func() {
		// A plan decided but not queued (a panic in between) still holds
		// registered batches: they are lost.
		if pl := c.unqueued; pl != nil {
			c.unqueued = nil
			c.lose(pl)
			putPlan(pl)
		}
	}()
	defer c.recoverPanic("read")

	cfg := &c.s.Config
	m := c.s.Metrics
	rb := relay.NewRequestBuffer(c.s.requestPool(), c.tracker)
	if relay.HolesSupported && cfg.ProduceSpliceOn() && c.rawClient != nil && c.rawUp != nil {
		rb.SpliceFrom(c.rawClient, c.client, &c.s.pipes)
	}
	c.req = rb
	defer rb.Release()
	// Asked when a request's size has arrived, not before waiting for it:
	// the answer that authenticated the connection may be read meanwhile.
	rb.SetLimit(func() int32 {
		if c.preAuthentication() {
			// Kafka's sasl.server.max.receive.size: before the broker
			// knows who the client is, it may not make anyone buffer
			// 100 MiB.
			return min(cfg.MaxFrameBytes, cfg.UnauthenticatedMaxFrameBytes)
		}
		return cfg.MaxFrameBytes
	})
	// Buffered reads take a small request's size prefix and body, and often
	// the next request too, in one syscall; large bodies bypass the buffer.
	client := relay.NewConnReader(c.client, c.readRawClient, c.tracker, &c.s.readBufs)
	c.in = client
	defer client.Close()
	for {
		rb.Release() // the previous request has been forwarded
		if cfg.IdleTimeout > 0 {
			c.client.SetReadDeadline(clock.Real.Now().Add(cfg.IdleTimeout))
		}
		if c.stopping.Load() { // after the deadline, so Shutdown's wins (see stopReading)
			return
		}
		rb.SetHoles(!c.s.keysOn())
		body, err := rb.Read(client, cfg.MaxFrameBytes, c.closed)
		if err != nil {
			c.readErr = err
			c.readFailed(err)
			return
		}
		start := c.s.now()
		c.readAt = start
		frame := rb.Frame(body)
		m.ClientReadBytes.Add(float64(len(frame)))
		h, err := protocol.ParseRequestHeader(body)
		if err != nil {
			m.ClientError(metrics.ClientHeader)
			c.log.Warn("closing client connection: bad request header", "err", err)
			return
		}
		api := m.API(h.APIKey)
		api.Requests.Inc()
		if !c.joined {
			c.joined = true
			c.clientID = protocol.ClientID(body, h)
		}
		if h.BodyOffset == 0 { // ApiVersions newer than the proxy knows
			c.answerUnsupportedAPIVersions(h, start, api)
			continue
		}
		respond := true
		initTxn := false
		var sasl *auth.Step
		switch h.APIKey {
		case int16(kmsg.Produce):
			acks, err := protocol.ProduceAcks(body, h)
			if err != nil {
				m.ClientError(metrics.ClientRequest)
				c.log.Warn("closing client connection: bad produce request", "api_version", h.APIVersion, "err", err)
				return
			}
			// acks=0: the broker sends nothing back, so nothing is queued.
			respond = acks != 0
			if c.replicaGate(h, body, acks, start, api) {
				continue // answered: its node is moving between replicas (replicas.go)
			}
			plan, err := c.decideProduce(h, body)
			switch {
			case errors.Is(err, errClientGone):
				return
			case errors.Is(err, errHolesLost):
				c.log.Error("closing connection", "err", err)
				return
			}
			if err != nil {
				m.ClientError(metrics.ClientRequest)
				c.log.Warn("closing client connection: bad produce request", "api_version", h.APIVersion, "err", err)
				return
			}
			if plan != nil {
				if !c.sendDecided(plan, h, body, frame, start, api) {
					return
				}
				continue
			}
		case int16(kmsg.ApiVersions):
			// What the client says it is: a client that names its
			// software resends byte for byte (docs/legacy.md, "What a
			// record is").
			if sw := protocol.ClientSoftware(body, h); sw != "" {
				c.software = sw
			}
		case int16(kmsg.InitProducerID):
			initTxn = c.s.table != nil && isTransactionalInit(body[h.BodyOffset:], h.APIVersion)
		case int16(kmsg.SASLHandshake), int16(kmsg.SASLAuthenticate):
			sasl = c.auth.NoteRequest(h.APIKey, body[h.BodyOffset:], h.APIVersion, &c.s.authEnv, c.log)
		}
		if respond {
			p := c.newPending(h, start, api)
			p.initTxn, p.sasl = initTxn, sasl
			c.enqueue(p)
		}
		if !c.forward(frame) {
			return
		}
	}
}

func (c *session) newPending(h protocol.RequestHeader, start time.Time, api *metrics.API) *pending {
	c.outstanding.Add(1)
	p := pendingPool.Get().(*pending)
	p.key, p.version, p.corrID, p.start, p.api = h.APIKey, h.APIVersion, h.CorrelationID, start, api
	return p
}

// forward writes one request frame upstream. On failure the upstream
// connection is closed, so responseLoop fails whatever is queued.
func (c *session) forward(frame []byte) bool {
	if c.s.Config.WriteTimeout > 0 {
		c.upstream.SetWriteDeadline(clock.Real.Now().Add(c.s.Config.WriteTimeout))
	}
	var err error
	if rb := c.req; rb != nil && rb.HasHoles() {
		var spliced int
		spliced, err = rb.WriteAround(c.upstream, c.rawUp, &c.reqSend, frame)
		c.s.Metrics.ProduceSpliced.Add(float64(spliced))
	} else {
		_, err = c.upstream.Write(frame)
	}
	if err != nil {
		c.s.Metrics.BrokerError(metrics.BrokerWrite)
		c.log.Warn("closing connection: write to broker failed", "err", err)
		c.upstream.Close()
		return false
	}
	c.s.Metrics.BrokerWrittenBytes.Add(float64(len(frame)))
	return true
}

// fillRequest reads back the record bytes of this connection's request
// being read that are held in pipes, when the core asks (ReadRecords).
func (c *session) fillRequest() bool {
	if c.req == nil {
		return true
	}
	ok, readBack := c.req.FillHoles()
	if readBack > 0 {
		c.s.Metrics.ProduceReadBack.Add(float64(readBack))
	}
	return ok
}

func (c *session) readFailed(err error) {
	m := c.s.Metrics
	switch {
	case c.stopping.Load():
		c.log.Debug("stopped reading for shutdown")
	case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed):
		c.log.Debug("client closed connection")
	case errors.Is(err, os.ErrDeadlineExceeded):
		m.ClientError(metrics.ClientIdle)
		c.log.Info("closing idle client connection", "idle_timeout", c.s.Config.IdleTimeout)
	case errors.Is(err, protocol.ErrLooksLikeTLS):
		m.ClientError(metrics.ClientTLS)
		c.log.Warn("closing client connection: it speaks TLS; this listener is plaintext", "err", err)
	case errors.Is(err, protocol.ErrLooksLikeHTTP):
		m.ClientError(metrics.ClientHTTP)
		c.log.Warn("closing client connection: it speaks HTTP, not the Kafka protocol", "err", err)
	case errors.Is(err, protocol.ErrFrameTooLarge) && c.preAuthentication():
		m.ClientError(metrics.ClientUnauth)
		c.log.Warn("closing client connection: request too large before authentication (unauthenticated_max_frame_bytes)", "err", err)
	case errors.Is(err, protocol.ErrFrameTooLarge), errors.Is(err, protocol.ErrFrameSize):
		m.ClientError(metrics.ClientFrame)
		c.log.Warn("closing client connection: bad frame", "err", err)
	case errors.Is(err, io.ErrUnexpectedEOF):
		m.ClientError(metrics.ClientFrame)
		c.log.Warn("closing client connection: truncated frame", "err", err)
	default:
		c.log.Info("client connection read failed", "err", err)
	}
}

func (c *session) responseLoop() {
	failed := false       // the upstream connection broke: no more responses come
	dead := false         // the client is gone or failed: nothing more is written
	disconnected := false // the core was told the connection broke
	defer func() {
		// Settle what a panic interrupted and whatever is still queued:
		// release their batches and abandon their waits, so nothing stays
		// pending in the table.
		c.upstream.Close()
		c.fetch.Close()
		if p := c.current; p != nil {
			c.current = nil
			c.fail(p)
			c.undelivered(p)
			c.release(p)
		}
		for {
			p, ok := c.queue.Pop()
			if !ok {
				break
			}
			c.fail(p)
			c.undelivered(p)
			c.release(p)
		}
	}()
	defer c.recoverPanic("response")
	upstream := relay.NewConnReader(c.upstream, c.readRawUp, nil, &c.s.readBufs)
	defer upstream.Close()
	// Idle, wait on the broker rather than on the queue (waitUpstream);
	// only on a plain TCP broker connection (a TLS one is left to the
	// simpler wait), and not once that connection has failed.
	_, waitUp := c.upstream.(*net.TCPConn)
	for {
		if waitUp && !failed && c.queue.Len() == 0 {
			waitUp = c.waitUpstream(upstream)
		}
		p, ok := c.queue.Pop()
		if !ok {
			break
		}
		c.current = p
		switch {
		case !c.awaitsUpstream(p):
			// answered wholly by the proxy
		case failed:
			c.fail(p)
		default:
			var err error
			if !dead {
				alive := true
				if p.key == int16(kmsg.Fetch) && p.plan == nil {
					p.relayed, alive, err = c.fetch.Relay(upstream, p.version, p.corrID, p.start, p.api.Duration)
				}
				dead = !alive
			}
			if !p.relayed && err == nil {
				err = c.readResponse(upstream, p)
			}
			if err != nil {
				failed = true
				c.upstreamFailed(err, p)
				c.fail(p)
				c.closeAll() // the client must not wait for responses that cannot come
			}
		}
		if pl := p.plan; pl != nil && pl.AnyLocal && !p.failed {
			c.finishProduce(p)
		}
		if p.failed && !dead {
			dead = true
			c.closeAll()
		}
		told, locked := false, false
		if pl := p.plan; pl != nil && pl.held && !dead && !p.relayed && !p.failed && c.clientHungUp() {
			// Its decision waited, and meanwhile the client closed this
			// connection (its end of stream is in the kernel, perhaps
			// behind requests of it not yet read): the answer will not be
			// read, whatever the write says. The broker connection stays:
			// requests forwarded behind this one are still in flight, and
			// their outcomes are read and committed as for any client
			// that left (docs/produce-path.md).
			dead = true
			c.client.Close()
		}
		if pl := p.plan; pl != nil && !dead && !p.relayed && !p.failed && !c.clientLeft.Load() {
			c.writeMu.Lock()
			locked = true
			// The core hears of the answer before it is written: its
			// client may read it and send the same record on another
			// connection before this goroutine runs again, and that is
			// new data. Should the write fail, Disconnect below makes the
			// answer one the client may not hold.
			told = true
			c.s.step(&decide.Event{Kind: decide.EvWritten, Plan: &pl.Plan, OK: true}, c.s.now(), nil)
		}
		if !dead && !p.relayed {
			dead = !c.writeResponse(p)
			if p.plan != nil {
				testHook("written")
			}
		}
		if locked {
			c.writeMu.Unlock()
		}
		if dead && !disconnected {
			// The client's connection broke (or is being closed): the
			// answers written to it before may not have been read, and
			// its client resends elsewhere at once. readLoop may be held
			// a while yet (behind a full queue the slow broker drains, or
			// a wait), so the core hears it now, not when readLoop ends.
			disconnected = true
			if conn := c.sharedConn.Load(); conn != nil {
				c.s.step(&decide.Event{Kind: decide.EvClose, Conn: conn, How: decide.Broken}, c.s.now(), nil)
			}
		}
		if pl := p.plan; pl != nil && !told {
			c.s.step(&decide.Event{Kind: decide.EvWritten, Plan: &pl.Plan, OK: !dead && !p.failed && !c.clientLeft.Load()}, c.s.now(), nil)
		}
		c.current = nil
		c.release(p)
	}
}

// waitUpstream blocks while nothing is queued until the broker sends
// something or readLoop kicks (kickResponseLoop), and reports whether it
// may be used again (false once the broker connection failed; the error
// is met again by the read that follows).
//
// Why: a request and its response used to take two wake-ups of this
// goroutine, one when readLoop queued the request and one when the
// response arrived; each wake-up of a parked goroutine on an idle CPU costs
// a futex and scheduler work. Parked on the broker connection instead, it
// wakes once, when the response arrives; the request is queued by then,
// since readLoop queues before it forwards. What readLoop queues for the
// proxy to answer alone (nothing will arrive from the broker), and the end
// of the queue, it announces with a kick: a read deadline in the past,
// which this function undoes under upMu before anything else reads.
func (c *session) waitUpstream(upstream *relay.ConnReader) bool {
	c.upMu.Lock()
	if c.queue.Len() > 0 || c.queueClosed {
		c.upMu.Unlock()
		return true
	}
	c.upWaiting = true
	c.upMu.Unlock()
	_, err := upstream.Peek(1)
	c.upMu.Lock()
	kicked := c.upKicked
	c.upWaiting, c.upKicked = false, false
	if kicked {
		c.upstream.SetReadDeadline(c.upRestore)
	}
	c.upMu.Unlock()
	return err == nil || (kicked && errors.Is(err, os.ErrDeadlineExceeded))
}

// kickResponseLoop wakes responseLoop from waitUpstream, if it is there.
// readLoop calls it after queueing a request no broker response answers,
// and after closing the queue.
func (c *session) kickResponseLoop() {
	c.upMu.Lock()
	if c.upWaiting && !c.upKicked {
		c.upKicked = true
		c.upstream.SetReadDeadline(clock.Real.Now())
	}
	c.upMu.Unlock()
}

// awaitsUpstream reports whether a response for p comes from the broker.
func (c *session) awaitsUpstream(p *pending) bool {
	return p.resp == nil && (p.plan == nil || p.plan.AnyUp)
}

// readResponse reads the broker's response to p, rewrites it and commits
// what it decides. For a Produce the proxy partly answers itself it keeps
// the response for the merge (finishProduce); otherwise it sets p.resp.
func (c *session) readResponse(upstream io.Reader, p *pending) error {
	bp, body, err := relay.ReadPooledFrame(upstream, c.s.Config.MaxFrameBytes)
	if err == nil && protocol.ResponseCorrelationID(body) != p.corrID {
		err = errCorrelation
	}
	if err == nil {
		c.s.Metrics.BrokerReadBytes.Add(float64(4 + len(body)))
		c.noteResponse(p, body)
		err = c.rewrite(p, bp, body)
	}
	var off int
	if err == nil && (p.plan != nil || p.initTxn) {
		if off, err = protocol.ResponseBodyOffset((*bp)[4:], p.key, p.version); err == nil {
			if p.initTxn {
				c.observeInit(p, (*bp)[4+off:])
			} else {
				testHook("commit")
				err = c.settleResponse(p.plan, (*bp)[4+off:])
			}
		}
	}
	if err != nil {
		relay.PutFrame(bp)
		return err
	}
	if pl := p.plan; pl != nil && pl.AnyLocal {
		pl.upstream, pl.upOff = bp, off
		return nil
	}
	p.resp = bp
	return nil
}

// writeResponse writes p's response to the client and reports whether the
// client can still be written to.
func (c *session) writeResponse(p *pending) bool {
	frame := *p.resp
	c.extendClientWrite()
	if _, err := c.client.Write(frame); err != nil {
		c.clientWriteFailed(err)
		return false
	}
	c.s.Metrics.ClientWrittenBytes.Add(float64(len(frame)))
	p.api.Duration.Observe(c.s.now().Sub(p.start).Seconds())
	return true
}

// clientWriteFailed handles a failed write to the client: counted and
// logged unless the proxy is stopping, and the client connection closed.
// readLoop ends on the closed socket; responseLoop keeps reading and
// committing what was forwarded until drained.
func (c *session) clientWriteFailed(err error) {
	if !c.stopping.Load() {
		c.s.Metrics.ClientError(metrics.ClientWrite)
		c.log.Info("client write failed; draining broker responses", "err", err)
	}
	c.client.Close()
}

// extendClientWrite sets the client's write deadline for one response.
func (c *session) extendClientWrite() {
	if c.s.Config.WriteTimeout > 0 {
		c.client.SetWriteDeadline(clock.Real.Now().Add(c.s.Config.WriteTimeout))
	}
}

var errCorrelation = errors.New("broker response out of order (correlation id mismatch)")

func (c *session) upstreamFailed(err error, p *pending) {
	m := c.s.Metrics
	if c.stopping.Load() && errors.Is(err, net.ErrClosed) {
		// Shutdown closed it (a connection with only long polls in flight
		// is cut at once, drain.go): not a broker error.
		c.log.Debug("connection closed for shutdown", "api", kmsg.NameForKey(p.key))
		return
	}
	switch {
	case errors.Is(err, errCorrelation), errors.Is(err, protocol.ErrMalformedResponse), errors.Is(err, protocol.ErrFrameTooLarge), errors.Is(err, protocol.ErrFrameSize):
		m.BrokerError(metrics.BrokerProtocol)
		c.log.Error("closing connection: bad broker response", "api", kmsg.NameForKey(p.key), "api_version", p.version, "err", err)
	case errors.Is(err, os.ErrDeadlineExceeded):
		m.BrokerError(metrics.BrokerRead)
		if c.stopping.Load() {
			c.s.drainGaveUp.Store(true)
			c.log.Warn("gave up waiting for broker responses at shutdown", "drain_timeout", c.s.Config.DrainTimeout)
			return
		}
		c.log.Warn("gave up waiting for broker responses after the client left", "drain_timeout", c.s.Config.DrainTimeout)
	default:
		m.BrokerError(metrics.BrokerRead)
		c.log.Warn("closing connection: broker connection failed", "api", kmsg.NameForKey(p.key), "err", err)
	}
}

// rewrite replaces the broker addresses in a response, or caps the versions
// of an ApiVersions response, in place in *bp. Most responses pass through
// untouched.
func (c *session) rewrite(p *pending, bp *[]byte, body []byte) error {
	var (
		out     []byte
		changed bool
		err     error
	)
	if p.key == int16(kmsg.ApiVersions) {
		off, herr := protocol.ResponseBodyOffset(body, p.key, p.version)
		if herr != nil {
			return herr
		}
		out, changed, err = rewrite.CapAPIVersions(nil, p.version, body[off:])
		if changed {
			*bp = spliceBody(*bp, off, out)
		}
		return err
	}
	if !rewrite.CarriesAddresses(p.key, p.version) {
		return nil
	}
	off, err := protocol.ResponseBodyOffset(body, p.key, p.version)
	if err != nil {
		return err
	}
	out, changed, err = rewrite.Addresses(nil, p.key, p.version, body[off:], &nodes.Mapper{Registry: &c.s.nodes, Table: c.s.table})
	if err != nil {
		return err
	}
	if changed {
		*bp = spliceBody(*bp, off, out)
	}
	return nil
}

// spliceBody replaces the body of the response frame in buf (size prefix,
// header of hdrLen bytes, body) with newBody and fixes the size prefix.
func spliceBody(buf []byte, hdrLen int, newBody []byte) []byte {
	buf = append(buf[:4+hdrLen], newBody...)
	size := uint32(len(buf) - 4)
	buf[0], buf[1], buf[2], buf[3] = byte(size>>24), byte(size>>16), byte(size>>8), byte(size)
	return buf
}

// fail marks p as getting no response: its batches' outcome is unknown
// (the core settles them from the log), and the connection closes. It is
// idempotent.
func (c *session) fail(p *pending) {
	if pl := p.plan; pl != nil {
		c.lose(pl)
	}
	p.failed = true
}

// undelivered tells the core that p's answer did not reach the client.
func (c *session) undelivered(p *pending) {
	if pl := p.plan; pl != nil {
		c.s.step(&decide.Event{Kind: decide.EvWritten, Plan: &pl.Plan}, c.s.now(), nil)
	}
}

func (c *session) release(p *pending) {
	c.outstanding.Add(-1)
	if pl := p.plan; pl != nil {
		putPlan(pl)
	}
	relay.PutFrame(p.resp)
	*p = pending{}
	pendingPool.Put(p)
}

// answerUnsupportedAPIVersions answers an ApiVersions request newer than the
// proxy can decode the way a broker answers one newer than it supports
// (KIP-511): UNSUPPORTED_VERSION in a v0 body offering the versions the proxy
// can read, so the client retries lower. Relaying it instead could bring
// back a response the proxy cannot cap.
func (c *session) answerUnsupportedAPIVersions(h protocol.RequestHeader, start time.Time, api *metrics.API) {
	maxV, _ := rewrite.MaxVersion(int16(kmsg.ApiVersions))
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.SetVersion(0)
	resp.ErrorCode = kerr.UnsupportedVersion.Code
	k := kmsg.NewApiVersionsResponseApiKey()
	k.ApiKey, k.MinVersion, k.MaxVersion = int16(kmsg.ApiVersions), 0, maxV
	resp.ApiKeys = append(resp.ApiKeys, k)
	bp := relay.GetFrame(64)
	buf := append((*bp)[:0], 0, 0, 0, 0)
	buf = binary.BigEndian.AppendUint32(buf, uint32(h.CorrelationID)) // v0 response header
	buf = resp.AppendTo(buf)
	binary.BigEndian.PutUint32(buf, uint32(len(buf)-4))
	*bp = buf
	p := c.newPending(h, start, api)
	p.resp = bp
	c.enqueue(p)
	c.kickResponseLoop()
}

// enqueue queues p for responseLoop (blocking at MaxInflight: the
// backpressure).
func (c *session) enqueue(p *pending) { c.queue.Push(p) }

// authenticated returns the connection's principal once the broker has
// authenticated it (auth.Client.Authenticated); ok is false before, and
// for a connection the proxy cannot scope.
func (c *session) authenticated() (auth.Principal, bool) {
	return c.auth.Authenticated(c.s.openUpstream.Load())
}

func (c *session) isAuthenticated() bool {
	_, ok := c.authenticated()
	return ok
}

// preAuthentication reports whether the broker has not yet authenticated
// the connection, as far as the proxy can tell: Kafka's limit on request
// size applies until it has.
func (c *session) preAuthentication() bool {
	return c.auth.PreAuthentication(c.s.openUpstream.Load())
}
