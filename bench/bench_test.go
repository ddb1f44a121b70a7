package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPipelineTiny runs the whole benchmark at a tiny size — both
// upstreams, the proxy as its own process, a retry rate above zero so the
// fault shim really drops acknowledgements, and the memory scenario — so CI
// notices when the command stops working. It checks real outcomes, not
// speed: every record acknowledged, every report field filled, every ratio
// finite, dropped acknowledgements caught by the proxy as duplicates.
func TestPipelineTiny(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the proxy process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	cfg := defaultConfig()
	cfg.Log = slog.New(slog.NewTextHandler(t.Output(), nil))
	cfg.Sizes = []int{512}
	cfg.BatchBytes = 4096 // many small requests, so several acknowledgements are dropped
	cfg.Producers = 2
	cfg.Duration = 3 * time.Second // a bound; the record count ends each phase first
	cfg.Records = 400
	cfg.Reps = 1
	cfg.RetryRate = 0.2 // every 5th Produce acknowledgement lost
	cfg.LostAckRate = 0.2
	cfg.Recovery = 10 * time.Millisecond
	cfg.RoundTrip = 256
	cfg.MemProducers = 5
	cfg.MemPartitions = 4
	cfg.DedupCostSize = 512
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	rep, err := Run(ctx, cfg, dir)
	if err != nil {
		t.Fatal(err)
	}
	rep.Command = "go test ./bench"

	// 2 upstreams × (batched, roundtrip, lostack).
	if len(rep.Rows) != 6 {
		t.Fatalf("got %d rows, want 6", len(rep.Rows))
	}
	var dropped int64
	for _, row := range rep.Rows {
		name := row.Scenario + "/" + row.Upstream
		for target, s := range map[string]Side{"direct": row.Direct, "proxy": row.Proxy} {
			if s.Acked == 0 || s.Acked != s.Sent || s.Failed != 0 {
				t.Errorf("%s %s: acked %d of %d sent, %d failed", name, target, s.Acked, s.Sent, s.Failed)
			}
			for field, v := range map[string]float64{"seconds": s.Seconds, "records/s": s.RecPerSec, "MB/s": s.MBPerSec,
				"p50": s.P50us, "p99": s.P99us, "p99.9": s.P999us} {
				if !(v > 0) || math.IsInf(v, 0) {
					t.Errorf("%s %s: %s = %v", name, target, field, v)
				}
			}
			if s.P50us > s.P99us || s.P99us > s.P999us {
				t.Errorf("%s %s: percentiles out of order: %v %v %v", name, target, s.P50us, s.P99us, s.P999us)
			}
		}
		for field, v := range map[string]float64{"ratio rec/s": row.RatioRecPerSec, "ratio MB/s": row.RatioMBPerSec,
			"ratio p50": row.RatioP50, "ratio p99": row.RatioP99, "ratio p99.9": row.RatioP999,
			"proxy CPU ms/MB": row.ProxyCPUmsPerMB, "added p50": row.AddedP50us} {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				t.Errorf("%s: %s is not finite: %v", name, field, v)
			}
		}
		if row.ProxyPeakRSSMiB <= 0 {
			t.Errorf("%s: proxy peak RSS %v", name, row.ProxyPeakRSSMiB)
		}
		if row.ProxyCPUSeconds < 0 {
			t.Errorf("%s: proxy CPU %v", name, row.ProxyCPUSeconds)
		}
		if row.Scenario != "roundtrip" && row.Direct.AcksDropped+row.Proxy.AcksDropped == 0 {
			t.Errorf("%s: the shim dropped no acknowledgement at rate %v", name, row.RetryRate)
		}
		// An idempotent retry of a batch the proxy already committed must
		// be answered by the proxy, not forwarded again.
		if row.Idempotent && row.Dedup == "enforce" && row.Proxy.AcksDropped > 0 && row.Duplicates+row.InFlightWaits == 0 {
			t.Errorf("%s: %d acknowledgements dropped through the proxy but no duplicate caught", name, row.Proxy.AcksDropped)
		}
		dropped += row.Direct.AcksDropped + row.Proxy.AcksDropped
	}
	if dropped == 0 {
		t.Error("no acknowledgement dropped in the whole run")
	}
	m := rep.Memory
	if m == nil {
		t.Fatal("no memory result")
	}
	if m.Entries != float64(m.ExpectedEntries) {
		t.Errorf("memory: table grew by %v entries, want %d", m.Entries, m.ExpectedEntries)
	}
	if m.RSSBeforeMiB <= 0 || m.RSSAfterMiB <= 0 || math.IsNaN(m.RSSPerEntry) || math.IsNaN(m.HeapPerEntry) {
		t.Errorf("memory: %+v", *m)
	}
	for _, dc := range []*DedupCostResult{rep.DedupCost, rep.LegacyDedupCost} {
		if dc == nil {
			t.Fatal("no dedup cost result")
		}
		if dc.Enforce.Acked != dc.Enforce.Sent || dc.Off.Acked != dc.Off.Sent || dc.Enforce.Acked == 0 {
			t.Errorf("dedup cost, %s: enforce acked %d/%d, off %d/%d", dc.Producers, dc.Enforce.Acked, dc.Enforce.Sent, dc.Off.Acked, dc.Off.Sent)
		}
		if dc.Decided == 0 {
			t.Errorf("dedup cost, %s: the enforce proxy decided no batch", dc.Producers)
		}
		// CPU is read in clock ticks (10 ms), so a phase this small may
		// show none; the ratio is then n/a, never a made-up number.
		if dc.EnforceCPUmsPerMB < 0 || dc.OffCPUmsPerMB < 0 || (dc.OffCPUmsPerMB > 0) == math.IsNaN(dc.CPURatio) || math.IsInf(dc.CPURatio, 0) {
			t.Errorf("dedup cost, %s: %+v", dc.Producers, *dc)
		}
	}
	// Targets: batched (throughput, CPU) and roundtrip (p50, p99) per
	// upstream, the dedup cost for idempotent and legacy producers, plus
	// memory.
	if len(rep.Targets) != 11 {
		t.Errorf("got %d targets, want 11: %+v", len(rep.Targets), rep.Targets)
	}
	for _, tg := range rep.Targets {
		if tg.Result != "met" && tg.Result != "NOT met" && tg.Result != "reported" {
			t.Errorf("target %q: result %q", tg.Name, tg.Result)
		}
	}

	out := filepath.Join(dir, "results")
	if err := writeResults(out, rep); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(out, "results.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Targets", "rec/s D", "p99.9 P", "proxy CPU ms/MB", "proxy peak RSS MiB", "duplicates caught",
		"in-flight waits", "| batched | kfake |", "| lostack | sink |", "## Memory per tracked", "results.svg"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("results.md lacks %q", want)
		}
	}
	svg, err := os.ReadFile(filepath.Join(out, "results.svg"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(svg), "<svg") || !strings.Contains(string(svg), "<rect") || strings.Contains(string(svg), "NaN") {
		t.Errorf("results.svg is not a chart:\n%.500s", svg)
	}
	var back Report
	b, err := os.ReadFile(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &back); err != nil || len(back.Rows) != len(rep.Rows) {
		t.Errorf("results.json: %v, %d rows", err, len(back.Rows))
	}
}

