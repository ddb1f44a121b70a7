package metrics

import (
	"log/slog"
	"sync"
	"time"

	"github.com/dedupproxy/dedupproxy/decide"
)

// Count counts one decided part of a Produce request: its outcome in
// batches_total (and in tc's, for a listed topic; tc may be nil), the
// legacy records not written again, the idempotency keys seen again and
// who answered a duplicate. A part relayed without a decision counts only
// its passthrough reason. waited: the request waited for an outcome before
// it was decided.
func (m *Metrics) Count(pp *decide.PartPlan, waited bool, tc *TopicCounter) {
	v := &pp.Verdict
	if v.Pass >= 0 {
		m.Passthrough[v.Pass].Inc()
		return
	}
	out := batchOutcome(pp, waited)
	m.Batches[out].Inc()
	if tc != nil {
		tc.batches[out].Inc()
	}
	if v.Legacy {
		if n := float64(v.Dropped); n > 0 && v.Rule != decide.RuleKey {
			action := RetryDropped
			if pp.Act == decide.Forward {
				action = RetryObserved
			}
			m.RetryRecords[action].Add(n)
			if tc != nil {
				tc.retryRecords[action].Add(n)
			}
		}
		if v.Rule == decide.RuleKey && v.Dropped > 0 {
			if pp.Act == decide.Forward {
				m.KeysObserved.Add(float64(v.Dropped))
			} else {
				m.KeysDropped.Add(float64(v.Dropped))
			}
		}
		if pp.Act != decide.Forward && pp.Local.ErrorCode == 0 {
			m.DupAnswered[DupByProxy].Inc()
		}
		return
	}
	switch v.Rule {
	case decide.RuleDuplicate:
		if pp.Act == decide.Answer {
			m.DupAnswered[DupByProxy].Inc()
		} else {
			m.DupAnswered[DupByBroker].Inc()
		}
	case decide.RuleKey:
		m.KeysObserved.Add(float64(v.Dropped))
	}
}

// batchOutcome is a decided part's outcome in batches_total: each batch
// counts once, under its final decision (in observe mode, what enforce
// would have done); a retry answered after it waited for its original (or
// whose wait ran out) counts as an in-flight wait.
func batchOutcome(pp *decide.PartPlan, waited bool) int {
	v := &pp.Verdict
	answeredAfterWait := waited && pp.Act == decide.Answer
	if v.Legacy {
		switch {
		case answeredAfterWait:
			return OutLegacyInFlight
		case v.Would == decide.Answer:
			return OutLegacyDuplicate
		case v.Would == decide.Rebuild:
			return OutLegacyRebatched
		}
		return OutLegacyAccepted
	}
	switch v.Rule {
	case decide.RuleDuplicate:
		if answeredAfterWait {
			return OutInFlight
		}
		return OutDuplicate
	case decide.RuleInFlight:
		return OutInFlight
	case decide.RuleOutOfOrder:
		return OutOutOfOrder
	case decide.RuleFenced:
		return OutFenced
	case decide.RuleSequenceReuse:
		return OutSequenceReuse
	}
	return OutAccepted
}

// LogVerdict writes one line for a part the proxy answered or cut itself,
// or would have in enforce mode ("would ..."): pp is the part's plan, p
// the part as decided, in topic, from the client clientID authenticated as
// principal. An operator of a payment system wants to see each one, and
// one running observe mode before enforcing wants to read what it would
// drop; the caller rate-limits the lines (LogLimiter), suppressed is how
// many it let go since the last.
func LogVerdict(log *slog.Logger, pp *decide.PartPlan, p *decide.Part, topic, clientID, principal string, suppressed int) {
	v := &pp.Verdict
	attrs := []any{"topic", topic, "partition", p.Partition, "client_id", clientID, "principal", principal,
		"rule", v.Rule.String(), "records", v.Records}
	if v.Dropped > 0 {
		attrs = append(attrs, "dropped", v.Dropped)
	}
	if v.Original >= 0 {
		attrs = append(attrs, "original_offset", v.Original, "original_age", v.Age.Round(time.Millisecond))
	}
	if pp.Act == decide.Answer {
		if pp.Local.ErrorCode != 0 {
			attrs = append(attrs, "error_code", pp.Local.ErrorCode)
		} else {
			attrs = append(attrs, "offset", pp.Local.BaseOffset)
		}
	}
	if !v.Legacy {
		attrs = append(attrs, "producer_id", p.Header.ProducerID, "epoch", p.Header.ProducerEpoch, "first_seq", p.Header.BaseSequence)
	}
	if suppressed > 0 {
		attrs = append(attrs, "suppressed", suppressed)
	}
	var msg string
	switch {
	case pp.Act == decide.Forward && v.Would == decide.Answer && v.Rule == decide.RuleSequenceReuse:
		msg = "would refuse a sequence reused for other records"
	case pp.Act == decide.Forward && v.Would == decide.Answer:
		msg = "would answer as a retry (observe mode: written)"
	case pp.Act == decide.Forward && v.Would == decide.Rebuild:
		msg = "would drop records already written (observe mode: written)"
	case pp.Act == decide.Answer && pp.Local.ErrorCode != 0 && v.Rule == decide.RuleSequenceReuse:
		msg = "refused: a sequence reused for other records (Kafka would drop them silently)"
	case pp.Act == decide.Answer && pp.Local.ErrorCode != 0:
		msg = "answered REQUEST_TIMED_OUT: the outcome it waited for did not come in time"
	case pp.Act == decide.Answer && pp.Local.BaseOffset >= 0:
		msg = "answered as a retry with the original's offset"
	case pp.Act == decide.Answer:
		msg = "answered as a retry, offset -1 (no one offset is true for the whole batch)"
	case pp.Act == decide.Rebuild:
		msg = "dropped records already written; the rest forwarded"
	default:
		return
	}
	log.Info(msg, attrs...)
}

// LogLimiter lets at most 20 lines through each second and counts the
// rest, which the next line that passes reports.
type LogLimiter struct {
	mu         sync.Mutex
	second     int64
	n          int
	suppressed int
}

const logPerSecond = 20

// Allow reports whether a line may be written at now, and how many were
// let go since the last that was.
func (l *LogLimiter) Allow(now time.Time) (ok bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := now.Unix(); s != l.second {
		l.second, l.n = s, 0
	}
	if l.n >= logPerSecond {
		l.suppressed++
		return false, 0
	}
	l.n++
	suppressed, l.suppressed = l.suppressed, 0
	return true, suppressed
}
