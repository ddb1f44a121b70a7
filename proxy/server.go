package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dedupproxy/dedupproxy/auth"
	"github.com/dedupproxy/dedupproxy/clock"
	"github.com/dedupproxy/dedupproxy/config"
	"github.com/dedupproxy/dedupproxy/decide"
	"github.com/dedupproxy/dedupproxy/metrics"
	"github.com/dedupproxy/dedupproxy/nodes"
	"github.com/dedupproxy/dedupproxy/relay"
	"github.com/dedupproxy/dedupproxy/replica"
	"github.com/dedupproxy/dedupproxy/seqstate"
	"github.com/dedupproxy/dedupproxy/tail"
)

// ErrAdminPortTaken is returned by [Server.Start] when a listener the proxy
// needs (the bootstrap's, or a broker node's learned by Start's probe)
// would take the admin listener's port ([Server.AdminAddr]).
var ErrAdminPortTaken = nodes.ErrAdminPortTaken

// ErrServerClosed is returned by [Server.Start] called after (or while)
// [Server.Shutdown] runs: a Server serves once, like net/http's.
var ErrServerClosed = errors.New("proxy: server closed")

// shutdownGrace bounds how long Shutdown, once its context has ended and it
// has closed every connection, waits for the connection goroutines to
// notice. Past it Shutdown returns anyway: its context is final.
const shutdownGrace = 250 * time.Millisecond

// Server is the proxy: a bootstrap listener that forwards to the configured
// upstream brokers, and one listener per broker node, started when the node is
// first seen in a response. Each client connection gets its own upstream
// connection to the broker it addressed (docs/produce-path.md).
//
// Fields other than Config are optional injectable dependencies; set them
// before Start.
type Server struct {
	Config Config

	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Metrics defaults to unregistered metrics.
	Metrics *Metrics
	// Listen replaces net.Listen, for tests that inject faults.
	Listen func(network, addr string) (net.Listener, error)
	// Dial replaces the upstream dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Clock is the proxy's clock (package clock): decisions read the time
	// on it, and their waits, windows, expiries and periodic work run on
	// it. Nil means clock.Real. Socket deadlines and waits that bound I/O
	// stay on the real clock.
	Clock clock.Clock
	// Now, when set, reads the time in place of Clock.Now.
	Now func() time.Time
	// AdminAddr is the bound address of the admin HTTP listener, when the
	// command runs one. Bind it before Start: a proxy listener that cannot
	// bind because the admin listener holds its port then says so, and
	// Start fails with ErrAdminPortTaken if that happens to the bootstrap
	// listener or to a node its probe learns.
	AdminAddr net.Addr

	nodes nodes.Registry // broker nodes and their listeners
	// The Produce path (produce.go): the decision core and its tables, nil
	// in dedup mode off.
	core           *decide.Core
	table          *seqstate.Table
	keys           *seqstate.KeyTable
	setDedupMu     sync.Mutex                                       // serializes SetDedup
	unknownTopics  atomic.Uint64                                    // batches relayed for topics not yet interned
	drainGaveUp    atomic.Bool                                      // a connection stopped by Shutdown gave up on its broker's responses
	pendingBatches atomic.Int64                                     // batches sent upstream, not yet settled
	byID           sync.Map                                         // session id -> *session, to wake a waiting request
	openUpstream   atomic.Bool                                      // a broker answered a request without authentication (see session.authenticated)
	answerLog      metrics.LogLimiter                               // lines about batches the proxy answered itself
	topicCounters  atomic.Pointer[map[string]*metrics.TopicCounter] // listed topics' counters (metrics: true)

	principals     auth.Principals    // numbers for the principals of authenticated connections (package auth)
	own            *tail.Conns        // the proxy's own broker connections (the probe, tails, a take's partitions)
	tails          *tail.Reader       // partitions' tails (warm.go)
	warmSlots      chan struct{}      // one per warm-up running (dedup.warm.max_concurrent)
	warmLog        metrics.LogLimiter // warm-up failures
	authEnv        auth.Env           // what client connections' authentication shares, set by Start
	replicas       *replica.Set       // nil when the proxy runs on its own (replicas.go)
	replicaMetrics *replica.Metrics

	// tls is TLS on both legs (tls.go, package auth), set by Start.
	tls auth.TLS

	// stop is closed, and dialCtx cancelled, once by the first Shutdown:
	// background loops end and dials in progress are abandoned.
	stop       chan struct{}
	stopOnce   sync.Once
	dialCtx    context.Context
	cancelDial context.CancelFunc
	// warmCtx bounds the partition tails read for requests already read:
	// a drain lets them finish (each within dedup.warm.timeout), so a
	// retry the proxy holds is decided with its tail; it is cancelled only
	// when the drain's deadline passes.
	warmCtx    context.Context
	cancelWarm context.CancelFunc

	// copyOnly turns off splicing large Fetch responses (relay.Fetch), so
	// tests and benchmarks can compare the two paths.
	copyOnly bool

	refusals refusalLog // connections refused for a limit, logged sparingly

	reqPool     *relay.RequestPool // large requests' buffers, made on first use
	pipes       relay.PipePool     // pipes holding produce records
	reqPoolOnce sync.Once
	readBufs    atomic.Int64 // connection read buffers held now (relay.ConnReader)

	// mu guards the fields below, and makes "not closing" and registering
	// a listener, a session or a goroutine one step, so that nothing
	// starts after Shutdown took its snapshot.
	mu        sync.Mutex
	listeners []net.Listener
	clients   map[net.Conn]netip.Addr     // every client connection admitted and not yet finished, with its IP when counted in perIP
	perIP     map[netip.Addr]int          // open connections per client IP, kept when MaxConnectionsPerIP is set
	sessions  map[*session]*relay.Tracker // with what each awaits (drain.go)
	closing   atomic.Bool                 // written under mu; read without it where a stale false is harmless
	started   bool
	wg        sync.WaitGroup // accept loops, connections, background loops
	connSeq   atomic.Uint64
	bootNext  atomic.Uint32
	bootstrap net.Listener
}