func TestHistogramQuantiles(t *testing.T) {
	var h histogram
	for i := 1; i <= 10000; i++ {
		h.record(time.Duration(i) * time.Microsecond)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 5000 * time.Microsecond}, {0.99, 9900 * time.Microsecond}, {0.999, 9990 * time.Microsecond}} {
		got := h.quantile(c.q)
		if rel := math.Abs(float64(got-c.want)) / float64(c.want); rel > 0.01 {
			t.Errorf("q%v = %v, want %v within 1%%", c.q, got, c.want)
		}
	}
	for _, ns := range []int64{0, 1, 127, 128, 129, 1 << 20, 1<<40 + 12345} {
		i := histIndex(ns)
		if v := histValue(i); ns >= histSub && math.Abs(float64(v-ns))/float64(ns) > 0.01 {
			t.Errorf("bucket of %d has value %d", ns, v)
		}
	}
}

func TestMetricValue(t *testing.T) {
	const text = `# HELP dedupproxy_batches_total x
# TYPE dedupproxy_batches_total counter
dedupproxy_batches_total{outcome="accepted"} 10
dedupproxy_batches_total{outcome="duplicate"} 3
dedupproxy_batches_total_other 99
dedupproxy_seqstate_entries 4.5e+06
`
	for _, c := range []struct {
		name, label string
		want        float64
	}{
		{"dedupproxy_batches_total", `outcome="duplicate"`, 3},
		{"dedupproxy_batches_total", "", 13},
		{"dedupproxy_seqstate_entries", "", 4.5e6},
		{"dedupproxy_missing", "", 0},
	} {
		var labels []string
		if c.label != "" {
			labels = append(labels, c.label)
		}
		if got := metricValue(text, c.name, labels...); got != c.want {
			t.Errorf("%s %s = %v, want %v", c.name, c.label, got, c.want)
		}
	}
}

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

func TestCountRecords(t *testing.T) {
	batch := func(n int32, extra int) []byte {
		b := make([]byte, 61+extra)
		putU32 := func(off int, v uint32) {
			b[off], b[off+1], b[off+2], b[off+3] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
		}
		putU32(8, uint32(len(b)-12))
		putU32(57, uint32(n))
		return b
	}
	two := append(batch(3, 10), batch(4, 0)...)
	if got := countRecords(two); got != 7 {
		t.Errorf("countRecords = %d, want 7", got)
	}
	if got := countRecords(two[:80]); got != 3 {
		t.Errorf("truncated second batch: countRecords = %d, want 3", got)
	}
}

// TestTLSCostTiny runs the TLS cost scenario at a tiny size: both proxy
// processes serve every record, the TLS one over TLS on both legs, and the
// report's figures are finite.
func TestTLSCostTiny(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the proxy process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	cfg := defaultConfig()
	cfg.Producers, cfg.Reps, cfg.Duration = 2, 1, 300*time.Millisecond
	var err error
	if cfg.ProxyBin, err = buildProxy(ctx, dir); err != nil {
		t.Fatal(err)
	}
	res, err := runTLSCost(ctx, cfg, dir, 512, slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]Side{"plain": res.Plain, "tls": res.TLS} {
		if s.Acked == 0 || s.Acked != s.Sent || s.Failed != 0 {
			t.Errorf("%s: acked %d of %d, failed %d", name, s.Acked, s.Sent, s.Failed)
		}
	}
	for name, v := range map[string]float64{"plain CPU/MB": res.PlainCPUmsPerMB, "TLS CPU/MB": res.TLSCPUmsPerMB, "MB ratio": res.MBRatio} {
		if !(v > 0) || math.IsInf(v, 0) {
			t.Errorf("%s = %v", name, v)
		}
	}
	if res.Decided < 1 {
		t.Errorf("the TLS proxy decided %v batches", res.Decided)
	}
	var b strings.Builder
	writeTLSCost(&b, res, "go test ./bench")
	t.Log(b.String())
}
