package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// ErrServerClosed is returned by [Server.Start] after [Server.Shutdown].
var ErrServerClosed = errors.New("proxy: server closed")

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

	nodes        nodeRegistry
	planner      *planner
	openUpstream atomic.Bool   // a broker answered a request without authentication (see session.trusted)
	answerLog    logLimiter    // lines about batches the proxy answered itself
	stop         chan struct{} // closed by Shutdown: background loops end

	mu        sync.Mutex
	listeners []net.Listener
	sessions  map[*session]struct{}
	closing   atomic.Bool
	started   bool
	wg        sync.WaitGroup // accept loops and sessions
	connSeq   atomic.Uint64
	bootNext  atomic.Uint32
	bootstrap net.Listener
}

// Start validates the configuration, binds the bootstrap listener, learns the
// cluster's brokers from the upstream (starting their listeners) when it can,
// and serves in the background until Shutdown.
func (s *Server) Start(ctx context.Context) error {
	s.Config.EnsureDefaults()
	if err := s.Config.Validate(); err != nil {
		return err
	}
	if len(s.Config.Upstream) == 0 {
		return fmt.Errorf("%w: no upstream brokers", ErrInvalidConfig)
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
	s.mu.Lock()
	if s.started {
		s.mu.Unlock()
		return errors.New("proxy: server already started")
	}
	s.started = true
	s.sessions = make(map[*session]struct{})
	s.mu.Unlock()
	s.nodes.init(s)
	s.stop = make(chan struct{})
	pn, err := newDedupPlanner(&s.Config, s.Metrics)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	s.planner = pn
	if pn.table != nil {
		s.Metrics.registerTable(pn.table)
		if pn.legacy != nil {
			s.Metrics.registerLegacy(pn.legacy)
		}
		s.wg.Add(1)
		go s.expireLoop()
	}

	ln, err := s.Listen("tcp", s.Config.Listen)
	if err != nil {
		return fmt.Errorf("bootstrap listener: %w", err)
	}
	s.mu.Lock()
	s.bootstrap = ln
	s.mu.Unlock()
	s.Logger.Info("listening", "listener", "bootstrap", "addr", ln.Addr().String(), "upstream", s.Config.Upstream)
	s.serve(ln, -1)

	// Learning the brokers up front makes node listeners exist before any
	// client asks, which matters after a restart: clients reconnect to node
	// addresses they cached. An unreachable upstream is not fatal; /readyz
	// says so and nodes are learned from the first Metadata that passes.
	if err := s.Probe(ctx); err != nil {
		s.Logger.Warn("upstream not reachable yet", "err", err)
	}
	return nil
}

// Addr returns the bootstrap listener's address.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bootstrap == nil {
		return nil
	}
	return s.bootstrap.Addr()
}

// serve runs the accept loop of ln in the background. node is -1 for the
// bootstrap listener.
func (s *Server) serve(ln net.Listener, node int32) {
	s.mu.Lock()
	s.listeners = append(s.listeners, ln)
	s.mu.Unlock()
	s.wg.Add(1)
	go s.acceptLoop(ln, node)
}

func (s *Server) acceptLoop(ln net.Listener, node int32) {
	defer s.wg.Done()
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
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		if !s.track(nil) {
			c.Close()
			return
		}
		s.wg.Add(1)
		go s.handle(c, node)
	}
}

// track reports whether the server still accepts work, registering sess when
// not nil.
func (s *Server) track(sess *session) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing.Load() {
		return false
	}
	if sess != nil {
		s.sessions[sess] = struct{}{}
	}
	return true
}

func (s *Server) untrack(sess *session) {
	s.mu.Lock()
	delete(s.sessions, sess)
	s.mu.Unlock()
}

// handle dials the upstream for a new client connection and runs its session.
func (s *Server) handle(c net.Conn, node int32) {
	defer s.wg.Done()
	id := s.connSeq.Add(1)
	log := s.Logger.With("conn", id, "client", c.RemoteAddr().String())
	addr, err := s.upstreamFor(node)
	var up net.Conn
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), s.Config.DialTimeout)
		up, err = s.Dial(ctx, "tcp", addr)
		cancel()
	}
	if err != nil {
		s.Metrics.brokerError(brokerDial)
		log.Warn("closing client connection: cannot reach broker", "node", node, "broker", addr, "err", err)
		c.Close()
		return
	}
	sess := newSession(s, id, c, up, log.With("broker", addr))
	if !s.track(sess) {
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

// upstreamFor returns the broker address a listener forwards to: the next
// bootstrap broker, round robin, or the learned address of node.
func (s *Server) upstreamFor(node int32) (string, error) {
	if node < 0 {
		ups := s.Config.Upstream
		return ups[int(s.bootNext.Add(1)-1)%len(ups)], nil
	}
	addr, ok := s.nodes.upstream(node)
	if !ok {
		return "", fmt.Errorf("node %d has no known address", node)
	}
	return addr, nil
}

// Shutdown stops accepting connections, stops reading new requests, lets
// every request already forwarded get its response to the client, then
// closes the connections. If ctx ends first, it closes everything at once and
// returns ctx.Err(). Like net/http's Server.Shutdown.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing.Store(true)
	lns := s.listeners
	s.listeners = nil
	sessions := make([]*session, 0, len(s.sessions))
	for sess := range s.sessions {
		sessions = append(sessions, sess)
	}
	s.mu.Unlock()
	for _, ln := range lns {
		ln.Close()
	}
	if s.stop != nil {
		select {
		case <-s.stop:
		default:
			close(s.stop)
		}
	}
	for _, sess := range sessions {
		sess.stopReading()
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.mu.Lock()
		for sess := range s.sessions {
			sess.closeAll()
		}
		s.mu.Unlock()
		<-done
		return ctx.Err()
	}
}

// hostPort joins a host and a port.
func hostPort(host string, port int) string { return net.JoinHostPort(host, strconv.Itoa(port)) }

// expireLoop forgets idle producers, like Kafka's periodic
// removeExpiredProducers (producer.id.expiration.check.interval.ms, 10
// minutes by default; we check more often since it is cheap).
func (s *Server) expireLoop() {
	defer s.wg.Done()
	every := max(min(s.Config.Dedup.ProducerIDExpiration/10, time.Minute), 10*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case now := <-t.C:
			s.planner.table.Expire(now)
		}
	}
}
