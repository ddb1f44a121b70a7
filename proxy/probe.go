package proxy

import (
	"context"
	"errors"
	"fmt"

	"github.com/dedupproxy/dedupproxy/protocol/rewrite"
	"github.com/dedupproxy/dedupproxy/tail"
)

// Probe asks the upstream bootstrap brokers, one after another, for the
// cluster's brokers, and starts a listener for each broker not yet known. It
// returns nil as soon as one broker answers: that is what /readyz reports.
func (s *Server) Probe(ctx context.Context) error { return s.probe(ctx, false) }

// learnTopics is Probe for every topic as well: the proxy keys batches only
// for topics it has seen in a Metadata response, and after a restart clients
// keep producing with the metadata they cached (kgo and the Java client
// refresh it every 5 minutes), so the proxy asks for itself: at start, and
// whenever batches for unknown topics were seen (topicRefreshLoop).
func (s *Server) learnTopics(ctx context.Context) error { return s.probe(ctx, true) }

func (s *Server) probe(ctx context.Context, topics bool) error {
	var errs []error
	for _, addr := range s.Config.Upstream {
		err := s.probeOne(ctx, addr, topics)
		if err == nil {
			return nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
		if ctx.Err() != nil {
			break
		}
	}
	return errors.Join(errs...)
}

// probeOne asks the broker at addr for the cluster's metadata on a
// connection of the proxy's own (tail.Conns.Metadata), and learns its
// brokers and, with topics, its topics and their leaders.
func (s *Server) probeOne(ctx context.Context, addr string, topics bool) error {
	ctx, cancel := context.WithTimeout(ctx, s.Config.DialTimeout)
	defer cancel()
	resp, err := s.own.Metadata(ctx, addr, topics)
	if err != nil {
		return err
	}
	for _, b := range resp.Brokers {
		s.nodes.MapBroker(b.NodeID, b.Host, b.Port)
	}
	if topics {
		if t := s.table; t != nil {
			t.InternTopics(tail.TopicRefs(resp.Topics))
		}
		rewrite.ObserveLeaders(&s.nodes, resp.Topics)
	}
	// The broker answered the proxy's own request without authentication:
	// clients need none either (see session.trusted). Not so when the
	// proxy authenticated with its own credentials: each client must then
	// authenticate itself before its batches are decided.
	if s.own.SASL == nil {
		s.openUpstream.Store(true)
	}
	return nil
}
