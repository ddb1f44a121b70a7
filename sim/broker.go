package sim

import (
	"encoding/binary"

	"github.com/twmb/franz-go/pkg/kerr"
)

// broker is the Kafka cluster: each partition's log and leader, and for
// idempotent producers a reference model of Kafka's rules
// (docs/kafka-rules.md §3) that also says what the broker would answer to
// a batch the proxy answered itself.
type broker struct {
	logs   [maxPartitions]plog
	leader [maxPartitions]int // node id
	pids   []*pidState
	faults []brokerFault
}

// plog is one partition's log.
type plog struct {
	batches []logBatch
	next    int64
}

// logBatch is one appended batch: its bytes (base offset set) and, hidden
// from the proxy, the lid of each record.
type logBatch struct {
	base int64
	raw  []byte
	recs []rec
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

func (b *broker) pidState(pid int64, p int32) *pidState {
	for _, s := range b.pids {
		if s.pid == pid && s.partition == p {
			return s
		}
	}
	return nil
}

// idempotent is Kafka's check of an idempotent batch (docs/kafka-rules.md
// §3.2–3.3), without appending: the answer the broker gives it now. ok is
// true when it would be appended.
func (b *broker) idempotent(s *batchSpec, maxTS int64) (res partResult, ok bool) {
	res = partResult{partition: s.partition, offset: -1, appendTime: -1}
	st := b.pidState(s.pid, s.partition)
	if st == nil {
		return res, true // no state: any sequence (Kafka ≥ 2.5)
	}
	last := s.seq + int32(len(s.recs)) - 1
	if s.epoch == st.epoch {
		for _, d := range st.batches {
			if d.first == s.seq && d.last == last {
				// A duplicate: error 0, the original's offset, and its max
				// timestamp as the log append time (§3.2).
				res.offset, res.appendTime = d.base, d.maxTS
				return res, false
			}
		}
	}
	switch {
	case s.epoch < st.epoch:
		res.code = kerr.InvalidProducerEpoch.Code
		return res, false
	case s.epoch > st.epoch:
		if s.seq != 0 {
			res.code = kerr.OutOfOrderSequenceNumber.Code
			return res, false
		}
	default:
		lastSeq := int32(-1)
		if n := len(st.batches); n > 0 {
			lastSeq = st.batches[n-1].last
		}
		if s.seq != lastSeq+1 {
			res.code = kerr.OutOfOrderSequenceNumber.Code
			return res, false
		}
	}
	return res, true
}

// appendIdempotent updates the producer's state for a batch appended at
// base.
func (b *broker) appendIdempotent(s *batchSpec, base, maxTS int64) {
	st := b.pidState(s.pid, s.partition)
	if st == nil {
		st = &pidState{pid: s.pid, partition: s.partition, epoch: s.epoch}
		b.pids = append(b.pids, st)
	}
	if s.epoch != st.epoch {
		st.epoch, st.batches = s.epoch, nil
	}
	st.batches = append(st.batches, seqBatch{first: s.seq, last: s.seq + int32(len(s.recs)) - 1, base: base, maxTS: maxTS})
	if len(st.batches) > retainedBatches {
		st.batches = st.batches[1:]
	}
}

// produce applies one batch the broker node received: it is appended
// unless node does not lead its partition (NOT_LEADER_OR_FOLLOWER, before
// any work) or the idempotence rules refuse it or find it a duplicate.
// recs are the records the batch carries, raw its bytes.
func (b *broker) produce(node int, s *batchSpec, recs []rec, raw []byte, req int) (partResult, bool) {
	p := s.partition
	if b.leader[p] != node {
		return partResult{partition: p, code: kerr.NotLeaderForPartition.Code, offset: -1, appendTime: -1}, false
	}
	maxTS := int64(binary.BigEndian.Uint64(raw[35:]))
	if s.pid >= 0 {
		if res, ok := b.idempotent(s, maxTS); !ok {
			return res, false
		}
	}
	l := &b.logs[p]
	base := l.next
	stored := append([]byte(nil), raw...)
	binary.BigEndian.PutUint64(stored, uint64(base))
	l.batches = append(l.batches, logBatch{base: base, raw: stored, recs: recs, pid: s.pid, req: req})
	l.next += int64(len(recs))
	if s.pid >= 0 {
		b.appendIdempotent(s, base, maxTS)
	}
	return partResult{partition: p, offset: base, appendTime: -1}, true
}

// tail is what a read of partition p's tail returns: its batches in log
// order, whole.
func (b *broker) tail(p int32) []byte {
	var out []byte
	for _, lb := range b.logs[p].batches {
		out = append(out, lb.raw...)
	}
	return out
}

// at returns the record at offset off of partition p.
func (b *broker) at(p int32, off int64) (rec, bool) {
	for _, lb := range b.logs[p].batches {
		if off >= lb.base && off < lb.base+int64(len(lb.recs)) {
			return lb.recs[off-lb.base], true
		}
	}
	return rec{}, false
}
