// Package micro is `go run ./bench micro`: the hot-path Go benchmarks of
// the proxy's packages, run with repetitions and summarized (bench/README.md,
// "Micro-benchmarks").
package micro

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/dedupproxy/dedupproxy/bench/proc"
)

// Main runs the hot-path Go benchmarks with repetitions and prints a
// benchstat-style summary. golang.org/x/perf's benchstat cannot be a
// dependency here, so the summary follows its classic form: per benchmark
// and unit, the mean after discarding outliers (Tukey's fences, 1.5×IQR)
// ± the largest deviation of a kept sample from that mean.
func Main(ctx context.Context, args []string, stdout io.Writer, log *slog.Logger) error {
	fs := flag.NewFlagSet("bench micro", flag.ContinueOnError)
	count := fs.Int("count", 5, "repetitions of each benchmark (go test -count)")
	benchtime := fs.String("benchtime", "1s", "go test -benchtime")
	bench := fs.String("bench", ".", "go test -bench regexp")
	pkgs := fs.String("pkgs", "./protocol,./seqstate,./decide,./proxy", "packages, comma-separated")
	out := fs.String("out", "", "also write the summary (markdown) to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *count < 1 || *count > 100 {
		return fmt.Errorf("-count: want 1..100")
	}
	root, err := proc.ModuleRoot()
	if err != nil {
		return err
	}
	goArgs := []string{"test", "-run", "^$", "-bench", *bench, "-benchmem", "-count", strconv.Itoa(*count), "-benchtime", *benchtime}
	goArgs = append(goArgs, strings.Split(*pkgs, ",")...)
	log.Info("running", "cmd", "go "+strings.Join(goArgs, " "))
	cmd := exec.CommandContext(ctx, "go", goArgs...)
	cmd.Dir = root
	cmd.Stderr = os.Stderr
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	// Echo the raw output (it is what benchstat would take) while parsing.
	results := parseBench(io.TeeReader(pipe, os.Stderr))
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("go test: %w", err)
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "Command: `go %s` (in the module root)\n\n", strings.Join(goArgs, " "))
	writeMicro(&sb, results)
	io.WriteString(stdout, sb.String())
	if *out != "" {
		if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
			return err
		}
		return os.WriteFile(*out, []byte(sb.String()), 0o644)
	}
	return nil
}

// benchResult is every sample of one benchmark, by unit.
type benchResult struct {
	pkg, name string
	units     []string // in first-seen order
	samples   map[string][]float64
}

// parseBench reads `go test -bench` output: "pkg: ..." lines name the
// package, and each "BenchmarkX-N  iters  v unit  v unit ..." line is one
// sample.
func parseBench(r io.Reader) []*benchResult {
	var out []*benchResult
	byKey := map[string]*benchResult{}
	pkg := ""
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if p, ok := strings.CutPrefix(line, "pkg: "); ok {
			pkg = strings.TrimSpace(p)
			continue
		}
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") || len(f)%2 != 0 {
			continue
		}
		if _, err := strconv.ParseInt(f[1], 10, 64); err != nil {
			continue
		}
		name := f[0]
		// Drop the -GOMAXPROCS suffix, as benchstat does.
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			if _, err := strconv.Atoi(name[i+1:]); err == nil {
				name = name[:i]
			}
		}
		key := pkg + " " + name
		b := byKey[key]
		if b == nil {
			b = &benchResult{pkg: pkg, name: name, samples: map[string][]float64{}}
			byKey[key] = b
			out = append(out, b)
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			unit := f[i+1]
			if _, ok := b.samples[unit]; !ok {
				b.units = append(b.units, unit)
			}
			b.samples[unit] = append(b.samples[unit], v)
		}
	}
	return out
}

// summarize returns the mean of the samples inside Tukey's fences and the
// largest relative deviation of a kept sample from it, and how many were
// kept.
func summarize(xs []float64) (mean, spread float64, kept int) {
	s := slices.Clone(xs)
	slices.Sort(s)
	q1, q3 := quantileSorted(s, 0.25), quantileSorted(s, 0.75)
	lo, hi := q1-1.5*(q3-q1), q3+1.5*(q3-q1)
	var sum float64
	var in []float64
	for _, x := range s {
		if x >= lo && x <= hi {
			in = append(in, x)
			sum += x
		}
	}
	if len(in) == 0 {
		return math.NaN(), math.NaN(), 0
	}
	mean = sum / float64(len(in))
	for _, x := range in {
		if mean != 0 {
			spread = math.Max(spread, math.Abs(x-mean)/math.Abs(mean))
		}
	}
	return mean, spread, len(in)
}

func quantileSorted(s []float64, q float64) float64 {
	if len(s) == 0 {
		return math.NaN()
	}
	pos := q * float64(len(s)-1)
	i := int(pos)
	if i+1 >= len(s) {
		return s[len(s)-1]
	}
	return s[i] + (pos-float64(i))*(s[i+1]-s[i])
}

func writeMicro(w io.Writer, results []*benchResult) {
	fmt.Fprintf(w, "Mean ± largest deviation from it, outliers (outside 1.5×IQR) dropped; n = samples kept of those run.\n\n")
	pkg := ""
	for _, b := range results {
		if b.pkg != pkg {
			pkg = b.pkg
			fmt.Fprintf(w, "\n### %s\n\n| benchmark | ns/op | B/op | allocs/op | other |\n|---|---|---|---|---|\n", pkg)
		}
		cell := func(unit string) string {
			xs, ok := b.samples[unit]
			if !ok {
				return ""
			}
			m, sp, n := summarize(xs)
			if unit == "allocs/op" || unit == "B/op" {
				return fmt.Sprintf("%s ± %.0f%%", strconv.FormatFloat(m, 'f', -1, 64), sp*100)
			}
			return fmt.Sprintf("%s ± %.0f%% (n=%d/%d)", fmtSig(m), sp*100, n, len(xs))
		}
		var other []string
		for _, u := range b.units {
			if u == "ns/op" || u == "B/op" || u == "allocs/op" {
				continue
			}
			other = append(other, cell(u)+" "+u)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", strings.TrimPrefix(b.name, "Benchmark"),
			cell("ns/op"), cell("B/op"), cell("allocs/op"), strings.Join(other, "; "))
	}
}

// fmtSig prints x with about 4 significant digits.
func fmtSig(x float64) string {
	if math.IsNaN(x) {
		return "n/a"
	}
	switch ax := math.Abs(x); {
	case ax >= 1000:
		return strconv.FormatFloat(x, 'f', 0, 64)
	case ax >= 100:
		return strconv.FormatFloat(x, 'f', 1, 64)
	case ax >= 10:
		return strconv.FormatFloat(x, 'f', 2, 64)
	default:
		return strconv.FormatFloat(x, 'f', 3, 64)
	}
}
