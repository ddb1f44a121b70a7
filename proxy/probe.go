package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/clock"
	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/protocol/rewrite"
	"github.com/dedupproxy/dedupproxy/seqstate"
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
// connection of the proxy's own: over TLS with upstream_tls, authenticated
// with upstream_sasl when that is set.
func (s *Server) probeOne(ctx context.Context, addr string, topics bool) error {
	ctx, cancel := context.WithTimeout(ctx, s.Config.DialTimeout)
	defer cancel()
	nc, err := s.dialUpstream(ctx, addr)
	if err != nil {
		return err
	}
	defer nc.Close()
	if dl, ok := ctx.Deadline(); ok {
		nc.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(clock.Real.Now()) })
	defer stop()

	conn := s.own.Wrap(nc)
	mech := s.own.SASL
	if err := conn.Authenticate(ctx, mech, addr); err != nil {
		return fmt.Errorf("as upstream_sasl.user %q: %w", s.Config.UpstreamSASL.User, err)
	}
	version := int16(tail.MetadataVersion)
	if topics {
		// Topic IDs (Produce v13 names topics by ID) come with Metadata
		// v10+: ask for the newest version both sides know, up to v12.
		if version, err = conn.NewestMetadata(); err != nil {
			return s.probeHint(err, mech != nil)
		}
	}
	req := kmsg.NewPtrMetadataRequest()
	req.SetVersion(version)
	if !topics {
		req.Topics = []kmsg.MetadataRequestTopic{} // no topics, only brokers
	} // nil: every topic
	resp := kmsg.NewPtrMetadataResponse()
	resp.SetVersion(version)
	if err := conn.RoundTrip(req, resp); err != nil {
		return s.probeHint(fmt.Errorf("metadata probe: %w", err), mech != nil)
	}
	for _, b := range resp.Brokers {
		s.nodes.MapBroker(b.NodeID, b.Host, b.Port)
	}
	if topics {
		if t := s.table; t != nil {
			refs := make([]seqstate.TopicRef, 0, len(resp.Topics))
			for _, tp := range resp.Topics {
				if tp.ErrorCode == 0 && tp.Topic != nil {
					refs = append(refs, seqstate.TopicRef{Name: *tp.Topic, ID: tp.TopicID, Partitions: int32(len(tp.Partitions))})
				}
			}
			t.InternTopics(refs)
		}
		rewrite.ObserveLeaders(&s.nodes, resp.Topics)
	}
	// The broker answered the proxy's own request without authentication:
	// clients need none either (see session.trusted). Not so when the
	// proxy authenticated with its own credentials: each client must then
	// authenticate itself before its batches are decided.
	if mech == nil {
		s.openUpstream.Store(true)
	}
	return nil
}

// probeHint adds the likely cause to a probe that failed after connecting:
// a broker that closes an unauthenticated connection wants SASL; one that
// closes it or answers with a TLS record (Java sends an alert) wants TLS.
func (s *Server) probeHint(err error, authenticated bool) error {
	var wants []string
	closed := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
	if s.tls.Upstream == nil && (closed || errors.Is(err, protocol.ErrLooksLikeTLS) || errors.Is(err, protocol.ErrFrameTooLarge)) {
		wants = append(wants, "TLS (upstream_tls, --upstream-tls)")
	}
	if closed && !authenticated {
		wants = append(wants, "SASL (upstream_sasl, --upstream-sasl-*)")
	}
	if len(wants) == 0 {
		return err
	}
	return fmt.Errorf("%w (does the cluster require %s?)", err, strings.Join(wants, " or "))
}
