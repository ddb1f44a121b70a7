package micro

import (
	"math"
	"strings"
	"testing"
)

func TestParseBenchAndSummarize(t *testing.T) {
	const out = `goos: linux
pkg: github.com/dedupproxy/dedupproxy/seqstate
BenchmarkCheckCommit/retained=5-2   	 1000000	        40.0 ns/op	       0 B/op	       0 allocs/op
BenchmarkCheckCommit/retained=5-2   	 1000000	        42.0 ns/op	       0 B/op	       0 allocs/op
BenchmarkCheckCommit/retained=5-2   	 1000000	        41.0 ns/op	       0 B/op	       0 allocs/op
BenchmarkCheckCommit/retained=5-2   	 1000000	       400.0 ns/op	       0 B/op	       0 allocs/op
BenchmarkProduceRelay/batched/proxy-2   	 4237	  881106 ns/op	 116.22 MB/s	  373016 B/op	     162 allocs/op
PASS
`
	rs := parseBench(strings.NewReader(out))
	if len(rs) != 2 || rs[0].name != "BenchmarkCheckCommit/retained=5" || rs[0].pkg != "github.com/dedupproxy/dedupproxy/seqstate" {
		t.Fatalf("parsed %+v", rs)
	}
	mean, spread, kept := summarize(rs[0].samples["ns/op"])
	if kept != 3 || mean != 41 || math.Abs(spread-1.0/41) > 1e-9 {
		t.Errorf("summarize = %v ± %v (n=%d), want 41 ± 2.4%% with the 400 dropped", mean, spread, kept)
	}
	if got := rs[1].samples["MB/s"]; len(got) != 1 || got[0] != 116.22 {
		t.Errorf("MB/s samples %v", got)
	}
	var sb strings.Builder
	writeMicro(&sb, rs)
	if !strings.Contains(sb.String(), "| CheckCommit/retained=5 | 41.00 ± 2% (n=3/4) | 0 ± 0% | 0 ± 0% |") {
		t.Errorf("summary:\n%s", sb.String())
	}
}