// Start validates the configuration, binds the bootstrap listener, learns the
// cluster's brokers from the upstream (starting their listeners) when it can,
// and serves in the background until Shutdown. A Server starts once: Start
// after Shutdown returns [ErrServerClosed].
func (s *Server) Start(ctx context.Context) error {
	if s.closing.Load() {
		return ErrServerClosed
	}
	s.Config.EnsureDefaults()
	if err := s.Config.Validate(); err != nil {
		return err
	}
	if len(s.Config.Upstream) == 0 {
		return fmt.Errorf("%w: no upstream brokers", config.ErrInvalidConfig)
	}
	if s.Config.Upstream[0] == config.EmbeddedUpstream {
		return fmt.Errorf("%w: upstream %q: the command starts the embedded cluster and passes its addresses", config.ErrInvalidConfig, config.EmbeddedUpstream)
	}
	if s.Logger == nil {
		s.Logger = slog.Default()
	}
	if s.Metrics == nil {
		s.Metrics = NewMetrics(nil)
	}
	if s.Listen == nil {
		s.Listen = net.Listen
	}
	if s.Dial == nil {
		d := &net.Dialer{Timeout: s.Config.DialTimeout, KeepAlive: 30 * time.Second}
		s.Dial = d.DialContext
	}
	s.own = &tail.Conns{Dial: s.dialUpstream, SASL: auth.SASLMechanism(s.Config.UpstreamSASL), MaxFrame: s.Config.MaxFrameBytes,
		TLS: s.Config.UpstreamTLS.Enabled, User: s.Config.UpstreamSASL.User}
	s.tails = &tail.Reader{Conns: s.own, Bootstrap: s.Config.Upstream, Brokers: &s.nodes, LogStart: s.noteLogStart}
	core, table, keys, err := newCore(&s.Config)
	if err != nil {
		return fmt.Errorf("%w: %v", config.ErrInvalidConfig, err)
	}
	if tc := s.Metrics.TopicCounters(&s.Config.Dedup, nil); tc != nil {
		s.topicCounters.Store(&tc)
	}
	s.warmSlots = make(chan struct{}, s.Config.Dedup.Warm.MaxConcurrent)
	if s.Config.ProduceSplice != nil && *s.Config.ProduceSplice {
		// Say so when it cannot apply, rather than leave an operator to
		// wonder why dedupproxy_produce_spliced_bytes_total stays at 0.
		switch {
		case !relay.HolesSupported:
			s.Logger.Warn("produce_splice has no effect: it needs Linux's splice(2)")
		case s.Config.TLS.Enabled() || s.Config.UpstreamTLS.Enabled:
			s.Logger.Warn("produce_splice applies to plain TCP legs only: it has no effect where TLS is on")
		}
	}
	s.mu.Lock()
	switch {
	case s.closing.Load():
		s.mu.Unlock()
		return ErrServerClosed
	case s.started:
		s.mu.Unlock()
		return errors.New("proxy: server already started")
	}
	s.started = true
	s.sessions = make(map[*session]*relay.Tracker)
	s.clients = make(map[net.Conn]netip.Addr)
	s.perIP = make(map[netip.Addr]int)
	s.stop = make(chan struct{})
	s.dialCtx, s.cancelDial = context.WithCancel(context.Background())
	s.warmCtx, s.cancelWarm = context.WithCancel(context.Background())
	s.core, s.table, s.keys = core, table, keys
	s.nodes.Init(nodes.Options{
		Config: &s.Config, Log: s.Logger, Now: s.now, Metrics: s.Metrics,
		Listen:    func(network, addr string) (net.Listener, error) { return s.Listen(network, addr) },
		Serve:     s.serve,
		Closing:   s.closing.Load,
		AdminAddr: s.AdminAddr,
		Replicas:  func() *replica.Set { return s.replicas },
	})
	s.mu.Unlock()
	if err := s.setupTLS(); err != nil {
		return err
	}
	s.setupAuth()
	s.replicaMetrics = newReplicaMetrics(s)
	if err := s.replicaStart(); err != nil {
		return fmt.Errorf("%w: %v", config.ErrInvalidConfig, err)
	}
	if s.core != nil {
		s.Metrics.RegisterTable(s.table)
		s.registerCore()
		if s.keys != nil {
			s.Metrics.RegisterKeys(s.keys)
		}
		every := max(min(s.Config.Dedup.ProducerIDExpiration/10, time.Minute), 10*time.Millisecond)
		s.spawnTicker(every, s.expireLoop)
	}
	if s.tls.Files() {
		s.spawnTicker(max(s.Config.CertReloadInterval, 10*time.Millisecond), s.certReloadLoop)
	}

	ln, err := s.Listen("tcp", s.Config.Listen)
	if err != nil {
		if port, ok := nodes.AdminHolds(s.AdminAddr, s.Config.Listen, err); ok {
			return fmt.Errorf("%w: port %d for the bootstrap listener is the admin listener's (%s)", ErrAdminPortTaken, port, s.AdminAddr)
		}
		return fmt.Errorf("bootstrap listener: %w", err)
	}
	s.mu.Lock()
	s.bootstrap = ln
	s.mu.Unlock()
	if !s.serve(ln, -1) {
		return ErrServerClosed
	}
	s.Logger.Info("listening", "listener", "bootstrap", "addr", ln.Addr().String(), "upstream", s.Config.Upstream,
		"tls", s.tls.Client != nil, "upstream_tls", s.tls.Upstream != nil, "upstream_sasl", s.Config.UpstreamSASL.Mechanism)

	// Learning the brokers and topics up front makes node listeners exist
	// before any client asks, and batches decidable, which matters after a
	// restart: clients reconnect to node addresses and produce to topics
	// they cached. An unreachable upstream is not fatal; /readyz says so and
	// nodes and topics are learned from the first Metadata that passes.
	if err := s.learnTopics(ctx); err != nil {
		s.Logger.Warn("upstream not reachable yet", "err", err)
	}
	if s.table != nil {
		s.spawnTicker(topicRefreshInterval, s.topicRefreshLoop)
	}
	if s.replicas != nil {
		s.spawn(s.replicas.PollLoop)
	}
	// A node listener on the admin port is a configuration mistake that
	// would leave that broker unreachable for good: refuse to start.
	if err := s.nodes.AdminCollision(); err != nil {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		s.Shutdown(sctx)
		return err
	}
	return nil
}

