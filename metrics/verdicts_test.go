package metrics

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/dedupproxy/dedupproxy/decide"
)

// TestLogLimiter: at most 20 lines a second pass; the first line of a
// later second reports how many were let go in between.
func TestLogLimiter(t *testing.T) {
	var l LogLimiter
	at := time.Unix(1_700_000_000, 0)
	for i := range 20 {
		if ok, sup := l.Allow(at.Add(time.Duration(i) * time.Millisecond)); !ok || sup != 0 {
			t.Fatalf("line %d: allow = %v, %d; want true, 0", i, ok, sup)
		}
	}
	for i := range 5 {
		if ok, _ := l.Allow(at.Add(900 * time.Millisecond)); ok {
			t.Fatalf("line %d past 20 in one second allowed", 21+i)
		}
	}
	if ok, sup := l.Allow(at.Add(time.Second)); !ok || sup != 5 {
		t.Fatalf("next second: allow = %v, %d; want true, 5", ok, sup)
	}
}

// TestCountOutcomes: each decided part counts once in batches_total under
// its final decision, a retry answered after a wait as an in-flight wait,
// and a part relayed undecided only under its passthrough reason.
func TestCountOutcomes(t *testing.T) {
	cases := []struct {
		name   string
		pp     decide.PartPlan
		waited bool
		want   int // -1: no outcome, a passthrough
	}{
		{"accepted", decide.PartPlan{Act: decide.Forward, Verdict: decide.Verdict{Pass: -1}}, false, OutAccepted},
		{"duplicate answered", decide.PartPlan{Act: decide.Answer, Verdict: decide.Verdict{Pass: -1, Rule: decide.RuleDuplicate}}, false, OutDuplicate},
		{"duplicate after a wait", decide.PartPlan{Act: decide.Answer, Verdict: decide.Verdict{Pass: -1, Rule: decide.RuleDuplicate}}, true, OutInFlight},
		{"legacy retry", decide.PartPlan{Act: decide.Answer, Verdict: decide.Verdict{Pass: -1, Legacy: true, Would: decide.Answer}}, false, OutLegacyDuplicate},
		{"legacy cut", decide.PartPlan{Act: decide.Rebuild, Verdict: decide.Verdict{Pass: -1, Legacy: true, Would: decide.Rebuild}}, false, OutLegacyRebatched},
		{"passthrough", decide.PartPlan{Act: decide.Forward, Verdict: decide.Verdict{Pass: decide.PassLegacy}}, false, -1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := New(nil, Build{})
			m.Count(&tc.pp, tc.waited, nil)
			for o := range NumBatchOutcomes {
				want := 0.0
				if o == tc.want {
					want = 1
				}
				if got := testutil.ToFloat64(m.Batches[o]); got != want {
					t.Errorf("batches_total{outcome=%s} = %v, want %v", batchOutcomes[o], got, want)
				}
			}
			if pass := testutil.ToFloat64(m.Passthrough[decide.PassLegacy]); (pass == 1) != (tc.want < 0) {
				t.Errorf("batches_passthrough_total{reason=legacy} = %v", pass)
			}
		})
	}
}
