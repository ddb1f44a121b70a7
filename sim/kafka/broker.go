package kafka

import (
	"encoding/binary"

	"github.com/twmb/franz-go/pkg/kerr"
)

// Broker is the Kafka cluster: each partition's log and leader, and for
// idempotent producers a reference model of Kafka's rules
// (docs/kafka-rules.md §3) that also says what the broker would answer to
// a batch the proxy answered itself.
type Broker struct {
	Logs   [MaxPartitions]Log
	Leader [MaxPartitions]int // node id
	pids   []*pidState
}

// Log is one partition's log.
type Log struct {
	Batches []LogBatch
	next    int64
}

// LogBatch is one appended batch: its bytes (base offset set) and, hidden
// from the proxy, the lid of each record.
type LogBatch struct {
	Base int64
	Raw  []byte
	Recs []Rec
	pid  int64
	req  int // the request that wrote it
}

// pidState is Kafka's ProducerStateEntry for one producer on one partition
// (docs/kafka-rules.md §1.1): its epoch and its last 5 batches.
type pidState struct {
	pid       int64
	partition int32
	epoch     int16
	batches   []seqBatch
}

type seqBatch struct {
	first, last int32
	base        int64
	maxTS       int64
}

// retainedBatches is Kafka's NUM_BATCHES_TO_RETAIN.
const retainedBatches = 5

func (b *Broker) pidState(pid int64, p int32) *pidState {
	for _, s := range b.pids {
		if s.pid == pid && s.partition == p {
			return s
		}
	}
	return nil
}

// Idempotent is Kafka's check of an idempotent batch (docs/kafka-rules.md
// §3.2–3.3), without appending: the answer the broker gives it now. ok is
// true when it would be appended.
func (b *Broker) Idempotent(s *Batch, maxTS int64) (res PartResult, ok bool) {
	res = PartResult{Partition: s.Partition, Offset: -1, AppendTime: -1}
	st := b.pidState(s.PID, s.Partition)
	if st == nil {
		return res, true // no state: any sequence (Kafka ≥ 2.5)
	}
	last := s.Seq + int32(len(s.Recs)) - 1
	if s.Epoch == st.epoch {
		for _, d := range st.batches {
			if d.first == s.Seq && d.last == last {
				// A duplicate: error 0, the original's offset, and its max
				// timestamp as the log append time (§3.2).
				res.Offset, res.AppendTime = d.base, d.maxTS
				return res, false
			}
		}
	}
	switch {
	case s.Epoch < st.epoch:
		res.Code = kerr.InvalidProducerEpoch.Code
		return res, false
	case s.Epoch > st.epoch:
		if s.Seq != 0 {
			res.Code = kerr.OutOfOrderSequenceNumber.Code
			return res, false
		}
	default:
		lastSeq := int32(-1)
		if n := len(st.batches); n > 0 {
			lastSeq = st.batches[n-1].last
		}
		if s.Seq != lastSeq+1 {
			res.Code = kerr.OutOfOrderSequenceNumber.Code
			return res, false
		}
	}
	return res, true
}

// appendIdempotent updates the producer's state for a batch appended at
// base.
func (b *Broker) appendIdempotent(s *Batch, base, maxTS int64) {
	st := b.pidState(s.PID, s.Partition)
	if st == nil {
		st = &pidState{pid: s.PID, partition: s.Partition, epoch: s.Epoch}
		b.pids = append(b.pids, st)
	}
	if s.Epoch != st.epoch {
		st.epoch, st.batches = s.Epoch, nil
	}
	st.batches = append(st.batches, seqBatch{first: s.Seq, last: s.Seq + int32(len(s.Recs)) - 1, base: base, maxTS: maxTS})
	if len(st.batches) > retainedBatches {
		st.batches = st.batches[1:]
	}
}

// Produce applies one batch the broker node received: it is appended
// unless node does not lead its partition (NOT_LEADER_OR_FOLLOWER, before
// any work) or the idempotence rules refuse it or find it a duplicate.
// recs are the records the batch carries, raw its bytes.
func (b *Broker) Produce(node int, s *Batch, recs []Rec, raw []byte, req int) (PartResult, bool) {
	p := s.Partition
	if b.Leader[p] != node {
		return PartResult{Partition: p, Code: kerr.NotLeaderForPartition.Code, Offset: -1, AppendTime: -1}, false
	}
	maxTS := int64(binary.BigEndian.Uint64(raw[35:]))
	if s.PID >= 0 {
		if res, ok := b.Idempotent(s, maxTS); !ok {
			return res, false
		}
	}
	l := &b.Logs[p]
	base := l.next
	stored := append([]byte(nil), raw...)
	binary.BigEndian.PutUint64(stored, uint64(base))
	l.Batches = append(l.Batches, LogBatch{Base: base, Raw: stored, Recs: recs, pid: s.PID, req: req})
	l.next += int64(len(recs))
	if s.PID >= 0 {
		b.appendIdempotent(s, base, maxTS)
	}
	return PartResult{Partition: p, Offset: base, AppendTime: -1}, true
}

// Tail is what a read of partition p's tail returns: its batches in log
// order, whole.
func (b *Broker) Tail(p int32) []byte {
	var out []byte
	for _, lb := range b.Logs[p].Batches {
		out = append(out, lb.Raw...)
	}
	return out
}

// At returns the record at offset off of partition p.
func (b *Broker) At(p int32, off int64) (Rec, bool) {
	for _, lb := range b.Logs[p].Batches {
		if off >= lb.Base && off < lb.Base+int64(len(lb.Recs)) {
			return lb.Recs[off-lb.Base], true
		}
	}
	return Rec{}, false
}
