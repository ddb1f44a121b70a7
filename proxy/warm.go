package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/auth"
	"github.com/dedupproxy/dedupproxy/decide"
	"github.com/dedupproxy/dedupproxy/protocol"
)

// Kafka is the proxy's memory (docs/warm.md). The tables live in memory,
// but what they hold — each batch's producer id, epoch, sequences, base
// offset, max timestamp and records — is in the partition's log. The core
// asks for a partition's tail before its first decision since start, and
// when only the log can tell a batch's outcome (decide.ReadTails); the
// session reads it here, on a connection of the proxy's own, bounded in
// time and bytes.

// Warm-up outcomes, for dedupproxy_warmups_total{result}.
const (
	warmOK       = iota // the tail was read and applied
	warmFailed          // the tail could not be read: decided without it
	warmTimedOut        // a request stopped waiting for it
	numWarmResults
)

var warmResults = [numWarmResults]string{warmOK: "ok", warmFailed: "failed", warmTimedOut: "timed_out"}

// readTail reads up to dedup.warm.max_bytes from the end of partition
// (topic) at its leader: whole record batches in log order, and how many.
func (s *Server) readTail(ctx context.Context, topic string, partition int32) (records []byte, batches int, err error) {
	leader, err := s.leaderOf(ctx, topic, partition)
	if err != nil {
		return nil, 0, err
	}
	conn, corr, err := s.ownConn(ctx, leader)
	if err != nil {
		return nil, 0, err
	}
	defer conn.Close()
	rt := func(req kmsg.Request, resp kmsg.Response) error {
		corr++
		return s.probeRoundTrip(conn, req, resp, corr)
	}
	// The log's bounds, earliest (-2) and latest (-1), and the first
	// offset within the legacy window (by timestamp): one request each
	// (ListOffsets takes a partition once per request).
	now := time.Now()
	var bounds [3]int64
	// Twice the window: batch timestamps are the producers' clocks
	// (CreateTime), which may lag.
	for i, ts := range []int64{-2, -1, now.Add(-2 * s.Config.Dedup.Legacy.Window).UnixMilli()} {
		lo := kmsg.NewPtrListOffsetsRequest()
		lo.SetVersion(4)
		lt := kmsg.NewListOffsetsRequestTopic()
		lt.Topic = topic
		p := kmsg.NewListOffsetsRequestTopicPartition()
		p.Partition, p.Timestamp = partition, ts
		lt.Partitions = append(lt.Partitions, p)
		lo.Topics = append(lo.Topics, lt)
		resp := kmsg.NewPtrListOffsetsResponse()
		resp.SetVersion(4)
		if err := rt(lo, resp); err != nil {
			return nil, 0, fmt.Errorf("list offsets: %w", err)
		}
		if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
			return nil, 0, errors.New("list offsets: unexpected answer")
		}
		rp := resp.Topics[0].Partitions[0]
		if rp.ErrorCode != 0 {
			return nil, 0, fmt.Errorf("list offsets: %w", kerr.ErrorForCode(rp.ErrorCode))
		}
		bounds[i] = rp.Offset
	}
	logStart, end, windowStart := bounds[0], bounds[1], bounds[2]
	if id, ok := s.table.LookupTopic([]byte(topic)); ok {
		s.step(&decide.Event{Kind: decide.EvLogStart, Topic: id, Partition: partition, LogStart: logStart}, s.now(), nil)
	}
	maxBytes := s.Config.Dedup.Warm.MaxBytes
	// Start far enough back that maxBytes of small records still reaches
	// the end, but not before the legacy window (an idempotent producer's
	// last batches are recent too); the broker returns whole batches.
	// -1: no batch is that recent.
	from := max(logStart, end-int64(maxBytes)/64)
	if windowStart < 0 {
		windowStart = end
	}
	from = max(from, min(windowStart, end))
	for iter := 0; from < end && len(records) < maxBytes && iter < 64; iter++ {
		fr := kmsg.NewPtrFetchRequest()
		fr.SetVersion(11)
		fr.ReplicaID, fr.MaxWaitMillis, fr.MinBytes, fr.MaxBytes = -1, 0, 1, int32(maxBytes-len(records))
		fr.IsolationLevel, fr.SessionID, fr.SessionEpoch = 0, 0, -1 // read uncommitted, no fetch session
		ft := kmsg.NewFetchRequestTopic()
		ft.Topic = topic
		fp := kmsg.NewFetchRequestTopicPartition()
		fp.Partition, fp.FetchOffset, fp.PartitionMaxBytes, fp.LogStartOffset, fp.CurrentLeaderEpoch = partition, from, int32(maxBytes-len(records)), -1, -1
		ft.Partitions = append(ft.Partitions, fp)
		fr.Topics = append(fr.Topics, ft)
		resp := kmsg.NewPtrFetchResponse()
		resp.SetVersion(11)
		if err := rt(fr, resp); err != nil {
			return nil, 0, fmt.Errorf("fetch: %w", err)
		}
		if resp.ErrorCode != 0 {
			return nil, 0, fmt.Errorf("fetch: %w", kerr.ErrorForCode(resp.ErrorCode))
		}
		if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
			return nil, 0, errors.New("fetch: unexpected answer")
		}
		p := resp.Topics[0].Partitions[0]
		if p.ErrorCode != 0 {
			return nil, 0, fmt.Errorf("fetch: %w", kerr.ErrorForCode(p.ErrorCode))
		}
		whole, n, next := wholeBatches(p.RecordBatches)
		records = append(records, whole...)
		batches += n
		if next <= from { // nothing whole came back: a batch larger than the budget
			break
		}
		from = next
	}
	return records, batches, nil
}

