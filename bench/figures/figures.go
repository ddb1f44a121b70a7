// Package figures derives what the documents state from the committed
// bench results (bench/results): the cost figures the docs quote, held to
// the results by TestDocFigures, which also writes docs/operations.md's
// sizing block and README.md's "What it costs"; and the replica simulation
// (go run ./bench replicas, docs/replicas.md), which scales the measured
// figures to a cluster of many brokers. It measures nothing.
package figures

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/dedupproxy/dedupproxy/bench/report"
)

// figures are the numbers the docs state about what the proxy costs, each
// from one source: the committed bench run (bench/results/results.json),
// its micro-benchmarks (micro.md), the TLS run (tls.md), the replica
// simulation fed with them (replicas.md), the proxy's defaults and the
// Kubernetes example's CPU request. The sizing block of docs/operations.md
// is written from them, and TestDocFigures fails when a doc states another
// value.
type figures struct {
	EntryRSS   float64            // bytes of RSS per tracked (producer, partition): the memory scenario
	EntryTable float64            // bytes per entry of the table alone (BenchmarkTableMemory, 5 retained)
	Record     float64            // bytes per legacy record of a closed connection, indexed (decide's BenchmarkLegacyMemory)
	LiveRecord float64            // bytes per legacy record while its connection is open: liveRecordBytes
	DecideNs   float64            // one legacy decision, a request of four 10-record batches (BenchmarkDecideLegacy)
	WarmMs     map[string]float64 // reading and applying a partition's tail, by tail (BenchmarkWarmPartition: 1MiB, 4MiB)
	Key        float64            // bytes per idempotency key: keyBytes
	CPU        map[int]float64    // proxy (dedup enforce) CPU ms per MB produced, by record size
	FloorCPU   map[int]float64    // the floor relay's, same rows
	EnforceOff map[bool]float64   // proxy CPU per MB, dedup enforce ÷ off, by idempotent
	AllCPU     []float64          // every CPU ms per MB of the run (produce, consume, every target)
	TLSCPU     float64            // proxy CPU ms per MB, TLS on both legs (tls.md)
	PlainCPU   float64            // the same run, plaintext
	TLSRatio   float64            // TLS ÷ plaintext CPU per MB, as tls.md gives it

	MaxEntries, MaxRecords, MaxKeys int // the proxy's defaults
	CPURequest                      int // millicores the Kubernetes example requests
}

// liveRecordBytes is what a legacy record takes while its connection is
// open: decide's record slot, its hash and its offset. It is the slot's
// size, not a measurement.
const liveRecordBytes = 16

// keyBytes is what one remembered idempotency key takes: seqstate's key
// slot (a 128-bit hash, its expiry and offset), as KeyConfig.MaxKeys
// states. No benchmark in bench/results measures it yet.
const keyBytes = 40

// Defaults of the tables (proxy.Config.EnsureDefaults), the multipliers
// of the full-table figures. bench does not import the proxy; TestDocFigures
// checks these against it.
const (
	defaultMaxEntries = 262144
	defaultMaxRecords = 1 << 20
	defaultMaxKeys    = 1 << 20
)

var (
	microValueRE = regexp.MustCompile(`\| ([0-9.]+) ± [0-9.]+% \(n=\d+/\d+\) (B/entry|B/record) \|`)
	tlsRowRE     = regexp.MustCompile(`(?m)^\| (plaintext|TLS) \| [0-9.]+ \| \d+ \| ([0-9.]+) ms \|$`)
	tlsRatioRE   = regexp.MustCompile(`(?m)^\| TLS ÷ plaintext \| [0-9.]+× \| \| ([0-9.]+)× \|$`)
	cpuRequestRE = regexp.MustCompile(`(?m)^\s+cpu: (\d+)m$`)
)

