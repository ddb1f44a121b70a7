package main

import (
	"encoding/json"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Target is one figure the issue asks for, with its limit and whether this
// run met it. Every target is reported, met or not.
type Target struct {
	Name     string `json:"name"`
	Where    string `json:"where"`
	Measured string `json:"measured"`
	Limit    string `json:"limit"`
	Result   string `json:"result"` // met, NOT met, reported
}

func metStr(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

// evaluateTargets compares the run with the targets:
// batched throughput ≥ 0.9× direct; added round-trip latency ≤ 100 µs at
// p50 and ≤ 300 µs at p99; proxy CPU ≤ 0.8 ms per MB with dedup enforced;
// RSS per tracked (producer, partition) reported.
func evaluateTargets(r *Report) []Target {
	var ts []Target
	for _, row := range r.Rows {
		where := fmt.Sprintf("%s, %s, %s", row.Scenario, row.Upstream, sizeLabel(row.RecordSize))
		switch row.Scenario {
		case "batched":
			ts = append(ts, Target{"throughput proxy/direct", where, fmtRatio(row.RatioRecPerSec), "≥ 0.90×",
				metStr(row.RatioRecPerSec >= 0.9)})
			if row.Dedup == "enforce" {
				ts = append(ts, Target{"proxy CPU per MB (dedup enforce)", where, fmt.Sprintf("%.3f ms/MB", row.ProxyCPUmsPerMB),
					"≤ 0.8 ms/MB", metStr(row.ProxyCPUmsPerMB <= 0.8)})
			}
		case "roundtrip":
			ts = append(ts,
				Target{"added latency p50 (1 record per round trip, acks=all)", where, fmt.Sprintf("%+.0f µs", row.AddedP50us),
					"≤ 100 µs", metStr(row.AddedP50us <= 100)},
				Target{"added latency p99 (1 record per round trip, acks=all)", where, fmt.Sprintf("%+.0f µs", row.AddedP99us),
					"≤ 300 µs", metStr(row.AddedP99us <= 300)})
		}
	}
	if dc := r.DedupCost; dc != nil {
		ts = append(ts, Target{"proxy CPU per MB, dedup enforce ÷ off",
			fmt.Sprintf("batched, %s, %s, %d alternated pairs", dc.Upstream, sizeLabel(dc.RecordSize), dc.Reps),
			fmt.Sprintf("%.3f ÷ %.3f ms/MB = %s", dc.EnforceCPUmsPerMB, dc.OffCPUmsPerMB, fmtRatio(dc.CPURatio)),
			"≤ 1.05×", metStr(dc.CPURatio <= 1.05)})
	}
	if dc := r.LegacyDedupCost; dc != nil {
		ts = append(ts, Target{"proxy CPU per MB, legacy producers, dedup enforce ÷ off",
			fmt.Sprintf("batched, %s, %s, %d alternated pairs", dc.Upstream, sizeLabel(dc.RecordSize), dc.Reps),
			fmt.Sprintf("%.3f ÷ %.3f ms/MB = %s", dc.EnforceCPUmsPerMB, dc.OffCPUmsPerMB, fmtRatio(dc.CPURatio)),
			"≤ 1.10×", metStr(dc.CPURatio <= 1.10)})
	}
	if m := r.Memory; m != nil {
		ts = append(ts, Target{"proxy RSS growth per tracked (producer, partition)",
			fmt.Sprintf("sink, %d producers × %d partitions, %.0f entries", m.Producers, m.Partitions, m.Entries),
			fmt.Sprintf("%.0f B/entry RSS (%.0f B/entry Go heap in use)", m.RSSPerEntry, m.HeapPerEntry), "report", "reported"})
	}
	return ts
}

func sizeLabel(n int) string {
	switch {
	case n >= 1024 && n%1024 == 0:
		return fmt.Sprintf("%d KiB", n/1024)
	default:
		return fmt.Sprintf("%d B", n)
	}
}

func fmtRatio(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "n/a"
	}
	return fmt.Sprintf("%.2f×", x)
}

func fmtNum(x float64) string {
	switch {
	case math.IsNaN(x):
		return "n/a"
	case x >= 100:
		return fmt.Sprintf("%.0f", x)
	case x >= 10:
		return fmt.Sprintf("%.1f", x)
	default:
		return fmt.Sprintf("%.2f", x)
	}
}

// writeMarkdown writes the whole report as markdown tables.
func writeMarkdown(w io.Writer, r *Report) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	c := r.Config
	p("# dedupproxy benchmark: proxy vs direct\n\n")
	p("Machine: %d CPUs, %s, %s, %s, %s RAM. Started %s, took %s.\n\n",
		r.Machine.NumCPU, r.Machine.CPUModel, r.Machine.GoVersion, r.Machine.Kernel, r.Machine.MemTotal,
		r.Started.UTC().Format("2006-01-02 15:04 MST"), r.Took)
	if r.Command != "" {
		p("Command: `%s`\n\n", r.Command)
	}
	p("Load: %d kgo producers, %d topic(s) × %d partitions, linger %s, batch max %d B, buffer %d B per producer, acks=%s, idempotent=%t, dedup=%s, retry rate %.3g; "+
		"%d direct/proxy pairs per row, each phase %s", c.Producers, c.Topics, c.Partitions, c.Linger, c.BatchBytes, c.BufferBytes,
		c.Acks, c.Idempotent, c.Dedup, c.RetryRate, c.Reps, c.Duration)
	if c.Records > 0 {
		p(" or %d records", c.Records)
	}
	p(", alternating which goes first. Upstreams and the load generator run in the bench process; the proxy is its own process.\n\n")

	p("## Targets\n\n| target | where | measured | limit | result |\n|---|---|---|---|---|\n")
	for _, t := range r.Targets {
		p("| %s | %s | %s | %s | **%s** |\n", t.Name, t.Where, t.Measured, t.Limit, t.Result)
	}

	p("\n## Results\n\n")
	p("D = direct to the upstream, P = through the proxy, × = P ÷ D. Latency is per record, from Produce to acknowledgement, in µs. " +
		"CPU and peak RSS are the proxy process's own (/proc) during its timed phases; MB = 10⁶ bytes of record values. " +
		"Duplicates and in-flight waits are the proxy's `dedupproxy_batches_total{outcome}` during its phases.\n\n")
	p("| scenario | upstream | record | rec/s D | rec/s P | × | MB/s D | MB/s P | × | p50 D | p50 P | × | p99 D | p99 P | × | p99.9 D | p99.9 P | × | proxy CPU s/GB | proxy CPU ms/MB | proxy peak RSS MiB | acks dropped D / P | duplicates caught | in-flight waits | acked/sent D | acked/sent P |\n")
	p("|%s\n", strings.Repeat("---|", 26))
	for _, row := range r.Rows {
		d, x := row.Direct, row.Proxy
		p("| %s | %s | %s | %.0f | %.0f | %s | %s | %s | %s | %.0f | %.0f | %s | %.0f | %.0f | %s | %.0f | %.0f | %s | %s | %.3f | %.1f | %d / %d | %.0f | %.0f | %d/%d | %d/%d |\n",
			row.Scenario, row.Upstream, sizeLabel(row.RecordSize),
			d.RecPerSec, x.RecPerSec, fmtRatio(row.RatioRecPerSec),
			fmtNum(d.MBPerSec), fmtNum(x.MBPerSec), fmtRatio(row.RatioMBPerSec),
			d.P50us, x.P50us, fmtRatio(row.RatioP50),
			d.P99us, x.P99us, fmtRatio(row.RatioP99),
			d.P999us, x.P999us, fmtRatio(row.RatioP999),
			fmtNum(row.ProxyCPUsPerGB), row.ProxyCPUmsPerMB, row.ProxyPeakRSSMiB,
			d.AcksDropped, x.AcksDropped, row.Duplicates, row.InFlightWaits,
			d.Acked, d.Sent, x.Acked, x.Sent)
	}
	p("\nRound trip (`roundtrip`): one producer, one record per ProduceSync, acks=all, no linger; added latency = P − D.\n\n")
	p("| upstream | record | added p50 µs | added p99 µs | added p99.9 µs |\n|---|---|---|---|---|\n")
	for _, row := range r.Rows {
		if row.Scenario == "roundtrip" {
			p("| %s | %s | %+.0f | %+.0f | %+.0f |\n", row.Upstream, sizeLabel(row.RecordSize), row.AddedP50us, row.AddedP99us, row.AddedP999us)
		}
	}
	for _, dc := range []*DedupCostResult{r.DedupCost, r.LegacyDedupCost} {
		if dc == nil {
			continue
		}
		p("\n## What deduplication costs: %s producers\n\n", dc.Producers)
		p("Two proxy processes in front of one %s upstream, `dedup: enforce` and `dedup: off`, the same batched %s load (%s records), "+
			"%d phases each, alternating which goes first. The enforce proxy decided %.0f batches.\n\n",
			dc.Upstream, dc.Producers, sizeLabel(dc.RecordSize), dc.Reps, dc.Decided)
		p("| dedup | rec/s | MB/s | p50 µs | p99 µs | proxy CPU ms/MB |\n|---|---|---|---|---|---|\n")
		p("| enforce | %.0f | %s | %.0f | %.0f | %.3f |\n", dc.Enforce.RecPerSec, fmtNum(dc.Enforce.MBPerSec), dc.Enforce.P50us, dc.Enforce.P99us, dc.EnforceCPUmsPerMB)
		p("| off | %.0f | %s | %.0f | %.0f | %.3f |\n", dc.Off.RecPerSec, fmtNum(dc.Off.MBPerSec), dc.Off.P50us, dc.Off.P99us, dc.OffCPUmsPerMB)
		p("| enforce ÷ off | %s | | | | %s |\n", fmtRatio(ratio(dc.Enforce.RecPerSec, dc.Off.RecPerSec)), fmtRatio(dc.CPURatio))
	}
	if m := r.Memory; m != nil {
		p("\n## Memory per tracked (producer, partition)\n\n")
		p("%d idempotent kgo producers × %d partitions through the proxy (dedup enforce) to the sink, 4 at a time, each closed when done. "+
			"RSS is the proxy's VmRSS; heap is its `go_memstats_heap_inuse_bytes`; entries is the growth of `dedupproxy_seqstate_entries` "+
			"(expected %d; %.0f at the end).\n\n", m.Producers, m.Partitions, m.ExpectedEntries, m.EntriesTotal)
		p("| entries added | RSS before MiB | RSS after MiB | RSS bytes/entry | Go heap in use bytes/entry |\n|---|---|---|---|---|\n")
		p("| %.0f | %.1f | %.1f | %.0f | %.0f |\n", m.Entries, m.RSSBeforeMiB, m.RSSAfterMiB, m.RSSPerEntry, m.HeapPerEntry)
	}
}

