package figures

import (
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dedupproxy/dedupproxy/internal/doccheck"
	"github.com/dedupproxy/dedupproxy/proxy"
)

var updateDocs = flag.Bool("update-docs", false, "rewrite docs/operations.md's sizing block and README.md's figures from bench/results")

// The sizing block of docs/operations.md lies between these lines.
const (
	figuresStart = "<!-- figures:start (written by go test ./bench/figures -run TestDocFigures -args -update-docs, from bench/results) -->"
	figuresEnd   = "<!-- figures:end -->"
	// README.md's figures section lies between these.
	readmeStart = "<!-- bench-figures:start (written by go test ./bench/figures -run TestDocFigures -args -update-docs, from bench/results) -->"
	readmeEnd   = "<!-- bench-figures:end -->"
)

// checkBlock holds the generated block of the document at path, between
// start and end, to want (rewriting it under -update-docs).
func checkBlock(t *testing.T, path, start, end, want string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := string(raw)
	i, j := strings.Index(s, start), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatalf("%s has no %q ... %q block", path, start, end)
	}
	want = start + "\n" + want + end
	if got := s[i : j+len(end)]; got != want {
		if *updateDocs {
			if err := os.WriteFile(path, []byte(s[:i]+want+s[j+len(end):]), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("rewrote the generated block of %s", path)
		} else {
			t.Errorf("%s's generated block is not the one bench/results gives (go test ./bench/figures -run TestDocFigures -args -update-docs):\n%s", path, want)
		}
	}
}

// docFiles are the documents whose figures TestDocFigures checks, relative
// to the repository root. docs/performance.md is left out on purpose: it
// records how the figures were reached, run after run, with the figures of
// each.
func docFiles(t *testing.T, root string) []string {
	t.Helper()
	files := []string{"README.md", "config.example.yaml"}
	for _, glob := range []string{"docs/*.md", "deploy/systemd/*", "deploy/kubernetes/*.yaml"} {
		m, err := filepath.Glob(filepath.Join(root, glob))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range m {
			rel, _ := filepath.Rel(root, p)
			if rel != filepath.Join("docs", "performance.md") {
				files = append(files, rel)
			}
		}
	}
	return files
}

// claim is a kind of figure a document may state: in a unit whose text
// matches context, every number that number finds must be one of allowed.
type claim struct {
	what    string
	group   string // claims of one group share their allowed values in a unit that matches several
	context *regexp.Regexp
	number  *regexp.Regexp
	allowed []float64
	exact   bool // compare at the precision written (else also to one decimal)
}

func (f figures) claims(sim measured) []claim {
	bytesRE := regexp.MustCompile(`(?:^|[^\d.,/])(\d[\d,]*(?:\.\d+)?) ?(?:B|bytes)\b(?:[^/]|$)`)
	cpu := append([]float64{f.TLSCPU, f.PlainCPU}, f.AllCPU...)
	wave := simulate(defaultReplicaModel(), sim, 3)
	return []claim{
		{what: "one legacy decision (BenchmarkDecideLegacy)", number: regexp.MustCompile(`(\d+(?:\.\d+)?) µs`),
			context: regexp.MustCompile(`10-record batches|BenchmarkDecideLegacy`),
			allowed: []float64{f.DecideNs / 1000}},
		{what: "reading a partition's tail (BenchmarkWarmPartition, and the replica simulation's first batch)",
			number:  regexp.MustCompile(`(\d+(?:\.\d+)?) ms\b`),
			context: regexp.MustCompile(`(?i)Mi?B tail|ms plus|idle broker`),
			allowed: []float64{f.WarmMs["1MiB"], f.WarmMs["4MiB"], sim.WarmFixedMs, sim.WarmMsPerMB, wave.FirstBatchWaitMs}},
		{what: "the CPU of 1 GB/s", number: regexp.MustCompile(`(\d+(?:\.\d+)?)\s+cores`),
			context: regexp.MustCompile(`GB/s of 1 KiB records`),
			allowed: []float64{1000 * f.CPU[1024] / 1000}},
		{what: "memory per tracked (producer, partition)", number: bytesRE, group: "bytes",
			context: regexp.MustCompile(`(?i)\(producer, partition\)|per entry|B/entry|max_entries|entries remembered`),
			allowed: []float64{math.Round(f.EntryRSS), math.Round(f.EntryTable)}},
		{what: "memory per remembered legacy record", number: bytesRE, group: "bytes",
			context: regexp.MustCompile(`(?i)legacy record|remembered record|max_records|B/record|records remembered`),
			allowed: []float64{math.Round(f.Record), f.LiveRecord}},
		{what: "memory per idempotency key", number: bytesRE, group: "bytes",
			context: regexp.MustCompile(`(?i)max_keys|per (idempotency )?key\b|keys remembered`),
			allowed: []float64{f.Key}},
		{what: "full default tables", number: regexp.MustCompile(`(\d+(?:\.\d+)?) MiB`),
			context: regexp.MustCompile(`(?i)tables.*(full|take)|(full|take).*tables`),
			allowed: []float64{math.Round(f.tablesMiB()), math.Round(f.keysMiB())}},
		{what: "CPU per MB", number: regexp.MustCompile(`(\d+\.\d+)(?:–\d+\.\d+)? ms\b`),
			context: regexp.MustCompile(`(?i)cpu.*per MB|per MB.*cpu|ms of CPU`),
			allowed: cpu},
		{what: "MB/s a CPU request covers", number: regexp.MustCompile(`(\d+) MB/s`),
			context: regexp.MustCompile(`\b\d+m\b.*(covers|about)|requests \d+m`),
			allowed: []float64{sig2(f.coveredMBps(f.CPU[1024])), sig2(f.coveredMBps(f.TLSCPU))}, exact: true},
	}
}