// loadFigures reads the figures from the repository at root.
func loadFigures(root string) (figures, error) {
	f := figures{CPU: map[int]float64{}, FloorCPU: map[int]float64{}, EnforceOff: map[bool]float64{}, Key: keyBytes,
		LiveRecord: liveRecordBytes, WarmMs: map[string]float64{},
		MaxEntries: defaultMaxEntries, MaxRecords: defaultMaxRecords, MaxKeys: defaultMaxKeys}
	raw, err := os.ReadFile(filepath.Join(root, "bench", "results", "results.json"))
	if err != nil {
		return f, err
	}
	var rep report.Report
	if err := json.Unmarshal(raw, &rep); err != nil {
		return f, fmt.Errorf("results.json: %w", err)
	}
	if rep.Memory == nil {
		return f, fmt.Errorf("results.json has no memory scenario")
	}
	f.EntryRSS = rep.Memory.RSSPerEntry
	for _, row := range rep.Rows {
		if row.Scenario == "batched" && row.Dedup == "enforce" {
			f.CPU[row.RecordSize] = row.Sides["proxy"].CPUmsPerMB
			f.FloorCPU[row.RecordSize] = row.Sides["floor"].CPUmsPerMB
		}
		for _, side := range row.Sides {
			if side.CPUmsPerMB > 0 {
				f.AllCPU = append(f.AllCPU, side.CPUmsPerMB)
			}
		}
		if row.Scenario == "dedupcost" {
			f.EnforceOff[row.Idempotent] = row.CPURatio["enforce"].Median
		}
	}
	if f.CPU[1024] == 0 || f.EnforceOff[true] == 0 || f.EnforceOff[false] == 0 {
		return f, fmt.Errorf("results.json has no batched 1 KiB row, or no dedup-cost rows")
	}

	micro, err := os.ReadFile(filepath.Join(root, "bench", "results", "micro.md"))
	if err != nil {
		return f, err
	}
	for _, line := range strings.Split(string(micro), "\n") {
		if m := microRow.FindStringSubmatch(line); m != nil {
			ns, _ := strconv.ParseFloat(m[2], 64)
			switch name := m[1]; {
			case name == "DecideLegacy":
				f.DecideNs = ns
			case strings.HasPrefix(name, "WarmPartition/tail="):
				f.WarmMs[strings.TrimPrefix(name, "WarmPartition/tail=")] = ns / 1e6
			}
		}
		m := microValueRE.FindStringSubmatch(line)
		switch {
		case m == nil:
		case strings.HasPrefix(line, "| TableMemory/entries=1M/retained=5 "):
			f.EntryTable, _ = strconv.ParseFloat(m[1], 64)
		case strings.HasPrefix(line, "| LegacyMemory "):
			f.Record, _ = strconv.ParseFloat(m[1], 64)
		}
	}
	if f.EntryTable == 0 || f.Record == 0 || f.DecideNs == 0 || f.WarmMs["1MiB"] == 0 || f.WarmMs["4MiB"] == 0 {
		return f, fmt.Errorf("micro.md: no TableMemory retained=5, LegacyMemory, DecideLegacy or WarmPartition rows")
	}

	tlsMD, err := os.ReadFile(filepath.Join(root, "bench", "results", "tls.md"))
	if err != nil {
		return f, err
	}
	for _, m := range tlsRowRE.FindAllStringSubmatch(string(tlsMD), -1) {
		v, _ := strconv.ParseFloat(m[2], 64)
		if m[1] == "TLS" {
			f.TLSCPU = v
		} else {
			f.PlainCPU = v
		}
	}
	if m := tlsRatioRE.FindSubmatch(tlsMD); m != nil {
		f.TLSRatio, _ = strconv.ParseFloat(string(m[1]), 64)
	}
	if f.TLSCPU == 0 || f.PlainCPU == 0 || f.TLSRatio == 0 {
		return f, fmt.Errorf("tls.md: no plaintext, TLS and ratio rows")
	}

	k8s, err := os.ReadFile(filepath.Join(root, "deploy", "kubernetes", "dedupproxy.yaml"))
	if err != nil {
		return f, err
	}
	m := cpuRequestRE.FindSubmatch(k8s)
	if m == nil {
		return f, fmt.Errorf("deploy/kubernetes/dedupproxy.yaml: no cpu request")
	}
	f.CPURequest, _ = strconv.Atoi(string(m[1]))
	return f, nil
}

const mib = 1 << 20

// tablesMiB is what the producer and legacy tables take when full with
// the default bounds; keysMiB, the key table.
func (f figures) tablesMiB() float64 {
	return (float64(f.MaxEntries)*f.EntryRSS + float64(f.MaxRecords)*f.Record) / mib
}

func (f figures) keysMiB() float64 { return float64(f.MaxKeys) * f.Key / mib }

// coveredMBps is how many MB/s the CPU request covers at ms CPU per MB.
func (f figures) coveredMBps(ms float64) float64 { return float64(f.CPURequest) / ms }