// registerCore exports the gauges of the Produce path.
func (s *Server) registerCore() {
	s.Metrics.RegisterCore(metrics.Core{
		Pending:       s.pendingBatches.Load,
		LegacyRecords: func() (int64, uint64) { return s.core.LegacyRecords() },
		LegacyUse:     func(buf []decide.PrincipalUse) []decide.PrincipalUse { return s.core.LegacyUse(buf) },
		PrincipalName: s.principals.Name,
	})
}

// now reads the proxy's clock.
func (s *Server) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	if s.Clock != nil {
		return s.Clock.Now()
	}
	return clock.Real.Now()
}

// clock is the proxy's clock, for its timers and tickers (Clock, with Now
// reading the time when set).
func (s *Server) clock() clock.Clock {
	c := s.Clock
	if c == nil {
		c = clock.Real
	}
	if s.Now != nil {
		return nowClock{c, s.Now}
	}
	return c
}

// nowClock is a clock whose Now is replaced.
type nowClock struct {
	clock.Clock
	now func() time.Time
}

func (c nowClock) Now() time.Time { return c.now() }

// Addr returns the bootstrap listener's address.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bootstrap == nil {
		return nil
	}
	return s.bootstrap.Addr()
}

// serve registers ln and runs its accept loop in the background; node is
// -1 for the bootstrap listener. With TLS to clients, its connections speak
// TLS. Once Shutdown has begun it closes ln instead and returns false:
// Shutdown closes only the listeners registered before it, so one
// registered after would never be closed.
func (s *Server) serve(ln net.Listener, node int32) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing.Load() {
		ln.Close()
		return false
	}
	if s.tls.Client != nil {
		ln = auth.Listener(ln, s.tls.Client.ServerConfig())
	}
	s.listeners = append(s.listeners, ln)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.acceptLoop(ln, node)
	}()
	return true
}

