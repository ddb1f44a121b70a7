package sim

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/dedupproxy/dedupproxy/decide"
)

// Invariant 6 (docs/simulation.md): an idempotent resend is answered by
// the proxy, or waits for its original's answer; it is forwarded only
// where the proxy cannot know that answer. The broker deduplicates what
// is forwarded, so nothing is written twice either way: this counts the
// batches that reach it all the same.

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
func (w *world) noteIdempotent(d *deciding) {
	req := d.req
	if req.Acks == 0 {
		return
	}
	if w.idemSent == nil {
		w.idemSent, w.idemForwarded = map[idemKey][]*Request{}, map[string]int{}
	}
	for i, b := range req.Parts {
		if b.PID < 0 {
			continue
		}
		pp := &d.pl.Parts[i]
		k := idemKey{b.PID, b.Partition, b.Epoch, b.Seq}
		ref, ok := w.broker.Idempotent(b, 0)
		appended := !ok && ref.Code == 0
		var copies []*Request
		for _, e := range w.idemSent[k] {
			// A copy the broker refused leaves nothing to answer with.
			if appended || e.Handled == 0 {
				copies = append(copies, e)
			}
		}
		if len(copies) > 0 {
			w.idemResent++
			if pp.Act == decide.Forward {
				sh := w.idemForwardShape(req, copies, b.Partition)
				if sh.Covered && ref.Code == kerr.OutOfOrderSequenceNumber.Code {
					// The broker itself would refuse this resend now: it
					// neither follows its producer's last batch nor is
					// one of the 5 Kafka retains, so more of its
					// producer's batches are on their way than that.
					sh = shIdemFwdBeyond
				}
				w.idemForwarded[sh.Name]++
				if sh.Covered {
					e := copies[len(copies)-1]
					w.idemFailures = append(w.idemFailures, fmt.Sprintf("req %d (conn %d) pid %d p%d epoch %d seq %d: %s; req %d (conn %d) sent it before (appended: %v; answered to the proxy: %v)",
						req.ID, req.Conn.ID, b.PID, b.Partition, b.Epoch, b.Seq, sh.Name, e.ID, e.Conn.ID, appended, e.Settled > 0))
				}
			}
		}
		if pp.Act == decide.Forward {
			w.idemSent[k] = append(w.idemSent[k], req)
		}
	}
}

// idemForwardShape says why resend s was forwarded, copies the earlier
// copies of its batch in the log or on their way: a reason one of them
// gives, or none.
func (w *world) idemForwardShape(s *Request, copies []*Request, p int32) Shape {
	sh := shIdemForwarded
	for _, e := range copies {
		switch {
		case s.CoreName != e.CoreName:
			return shIdemFwdRestart
		case e.Lost:
			sh = shIdemFwdLost
		case e.Acks != -1 || s.Acks != -1 || e.settledCode(p) == kerr.RequestTimedOut.Code:
			if sh != shIdemFwdLost {
				sh = shIdemFwdNoOffset
			}
		}
	}
	return sh
}

// settledCode is the error code of the broker's answer for partition p of
// e as the proxy stepped it, -1 if none.
func (e *Request) settledCode(p int32) int16 {
	for _, r := range e.Resp {
		if r.Partition == p {
			return r.Code
		}
	}
	return -1
}