// sig2 rounds to two significant digits: the precision a sizing figure
// deserves on a shared 2-core VM.
func sig2(x float64) float64 { return sig(x, 2) }

// sig rounds x to n significant digits.
func sig(x float64, n int) float64 {
	if x == 0 {
		return 0
	}
	p := math.Pow(10, math.Floor(math.Log10(math.Abs(x)))-float64(n-1))
	return math.Round(x/p) * p
}

// sizingBlock is the generated part of docs/operations.md's sizing
// section.
func (f figures) sizingBlock() string {
	var b strings.Builder
	ms := func(x float64) string { return strconv.FormatFloat(x, 'f', 2, 64) }
	fmt.Fprintf(&b, "| what | cost |\n|---|---|\n")
	fmt.Fprintf(&b, "| CPU, dedup enforced, 100 B / 1 KiB / 10 KiB records | %s / %s / %s ms of CPU per MB produced (the floor relay: %s / %s / %s ms) |\n",
		ms(f.CPU[100]), ms(f.CPU[1024]), ms(f.CPU[10240]), ms(f.FloorCPU[100]), ms(f.FloorCPU[1024]), ms(f.FloorCPU[10240]))
	fmt.Fprintf(&b, "| CPU, dedup enforce ÷ off | %.2f× (idempotent producers), %.2f× (legacy: the XXH3 of each record, docs/performance.md) |\n",
		f.EnforceOff[true], f.EnforceOff[false])
	fmt.Fprintf(&b, "| CPU, TLS on both legs, 1 KiB records | %s ms per MB against %s ms plaintext in the same run (%.2f×; `go run ./bench tls`, bench/results/tls.md) |\n",
		ms(f.TLSCPU), ms(f.PlainCPU), f.TLSRatio)
	fmt.Fprintf(&b, "| memory per tracked (producer, partition) | %.0f B RSS (the table itself: %.0f B), with 5 retained batches |\n", f.EntryRSS, f.EntryTable)
	fmt.Fprintf(&b, "| memory per legacy record remembered | %.0f B while its connection is open; %.0f B once the connection closed and the record waits, indexed, for a retry (for 100-record batches, the batch's own share included) |\n", f.LiveRecord, f.Record)
	fmt.Fprintf(&b, "| memory per idempotency key | %.0f B (the key table's slot; not measured by the bench) |\n", f.Key)
	fmt.Fprintf(&b, "\nWorked out: 100 MB/s of 1 KiB records takes about %s cores (%s with TLS); the Kubernetes\n",
		strconv.FormatFloat(sig(100*f.CPU[1024]/1000, 1), 'g', -1, 64), strconv.FormatFloat(sig(100*f.TLSCPU/1000, 1), 'g', -1, 64))
	fmt.Fprintf(&b, "example requests %dm, which covers about %.0f MB/s of 1 KiB records, or %.0f MB/s with TLS.\n",
		f.CPURequest, sig2(f.coveredMBps(f.CPU[1024])), sig2(f.coveredMBps(f.TLSCPU)))
	fmt.Fprintf(&b, "Full default tables take about %.0f MiB (%s × %.0f B + %s × %.0f B), %.0f MiB more\n",
		f.tablesMiB(), commas(f.MaxEntries), f.EntryRSS, commas(f.MaxRecords), f.Record, f.keysMiB())
	fmt.Fprintf(&b, "with idempotency keys (%s × %.0f B).\n", commas(f.MaxKeys), f.Key)
	return b.String()
}

