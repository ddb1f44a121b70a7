package report

import (
	"encoding/json"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// Target is one figure the performance targets ask for, with its limit and whether this
// run met it. Every target is reported, met or not. Floor and AA give the
// same figure for the floor relay and for direct against direct (the noise
// floor), for context.
type Target struct {
	Name     string `json:"name"`
	Where    string `json:"where"`
	Measured string `json:"measured"`
	Floor    string `json:"floor,omitempty"`
	Peer     string `json:"peer,omitempty"` // the same figure for the peer proxy, when the run had one
	AA       string `json:"aa,omitempty"`
	Limit    string `json:"limit"`
	Result   string `json:"result"` // met, NOT met, reported
	// Inconclusive says why the result may be noise: the measured figure
	// is closer to the limit than the A/A row's largest departure from
	// direct. Empty when the run was quiet enough to decide.
	Inconclusive string `json:"inconclusive,omitempty"`
}

// inconclusive compares how far measured is from limit with the A/A
// noise: the largest departure of an A/A pair from what identical targets
// must give (ideal: 1 for ratios, 0 for added latency). A measurement
// closer to its limit than that could fall either side in another run.
func inconclusive(measured, aa Spread, limit, ideal float64, unit string) string {
	if measured.N == 0 || aa.N == 0 {
		return ""
	}
	noise := math.Max(math.Abs(aa.Max-ideal), math.Abs(aa.Min-ideal))
	if math.Abs(measured.Median-limit) >= noise {
		return ""
	}
	if unit == "×" {
		return fmt.Sprintf("inconclusive: %.2f× from the limit, A/A departs up to %.2f×", math.Abs(measured.Median-limit), noise)
	}
	return fmt.Sprintf("inconclusive: %.0f%s from the limit, A/A departs up to %.0f%s", math.Abs(measured.Median-limit), unit, noise, unit)
}

func fmtLoad(l [3]float64) string { return fmt.Sprintf("%.2f / %.2f / %.2f", l[0], l[1], l[2]) }

func metStr(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

// The performance targets (bench/README.md, "Targets"). CPU, p50 latency
// and peak RSS are held to the floor relay measured in the same run: what
// an extra hop costs on the machine at hand, which no proxy avoids.
const (
	targetThroughput        = 0.90 // produce and consume, proxy ÷ direct
	targetProduceCPUx       = 1.20 // proxy ÷ floor CPU per MB produced, dedup enforce
	targetConsumeCPUx       = 1.05 // proxy ÷ floor CPU per MB fetched
	targetIdemCPURatio      = 1.03 // enforce ÷ off CPU per MB, idempotent producers
	targetLegacyCPURatio    = 1.05 // the same, legacy producers
	targetAddedP50OverFloor = 10.0 // µs: proxy added p50 − floor added p50
	targetAddedP99          = 100.0
	targetRSSOverFloorMiB   = 8.0  // proxy − floor peak RSS under the produce rows
	targetIdleConnKiB       = 16.0 // RSS per idle client connection
)

// CPUOverFloor is a side's CPU per MB ÷ the floor's in the same row.
func CPUOverFloor(row Row, side string) float64 {
	return Ratio(row.Sides[side].CPUmsPerMB, row.Sides["floor"].CPUmsPerMB)
}

// peerStr formats the peer's figure with f, or "" when the row has no peer.
func peerStr(row Row, f func(Side) string) string {
	s, ok := row.Sides["peer"]
	if !ok {
		return ""
	}
	return f(s)
}

// FormatRatio formats a ratio's spread: its median, then min–max when
// there was more than one pair.
func FormatRatio(s Spread) string {
	if s.N == 0 {
		return "n/a"
	}
	if s.N == 1 {
		return fmt.Sprintf("%.2f×", s.Median)
	}
	return fmt.Sprintf("%.2f× (%.2f–%.2f)", s.Median, s.Min, s.Max)
}

func fmtUs(s Spread) string {
	if s.N == 0 {
		return "n/a"
	}
	if s.N == 1 {
		return fmt.Sprintf("%+.0f µs", s.Median)
	}
	return fmt.Sprintf("%+.0f µs (%+.0f…%+.0f)", s.Median, s.Min, s.Max)
}

func fmtMs(s Spread) string {
	if s.N == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.3f ms/MB (%.3f–%.3f)", s.Median, s.Min, s.Max)
}

// EvaluateTargets compares the run with the performance targets. Throughput
// ratios and added latencies are medians of per-pair figures; CPU per MB is
// the proxy's CPU over all its phases of the row ÷ their MB; peak RSS is
// the largest VmHWM of any batched proxy phase.
func EvaluateTargets(r *Report) []Target {
	var ts []Target
	var peak, floorPeak, peerPeak float64
	var peakWhere []string
	for _, row := range r.Rows {
		where := fmt.Sprintf("%s, %s, %s, %d pairs", row.Scenario, row.Upstream, SizeLabel(row.RecordSize), row.Pairs)
		px, fl := row.Sides["proxy"], row.Sides["floor"]
		cpuMs := func(s Side) string { return fmt.Sprintf("%.3f ms/MB", s.CPUmsPerMB) }
		switch row.Scenario {
		case "batched":
			ts = append(ts, Target{Name: "produce throughput proxy ÷ direct", Where: where, Measured: FormatRatio(row.Throughput["proxy"]),
				Floor: FormatRatio(row.Throughput["floor"]), Peer: fmtSpreadIf(row, "peer", row.Throughput), AA: FormatRatio(row.Throughput["A/A"]), Limit: "≥ 0.90×",
				Result:       metStr(row.Throughput["proxy"].N > 0 && row.Throughput["proxy"].Median >= targetThroughput),
				Inconclusive: inconclusive(row.Throughput["proxy"], row.Throughput["A/A"], targetThroughput, 1, "×")})
			t := Target{Name: "proxy CPU per MB produced ÷ the floor's", Where: where,
				Measured: fmt.Sprintf("%.2f× (%.3f ms/MB)", CPUOverFloor(row, "proxy"), px.CPUmsPerMB), Floor: cpuMs(fl),
				Peer: peerStr(row, func(s Side) string {
					return fmt.Sprintf("%.2f× (%.3f ms/MB)", CPUOverFloor(row, "peer"), s.CPUmsPerMB)
				}),
				Limit: "≤ 1.20× (dedup enforce)", Result: "reported"}
			if row.Dedup == "enforce" {
				t.Result = metStr(CPUOverFloor(row, "proxy") <= targetProduceCPUx)
			}
			ts = append(ts, t)
			peak, floorPeak = max(peak, px.PeakRSSMiB), max(floorPeak, fl.PeakRSSMiB)
			if pe, ok := row.Sides["peer"]; ok {
				peerPeak = max(peerPeak, pe.PeakRSSMiB)
			}
			peakWhere = append(peakWhere, SizeLabel(row.RecordSize))
		case "consume":
			ts = append(ts,
				Target{Name: "consume throughput proxy ÷ direct", Where: where, Measured: FormatRatio(row.Throughput["proxy"]),
					Floor: FormatRatio(row.Throughput["floor"]), Peer: fmtSpreadIf(row, "peer", row.Throughput), AA: FormatRatio(row.Throughput["A/A"]), Limit: "≥ 0.90×",
					Result:       metStr(row.Throughput["proxy"].N > 0 && row.Throughput["proxy"].Median >= targetThroughput),
					Inconclusive: inconclusive(row.Throughput["proxy"], row.Throughput["A/A"], targetThroughput, 1, "×")},
				Target{Name: "proxy CPU per MB fetched ÷ the floor's", Where: where,
					Measured: fmt.Sprintf("%.2f× (%.3f ms/MB)", CPUOverFloor(row, "proxy"), px.CPUmsPerMB), Floor: cpuMs(fl),
					Peer: peerStr(row, func(s Side) string {
						return fmt.Sprintf("%.2f× (%.3f ms/MB)", CPUOverFloor(row, "peer"), s.CPUmsPerMB)
					}),
					Limit:  "≤ 1.05×",
					Result: metStr(CPUOverFloor(row, "proxy") <= targetConsumeCPUx)})
		case "roundtrip":
			p50, p99 := row.AddedP50us["proxy"], row.AddedP99us["proxy"]
			over := p50.Median - row.AddedP50us["floor"].Median
			ts = append(ts,
				Target{Name: "added latency p50 over the floor's, 1 record per round trip", Where: where,
					Measured: fmt.Sprintf("%+.0f µs (proxy %s)", over, fmtUs(p50)), Floor: fmtUs(row.AddedP50us["floor"]),
					Peer: fmtUsIf(row, "peer", row.AddedP50us), AA: fmtUs(row.AddedP50us["A/A"]), Limit: "≤ +10 µs",
					Result:       metStr(p50.N > 0 && row.AddedP50us["floor"].N > 0 && over <= targetAddedP50OverFloor),
					Inconclusive: inconclusive(Spread{N: p50.N, Median: over}, row.AddedP50us["A/A"], targetAddedP50OverFloor, 0, " µs")},
				Target{Name: "added latency p99, 1 record per round trip", Where: where, Measured: fmtUs(p99),
					Floor: fmtUs(row.AddedP99us["floor"]), Peer: fmtUsIf(row, "peer", row.AddedP99us), AA: fmtUs(row.AddedP99us["A/A"]), Limit: "≤ 100 µs",
					Result:       metStr(p99.N > 0 && p99.Median <= targetAddedP99),
					Inconclusive: inconclusive(p99, row.AddedP99us["A/A"], targetAddedP99, 0, " µs")})
		case "dedupcost":
			prod, limit, lim := "idempotent", "≤ 1.03×", targetIdemCPURatio
			if !row.Idempotent {
				prod, limit, lim = "legacy", "≤ 1.05×", targetLegacyCPURatio
			}
			c := row.CPURatio["enforce"]
			ts = append(ts, Target{Name: "proxy CPU per MB, dedup enforce ÷ off, " + prod + " producers", Where: where,
				Measured: FormatRatio(c) + fmt.Sprintf("; %.3f ÷ %.3f ms/MB overall", row.Sides["enforce"].CPUmsPerMB, row.Sides["off"].CPUmsPerMB),
				AA:       FormatRatio(row.CPURatio["A/A"]), Limit: limit, Result: metStr(c.N > 0 && c.Median <= lim),
				Inconclusive: inconclusive(c, row.CPURatio["A/A"], lim, 1, "×")})
		}
	}
	if len(peakWhere) > 0 {
		t := Target{Name: "proxy peak RSS under produce, over the floor's", Where: "batched " + strings.Join(peakWhere, ", "),
			Measured: fmt.Sprintf("%+.1f MiB (%.1f MiB)", peak-floorPeak, peak), Floor: fmt.Sprintf("%.1f MiB", floorPeak),
			Limit: "≤ +8 MiB", Result: metStr(peak-floorPeak <= targetRSSOverFloorMiB)}
		if peerPeak > 0 {
			t.Peer = fmt.Sprintf("%+.1f MiB (%.1f MiB)", peerPeak-floorPeak, peerPeak)
		}
		ts = append(ts, t)
	}
	if m := r.Memory; m != nil {
		ts = append(ts, Target{Name: "proxy RSS growth per tracked (producer, partition)",
			Where:    fmt.Sprintf("sink, %d producers × %d partitions, %.0f entries", m.Producers, m.Partitions, m.Entries),
			Measured: fmt.Sprintf("%.0f B/entry RSS (%.0f B/entry Go heap in use)", m.RSSPerEntry, m.HeapPerEntry), Limit: "report", Result: "reported"})
	}
	if m := r.Idle; m != nil {
		px, fl := m.Sides["proxy"], m.Sides["floor"]
		t := Target{Name: "proxy RSS per idle client connection", Where: fmt.Sprintf("sink, %d connections, one ApiVersions each", m.Conns),
			Measured: fmt.Sprintf("%.1f KiB", px.PerConnKiB), Floor: fmt.Sprintf("%.1f KiB", fl.PerConnKiB), Limit: "≤ 16 KiB",
			Result: metStr(px.PerConnKiB <= targetIdleConnKiB)}
		if pe, ok := m.Sides["peer"]; ok {
			t.Peer = fmt.Sprintf("%.1f KiB", pe.PerConnKiB)
		}
		ts = append(ts, t)
	}
	return ts
}

// fmtSpreadIf formats m[side] as a ratio when the row has that side.
func fmtSpreadIf(row Row, side string, m map[string]Spread) string {
	if _, ok := row.Sides[side]; !ok {
		return ""
	}
	return FormatRatio(m[side])
}

// fmtUsIf formats m[side] as an added latency when the row has that side.
func fmtUsIf(row Row, side string, m map[string]Spread) string {
	if _, ok := row.Sides[side]; !ok {
		return ""
	}
	return fmtUs(m[side])
}

// SizeLabel is a record size as the report names it (100 B, 1 KiB).
func SizeLabel(n int) string {
	switch {
	case n >= 1024 && n%1024 == 0:
		return fmt.Sprintf("%d KiB", n/1024)
	default:
		return fmt.Sprintf("%d B", n)
	}
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

func stalled(row Row) string {
	var parts []string
	for _, t := range row.Targets {
		parts = append(parts, fmt.Sprint(row.Sides[t].Stalled))
	}
	return strings.Join(parts, " · ")
}

func ackedSent(row Row) string {
	var parts []string
	for _, t := range row.Targets {
		s := row.Sides[t]
		parts = append(parts, fmt.Sprintf("%d/%d", s.Acked, s.Sent))
	}
	return strings.Join(parts, " · ")
}

// WriteMarkdown writes the whole report as markdown tables.
func WriteMarkdown(w io.Writer, r *Report) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	c := r.Config
	p("# dedupproxy benchmark: direct, A/A, floor relay, proxy\n\n")
	p("Machine: %d CPUs, %s, %s, %s, %s RAM. Started %s, took %s.\n\n",
		r.Machine.NumCPU, r.Machine.CPUModel, r.Machine.GoVersion, r.Machine.Kernel, r.Machine.MemTotal,
		r.Started.UTC().Format("2006-01-02 15:04 MST"), r.Took)
	p("How quiet the machine was: load average %s at the start, %s at the end (1, 5 and 15 minutes, against %d CPUs).\n\n", fmtLoad(r.LoadStart), fmtLoad(r.LoadEnd), r.Machine.NumCPU)
	if r.Command != "" {
		p("Command: `%s`\n\n", r.Command)
	}
	p("Processes: the upstream, the floor relay, the proxy and each phase's load generator are separate OS processes on 127.0.0.1. "+
		"Produce rows: kfake with produce blackholed (acknowledged, not stored). Consume row: a kfake that keeps records, pre-filled with %d MB.\n\n", c.ConsumeMB)
	p("Load: %d kgo producers, %d topic(s) × %d partitions, linger %s, batch max %d B, buffer %d B per producer, acks=%s, idempotent=%t, proxy dedup=%s, retry rate %.3g. "+
		"Each row runs %d repetitions of one phase per target (each phase %s", c.Producers, c.Topics, c.Partitions, c.Linger, c.BatchBytes, c.BufferBytes,
		c.Acks, c.Idempotent, c.Dedup, c.RetryRate, c.Reps, c.Duration)
	if c.Records > 0 {
		p(" or %d records", c.Records)
	}
	p("), in order direct, A/A, floor, proxy on even repetitions and reversed on odd ones. A pair is a target's phase and the direct phase of the same repetition; " +
		"ratios are the median of the pairs, (min–max) in brackets. **A/A** is direct against direct: the noise floor. Any ratio closer to 1 than A/A's spread is noise.\n\n")

	peer := c.Peer != ""
	if peer {
		p("**Peer**: %s, another Kafka proxy, run as its own process in front of the same upstream and measured like the floor relay (bench/README.md, \"The peer\").\n\n", c.Peer)
		p("## Targets\n\n| target | where | proxy | floor relay | %s | A/A (noise) | limit | result |\n|---|---|---|---|---|---|---|---|\n", c.Peer)
	} else {
		p("## Targets\n\n| target | where | proxy | floor relay | A/A (noise) | limit | result |\n|---|---|---|---|---|---|---|\n")
	}
	for _, t := range r.Targets {
		res := "**" + t.Result + "**"
		if t.Inconclusive != "" {
			res += " (" + t.Inconclusive + ")"
		}
		if peer {
			p("| %s | %s | %s | %s | %s | %s | %s | %s |\n", t.Name, t.Where, t.Measured, t.Floor, t.Peer, t.AA, t.Limit, res)
		} else {
			p("| %s | %s | %s | %s | %s | %s | %s |\n", t.Name, t.Where, t.Measured, t.Floor, t.AA, t.Limit, res)
		}
	}

	p("\n## Throughput\n\nMB = 10⁶ bytes of record values acknowledged (produce) or read (consume), ÷ the phases' wall time. " +
		"CPU per MB and peak RSS (VmHWM, reset per phase) are the floor's and the proxy's own processes (/proc) over their timed phases: CPU from each thread's /proc schedstat (nanoseconds). " +
		"A stalled phase acknowledged no record before its deadline (the producers filled their buffers, then waited seconds): it happens to any target under heavy load from other jobs, and drags its pairs.\n\n")
	peerCol := ""
	if peer {
		peerCol = " · peer"
	}
	p("| scenario | upstream | record | pairs | direct MB/s | A/A ÷ direct | floor ÷ direct | proxy ÷ direct | floor CPU ms/MB | proxy CPU ms/MB | proxy CPU ms/MB per phase | floor / proxy peak RSS MiB | acked/sent D · A/A · F · P%s | stalled phases D · A/A · F · P%s |\n", peerCol, peerCol)
	p("|%s\n", strings.Repeat("---|", 14))
	for _, row := range r.Rows {
		if row.Scenario != "batched" && row.Scenario != "consume" {
			continue
		}
		d, f, x := row.Sides["direct"], row.Sides["floor"], row.Sides["proxy"]
		p("| %s | %s | %s | %d | %s | %s | %s | %s | %.3f | %.3f | %s | %.1f / %.1f | %s | %s |\n",
			row.Scenario, row.Upstream, SizeLabel(row.RecordSize), row.Pairs, fmtNum(d.MBPerSec),
			FormatRatio(row.Throughput["A/A"]), FormatRatio(row.Throughput["floor"]), FormatRatio(row.Throughput["proxy"]),
			f.CPUmsPerMB, x.CPUmsPerMB, fmtMs(row.CPUmsPerMB["proxy"]), f.PeakRSSMiB, x.PeakRSSMiB, ackedSent(row), stalled(row))
	}

	if peer {
		p("\n### %s beside the floor relay and the proxy\n\n", c.Peer)
		p("| scenario | record | peer ÷ direct | floor CPU ms/MB | proxy CPU ms/MB | peer CPU ms/MB | floor / proxy / peer peak RSS MiB | peer added p50 / p99 |\n|---|---|---|---|---|---|---|---|\n")
		for _, row := range r.Rows {
			pe, ok := row.Sides["peer"]
			if !ok {
				continue
			}
			lat := ""
			if row.Scenario == "roundtrip" {
				lat = fmtUs(row.AddedP50us["peer"]) + " / " + fmtUs(row.AddedP99us["peer"])
			}
			p("| %s | %s | %s | %.3f | %.3f | %.3f | %.1f / %.1f / %.1f | %s |\n", row.Scenario, SizeLabel(row.RecordSize), FormatRatio(row.Throughput["peer"]),
				row.Sides["floor"].CPUmsPerMB, row.Sides["proxy"].CPUmsPerMB, pe.CPUmsPerMB,
				row.Sides["floor"].PeakRSSMiB, row.Sides["proxy"].PeakRSSMiB, pe.PeakRSSMiB, lat)
		}
	}

	p("\n## Round-trip latency\n\nOne producer, one record per ProduceSync, acks=all, no linger; per pair, the target's p50 (p99) minus the direct phase's, median (min…max).\n\n")
	p("| upstream | record | pairs | direct p50 / p99 µs | A/A added p50 | A/A added p99 | floor added p50 | floor added p99 | proxy added p50 | proxy added p99 |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, row := range r.Rows {
		if row.Scenario != "roundtrip" {
			continue
		}
		d := row.Sides["direct"]
		p("| %s | %s | %d | %.0f / %.0f | %s | %s | %s | %s | %s | %s |\n", row.Upstream, SizeLabel(row.RecordSize), row.Pairs, d.P50us, d.P99us,
			fmtUs(row.AddedP50us["A/A"]), fmtUs(row.AddedP99us["A/A"]), fmtUs(row.AddedP50us["floor"]), fmtUs(row.AddedP99us["floor"]),
			fmtUs(row.AddedP50us["proxy"]), fmtUs(row.AddedP99us["proxy"]))
	}

	first := true
	for _, row := range r.Rows {
		if row.Scenario != "dedupcost" {
			continue
		}
		if first {
			p("\n## What deduplication costs\n\nTwo proxy processes in front of one upstream, `dedup: off` and `dedup: enforce`, the same batched load; " +
				"per pair, enforce ÷ off of the proxy's CPU per MB and of throughput; A/A is the off proxy measured twice per repetition. Legacy producers (idempotence off) write records that each carry a unique header: " +
				"the proxy deduplicates legacy batches by content (docs/legacy.md).\n\n")
			p("| producers | upstream | record | pairs | off MB/s | enforce ÷ off MB/s | off CPU ms/MB | enforce CPU ms/MB | enforce ÷ off CPU per MB | A/A: off ÷ off CPU per MB | batches decided |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
			first = false
		}
		prod := "idempotent"
		if !row.Idempotent {
			prod = "legacy"
		}
		off, enf := row.Sides["off"], row.Sides["enforce"]
		p("| %s | %s | %s | %d | %s | %s | %.3f | %.3f | %s | %s | %.0f |\n", prod, row.Upstream, SizeLabel(row.RecordSize), row.Pairs,
			fmtNum(off.MBPerSec), FormatRatio(row.Throughput["enforce"]), off.CPUmsPerMB, enf.CPUmsPerMB, FormatRatio(row.CPURatio["enforce"]),
			FormatRatio(row.CPURatio["A/A"]), row.Decided)
	}

	first = true
	for _, row := range r.Rows {
		if row.Scenario != "lostack" {
			continue
		}
		if first {
			p("\n## Lost acknowledgements\n\nA correctness row, one pair: 1 KiB idempotent producers dial through a fault shim (in the load process) that drops %.3g of the Produce acknowledgements and cuts the connection; kgo retries. "+
				"Every record must be acknowledged exactly once; duplicates caught and in-flight waits are the proxy's `dedupproxy_batches_total{outcome}`.\n\n", c.LostAckRate)
			p("| upstream | direct acked/sent | direct acks dropped | proxy acked/sent | proxy acks dropped | duplicates caught | in-flight waits |\n|---|---|---|---|---|---|---|\n")
			first = false
		}
		d, x := row.Sides["direct"], row.Sides["proxy"]
		p("| %s | %d/%d | %d | %d/%d | %d | %.0f | %.0f |\n", row.Upstream, d.Acked, d.Sent, d.AcksDropped, x.Acked, x.Sent, x.AcksDropped, row.Duplicates, row.InFlightWaits)
	}
	if m := r.Memory; m != nil {
		p("\n## Memory per tracked (producer, partition)\n\n")
		p("%d idempotent kgo producers (in the bench process) × %d partitions through the proxy (dedup enforce) to the sink (its own process), 4 at a time, each closed when done. "+
			"RSS is the proxy's VmRSS; heap is its `go_memstats_heap_inuse_bytes`; entries is the growth of `dedupproxy_seqstate_entries` "+
			"(expected %d; %.0f at the end).\n\n", m.Producers, m.Partitions, m.ExpectedEntries, m.EntriesTotal)
		p("| entries added | RSS before MiB | RSS after MiB | RSS bytes/entry | Go heap in use bytes/entry |\n|---|---|---|---|---|\n")
		p("| %.0f | %.1f | %.1f | %.0f | %.0f |\n", m.Entries, m.RSSBeforeMiB, m.RSSAfterMiB, m.RSSPerEntry, m.HeapPerEntry)
	}
	if m := r.Idle; m != nil {
		p("\n## Memory per idle client connection\n\n")
		p("%d client connections (in the bench process) each send one ApiVersions (v3), read its answer and stay open, to the floor relay, then to the proxy (dedup enforce), then to the peer if the run has one, each in front of the sink; "+
			"each process's VmRSS growth ÷ connections, after %d connections came and went. The proxy holds an upstream connection per client connection; the kernel's socket memory is not in RSS.\n\n", m.Conns, IdleWarmConns)
		p("| process | RSS before MiB | RSS with the connections MiB | KiB per connection |\n|---|---|---|---|\n")
		for _, name := range []string{"floor", "proxy", "peer"} {
			if sd, ok := m.Sides[name]; ok {
				label := name
				if name == "peer" {
					label = c.Peer
				}
				p("| %s | %.1f | %.1f | %.1f |\n", label, sd.RSSBeforeMiB, sd.RSSAfterMiB, sd.PerConnKiB)
			}
		}
	}
}

// WriteResults writes results.md, results.svg and results.json into dir.
func WriteResults(dir string, r *Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var md strings.Builder
	WriteMarkdown(&md, r)
	md.WriteString("\n![direct, A/A, floor, proxy](results.svg)\n")
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(md.String()), 0o644); err != nil {
		return err
	}
	var svg strings.Builder
	writeSVG(&svg, r)
	if err := os.WriteFile(filepath.Join(dir, "results.svg"), []byte(svg.String()), 0o644); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "results.json"), append(b, '\n'), 0o644)
}

