package proxy

import (
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
// or would have in enforce mode (metrics.LogVerdict), rate-limited across
// the server.
func (c *session) logVerdict(pl *producePlan, i int) {
	ok, suppressed := c.s.answerLog.Allow(c.s.now())
	if !ok {
		return
	}
	p := &c.dreq.Parts[i]
	topic, _ := c.s.table.TopicName(p.Topic)
	who, _ := c.authenticated()
	metrics.LogVerdict(c.log, &pl.Parts[i], p, topic, c.clientID, who.Name, suppressed)
}
