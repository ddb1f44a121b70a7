package proxy

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/dedupproxy/dedupproxy/config"
	"github.com/dedupproxy/dedupproxy/metrics"
	"github.com/dedupproxy/dedupproxy/protocol/rewrite"
)

// ErrAdminPortTaken is returned by [Server.Start] when a listener the proxy
// needs (the bootstrap's, or a broker node's learned by Start's probe)
// would take the admin listener's port ([Server.AdminAddr]).
var ErrAdminPortTaken = errors.New("proxy: port collision with the admin listener")

// bindRetryInterval spaces the attempts to bind a node listener that failed
// to bind: the cause (a port in use) rarely clears at once, and a Metadata
// response arrives every few seconds per client.
const bindRetryInterval = 30 * time.Second

// nodeRegistry knows every broker node seen in a response: its real address
// and the proxy listener that stands for it. It implements
// rewrite.AddrMapper, so rewriting a response is also how nodes are learned.
type nodeRegistry struct {
	s     *Server
	mu    sync.Mutex
	nodes map[int32]*node
}

type node struct {
	upstream string // real broker host:port, updated whenever a response names it
	advHost  string // what clients are told; empty while the node has no listener
	advPort  int32
	bound    string // the listener's bound address

	// While the node has no listener: the attempts that failed in a row,
	// the last error, and when the next attempt may be made. A permanent
	// failure (the config gives it no valid port, or the admin listener
	// holds it) is not retried.
	failures  int
	err       *listenerError
	retryAt   time.Time
	permanent bool
}

// listenerError is why a node has no listener; reason is its
// dedupproxy_broker_listener_errors_total label.
type listenerError struct {
	reason    string
	permanent bool
	err       error
}

func (e *listenerError) Error() string { return e.err.Error() }
func (e *listenerError) Unwrap() error { return e.err }

func (r *nodeRegistry) init(s *Server) {
	r.s = s
	r.nodes = make(map[int32]*node)
}

// Upstream returns the real address of broker node id, if known.
func (r *nodeRegistry) Upstream(id int32) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.nodes[id]
	if !ok {
		return "", false
	}
	return n.upstream, true
}

// listenAddr returns the bound address of node id's listener, if any.
func (r *nodeRegistry) listenAddr(id int32) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.nodes[id]
	if !ok || n.bound == "" {
		return "", false
	}
	return n.bound, true
}

// advertised returns the address clients are told for node id, if known.
func (r *nodeRegistry) advertised(id int32) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.nodes[id]
	if !ok || n.advHost == "" {
		return "", false
	}
	return hostPort(n.advHost, int(n.advPort)), true
}

// adminCollision returns the error of a node whose listener could not bind
// because the admin listener holds its port, if any.
func (r *nodeRegistry) adminCollision() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.nodes {
		if n.err != nil && n.err.reason == metrics.ListenerAdminPort {
			return n.err.err
		}
	}
	return nil
}

// MapBroker records the real address of node id, starting its listener on
// first sight, and returns the address clients must use instead.
//
// A node without a listener of its own (its port is out of range, the bind
// failed, Shutdown has begun) is left out of the response
// ([rewrite.OmitBroker]), never advertised at another address: the
// bootstrap address would send clients to the wrong broker, which answers
// NOT_LEADER forever, and the real one would leak past the proxy. The
// failure is logged once, and a failed bind is retried at most every
// bindRetryInterval, not on every response.
func (r *nodeRegistry) MapBroker(id int32, host string, port int32) (string, int32) {
	real := net.JoinHostPort(host, strconv.Itoa(int(port)))
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.nodes[id]
	if !ok {
		n = &node{}
		r.nodes[id] = n
	}
	if n.upstream != real {
		if n.upstream != "" {
			r.s.Logger.Info("broker address changed", "node", id, "broker", real, "was", n.upstream)
		}
		n.upstream = real
	}
	if n.advHost == "" {
		r.tryListen(id, n)
	}
	if rs := r.s.replicas; rs != nil {
		// Node id is advertised at the replica that serves it, which
		// this one relays to the broker too (docs/replicas.md).
		rs.Node(id)
		if i := rs.Advertised(id); i != rs.Layout.Self {
			if h, p, ok := rs.Layout.NodeAddr(&r.s.Config, i, id); ok {
				return h, p
			}
			return "", rewrite.OmitBroker
		}
	}
	if n.advHost == "" {
		return "", rewrite.OmitBroker
	}
	return n.advHost, n.advPort
}