// writeResults writes results.md, results.svg and results.json into dir.
func writeResults(dir string, r *Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var md strings.Builder
	writeMarkdown(&md, r)
	md.WriteString("\n![proxy vs direct](results.svg)\n")
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(md.String()), 0o644); err != nil {
		return err
	}
	var svg strings.Builder
	writeSVG(&svg, r)
	if err := os.WriteFile(filepath.Join(dir, "results.svg"), []byte(svg.String()), 0o644); err != nil {
		return err
	}
	b, err := json.MarshalIndent(jsonSafe(r), "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "results.json"), append(b, '\n'), 0o644)
}

// jsonSafe replaces NaN ratios (a side with no samples), which JSON cannot
// carry, with -1.
func jsonSafe(r *Report) *Report {
	c := *r
	c.Rows = slices.Clone(r.Rows)
	for i := range c.Rows {
		row := &c.Rows[i]
		for _, f := range []*float64{&row.RatioRecPerSec, &row.RatioMBPerSec, &row.RatioP50, &row.RatioP99, &row.RatioP999} {
			if math.IsNaN(*f) || math.IsInf(*f, 0) {
				*f = -1
			}
		}
	}
	clean := func(in *DedupCostResult) *DedupCostResult {
		if in == nil {
			return nil
		}
		dc := *in
		if math.IsNaN(dc.CPURatio) || math.IsInf(dc.CPURatio, 0) {
			dc.CPURatio = -1
		}
		return &dc
	}
	c.DedupCost, c.LegacyDedupCost = clean(r.DedupCost), clean(r.LegacyDedupCost)
	return &c
}