// wholeBatches returns the whole record batches at the start of records
// (a fetch may end in a partial one), their number, and the offset after
// the last (-1 if none).
func wholeBatches(records []byte) (whole []byte, n int, next int64) {
	next = -1
	off := 0
	for off < len(records) {
		var bh protocol.BatchHeader
		if _, err := protocol.ReadBatch(records[off:], &bh); err != nil {
			break
		}
		size := 12 + int(bh.Length)
		if size > len(records)-off {
			break
		}
		off += size
		n++
		next = bh.BaseOffset + int64(bh.LastOffsetDelta) + 1
	}
	return records[:off], n, next
}

// leaderOf returns the address of the leader of topic/partition, from a
// Metadata request to a bootstrap broker.
func (s *Server) leaderOf(ctx context.Context, topic string, partition int32) (string, error) {
	var errs []error
	for _, addr := range s.Config.Upstream {
		conn, corr, err := s.ownConn(ctx, addr)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		req := kmsg.NewPtrMetadataRequest()
		req.SetVersion(probeMetadataVersion)
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(topic)
		req.Topics = append(req.Topics, rt)
		resp := kmsg.NewPtrMetadataResponse()
		resp.SetVersion(probeMetadataVersion)
		err = s.probeRoundTrip(conn, req, resp, corr+1)
		conn.Close()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, b := range resp.Brokers {
			s.nodes.MapBroker(b.NodeID, b.Host, b.Port)
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if p.Partition != partition {
					continue
				}
				if p.ErrorCode != 0 {
					return "", fmt.Errorf("metadata: %w", kerr.ErrorForCode(p.ErrorCode))
				}
				if a, ok := s.nodes.upstream(p.Leader); ok {
					return a, nil
				}
			}
		}
		return "", fmt.Errorf("metadata: no leader for %s/%d", topic, partition)
	}
	return "", errors.Join(errs...)
}

// ownConn opens one of the proxy's own connections to addr: TLS and SASL
// as configured for them. It returns the last correlation id used.
func (s *Server) ownConn(ctx context.Context, addr string) (net.Conn, int32, error) {
	conn, err := s.dialUpstream(ctx, addr)
	if err != nil {
		return nil, 0, err
	}
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	corr := int32(0)
	if mech := auth.SASLMechanism(s.Config.UpstreamSASL); mech != nil {
		host, _, _ := net.SplitHostPort(addr)
		if corr, err = auth.Authenticate(ctx, conn, mech, host, 1, s.probeRoundTrip); err != nil {
			conn.Close()
			return nil, 0, err
		}
	}
	return conn, corr, nil
}