// spawnTicker runs loop on a ticker of the proxy's clock, made before
// spawnTicker returns (a test that moves the clock after Start finds it
// there), and stopped when loop returns.
func (s *Server) spawnTicker(every time.Duration, loop func(*clock.Ticker)) {
	t := s.clock().NewTicker(every)
	if !s.spawn(func() { defer t.Stop(); loop(t) }) {
		t.Stop()
	}
}

// spawn runs f in a goroutine that Shutdown waits for, unless Shutdown has
// begun; it reports whether f runs. (Adding to the WaitGroup under mu,
// before closing is set, keeps every Add ahead of Shutdown's Wait.)
func (s *Server) spawn(f func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing.Load() {
		return false
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f()
	}()
	return true
}

func (s *Server) acceptLoop(ln net.Listener, node int32) {
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if s.closing.Load() {
				return
			}
			// Accept errors are usually temporary (EMFILE): back off like
			// net/http, 5ms doubling to 1s, rather than spin or exit.
			if backoff == 0 {
				backoff = 5 * time.Millisecond
			} else if backoff *= 2; backoff > time.Second {
				backoff = time.Second
			}
			s.Logger.Error("accept failed", "addr", ln.Addr().String(), "err", err, "retry_in", backoff)
			t := clock.Real.NewTimer(backoff)
			select {
			case <-t.C:
			case <-s.stop:
				t.Stop()
				return
			}
			continue
		}
		backoff = 0
		switch refused := s.admit(c, node); refused {
		case "":
		case refusedClosing:
			c.Close()
			return
		default:
			// Closed at once, before any dial or buffer: a flood of
			// connections costs an accept and a close each.
			c.Close()
			s.refused(refused, c)
		}
	}
}

