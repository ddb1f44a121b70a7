package nodes

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/dedupproxy/dedupproxy/config"
	"github.com/dedupproxy/dedupproxy/metrics"
	"github.com/dedupproxy/dedupproxy/protocol/rewrite"
	"github.com/dedupproxy/dedupproxy/replica"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// ErrAdminPortTaken is returned when a listener the proxy needs would take
// the admin listener's port.
var ErrAdminPortTaken = errors.New("proxy: port collision with the admin listener")

// BindRetryInterval spaces the attempts to bind a node listener that failed
// to bind: the cause (a port in use) rarely clears at once, and a Metadata
// response arrives every few seconds per client.
const BindRetryInterval = 30 * time.Second

// Options are what a [Registry] needs of the proxy. Every field is set.
type Options struct {
	Config *config.Config
	Log    *slog.Logger
	// Now reads the proxy's clock (the bind retries' spacing).
	Now     func() time.Time
	Metrics *metrics.Metrics
	// Listen binds an address (net.Listen, or a test's).
	Listen func(network, addr string) (net.Listener, error)
	// Serve serves ln as node id's listener; once the proxy stops it
	// closes ln instead and returns false.
	Serve func(ln net.Listener, id int32) bool
	// Closing reports whether the proxy stops: no listener starts then.
	Closing func() bool
	// AdminAddr is the admin listener's bound address, nil without one.
	AdminAddr net.Addr
	// Replicas returns the replica set, nil while the proxy runs on its
	// own.
	Replicas func() *replica.Set
}

// Registry knows every broker node seen in a response: its real address
// and the proxy listener that stands for it. It implements
// rewrite.AddrMapper, so rewriting a response is also how nodes are
// learned. The zero Registry knows no node; Init readies it.
type Registry struct {
	o     Options
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
// dedupproxy_broker_listener_errors_total label (metrics.Listener*).
type listenerError struct {
	reason    string
	permanent bool
	err       error
}

func (e *listenerError) Error() string { return e.err.Error() }
func (e *listenerError) Unwrap() error { return e.err }

// Init readies r to learn nodes.
func (r *Registry) Init(o Options) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.o = o
	r.nodes = make(map[int32]*node)
}

// Upstream returns the real address of broker node id, if known.
func (r *Registry) Upstream(id int32) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.nodes[id]
	if !ok {
		return "", false
	}
	return n.upstream, true
}

// ListenAddr returns the bound address of node id's listener, if any.
func (r *Registry) ListenAddr(id int32) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.nodes[id]
	if !ok || n.bound == "" {
		return "", false
	}
	return n.bound, true
}

// Advertised returns the address clients are told for node id, if known.
func (r *Registry) Advertised(id int32) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.nodes[id]
	if !ok || n.advHost == "" {
		return "", false
	}
	return net.JoinHostPort(n.advHost, strconv.Itoa(int(n.advPort))), true
}

