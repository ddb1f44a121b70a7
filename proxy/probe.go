package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/auth"
	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// probeMetadataVersion is old enough for every broker since Kafka 1.0 and
// still served by Kafka 4 (which dropped v0–v3, KIP-896).
const probeMetadataVersion = 4

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
	conn, err := s.dialUpstream(ctx, addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()

	corrID := int32(1)
	mech := auth.SASLMechanism(s.Config.UpstreamSASL)
	if mech != nil {
		host, _, _ := net.SplitHostPort(addr)
		if corrID, err = auth.Authenticate(ctx, conn, mech, host, corrID, s.probeRoundTrip); err != nil {
			return fmt.Errorf("as upstream_sasl.user %q: %w", s.Config.UpstreamSASL.User, err)
		}
	}
	version := int16(probeMetadataVersion)
	if topics {
		// Topic IDs (Produce v13 names topics by ID) come with Metadata
		// v10+: ask for the newest version both sides know, up to v12.
		if version, err = s.probeMetadataVersion(conn, corrID); err != nil {
			return s.probeHint(err, mech != nil)
		}
		corrID++
	}
	req := kmsg.NewPtrMetadataRequest()
	req.SetVersion(version)
	if !topics {
		req.Topics = []kmsg.MetadataRequestTopic{} // no topics, only brokers
	} // nil: every topic
	resp := kmsg.NewPtrMetadataResponse()
	resp.SetVersion(version)
	if err := s.probeRoundTrip(conn, req, resp, corrID); err != nil {
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
		protocol.ObserveLeaders(&s.nodes, resp.Topics)
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
	if s.upTLS == nil && (closed || errors.Is(err, protocol.ErrLooksLikeTLS) || errors.Is(err, protocol.ErrFrameTooLarge)) {
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

// probeMetadataVersion asks the broker on conn (ApiVersions v0, which every
// broker answers) for its newest Metadata version and returns the newest
// both sides know, capped at v12.
func (s *Server) probeMetadataVersion(conn net.Conn, corrID int32) (int16, error) {
	req := kmsg.NewPtrApiVersionsRequest()
	req.SetVersion(0)
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.SetVersion(0)
	if err := s.probeRoundTrip(conn, req, resp, corrID); err != nil {
		return 0, fmt.Errorf("api versions: %w", err)
	}
	if resp.ErrorCode != 0 {
		return 0, fmt.Errorf("api versions: error %d", resp.ErrorCode)
	}
	for _, k := range resp.ApiKeys {
		if k.ApiKey == int16(kmsg.Metadata) {
			return max(min(k.MaxVersion, 12), min(k.MinVersion, probeMetadataVersion)), nil
		}
	}
	return probeMetadataVersion, nil
}

// probeRoundTrip writes req and decodes its response into resp.
func (s *Server) probeRoundTrip(conn net.Conn, req kmsg.Request, resp kmsg.Response, corrID int32) error {
	frame := kmsg.NewRequestFormatter(kmsg.FormatterClientID("dedupproxy-probe")).AppendRequest(nil, req, corrID)
	if _, err := conn.Write(frame); err != nil {
		return err
	}
	body, _, err := protocol.ReadFrame(conn, nil, s.Config.MaxFrameBytes, protocol.ResponseMinSize)
	if err != nil {
		return err
	}
	if got := protocol.ResponseCorrelationID(body); got != corrID {
		return fmt.Errorf("correlation id %d, want %d", got, corrID)
	}
	off, err := protocol.ResponseBodyOffset(body, req.Key(), req.GetVersion())
	if err != nil {
		return err
	}
	return resp.ReadFrom(body[off:])
}