// Why admit refuses a connection: Shutdown has begun, or a limit
// (metrics.RefusedMaxConns, metrics.RefusedMaxPerIP: the label of
// dedupproxy_client_connections_refused_total).
const refusedClosing = "closing"

// admit registers a new client connection and starts its handler, or says
// why not: Shutdown has begun, or MaxConnections or MaxConnectionsPerIP is
// reached.
func (s *Server) admit(c net.Conn, node int32) (refused string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing.Load() {
		return refusedClosing
	}
	if limit := s.Config.MaxConnections; limit > 0 && len(s.clients) >= limit {
		return metrics.RefusedMaxConns
	}
	var ip netip.Addr
	if limit := s.Config.MaxConnectionsPerIP; limit > 0 {
		ip = remoteIP(c)
		if s.perIP[ip] >= limit {
			return metrics.RefusedMaxPerIP
		}
		s.perIP[ip]++
	}
	s.clients[c] = ip
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer s.release(c)
		s.handle(c, node)
	}()
	return ""
}

// release forgets a client connection admit registered.
func (s *Server) release(c net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ip, ok := s.clients[c]
	delete(s.clients, c)
	if ok && ip.IsValid() {
		if s.perIP[ip]--; s.perIP[ip] <= 0 {
			delete(s.perIP, ip)
		}
	}
}

// remoteIP is the client's address for MaxConnectionsPerIP; an IPv4-mapped
// IPv6 address counts as the IPv4 one.
func remoteIP(c net.Conn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.AddrPort().Addr().Unmap()
	}
	ap, _ := netip.ParseAddrPort(c.RemoteAddr().String())
	return ap.Addr().Unmap()
}

// refusalLogEvery spaces the log lines about refused connections: a flood
// must not become a flood of log lines.
const refusalLogEvery = 10 * time.Second

// refusalLog rate-limits the refused-connection log line.
type refusalLog struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// refused counts a connection refused for reason and logs it, at most one
// line per refusalLogEvery, with the number refused in between.
func (s *Server) refused(reason string, c net.Conn) {
	s.Metrics.ConnectionRefused(reason)
	r := &s.refusals
	now := s.now()
	r.mu.Lock()
	if !r.last.IsZero() && now.Sub(r.last) < refusalLogEvery {
		r.suppressed++
		r.mu.Unlock()
		return
	}
	suppressed := r.suppressed
	r.last, r.suppressed = now, 0
	r.mu.Unlock()
	s.Logger.Warn("refusing client connections: limit reached", "reason", reason, "client", c.RemoteAddr().String(),
		"max_connections", s.Config.MaxConnections, "max_connections_per_ip", s.Config.MaxConnectionsPerIP,
		"refused_since_last_line", suppressed, "next_line_in", refusalLogEvery)
}

// track registers sess, and the tracker of its client connection, unless
// Shutdown has begun.
func (s *Server) track(sess *session, tr *relay.Tracker) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing.Load() {
		return false
	}
	s.sessions[sess] = tr
	s.byID.Store(sess.id, sess)
	return true
}

func (s *Server) untrack(sess *session) {
	s.mu.Lock()
	delete(s.sessions, sess)
	s.mu.Unlock()
	s.byID.Delete(sess.id)
}

