package sim

import (
	"flag"
	"testing"
	"time"
)

var (
	seeds      = flag.Int("seeds", 2000, "how many seeds TestSimulation runs")
	first      = flag.Uint64("seed", 1, "the first seed TestSimulation runs")
	showScript = flag.Bool("script", false, "print every run's script (with -seeds=1), failing or not")
)

// TestSimulation runs -seeds scenarios from -seed and checks the
// invariants of docs/simulation.md after each.
func TestSimulation(t *testing.T) {
	start := time.Now()
	var tab table
	failed := 0
	for s := *first; s < *first+uint64(*seeds); s++ {
		res, _ := runSeed(s, false)
		tab.add(res)
		if *showScript {
			_, w := runSeed(s, true)
			t.Logf("%s\nscript:\n%s", res.report(), w.script.b.String())
		}
		if len(res.failures) > 0 {
			failed++
			if failed <= 3 && !*showScript {
				_, w := runSeed(s, true)
				t.Errorf("%s\nscript:\n%s", res.report(), w.script.b.String())
			} else if failed <= 20 {
				t.Errorf("%s", res.report())
			}
		}
	}
	t.Logf("%d seeds in %v, %d failed\n%s", *seeds, time.Since(start).Round(time.Millisecond), failed, &tab)
}