// commas writes n as 262,144.
func commas(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// readCommittedRun reads the committed run, bench/results/results.json.
func readCommittedRun(root string) (*report.Report, error) {
	raw, err := os.ReadFile(filepath.Join(root, "bench", "results", "results.json"))
	if err != nil {
		return nil, err
	}
	var rep report.Report
	if err := json.Unmarshal(raw, &rep); err != nil {
		return nil, fmt.Errorf("results.json: %w", err)
	}
	return &rep, nil
}

// readmeBlock is the generated figures section of README.md: the
// headline figures of the committed run, the proxy's beside the floor
// relay's and, when the run had one, the peer's, and the chart.
func readmeBlock(rep *report.Report) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	peer := rep.Config.Peer
	row := func(scenario string, size int) (report.Row, bool) {
		for _, r := range rep.Rows {
			if r.Scenario == scenario && (size == 0 || r.RecordSize == size) {
				return r, true
			}
		}
		return report.Row{}, false
	}
	quiet := "load average not recorded"
	if rep.LoadStart != [3]float64{} {
		quiet = fmt.Sprintf("load average %.2f at the start and %.2f at the end (its own processes included)", rep.LoadStart[0], rep.LoadEnd[0])
	}
	p("From `go run ./bench` (bench/README.md) started %s on %d CPUs (%s), %s; "+
		"every figure is measured in the same run against the same upstream, each process on its own.",
		rep.Started.UTC().Format("2006-01-02 15:04 MST"), rep.Machine.NumCPU, rep.Machine.CPUModel, quiet)
	if peer != "" {
		p(" The peer is %s, built from its source (bench/README.md, \"The peer\").", peer)
	}
	p("\n\n")
	if peer != "" {
		p("| | dedupproxy | floor relay (the least a proxy costs here) | %s |\n|---|---|---|---|\n", peer)
	} else {
		p("| | dedupproxy | floor relay (the least a proxy costs here) |\n|---|---|---|\n")
	}
	line := func(what string, cell func(side string) string) {
		p("| %s | %s | %s |", what, cell("proxy"), cell("floor"))
		if peer != "" {
			p(" %s |", cell("peer"))
		}
		p("\n")
	}
	ms := func(r report.Row) func(string) string {
		return func(side string) string {
			s, ok := r.Sides[side]
			if !ok || s.CPUmsPerMB == 0 {
				return "n/a"
			}
			if side == "floor" {
				return fmt.Sprintf("%.2f ms", s.CPUmsPerMB)
			}
			return fmt.Sprintf("%.2f ms (%.2f× the relay)", s.CPUmsPerMB, report.CPUOverFloor(r, side))
		}
	}
	if r, ok := row("batched", 1024); ok {
		line("CPU per MB produced, 1 KiB records, dedup enforced", ms(r))
		line("produce throughput ÷ direct, 1 KiB records", func(side string) string {
			if _, ok := r.Sides[side]; !ok {
				return "n/a"
			}
			return report.FormatRatio(r.Throughput[side])
		})
	}
	if r, ok := row("consume", 0); ok {
		line("CPU per MB fetched", ms(r))
	}
	if r, ok := row("roundtrip", 0); ok {
		line("added round-trip latency, p50", func(side string) string {
			if s := r.AddedP50us[side]; s.N > 0 {
				return fmt.Sprintf("%+.0f µs", s.Median)
			}
			return "n/a"
		})
	}
	var peak = map[string]float64{}
	for _, r := range rep.Rows {
		if r.Scenario == "batched" {
			for side, s := range r.Sides {
				peak[side] = max(peak[side], s.PeakRSSMiB)
			}
		}
	}
	if len(peak) > 0 {
		line("peak RSS under the produce rows", func(side string) string {
			if v, ok := peak[side]; ok && v > 0 {
				return fmt.Sprintf("%.1f MiB", v)
			}
			return "n/a"
		})
	}
	if m := rep.Idle; m != nil {
		line(fmt.Sprintf("memory per idle client connection (%d open)", m.Conns), func(side string) string {
			if s, ok := m.Sides[side]; ok {
				return fmt.Sprintf("%.1f KiB", s.PerConnKiB)
			}
			return "n/a"
		})
	}
	var idem, legacy string
	for _, r := range rep.Rows {
		if r.Scenario == "dedupcost" {
			if r.Idempotent {
				idem = report.FormatRatio(r.CPURatio["enforce"])
			} else {
				legacy = report.FormatRatio(r.CPURatio["enforce"])
			}
		}
	}
	if idem != "" {
		p("\nWhat deduplication itself costs, CPU per MB with `dedup.mode: enforce` ÷ `off`: %s for idempotent producers, %s for legacy ones.\n", idem, legacy)
	}
	p("\nTargets, every figure and how each was measured: [bench/results/results.md](bench/results/results.md); where the CPU goes: [docs/performance.md](docs/performance.md).\n\n")
	p("![throughput, CPU per MB and added latency of the floor relay, dedupproxy")
	if peer != "" {
		p(" and %s", peer)
	}
	p(", against direct](bench/results/results.svg)\n")
	return b.String()
}
