package proxy

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/dedupproxy/dedupproxy/relay"
)

// ErrDraining is Ready's answer once Shutdown has begun.
var ErrDraining = errors.New("proxy: draining for shutdown")

// Draining reports whether Shutdown has begun.
func (s *Server) Draining() bool { return s.closing.Load() }

// Ready is /readyz: nil when the proxy should get traffic. It is not ready
// once draining (or, with replicas, handing over) has begun, while a
// replica has not yet taken back every node it owns from the peers that
// covered them, while a broker node's listener failed to bind (clients
// sent to that node would find nothing), or when no upstream broker
// answers (Probe).
func (s *Server) Ready(ctx context.Context) error {
	if s.Draining() {
		return ErrDraining
	}
	if rs := s.replicas; rs != nil {
		if err := replicasReady(rs); err != nil {
			return err
		}
	}
	if unbound := s.nodes.Unbound(); len(unbound) > 0 {
		return fmt.Errorf("broker node listeners not bound: %s", strings.Join(unbound, "; "))
	}
	return s.Probe(ctx)
}

// NodeListeners lists the broker node listeners bound now, as
// "node=ID addr=HOST:PORT", by node id.
func (s *Server) NodeListeners() []string { return s.nodes.Listeners() }

// cutFetchOnly closes, until done is closed, every session of sessions
// whose tracker cut accepts; Shutdown's cut accepts those whose requests
// awaiting a response are all Fetches (or none): a Fetch commits nothing,
// and a consumer's long poll would hold the drain for its
// fetch.max.wait.ms (5s with franz-go). Sessions with a Produce (or any
// other request) in flight are left to drain, until deadline. Nothing new is
// read once Shutdown stopped reading, so what cut looks at changes only when
// a response is written, which kicks the trackers' shared channel: the
// sessions are looked at again then, not on a timer.
func (s *Server) cutFetchOnly(sessions map[*session]*relay.Tracker, cut func(*relay.Tracker) bool, done, deadline <-chan struct{}) {
	kick := make(chan struct{}, 1)
	for _, tr := range sessions {
		if tr != nil {
			tr.Kick(kick)
		}
	}
	for len(sessions) > 0 {
		for sess, tr := range sessions {
			if tr == nil || !cut(tr) {
				continue
			}
			delete(sessions, sess)
			if tr.OnlyFetch() {
				sess.log.Debug("shutdown: closing a connection whose in-flight requests are only Fetch", "fetches", tr.Fetches())
			} else {
				sess.log.Debug("shutdown: closing a connection: every node was handed over, so nothing it waits for holds state")
			}
			sess.closeAll()
		}
		select {
		case <-done:
			return
		case <-deadline: // Shutdown closes everything
			return
		case <-kick:
		}
	}
}