// SVG chart, hand-rolled: per upstream, batched throughput (MB/s) and
// latency percentiles (log scale) per record size, direct vs proxy.

const (
	colDirect = "#4c78a8"
	colProxy  = "#f58518"
)

type svgBar struct {
	value float64
	color string
	note  string // drawn above the bar
}

type svgGroup struct {
	label string
	bars  []svgBar
}

func writeSVG(w io.Writer, r *Report) {
	var ups []string
	for _, row := range r.Rows {
		if !slices.Contains(ups, row.Upstream) {
			ups = append(ups, row.Upstream)
		}
	}
	const width, panelH, top = 1100, 330, 60
	height := top + len(ups)*panelH + 20
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(w, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(w, `<text x="20" y="24" font-size="16" font-weight="bold">dedupproxy: direct vs through the proxy (%d CPUs, %s)</text>`+"\n",
		r.Machine.NumCPU, html.EscapeString(r.Machine.CPUModel))
	fmt.Fprintf(w, `<rect x="20" y="36" width="12" height="12" fill="%s"/><text x="38" y="46">direct</text>`, colDirect)
	fmt.Fprintf(w, `<rect x="100" y="36" width="12" height="12" fill="%s"/><text x="118" y="46">proxy (× = proxy ÷ direct)</text>`+"\n", colProxy)
	for i, up := range ups {
		y := top + i*panelH
		var tput, lat []svgGroup
		for _, row := range r.Rows {
			if row.Upstream != up {
				continue
			}
			switch row.Scenario {
			case "batched":
				tput = append(tput, svgGroup{sizeLabel(row.RecordSize), []svgBar{
					{row.Direct.MBPerSec, colDirect, fmtNum(row.Direct.MBPerSec)},
					{row.Proxy.MBPerSec, colProxy, fmtRatio(row.RatioMBPerSec)}}})
				lat = append(lat, latencyGroups(sizeLabel(row.RecordSize), row)...)
			case "roundtrip":
				lat = append(lat, latencyGroups("1 rec/RTT "+sizeLabel(row.RecordSize), row)...)
			}
		}
		svgPanel(w, 60, y+30, 380, panelH-90, fmt.Sprintf("%s: batched throughput, MB/s", up), tput, false)
		svgPanel(w, 520, y+30, 560, panelH-90, fmt.Sprintf("%s: latency p50 / p99 / p99.9, µs (log)", up), lat, true)
	}
	fmt.Fprintln(w, "</svg>")
}

func latencyGroups(prefix string, row Row) []svgGroup {
	var gs []svgGroup
	for _, q := range []struct {
		name string
		d, p float64
	}{{"p50", row.Direct.P50us, row.Proxy.P50us}, {"p99", row.Direct.P99us, row.Proxy.P99us}, {"p99.9", row.Direct.P999us, row.Proxy.P999us}} {
		gs = append(gs, svgGroup{prefix + "|" + q.name, []svgBar{{q.d, colDirect, ""}, {q.p, colProxy, ""}}})
	}
	return gs
}

// svgPanel draws grouped bars in the box (x, y, w, h) with a linear axis
// from 0, or a log axis over whole decades. A group label "a|b" puts b
// under the group and a once under each run of groups sharing it.
func svgPanel(w io.Writer, x, y, wd, ht int, title string, groups []svgGroup, logScale bool) {
	fmt.Fprintf(w, `<text x="%d" y="%d" font-weight="bold">%s</text>`+"\n", x, y-10, html.EscapeString(title))
	fmt.Fprintf(w, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", x, y+ht, x+wd, y+ht)
	fmt.Fprintf(w, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", x, y, x, y+ht)
	var lo, hi float64 = math.Inf(1), 0
	for _, g := range groups {
		for _, b := range g.bars {
			if b.value > 0 {
				lo, hi = math.Min(lo, b.value), math.Max(hi, b.value)
			}
		}
	}
	if hi == 0 {
		return
	}
	var scale func(float64) float64 // value -> height in px
	if logScale {
		dlo, dhi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
		if dhi == dlo {
			dhi++
		}
		scale = func(v float64) float64 {
			if v <= 0 {
				return 0
			}
			return (math.Log10(v) - dlo) / (dhi - dlo) * float64(ht)
		}
		for d := dlo; d <= dhi; d++ {
			svgTick(w, x, y+ht-int(scale(math.Pow(10, d))), wd, fmtNum(math.Pow(10, d)))
		}
	} else {
		top := niceCeil(hi)
		scale = func(v float64) float64 { return v / top * float64(ht) }
		for i := 0; i <= 4; i++ {
			v := top * float64(i) / 4
			svgTick(w, x, y+ht-int(scale(v)), wd, fmtNum(v))
		}
	}
	slot := float64(wd) / float64(len(groups))
	barW := math.Min(28, slot*0.8/2)
	prevMajor := ""
	for gi, g := range groups {
		major, minor, hasMinor := strings.Cut(g.label, "|")
		gx := float64(x) + slot*float64(gi) + (slot-barW*float64(len(g.bars)))/2
		for bi, b := range g.bars {
			bh := scale(b.value)
			bx := gx + barW*float64(bi)
			fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s</title></rect>`+"\n",
				bx, float64(y+ht)-bh, barW-1, bh, b.color, fmtNum(b.value))
			if b.note != "" {
				fmt.Fprintf(w, `<text x="%.1f" y="%.1f" font-size="10" text-anchor="middle">%s</text>`+"\n",
					bx+barW/2, float64(y+ht)-bh-3, html.EscapeString(b.note))
			}
		}
		cx := float64(x) + slot*(float64(gi)+0.5)
		if hasMinor {
			fmt.Fprintf(w, `<text x="%.1f" y="%d" font-size="10" text-anchor="middle">%s</text>`+"\n", cx, y+ht+13, html.EscapeString(minor))
			if major != prevMajor {
				fmt.Fprintf(w, `<text x="%.1f" y="%d" text-anchor="start">%s</text>`+"\n", float64(x)+slot*float64(gi)+4, y+ht+30, html.EscapeString(major))
				if gi > 0 {
					fmt.Fprintf(w, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#bbb"/>`+"\n",
						float64(x)+slot*float64(gi), y, float64(x)+slot*float64(gi), y+ht+32)
				}
			}
			prevMajor = major
		} else {
			fmt.Fprintf(w, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", cx, y+ht+16, html.EscapeString(major))
		}
	}
}

func svgTick(w io.Writer, x, y, wd int, label string) {
	fmt.Fprintf(w, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#e5e5e5"/>`+"\n", x+1, y, x+wd, y)
	fmt.Fprintf(w, `<text x="%d" y="%d" font-size="10" text-anchor="end">%s</text>`+"\n", x-4, y+3, label)
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}