// handle runs a TLS client's handshake, dials the upstream for a new client
// connection and runs its session. Shutdown abandons the handshake and the
// dial (dialCtx): the connection has sent nothing yet, so there is nothing
// to drain.
func (s *Server) handle(c net.Conn, node int32) {
	id := s.connSeq.Add(1)
	log := s.Logger.With("conn", id, "client", c.RemoteAddr().String())
	if tc, ok := c.(*auth.Conn); ok && !s.clientHandshake(tc, log) {
		c.Close()
		return
	}
	addr, err := s.upstreamFor(node)
	var up net.Conn
	if err == nil {
		onOwnStack(func() {
			ctx, cancel := context.WithTimeout(s.dialCtx, s.Config.DialTimeout)
			up, err = s.dialUpstream(ctx, addr)
			cancel()
		})
	}
	if err != nil {
		reason := metrics.BrokerDial
		if errors.Is(err, auth.ErrBrokerTLS) {
			reason = metrics.BrokerTLS
		}
		s.Metrics.BrokerError(reason)
		log.Warn("closing client connection: cannot reach broker", "node", node, "broker", addr, "err", err)
		c.Close()
		return
	}
	tr := relay.NewTracker(c)
	var rnode *replica.Node
	if rs := s.replicas; rs != nil {
		rnode = rs.Attach(tr, node)
		tr.Drain = rnode
		defer rs.Detach(tr)
	}
	sess := newSession(s, id, tr, up, log.With("broker", addr))
	sess.rnode = rnode
	if tc, ok := c.(*auth.Conn); ok {
		sess.auth.NoteTLS(tc.ConnectionState(), &s.authEnv, sess.log)
	}
	if !s.track(sess, tr) {
		c.Close()
		up.Close()
		return
	}
	defer s.untrack(sess)
	s.Metrics.ClientConnectionsTotal.Inc()
	s.Metrics.ClientConnections.Inc()
	defer s.Metrics.ClientConnections.Dec()
	sess.run()
}

// onOwnStack runs f on a goroutine of its own and waits for it. A dial's
// call chain is deep: run on the goroutine that then becomes readLoop, the
// stack it grew would stay with the connection for its whole life (Go
// shrinks a stack only at a garbage collection, and only when a quarter of
// it is used), a third of what an idle connection costs.
func onOwnStack(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	<-done
}

// upstreamFor returns the broker address a listener forwards to: the next
// bootstrap broker, round robin, or the learned address of node.
func (s *Server) upstreamFor(node int32) (string, error) {
	if node < 0 {
		ups := s.Config.Upstream
		return ups[int(s.bootNext.Add(1)-1)%len(ups)], nil
	}
	addr, ok := s.nodes.Upstream(node)
	if !ok {
		return "", fmt.Errorf("node %d has no known address", node)
	}
	return addr, nil
}

