package check

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/dedupproxy/dedupproxy/decide"
	"github.com/dedupproxy/dedupproxy/sim/client"
	"github.com/dedupproxy/dedupproxy/sim/kafka"
)

// Invariant 6 (docs/simulation.md): an idempotent resend is answered by
// the proxy, or waits for its original's answer; it is forwarded only
// where the proxy cannot know that answer. The broker deduplicates what
// is forwarded, so nothing is written twice either way: this counts the
// batches that reach it all the same.

// Idem follows the idempotent batches of a run as each request is
// decided (invariants 4 and 6).
type Idem struct {
	failures  []string
	sent      map[idemKey][]*client.Request
	resent    int            // idempotent resends decided
	forwarded map[string]int // of them, forwarded, per shape
}

// Decided looks at a request just decided Ready, plan pl, against the
// broker as it is now.
func (x *Idem) Decided(req *client.Request, pl *decide.Plan, broker *kafka.Broker) {
	x.checkIdempotent(req, pl, broker)
	x.noteIdempotent(req, pl, broker)
}

// checkIdempotent compares every idempotent part the proxy answered itself
// with what the broker would answer it now (invariant 4). Deliberate
// differences are not failures: a sequence reused for other records is
// answered OUT_OF_ORDER_SEQUENCE_NUMBER where Kafka would drop the
// records (docs/kafka-rules.md §12.2), and a wait past its deadline
// REQUEST_TIMED_OUT.
func (x *Idem) checkIdempotent(req *client.Request, pl *decide.Plan, broker *kafka.Broker) {
	for i, b := range req.Parts {
		pp := &pl.Parts[i]
		if b.PID < 0 || pp.Act != decide.Answer {
			continue
		}
		ref, appended := broker.Idempotent(b, kafka.HeaderOf(req.Raws[i]).MaxTimestamp)
		got := kafka.PartResult{Partition: b.Partition, Code: pp.Local.ErrorCode, Offset: pp.Local.BaseOffset, AppendTime: pp.Local.LogAppendTime}
		switch {
		case pp.Verdict.Rule == decide.RuleSequenceReuse, got.Code == kerr.RequestTimedOut.Code:
		case appended || got != ref:
			x.failures = append(x.failures, fmt.Sprintf("req %d p%d (pid %d seq %d): the proxy answered %s, the broker would answer %s (append %v)",
				req.ID, b.Partition, b.PID, b.Seq, partString(got), partString(ref), appended))
		}
	}
}

// partString prints a partition's answer in a failure's account.
func partString(r kafka.PartResult) string {
	return fmt.Sprintf("{partition:%d code:%d offset:%d appendTime:%d}", r.Partition, r.Code, r.Offset, r.AppendTime)
}

// idemKey is one idempotent batch: its producer, partition, epoch and
// first sequence.
type idemKey struct {
	pid       int64
	partition int32
	epoch     int16
	seq       int32
}

// noteIdempotent looks at the idempotent batches of a request just
// decided: a batch whose earlier copy went upstream and is in the log or
// still on its way there is a resend, and forwarded, it is counted under
// the reason the proxy could not answer it (a shape), or fails the run.
func (x *Idem) noteIdempotent(req *client.Request, pl *decide.Plan, broker *kafka.Broker) {
	if req.Acks == 0 {
		return
	}
	if x.sent == nil {
		x.sent, x.forwarded = map[idemKey][]*client.Request{}, map[string]int{}
	}
	for i, b := range req.Parts {
		if b.PID < 0 {
			continue
		}
		pp := &pl.Parts[i]
		k := idemKey{b.PID, b.Partition, b.Epoch, b.Seq}
		ref, ok := broker.Idempotent(b, 0)
		appended := !ok && ref.Code == 0
		var copies []*client.Request
		for _, e := range x.sent[k] {
			// A copy the broker refused leaves nothing to answer with.
			if appended || e.Handled == 0 {
				copies = append(copies, e)
			}
		}
		if len(copies) > 0 {
			x.resent++
			if pp.Act == decide.Forward {
				sh := idemForwardShape(req, copies, b.Partition)
				if sh.Covered && ref.Code == kerr.OutOfOrderSequenceNumber.Code {
					// The broker itself would refuse this resend now: it
					// neither follows its producer's last batch nor is
					// one of the 5 Kafka retains, so more of its
					// producer's batches are on their way than that.
					sh = shIdemFwdBeyond
				}
				x.forwarded[sh.Name]++
				if sh.Covered {
					e := copies[len(copies)-1]
					x.failures = append(x.failures, fmt.Sprintf("req %d (conn %d) pid %d p%d epoch %d seq %d: %s; req %d (conn %d) sent it before (appended: %v; answered to the proxy: %v)",
						req.ID, req.Conn.ID, b.PID, b.Partition, b.Epoch, b.Seq, sh.Name, e.ID, e.Conn.ID, appended, e.Settled > 0))
				}
			}
		}
		if pp.Act == decide.Forward {
			x.sent[k] = append(x.sent[k], req)
		}
	}
}

// idemForwardShape says why resend s was forwarded, copies the earlier
// copies of its batch in the log or on their way: a reason one of them
// gives, or none.
func idemForwardShape(s *client.Request, copies []*client.Request, p int32) Shape {
	sh := shIdemForwarded
	for _, e := range copies {
		switch {
		case s.CoreName != e.CoreName:
			return shIdemFwdRestart
		case e.Lost:
			sh = shIdemFwdLost
		case e.Acks != -1 || s.Acks != -1 || settledCode(e, p) == kerr.RequestTimedOut.Code:
			if sh != shIdemFwdLost {
				sh = shIdemFwdNoOffset
			}
		}
	}
	return sh
}

// settledCode is the error code of the broker's answer for partition p of
// e as the proxy stepped it, -1 if none.
func settledCode(e *client.Request, p int32) int16 {
	for _, r := range e.Resp {
		if r.Partition == p {
			return r.Code
		}
	}
	return -1
}
