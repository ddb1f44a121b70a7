package proxy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// probeMetadataVersion is old enough for every broker since Kafka 1.0 and
// still served by Kafka 4 (which dropped v0–v3, KIP-896).
const probeMetadataVersion = 4

// Probe asks the upstream bootstrap brokers, one after another, for the
// cluster's brokers, and starts a listener for each broker not yet known. It
// returns nil as soon as one broker answers: that is what /readyz reports.
func (s *Server) Probe(ctx context.Context) error {
	var errs []error
	for _, addr := range s.Config.Upstream {
		err := s.probeOne(ctx, addr)
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

func (s *Server) probeOne(ctx context.Context, addr string) error {
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

	req := kmsg.NewPtrMetadataRequest()
	req.SetVersion(probeMetadataVersion)
	req.Topics = []kmsg.MetadataRequestTopic{} // no topics, only brokers
	const corrID = 1
	frame := kmsg.NewRequestFormatter(kmsg.FormatterClientID("dedupproxy-probe")).AppendRequest(nil, req, corrID)
	if _, err := conn.Write(frame); err != nil {
		return err
	}
	body, _, err := protocol.ReadFrame(conn, nil, s.Config.MaxFrameBytes, protocol.ResponseMinSize)
	if err != nil {
		return err
	}
	if got := protocol.ResponseCorrelationID(body); got != corrID {
		return fmt.Errorf("metadata probe: correlation id %d, want %d", got, corrID)
	}
	resp := kmsg.NewPtrMetadataResponse()
	resp.SetVersion(probeMetadataVersion)
	if err := resp.ReadFrom(body[4:]); err != nil {
		return fmt.Errorf("metadata probe: %w", err)
	}
	for _, b := range resp.Brokers {
		s.nodes.MapBroker(b.NodeID, b.Host, b.Port)
	}
	return nil
}
