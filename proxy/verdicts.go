package proxy

import (
	"time"

	"github.com/dedupproxy/dedupproxy/decide"
	"github.com/dedupproxy/dedupproxy/metrics"
)

// countVerdicts counts a decided request's parts (package metrics), and
// logs those the proxy answers or cuts itself (enforce) or would
// (observe). waited: the request waited for an outcome before it was
// decided.
func (c *session) countVerdicts(pl *producePlan, waited bool) {
	m := c.s.Metrics
	topics := c.s.topicCounters.Load()
	for i := range pl.Parts {
		pp := &pl.Parts[i]
		v := &pp.Verdict
		if v.Pass >= 0 {
			m.Count(pp, waited, nil)
			continue
		}
		var tc *metrics.TopicCounter
		if topics != nil && len(*topics) > 0 {
			if name, ok := c.s.table.TopicName(c.dreq.Parts[i].Topic); ok {
				tc = (*topics)[name]
			}
		}
		m.Count(pp, waited, tc)
		if v.Would != decide.Forward || pp.Act != decide.Forward {
			c.logVerdict(pl, i)
		}
	}
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
