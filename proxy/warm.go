package proxy

import (
	"context"

	"github.com/dedupproxy/dedupproxy/decide"
	"github.com/dedupproxy/dedupproxy/tail"
)

// Kafka is the proxy's memory (docs/warm.md). The tables live in memory,
// but what they hold — each batch's producer id, epoch, sequences, base
// offset, max timestamp and records — is in the partition's log. The core
// asks for a partition's tail before its first decision since start, and
// when only the log can tell a batch's outcome (decide.ReadTails); the
// session reads it with package tail, on a connection of the proxy's own,
// bounded in time and bytes.

// readTail reads up to dedup.warm.max_bytes from the end of partition
// (topic) at its leader (package tail): whole record batches in log order,
// and how many.
func (s *Server) readTail(ctx context.Context, topic string, partition int32) (records []byte, batches int, err error) {
	lim := tail.Limits{MaxBytes: s.Config.Dedup.Warm.MaxBytes, Window: s.Config.Dedup.Legacy.Window}
	return s.tails.Read(ctx, topic, partition, lim, s.now())
}

// noteLogStart gives the core a partition's log start offset, which its
// own answers carry, as a tail read learns it.
func (s *Server) noteLogStart(topic string, partition int32, offset int64) {
	if id, ok := s.table.LookupTopic([]byte(topic)); ok {
		s.step(&decide.Event{Kind: decide.EvLogStart, Topic: id, Partition: partition, LogStart: offset}, s.now(), nil)
	}
}
