package proxy

import (
	"net"
	"strconv"
	"sync"

	"github.com/dedupproxy/dedupproxy/protocol"
)

// nodeRegistry knows every broker node seen in a response: its real address
// and the proxy listener that stands for it. It implements
// protocol.AddrMapper, so rewriting a response is also how nodes are learned.
type nodeRegistry struct {
	s     *Server
	mu    sync.Mutex
	nodes map[int32]*node
}

type node struct {
	upstream string // real broker host:port, updated whenever a response names it
	advHost  string
	advPort  int32
	bound    string // the listener's bound address
}

func (r *nodeRegistry) init(s *Server) {
	r.s = s
	r.nodes = make(map[int32]*node)
}

func (r *nodeRegistry) upstream(id int32) (string, bool) {
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

// MapBroker records the real address of node id, starting its listener on
// first sight, and returns the address clients must use instead.
//
// If the listener cannot be bound, the node keeps no advertised address and
// the response goes out with the proxy's bootstrap address for it: better a
// client that reaches the wrong broker through the proxy (and gets
// NOT_LEADER, then refreshes) than one that leaks past the proxy.
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
	if n.advHost == "" && !r.s.closing.Load() {
		r.startListener(id, n)
	}
	if n.advHost == "" {
		if r.s.closing.Load() {
			// Shutdown has begun: no listener will stand for this node.
			return "", protocol.OmitBroker
		}
		h, p, _ := r.s.bootstrapAdvertised()
		return h, int32(p)
	}
	return n.advHost, n.advPort
}

// startListener binds node id's listener at its configured or derived
// address. Called with r.mu held.
func (r *nodeRegistry) startListener(id int32, n *node) {
	cfg := &r.s.Config
	lhost, lport, _ := splitHostPort(cfg.Listen)
	bind := hostPort(lhost, 0)
	if lport != 0 {
		bind = hostPort(lhost, lport+1+int(id))
	}
	override := cfg.Nodes[id]
	if override.Listen != "" {
		bind = override.Listen
	}
	ln, err := r.s.Listen("tcp", bind)
	if err != nil {
		r.s.Logger.Error("cannot start broker listener; clients are sent to the bootstrap listener for this node", "node", id, "addr", bind, "err", err)
		return
	}
	bound := ln.Addr().(*net.TCPAddr)
	adv := hostPort(lhost, bound.Port)
	if cfg.Advertise != "" {
		ahost, aport, _ := splitHostPort(cfg.Advertise)
		adv = hostPort(ahost, aport+1+int(id))
	}
	if override.Advertise != "" {
		adv = override.Advertise
	}
	if !r.s.serve(ln, id) {
		return // Shutdown has begun; serve closed ln
	}
	ah, ap, _ := splitHostPort(adv)
	n.advHost, n.advPort = ah, int32(ap)
	n.bound = bound.String()
	r.s.Logger.Info("listening", "listener", "broker", "node", id, "addr", bound.String(), "advertised", adv, "broker", n.upstream)
}

// bootstrapAdvertised returns what clients are told for the bootstrap listener.
func (s *Server) bootstrapAdvertised() (string, int, error) {
	if s.Config.Advertise != "" {
		return splitHostPort(s.Config.Advertise)
	}
	lhost, _, _ := splitHostPort(s.Config.Listen)
	port := 0
	if a := s.Addr(); a != nil {
		port = a.(*net.TCPAddr).Port
	}
	return lhost, port, nil
}