// TestDocFigures: every figure of what the proxy costs that a document
// states (memory per entry, per legacy batch and per key, full tables, CPU
// per MB, what the Kubernetes CPU request covers) is the one bench/results
// holds, and docs/operations.md's sizing block is the one written from
// them. After a new bench run, -update-docs rewrites the block; the other
// statements are then fixed by hand where the test names them.
func TestDocFigures(t *testing.T) {
	root := filepath.Join("..", "..")
	f, err := loadFigures(root)
	if err != nil {
		t.Fatal(err)
	}
	var def proxy.Config
	def.EnsureDefaults()
	if def.Dedup.MaxEntries != f.MaxEntries || def.Dedup.Legacy.MaxRecords != f.MaxRecords || def.Dedup.Keys.MaxKeys != f.MaxKeys {
		t.Errorf("bench's table defaults %d/%d/%d differ from the proxy's %d/%d/%d", f.MaxEntries, f.MaxRecords, f.MaxKeys,
			def.Dedup.MaxEntries, def.Dedup.Legacy.MaxRecords, def.Dedup.Keys.MaxKeys)
	}

	checkBlock(t, filepath.Join(root, "docs", "operations.md"), figuresStart, figuresEnd, f.sizingBlock())
	rep, err := readCommittedRun(root)
	if err != nil {
		t.Fatal(err)
	}
	checkBlock(t, filepath.Join(root, "README.md"), readmeStart, readmeEnd, readmeBlock(rep))

	sim, err := readMeasured(filepath.Join(root, "bench", "results"))
	if err != nil {
		t.Fatal(err)
	}
	claims := f.claims(sim)
	for _, name := range docFiles(t, root) {
		raw, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		yamlLike := !strings.HasSuffix(name, ".md")
		start, end := figuresStart, figuresEnd
		if name == "README.md" {
			start, end = readmeStart, readmeEnd
		}
		for _, u := range doccheck.Units(string(raw), yamlLike, start, end) {
			text := u.Text
			if u.Key != "" {
				text += " [" + u.Key + "]" // the key a YAML comment documents
			}
			checked := map[string]bool{}
			for _, c := range claims {
				if !c.context.MatchString(text) || checked[c.group] && c.group != "" {
					continue
				}
				// A unit stating several figures of one group (the
				// bytes of an entry and of a legacy batch) may state any.
				for _, o := range claims {
					if o.group != "" && o.group == c.group && o.what != c.what && o.context.MatchString(text) {
						c.allowed = append(slices.Clip(c.allowed), o.allowed...)
						c.what += " or " + o.what
					}
				}
				checked[c.group] = true
				for _, m := range c.number.FindAllStringSubmatch(u.Text, -1) {
					v, err := strconv.ParseFloat(strings.ReplaceAll(m[1], ",", ""), 64)
					if err != nil || c.ok(v, m[1]) {
						continue
					}
					t.Errorf("%s:%d states %s for %s; bench/results gives %s:\n\t%s", name, u.Line, m[1], c.what, c.allowedText(), text)
				}
			}
		}
	}
}