// AdminCollision returns the error of a node whose listener could not bind
// because the admin listener holds its port, if any.
func (r *Registry) AdminCollision() error {
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
// BindRetryInterval, not on every response.
func (r *Registry) MapBroker(id int32, host string, port int32) (string, int32) {
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
			r.o.Log.Info("broker address changed", "node", id, "broker", real, "was", n.upstream)
		}
		n.upstream = real
	}
	if n.advHost == "" {
		r.tryListen(id, n)
	}
	if rs := r.o.Replicas(); rs != nil {
		// Node id is advertised at the replica that serves it, which
		// this one relays to the broker too (docs/replicas.md).
		rs.Node(id)
		if i := rs.Advertised(id); i != rs.Layout.Self {
			if h, p, ok := rs.Layout.NodeAddr(r.o.Config, i, id); ok {
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
func (r *Registry) ObserveLeaders(topic string, leaders []rewrite.PartitionLeader) {
	if rs := r.o.Replicas(); rs != nil {
		rs.ObserveLeaders(topic, leaders)
	}
}

// tryListen starts node id's listener unless an earlier failure says not
// yet (or never). Called with r.mu held.
func (r *Registry) tryListen(id int32, n *node) {
	if r.o.Closing() {
		return
	}
	now := r.o.Now()
	if n.failures > 0 && (n.permanent || now.Before(n.retryAt)) {
		return
	}
	err := r.startListener(id, n)
	if err == nil {
		if n.failures > 0 {
			r.o.Log.Info("broker listener started after failed attempts; the node is advertised again", "node", id, "failed_attempts", n.failures)
		}
		n.failures, n.err = 0, nil
		return
	}
	var le *listenerError
	if !errors.As(err, &le) {
		return // Shutdown has begun
	}
	n.failures++
	n.err, n.permanent, n.retryAt = le, le.permanent, now.Add(BindRetryInterval)
	r.o.Metrics.ListenerError(le.reason)
	if n.failures > 1 {
		r.o.Log.Debug("broker listener retry failed", "node", id, "err", err, "failed_attempts", n.failures)
		return
	}
	retry := "never (fix the configuration)"
	if !le.permanent {
		retry = BindRetryInterval.String()
	}
	r.o.Log.Error("broker node has no listener on the proxy: left out of every response until it has one (never advertised at another address)",
		"node", id, "broker", n.upstream, "reason", le.reason, "err", err, "retry_every", retry)
}

// startListener binds node id's listener at its configured or derived
// address and serves it. Called with r.mu held.
func (r *Registry) startListener(id int32, n *node) error {
	bind, adv, err := r.o.Config.NodeAddrs(id)
	if err != nil {
		return &listenerError{reason: metrics.ListenerPortRange, permanent: true, err: err}
	}
	ln, err := r.o.Listen("tcp", bind)
	if err != nil {
		if port, ok := AdminHolds(r.o.AdminAddr, bind, err); ok {
			return &listenerError{reason: metrics.ListenerAdminPort, permanent: true, err: fmt.Errorf(
				"%w: port %d for node %d is the admin listener's (%s); move admin, or set node_port_base, node_id_offset or nodes[%d]",
				ErrAdminPortTaken, port, id, r.o.AdminAddr, id)}
		}
		return &listenerError{reason: metrics.ListenerBind, err: fmt.Errorf("node %d listener on %s: %w", id, bind, err)}
	}
	if !r.o.Serve(ln, id) {
		return errClosed // Serve closed ln
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
	r.o.Log.Info("listening", "listener", "broker", "node", id, "addr", bound, "advertised", adv, "broker", n.upstream)
	return nil
}

// errClosed is a listener not started because the proxy stops.
var errClosed = errors.New("proxy: server closed")

// AdminHolds reports whether binding addr failed because the admin
// listener (at admin) holds its port, and which port.
func AdminHolds(admin net.Addr, addr string, err error) (int, bool) {
	tcp, ok := admin.(*net.TCPAddr)
	if !ok || !errors.Is(err, syscall.EADDRINUSE) {
		return 0, false
	}
	_, port, perr := config.SplitHostPort(addr)
	return port, perr == nil && port != 0 && port == tcp.Port
}

// Listeners lists the broker node listeners bound now, as
// "node=ID addr=HOST:PORT", by node id.
func (r *Registry) Listeners() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make([]int32, 0, len(r.nodes))
	for id, n := range r.nodes {
		if n.bound != "" {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = fmt.Sprintf("node=%d addr=%s", id, r.nodes[id].bound)
	}
	return out
}

// Unbound describes the nodes whose listener failed to bind (and is being
// retried). Nodes left out by design (a port outside 1..65535) are not
// listed: they never get a listener.
func (r *Registry) Unbound() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, n := range r.nodes {
		if n.bound == "" && n.err != nil && n.err.reason == metrics.ListenerBind {
			out = append(out, n.err.Error())
		}
	}
	sort.Strings(out)
	return out
}

// Mapper is what a session hands package rewrite for a response: the
// registry maps broker addresses, and the topics of every Metadata
// response are interned in Table (nil: none) so that Produce requests can
// be keyed (only topics the cluster knows are interned, never a name a
// client made up).
type Mapper struct {
	*Registry
	Table *seqstate.Table
}

// ObserveTopics interns a Metadata response's topics (rewrite.TopicObserver).
func (m *Mapper) ObserveTopics(topics []rewrite.TopicInfo) {
	if m.Table == nil {
		return
	}
	refs := make([]seqstate.TopicRef, len(topics))
	for i, t := range topics {
		refs[i] = seqstate.TopicRef{Name: t.Name, ID: t.ID, Partitions: t.Partitions}
	}
	m.Table.InternTopics(refs)
}