// ObserveLeaders passes a Metadata response's partition leaders to the
// replicas (rewrite.LeaderObserver), which note partitions led away from
// the nodes this replica decides.
func (r *nodeRegistry) ObserveLeaders(topic string, leaders []rewrite.PartitionLeader) {
	if rs := r.s.replicas; rs != nil {
		rs.ObserveLeaders(topic, leaders)
	}
}

// tryListen starts node id's listener unless an earlier failure says not
// yet (or never). Called with r.mu held.
func (r *nodeRegistry) tryListen(id int32, n *node) {
	if r.s.closing.Load() {
		return
	}
	now := r.s.now()
	if n.failures > 0 && (n.permanent || now.Before(n.retryAt)) {
		return
	}
	err := r.startListener(id, n)
	if err == nil {
		if n.failures > 0 {
			r.s.Logger.Info("broker listener started after failed attempts; the node is advertised again", "node", id, "failed_attempts", n.failures)
		}
		n.failures, n.err = 0, nil
		return
	}
	var le *listenerError
	if !errors.As(err, &le) {
		return // Shutdown has begun
	}
	n.failures++
	n.err, n.permanent, n.retryAt = le, le.permanent, now.Add(bindRetryInterval)
	r.s.Metrics.ListenerError(le.reason)
	if n.failures > 1 {
		r.s.Logger.Debug("broker listener retry failed", "node", id, "err", err, "failed_attempts", n.failures)
		return
	}
	retry := "never (fix the configuration)"
	if !le.permanent {
		retry = bindRetryInterval.String()
	}
	r.s.Logger.Error("broker node has no listener on the proxy: left out of every response until it has one (never advertised at another address)",
		"node", id, "broker", n.upstream, "reason", le.reason, "err", err, "retry_every", retry)
}

// startListener binds node id's listener at its configured or derived
// address and serves it. Called with r.mu held.
func (r *nodeRegistry) startListener(id int32, n *node) error {
	bind, adv, err := r.s.Config.NodeAddrs(id)
	if err != nil {
		return &listenerError{reason: metrics.ListenerPortRange, permanent: true, err: err}
	}
	ln, err := r.s.Listen("tcp", bind)
	if err != nil {
		if port, ok := r.s.adminHolds(bind, err); ok {
			return &listenerError{reason: metrics.ListenerAdminPort, permanent: true, err: fmt.Errorf(
				"%w: port %d for node %d is the admin listener's (%s); move admin, or set node_port_base, node_id_offset or nodes[%d]",
				ErrAdminPortTaken, port, id, r.s.AdminAddr, id)}
		}
		return &listenerError{reason: metrics.ListenerBind, err: fmt.Errorf("node %d listener on %s: %w", id, bind, err)}
	}
	if !r.s.serve(ln, id) {
		return ErrServerClosed // serve closed ln
	}
	bound := ln.Addr().String()
	if adv == "" {
		bhost, _, _ := net.SplitHostPort(bind)
		_, bport, _ := net.SplitHostPort(bound)
		adv = net.JoinHostPort(bhost, bport)
	}
	ah, ap, _ := config.SplitHostPort(adv)
	n.advHost, n.advPort = ah, int32(ap)
	n.bound = bound
	r.s.Logger.Info("listening", "listener", "broker", "node", id, "addr", bound, "advertised", adv, "broker", n.upstream)
	return nil
}

// adminHolds reports whether binding addr failed because the admin
// listener holds its port, and which port.
func (s *Server) adminHolds(addr string, err error) (int, bool) {
	admin, ok := s.AdminAddr.(*net.TCPAddr)
	if !ok || !errors.Is(err, syscall.EADDRINUSE) {
		return 0, false
	}
	_, port, perr := config.SplitHostPort(addr)
	return port, perr == nil && port != 0 && port == admin.Port
}
