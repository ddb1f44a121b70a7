package proxy

import (
	"time"

	"github.com/dedupproxy/dedupproxy/decide"
)

// countVerdicts counts a decided request's parts, and logs those the proxy
// answers or cuts itself (enforce) or would (observe). waited: the request
// waited for an outcome before it was decided.
func (c *session) countVerdicts(pl *producePlan, waited bool) {
	m := c.s.Metrics
	topics := c.s.topicCounters.Load()
	for i := range pl.Parts {
		pp := &pl.Parts[i]
		v := &pp.Verdict
		if v.Pass >= 0 {
			m.passthrough[v.Pass].Inc()
			continue
		}
		out := batchOutcome(pp, waited)
		m.batches[out].Inc()
		var tc *topicCounter
		if topics != nil && len(*topics) > 0 {
			if name, ok := c.s.table.TopicName(c.dreq.Parts[i].Topic); ok {
				tc = (*topics)[name]
			}
		}
		if tc != nil {
			tc.batches[out].Inc()
		}
		if v.Legacy {
			if n := float64(v.Dropped); n > 0 && v.Rule != decide.RuleKey {
				action := retryDropped
				if pp.Act == decide.Forward {
					action = retryObserved
				}
				m.retryRecords[action].Add(n)
				if tc != nil {
					tc.retryRecords[action].Add(n)
				}
			}
			if v.Rule == decide.RuleKey && v.Dropped > 0 {
				if pp.Act == decide.Forward {
					m.keysObserved.Add(float64(v.Dropped))
				} else {
					m.keysDropped.Add(float64(v.Dropped))
				}
			}
			if pp.Act != decide.Forward && pp.Local.ErrorCode == 0 {
				m.dupAnswered[dupByProxy].Inc()
			}
		} else {
			switch v.Rule {
			case decide.RuleDuplicate:
				if pp.Act == decide.Answer {
					m.dupAnswered[dupByProxy].Inc()
				} else {
					m.dupAnswered[dupByBroker].Inc()
				}
			case decide.RuleKey:
				m.keysObserved.Add(float64(v.Dropped))
			}
		}
		if v.Would != decide.Forward || pp.Act != decide.Forward {
			c.logVerdict(pl, i)
		}
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
			return outLegacyInFlight
		case v.Would == decide.Answer:
			return outLegacyDuplicate
		case v.Would == decide.Rebuild:
			return outLegacyRebatched
		}
		return outLegacyAccepted
	}
	switch v.Rule {
	case decide.RuleDuplicate:
		if answeredAfterWait {
			return outInFlight
		}
		return outDuplicate
	case decide.RuleInFlight:
		return outInFlight
	case decide.RuleOutOfOrder:
		return outOutOfOrder
	case decide.RuleFenced:
		return outFenced
	case decide.RuleSequenceReuse:
		return outSequenceReuse
	}
	return outAccepted
}

// logVerdict writes one line for a part the proxy answered or cut itself,
// or would have in enforce mode ("would ..."), rate-limited across the
// server: an operator of a payment system wants to see each one, and one
// running observe mode before enforcing wants to read what it would drop.
func (c *session) logVerdict(pl *producePlan, i int) {
	ok, suppressed := c.s.answerLog.allow(c.s.now())
	if !ok {
		return
	}
	pp := &pl.Parts[i]
	v := &pp.Verdict
	req := &c.dreq
	p := &req.Parts[i]
	topic, _ := c.s.table.TopicName(p.Topic)
	who, _ := c.authenticated()
	attrs := []any{"topic", topic, "partition", p.Partition, "client_id", c.clientID, "principal", who.Name,
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
	c.log.Info(msg, attrs...)
}
