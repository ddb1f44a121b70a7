package metrics

import "github.com/dedupproxy/dedupproxy/decide"

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