// SVG chart, hand-rolled: throughput ÷ direct per row (median of pairs,
// whiskers min–max) for A/A, floor and proxy, and the added round-trip
// latency of each.

const (
	colAA    = "#9d9d9d"
	colFloor = "#4c78a8"
	colProxy = "#f58518"
)

type svgBar struct {
	value  float64
	lo, hi float64 // whisker; both 0 for none
	color  string
	note   string // drawn above the bar
}

type svgGroup struct {
	label string
	bars  []svgBar
}

const colPeer = "#54a24b"

type chartTarget struct{ name, label, color string }

// chartTargetsOf lists the targets the chart shows: A/A, floor, proxy, and
// the peer when the run had one.
func chartTargetsOf(r *Report) []chartTarget {
	ts := []chartTarget{{"A/A", "A/A", colAA}, {"floor", "floor relay", colFloor}, {"proxy", "dedupproxy", colProxy}}
	if r.Config.Peer != "" {
		ts = append(ts, chartTarget{"peer", r.Config.Peer, colPeer})
	}
	return ts
}

func writeSVG(w io.Writer, r *Report) {
	chartTargets := chartTargetsOf(r)
	var tput, lat, cpu []svgGroup
	for _, row := range r.Rows {
		switch row.Scenario {
		case "batched", "consume":
			g := svgGroup{label: row.Scenario + "|" + SizeLabel(row.RecordSize)}
			for _, t := range chartTargets {
				s := row.Throughput[t.name]
				g.bars = append(g.bars, svgBar{value: s.Median, lo: s.Min, hi: s.Max, color: t.color, note: fmt.Sprintf("%.2f", s.Median)})
			}
			tput = append(tput, g)
			cg := svgGroup{label: row.Scenario + "|" + SizeLabel(row.RecordSize)}
			for _, t := range chartTargets[1:] { // A/A is direct: no process of its own
				if s, ok := row.Sides[t.name]; ok {
					cg.bars = append(cg.bars, svgBar{value: s.CPUmsPerMB, color: t.color, note: fmt.Sprintf("%.2f", s.CPUmsPerMB)})
				}
			}
			cpu = append(cpu, cg)
		case "roundtrip":
			for _, q := range []struct {
				name string
				m    map[string]Spread
			}{{"p50", row.AddedP50us}, {"p99", row.AddedP99us}} {
				g := svgGroup{label: "1 rec/RTT " + SizeLabel(row.RecordSize) + "|" + q.name}
				for _, t := range chartTargets {
					s := q.m[t.name]
					g.bars = append(g.bars, svgBar{value: math.Max(s.Median, 0), lo: math.Max(s.Min, 0), hi: math.Max(s.Max, 0),
						color: t.color, note: fmt.Sprintf("%+.0f", s.Median)})
				}
				lat = append(lat, g)
			}
		}
	}
	const width, height = 1400, 400
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(w, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(w, `<text x="20" y="24" font-size="16" font-weight="bold">dedupproxy: each target vs direct, median of %d pairs, whiskers min–max (%d CPUs, %s)</text>`+"\n",
		r.Config.Reps, r.Machine.NumCPU, html.EscapeString(r.Machine.CPUModel))
	x := 20
	for _, t := range chartTargets {
		fmt.Fprintf(w, `<rect x="%d" y="36" width="12" height="12" fill="%s"/><text x="%d" y="46">%s</text>`, x, t.color, x+18, html.EscapeString(t.label))
		x += 40 + 7*len(t.label)
	}
	fmt.Fprintln(w)
	svgPanel(w, 60, 90, 480, 250, "throughput ÷ direct (dashed: proxy target 0.90)", tput, false, targetThroughput)
	svgPanel(w, 600, 90, 420, 250, "CPU ms per MB (log scale)", cpu, true, 0)
	svgPanel(w, 1080, 90, 300, 250, "added round-trip latency, µs", lat, false, 0)
	fmt.Fprintln(w, "</svg>")
}

// svgPanel draws grouped bars in the box (x, y, w, h) with a linear axis
// from 0, or a log axis over whole decades, and a dashed line at ref when
// it is above 0. A group label "a|b" puts b
// under the group and a once under each run of groups sharing it.
func svgPanel(w io.Writer, x, y, wd, ht int, title string, groups []svgGroup, logScale bool, ref float64) {
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
		// Scaled to the medians, not the whiskers: one wild pair would
		// flatten every bar. A whisker past the top ends in an arrow.
		top := niceCeil(math.Max(hi*1.25, ref))
		scale = func(v float64) float64 { return v / top * float64(ht) }
		for i := 0; i <= 4; i++ {
			v := top * float64(i) / 4
			svgTick(w, x, y+ht-int(scale(v)), wd, fmtNum(v))
		}
	}
	if ref > 0 {
		ry := float64(y+ht) - scale(ref)
		fmt.Fprintf(w, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#d62728" stroke-dasharray="6,4"/>`+"\n", x, ry, x+wd, ry)
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
			if b.hi > b.lo {
				wx := bx + barW/2 - 0.5
				whi, wlo := math.Min(scale(b.hi), float64(ht)), math.Max(scale(b.lo), 0)
				fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n",
					wx, float64(y+ht)-whi, wx, float64(y+ht)-wlo)
				if scale(b.hi) > float64(ht) {
					fmt.Fprintf(w, `<path d="M%.1f %d l-4 6 h8 z" fill="black"><title>max %s</title></path>`+"\n", wx, y, fmtNum(b.hi))
				}
			}
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
