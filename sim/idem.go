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
	if req.acks == 0 {
		return
	}
	if w.idemSent == nil {
		w.idemSent, w.idemForwarded = map[idemKey][]*wireReq{}, map[string]int{}
	}
	for i, b := range req.parts {
		if b.pid < 0 {
			continue
		}
		pp := &d.pl.Parts[i]
		k := idemKey{b.pid, b.partition, b.epoch, b.seq}
		ref, ok := w.broker.idempotent(b, 0)
		appended := !ok && ref.code == 0
		var copies []*wireReq
		for _, e := range w.idemSent[k] {
			// A copy the broker refused leaves nothing to answer with.
			if appended || e.handled == 0 {
				copies = append(copies, e)
			}
		}
		if len(copies) > 0 {
			w.idemResent++
			if pp.Act == decide.Forward {
				sh := w.idemForwardShape(req, copies, b.partition)
				if sh.covered && ref.code == kerr.OutOfOrderSequenceNumber.Code {
					// The broker itself would refuse this resend now: it
					// neither follows its producer's last batch nor is
					// one of the 5 Kafka retains, so more of its
					// producer's batches are on their way than that.
					sh = shIdemFwdBeyond
				}
				w.idemForwarded[sh.name]++
				if sh.covered {
					e := copies[len(copies)-1]
					w.idemFailures = append(w.idemFailures, fmt.Sprintf("req %d (conn %d) pid %d p%d epoch %d seq %d: %s; req %d (conn %d) sent it before (appended: %v; answered to the proxy: %v)",
						req.id, req.cn.id, b.pid, b.partition, b.epoch, b.seq, sh.name, e.id, e.cn.id, appended, e.settled > 0))
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
func (w *world) idemForwardShape(s *wireReq, copies []*wireReq, p int32) shape {
	sh := shIdemForwarded
	for _, e := range copies {
		switch {
		case s.coreName != e.coreName:
			return shIdemFwdRestart
		case e.lost:
			sh = shIdemFwdLost
		case e.acks != -1 || s.acks != -1 || e.settledCode(p) == kerr.RequestTimedOut.Code:
			if sh != shIdemFwdLost {
				sh = shIdemFwdNoOffset
			}
		}
	}
	return sh
}

// settledCode is the error code of the broker's answer for partition p of
// e as the proxy stepped it, -1 if none.
func (e *wireReq) settledCode(p int32) int16 {
	for _, r := range e.resp {
		if r.partition == p {
			return r.code
		}
	}
	return -1
}