// Shutdown stops accepting connections, stops reading new requests, lets
// every request already forwarded get its response to the client, then
// closes the connections, like net/http's Server.Shutdown. A connection
// whose requests in flight are only Fetches is closed at once: a consumer's
// long poll holds nothing to lose (drain.go). It may be called
// more than once, concurrently, and before Start.
//
// With replicas it first hands every node it serves to a peer
// (docs/replicas.md), within ctx.
//
// ctx is final: once it ends, Shutdown closes every listener and connection
// at once, waits at most a short grace (shutdownGrace) for the connection
// goroutines to notice, and returns ctx.Err() whether or not they all have.
// A connection also gives up on its own after drain_timeout; Shutdown then
// returns [ErrDrainTimedOut] once the others are done: responses were lost
// either way.
func (s *Server) Shutdown(ctx context.Context) error {
	handed := false
	if rs := s.replicas; rs != nil && ctx.Err() == nil && !s.closing.Load() {
		// Listeners and connections stay open while the nodes move, so
		// clients are answered where to go (package replica).
		handed = rs.HandOver(ctx)
	}
	s.mu.Lock()
	s.closing.Store(true)
	lns := s.listeners
	s.listeners = nil
	sessions := make(map[*session]*relay.Tracker, len(s.sessions))
	for sess, tr := range s.sessions {
		sessions[sess] = tr
	}
	stop, cancelDial := s.stop, s.cancelDial
	s.mu.Unlock()
	for _, ln := range lns {
		ln.Close()
	}
	s.stopOnce.Do(func() {
		if stop != nil {
			close(stop)
			cancelDial()
		}
	})
	for sess := range sessions {
		sess.stopReading()
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	// Produce responses commit state and are waited for; consumers' long
	// polls are not. A replica that handed every node over has no Produce
	// request of its own in flight: nothing it waits for holds state, so
	// it stops at once (docs/replicas.md).
	cut := (*relay.Tracker).OnlyFetch
	if handed {
		cut = func(tr *relay.Tracker) bool { return tr.ProducesAwaited() == 0 }
	}
	go s.cutFetchOnly(sessions, cut, done, ctx.Done())
	select {
	case <-done:
		s.pipes.Close() // every session has ended
		s.stopWarm()
		return s.drainResult()
	case <-ctx.Done():
	}
	select {
	case <-done: // both ready: the drain finished in time
		s.pipes.Close()
		s.stopWarm()
		return s.drainResult()
	default:
	}
	log := s.Logger
	if log == nil { // Shutdown before Start
		log = slog.Default()
	}
	s.stopWarm()
	s.mu.Lock()
	open := len(s.clients)
	for sess := range s.sessions {
		sess.closeAll()
	}
	for c := range s.clients { // also those still dialing their broker
		c.Close()
	}
	s.mu.Unlock()
	t := clock.Real.NewTimer(shutdownGrace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		// Left running: goroutines stuck outside any socket (a Dial
		// that ignores its context). They end on their own.
		log.Warn("shutdown: connection goroutines still running after their sockets were closed; not waiting for them", "grace", shutdownGrace)
	}
	log.Warn("shutdown deadline passed; closed the remaining connections", "connections", open, "err", ctx.Err())
	return ctx.Err()
}

// ErrDrainTimedOut is returned by [Server.Shutdown] when a connection gave
// up waiting for its broker's responses after drain_timeout.
var ErrDrainTimedOut = errors.New("proxy: drain timed out: a connection gave up waiting for its broker's responses")

func (s *Server) drainResult() error {
	if s.drainGaveUp.Load() {
		return ErrDrainTimedOut
	}
	return nil
}

// topicRefreshInterval is how often the proxy checks whether batches for
// topics it does not know were seen, and if so asks the cluster for its
// topics.
const topicRefreshInterval = 5 * time.Second

// topicRefreshLoop learns the cluster's topics again when batches for
// unknown topics were relayed undecided since the last look: a topic
// created since, or clients producing with metadata they cached before the
// proxy started.
func (s *Server) topicRefreshLoop(t *clock.Ticker) {
	var seen uint64
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			n := s.unknownTopics.Load()
			if n == seen {
				continue
			}
			seen = n
			ctx, cancel := context.WithTimeout(s.dialCtx, s.Config.DialTimeout)
			if err := s.learnTopics(ctx); err != nil {
				s.Logger.Debug("topic refresh failed", "err", err)
			}
			cancel()
		}
	}
}

// expireLoop forgets idle producers, like Kafka's periodic
// removeExpiredProducers (producer.id.expiration.check.interval.ms, 10
// minutes by default; we check more often since it is cheap).
func (s *Server) expireLoop(t *clock.Ticker) {
	for {
		select {
		case <-s.stop:
			return
		case now := <-t.C:
			s.table.Expire(now)
		}
	}
}

// stopWarm cancels the tail reads still running (none once the drain
// ended).
func (s *Server) stopWarm() {
	if s.cancelWarm != nil {
		s.cancelWarm()
	}
}
