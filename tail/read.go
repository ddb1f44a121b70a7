package tail

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/protocol"
)

// Reader reads partitions' tails, each at its leader on a connection of
// its own.
type Reader struct {
	Conns *Conns
	// Bootstrap lists the brokers asked where a partition's leader is.
	Bootstrap []string
	// Brokers keeps the brokers' addresses the answers name.
	Brokers Brokers
	// LogStart, if set, is told each partition's log start offset as soon
	// as a read learns it, before the records are fetched.
	LogStart func(topic string, partition int32, offset int64)
}

// Brokers is where the proxy keeps the cluster's brokers: a Metadata
// answer names them (MapBroker, rewrite.AddrMapper's method) and a
// partition's leader is reached at its address (Upstream).
type Brokers interface {
	MapBroker(id int32, host string, port int32) (string, int32)
	Upstream(id int32) (string, bool)
}

// Limits bound one read: at most MaxBytes (dedup.warm.max_bytes), and
// nothing older than the last Window (dedup.legacy.window) needs.
type Limits struct {
	MaxBytes int
	Window   time.Duration
}

// Read reads up to lim.MaxBytes from the end of partition (topic) at its
// leader: whole record batches in log order, and how many. now is the
// clock's reading that lim.Window counts back from.
func (r *Reader) Read(ctx context.Context, topic string, partition int32, lim Limits, now time.Time) (records []byte, batches int, err error) {
	leader, err := r.leaderOf(ctx, topic, partition)
	if err != nil {
		return nil, 0, err
	}
	conn, err := r.Conns.Open(ctx, leader)
	if err != nil {
		return nil, 0, err
	}
	defer conn.Close()
	// The log's bounds, earliest (-2) and latest (-1), and the first
	// offset within the legacy window (by timestamp): one request each
	// (ListOffsets takes a partition once per request).
	var bounds [3]int64
	// Twice the window: batch timestamps are the producers' clocks
	// (CreateTime), which may lag.
	for i, ts := range []int64{-2, -1, now.Add(-2 * lim.Window).UnixMilli()} {
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
		if err := conn.RoundTrip(lo, resp); err != nil {
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
	if r.LogStart != nil {
		r.LogStart(topic, partition, logStart)
	}
	maxBytes := lim.MaxBytes
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
		if err := conn.RoundTrip(fr, resp); err != nil {
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
func (r *Reader) leaderOf(ctx context.Context, topic string, partition int32) (string, error) {
	var errs []error
	for _, addr := range r.Bootstrap {
		conn, err := r.Conns.Open(ctx, addr)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		req := kmsg.NewPtrMetadataRequest()
		req.SetVersion(MetadataVersion)
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(topic)
		req.Topics = append(req.Topics, rt)
		resp := kmsg.NewPtrMetadataResponse()
		resp.SetVersion(MetadataVersion)
		err = conn.RoundTrip(req, resp)
		conn.Close()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, b := range resp.Brokers {
			r.Brokers.MapBroker(b.NodeID, b.Host, b.Port)
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if p.Partition != partition {
					continue
				}
				if p.ErrorCode != 0 {
					return "", fmt.Errorf("metadata: %w", kerr.ErrorForCode(p.ErrorCode))
				}
				if a, ok := r.Brokers.Upstream(p.Leader); ok {
					return a, nil
				}
			}
		}
		return "", fmt.Errorf("metadata: no leader for %s/%d", topic, partition)
	}
	return "", errors.Join(errs...)
}