// ok reports whether v, written as text, is an allowed value at the
// precision it is written with.
func (c claim) ok(v float64, text string) bool {
	decimals := 0
	if i := strings.IndexByte(text, '.'); i >= 0 {
		decimals = len(text) - i - 1
	}
	for _, a := range c.allowed {
		if c.exact {
			if v == a {
				return true
			}
			continue
		}
		p := math.Pow(10, float64(decimals))
		if math.Round(a*p)/p == v {
			return true
		}
	}
	// Byte counts of other quantities (multipliers such as 262,144)
	// are not per-entry figures.
	return v >= 1000 && !c.exact && !strings.Contains(text, ".")
}

func (c claim) allowedText() string {
	var parts []string
	for _, a := range c.allowed {
		parts = append(parts, strconv.FormatFloat(a, 'g', 3, 64))
	}
	slices.Sort(parts)
	return strings.Join(slices.Compact(parts), " or ")
}

// TestSig pins the rounding of the sizing figures.
func TestSig(t *testing.T) {
	for _, tc := range []struct {
		in   float64
		n    int
		want float64
	}{{572.1, 2, 570}, {128.2, 2, 130}, {0.0437, 2, 0.044}, {0.0437, 1, 0.04}, {0.195, 1, 0.2}, {61.95, 2, 62}} {
		if got := sig(tc.in, tc.n); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("sig(%v, %d) = %v, want %v", tc.in, tc.n, got, tc.want)
		}
	}
}

// TestReplicaFiguresCurrent: bench/results/replicas.md is what go run
// ./bench replicas writes from the committed results, and the figures
// docs/replicas.md ("At 100 brokers") quotes from the simulation are its
// own: the table's rows and the smaller warm-up's read and duration.
func TestReplicaFiguresCurrent(t *testing.T) {
	var out strings.Builder
	if err := ReplicasMain(t.Context(), []string{"-results", filepath.Join("..", "results")}, &out, nil); err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile(filepath.Join("..", "results", "replicas.md"))
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != string(committed) {
		t.Errorf("bench/results/replicas.md is not what the committed results give: go run ./bench replicas -out bench/results/replicas.md")
	}

	in, err := readMeasured(filepath.Join("..", "results"))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join("..", "..", "docs", "replicas.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	row := regexp.MustCompile(`(?m)^\| (\d+) \| ([\d.]+ [MG]B) \| ([\d.]+ [MG]B) \| ([\d.]+ [MG]B) \| ([\d.]+) cores \| ([\d.]+) GB \| ([\d.]+) s \|$`)
	rows := row.FindAllStringSubmatch(doc, -1)
	if len(rows) == 0 {
		t.Fatal("docs/replicas.md: no rows of the simulation's table")
	}
	m := defaultReplicaModel()
	for _, r := range rows {
		n, _ := strconv.Atoi(r[1])
		f := simulate(m, in, n)
		want := []string{mb(f.EntriesMB), mb(f.LegacyMB), mb(f.ConnMB), fmt.Sprintf("%.2f", f.Cores), fmt.Sprintf("%.0f", f.WarmGB), fmt.Sprintf("%.0f", f.WarmSeconds)}
		if got := r[2:]; !slices.Equal(got, want) {
			t.Errorf("docs/replicas.md, %d replicas: %q; the simulation gives %q", n, got, want)
		}
	}
	small := m
	small.WarmMaxBytes, small.Window = 256<<10, 30*time.Second
	f := simulate(small, in, 3)
	flat := strings.Join(strings.Fields(doc), " ")
	claim := regexp.MustCompile(`with 256 KiB and 30 s, three replicas read (\d+) GB per restart, in (\d+) s`).FindStringSubmatch(flat)
	if want := []string{fmt.Sprintf("%.0f", f.WarmGB), fmt.Sprintf("%.0f", f.WarmSeconds)}; claim == nil || !slices.Equal(claim[1:], want) {
		t.Errorf("docs/replicas.md: the smaller warm-up reads %v; the simulation gives %v GB in %v s", claim, want[0], want[1])
	}
}
