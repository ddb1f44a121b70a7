package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

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

func (s *Server) probeOne(ctx context.Context, addr string, topics bool) error {
	ctx, cancel := context.WithTimeout(ctx, s.Config.DialTimeout)
	defer cancel()
	conn, err := s.Dial(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()

	version := int16(probeMetadataVersion)
	if topics {
		// Topic IDs (Produce v13 names topics by ID) come with Metadata
		// v10+: ask for the newest version both sides know, up to v12.
		if version, err = s.probeMetadataVersion(conn); err != nil {
			return err
		}
	}
	req := kmsg.NewPtrMetadataRequest()
	req.SetVersion(version)
	if !topics {
		req.Topics = []kmsg.MetadataRequestTopic{} // no topics, only brokers
	} // nil: every topic
	resp := kmsg.NewPtrMetadataResponse()
	resp.SetVersion(version)
	if err := s.probeRoundTrip(conn, req, resp, 2); err != nil {
		return fmt.Errorf("metadata probe: %w", err)
	}
	for _, b := range resp.Brokers {
		s.nodes.MapBroker(b.NodeID, b.Host, b.Port)
	}
	if topics {
		if t := s.planner.table; t != nil {
			refs := make([]seqstate.TopicRef, 0, len(resp.Topics))
			for _, tp := range resp.Topics {
				if tp.ErrorCode == 0 && tp.Topic != nil {
					refs = append(refs, seqstate.TopicRef{Name: *tp.Topic, ID: tp.TopicID})
				}
			}
			t.InternTopics(refs)
		}
	}
	// The broker answered the proxy's own request without authentication.
	s.openUpstream.Store(true)
	return nil
}

// probeMetadataVersion asks the broker on conn (ApiVersions v0, which every
// broker answers) for its newest Metadata version and returns the newest
// both sides know, capped at v12.
func (s *Server) probeMetadataVersion(conn net.Conn) (int16, error) {
	req := kmsg.NewPtrApiVersionsRequest()
	req.SetVersion(0)
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.SetVersion(0)
	if err := s.probeRoundTrip(conn, req, resp, 1); err != nil {
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
