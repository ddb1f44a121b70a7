package sim

import (
	"flag"
	"fmt"
	"math"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/dedupproxy/dedupproxy/decide"
)

var (
	seeds      = flag.Int("seeds", defaultSeeds, "how many seeds TestSimulation runs")
	first      = flag.Uint64("seed", 1, "the first seed TestSimulation runs")
	showScript = flag.Bool("script", false, "print every run's script (with -seeds=1), failing or not")
)

// defaultSeeds is what CI runs: about 15 s under -race on a 2-core
// machine.
const defaultSeeds = 2000

// bounds are the counts of each documented miss (docs/simulation.md) over
// the default run, seeds 1 to 2000: the run is deterministic, so a count
// above its bound is a regression; below, tighten the bound. Other seed
// ranges are held to twice the default rate, plus 3. A shape the rule
// covers has no bound: any count fails.
//
// NOTE: a new shape in check.go needs its bound here.
var bounds = map[string]int{}

// TestSimulation runs -seeds scenarios from -seed, checks the invariants
// of docs/simulation.md after each, and holds each documented miss to its
// bound. A failing seed prints the script that replays it against the
// core (decide/testdata's format).
func TestSimulation(t *testing.T) {
	start := time.Now()
	var tab table
	failed := 0
	for s := *first; s < *first+uint64(*seeds); s++ {
		res, _ := runSeed(s, defaultConfig, false)
		tab.add(res)
		if *showScript {
			_, w := runSeed(s, defaultConfig, true)
			t.Logf("%s\nscript:\n%s", res.report(), w.script.b.String())
		}
		if len(res.failures) > 0 {
			failed++
			switch {
			case failed == 1 && !*showScript:
				_, w := runSeed(s, defaultConfig, true)
				t.Errorf("%s\nscript (replay it with -seed=%d -seeds=1 -script):\n%s", res.report(), s, w.script.b.String())
			case failed <= 20:
				t.Errorf("%s(replay: go test ./sim -run TestSimulation -args -seed=%d -seeds=1 -script -v)", res.report(), s)
			}
		}
	}
	t.Logf("%d seeds in %v, %d failed\n%s", *seeds, time.Since(start).Round(time.Millisecond), failed, &tab)
	checkBounds(t, &tab)
}

// checkBounds holds each documented miss to its bound.
func checkBounds(t *testing.T, tab *table) {
	t.Helper()
	def := *first == 1 && *seeds == defaultSeeds
	var over []string
	for _, sh := range allShapes {
		if sh.covered {
			continue
		}
		b, ok := bounds[sh.name]
		if !ok {
			t.Errorf("shape %q has no bound in sim_test.go", sh.name)
			continue
		}
		limit := b
		if !def {
			limit = int(math.Ceil(2*float64(b)*float64(tab.runs)/defaultSeeds)) + 3
		}
		if n := tab.counts[sh.name]; n > limit {
			over = append(over, fmt.Sprintf("%q: %d, bound %d (seeds %v)", sh.name, n, limit, tab.seeds[sh.name]))
		}
	}
	if len(over) > 0 {
		t.Errorf("documented misses above their bound:\n  %s", strings.Join(over, "\n  "))
	}
	if def && (t.Failed() || testing.Verbose()) {
		// What the bounds would be now, to paste once the change is
		// understood.
		var names []string
		for _, sh := range allShapes {
			if !sh.covered {
				names = append(names, sh.name)
			}
		}
		sort.Strings(names)
		var sb strings.Builder
		for _, n := range names {
			fmt.Fprintf(&sb, "\t%q: %d,\n", n, tab.counts[n])
		}
		t.Logf("measured bounds:\n%s", sb.String())
	}
}

// TestSimulationDeterministic: a seed replays bit for bit: the same
// script, the same verdict.
func TestSimulationDeterministic(t *testing.T) {
	for s := uint64(1); s <= 30; s++ {
		r1, w1 := runSeed(s, defaultConfig, true)
		r2, w2 := runSeed(s, defaultConfig, true)
		if w1.script.b.String() != w2.script.b.String() || r1.report() != r2.report() {
			t.Fatalf("seed %d ran twice differently", s)
		}
	}
}

// TestSimulationFindsBrokenRules: the invariants fail a rule that is
// wrong. Comparing records by content alone for every client drops the
// heartbeats of clients that keep timestamps (invariant 1); a client
// instance of one client id from any host takes the records of another
// host's twin for retries (invariant 2).
func TestSimulationFindsBrokenRules(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  coreConfig
	}{
		{"match-records", coreConfig{window: decide.DefaultWindow, scope: decide.ScopeInstance, match: decide.MatchRecords}},
		{"scope-client-id", coreConfig{window: decide.DefaultWindow, scope: decide.ScopeClientID, match: decide.MatchAuto}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			failed := 0
			for s := uint64(1); s <= 200 && failed == 0; s++ {
				res, _ := runSeed(s, tc.cfg, false)
				for _, f := range res.failures {
					if strings.Contains(f, "acknowledged and never written") {
						failed++
					}
				}
			}
			if failed == 0 {
				t.Errorf("200 seeds with %s found no record dropped", tc.name)
			}
		})
	}
}
