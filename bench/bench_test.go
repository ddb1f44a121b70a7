package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/dedupproxy/dedupproxy/bench/proc"
	"github.com/dedupproxy/dedupproxy/bench/report"
	"github.com/dedupproxy/dedupproxy/internal/testcluster"
	"github.com/dedupproxy/dedupproxy/internal/testskip"
)

// TestMain lets the test binary serve as the bench's child processes
// (upstream, floor relay, load generator): the pipeline re-executes
// os.Executable, which under go test is this binary.
func TestMain(m *testing.M) {
	if proc.IsChild() {
		os.Exit(proc.ChildMain(os.Args[1:]))
	}
	os.Exit(testskip.Run(m))
}

// TestPipelineTiny runs the whole benchmark at a tiny size — upstream,
// floor relay, proxy and every load phase in processes of their own; the
// batched, round-trip, consume, lost-ack, dedup-cost and memory scenarios —
// so CI notices when the command stops working. It checks real outcomes,
// not speed: every record acknowledged (or read back), every figure filled
// and finite, dropped acknowledgements caught by the proxy as duplicates,
// and no child process left behind.
func TestPipelineTiny(t *testing.T) {
	if testing.Short() {
		testskip.Skip(t, "builds and runs the proxy process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	cfg := defaultConfig()
	cfg.Log = slog.New(slog.NewTextHandler(t.Output(), nil))
	cfg.Sizes = []int{512}
	cfg.BatchBytes = 4096 // many small requests, so several acknowledgements are dropped
	cfg.Producers = 2
	cfg.Duration = 3 * time.Second // a bound; the record count ends each phase first
	cfg.Records = 300
	cfg.Reps = 2 // both orders
	if raceOn {
		cfg.Reps = 1
	}
	cfg.LostAckRate = 0.2
	cfg.Recovery = 10 * time.Millisecond
	cfg.RoundTrip = 256
	cfg.MemProducers = 5
	cfg.MemPartitions = 4
	cfg.IdleConns = 100
	cfg.DedupCostSize = 512
	cfg.ConsumeMB = 1 // Fetch responses above floorSmall: spliced by the floor
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	rep, err := Run(ctx, cfg, dir)
	if err != nil {
		t.Fatal(err)
	}
	rep.Command = "go test ./bench"
	if kids := childPIDs(); len(kids) > 0 {
		t.Errorf("child processes left after the run: %v", kids)
	}

	scenarios := map[string]int{}
	for _, row := range rep.Rows {
		scenarios[row.Scenario]++
		name := row.Scenario + "/" + row.Upstream
		if !row.Idempotent && row.Scenario == "dedupcost" {
			name += "/legacy"
		}
		for _, target := range row.Targets {
			s := row.Sides[target]
			if s.Acked == 0 || s.Acked != s.Sent || s.Failed != 0 {
				t.Errorf("%s %s: acked %d of %d sent, %d failed", name, target, s.Acked, s.Sent, s.Failed)
			}
			if s.Phases != row.Pairs || !(s.MBPerSec > 0) || math.IsInf(s.MBPerSec, 0) {
				t.Errorf("%s %s: %d phases, %v MB/s", name, target, s.Phases, s.MBPerSec)
			}
			if row.Scenario != "consume" && (!(s.P50us > 0) || s.P50us > s.P99us || s.P99us > s.P999us) {
				t.Errorf("%s %s: percentiles %v %v %v", name, target, s.P50us, s.P99us, s.P999us)
			}
			if target == "floor" || target == "proxy" || row.Scenario == "dedupcost" {
				if s.PeakRSSMiB <= 0 || s.CPUSeconds < 0 {
					t.Errorf("%s %s: peak RSS %v, CPU %v", name, target, s.PeakRSSMiB, s.CPUSeconds)
				}
			}
		}
		for _, target := range row.Targets[1:] {
			if x := row.Throughput[target]; x.N != row.Pairs || !(x.Min > 0) || x.Min > x.Median || x.Median > x.Max {
				t.Errorf("%s %s: throughput ratio %+v", name, target, x)
			}
			if row.Scenario == "roundtrip" {
				if a := row.AddedP50us[target]; a.N != row.Pairs || a.Min > a.Max {
					t.Errorf("%s %s: added p50 %+v", name, target, a)
				}
			}
		}
		switch row.Scenario {
		case "batched", "roundtrip", "consume":
			if want := []string{"direct", "A/A", "floor", "proxy"}; strings.Join(row.Targets, ",") != strings.Join(want, ",") || row.Pairs != cfg.Reps {
				t.Errorf("%s: targets %v, %d pairs", name, row.Targets, row.Pairs)
			}
		case "lostack":
			if row.Sides["direct"].AcksDropped == 0 || row.Sides["proxy"].AcksDropped == 0 {
				t.Errorf("%s: the shim dropped no acknowledgement at rate %v", name, row.RetryRate)
			}
			// An idempotent retry of a batch the proxy already committed
			// must be answered by the proxy, not forwarded again.
			if row.Duplicates+row.InFlightWaits == 0 {
				t.Errorf("%s: acknowledgements dropped through the proxy but no duplicate caught", name)
			}
		case "dedupcost":
			if row.Decided == 0 {
				t.Errorf("%s: the enforce proxy decided no batch", name)
			}
		}
	}
	if want := map[string]int{"batched": 1, "roundtrip": 1, "consume": 1, "lostack": 1, "dedupcost": 2}; fmt.Sprint(scenarios) != fmt.Sprint(want) {
		t.Errorf("rows %v, want %v", scenarios, want)
	}
	for _, row := range rep.Rows {
		if row.Scenario == "consume" {
			if s := row.Sides["proxy"]; s.Acked < int64(row.Pairs)*int64(cfg.ConsumeMB*1_000_000/cfg.ConsumeSize) {
				t.Errorf("consume: proxy read %d records", s.Acked)
			}
		}
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
	idle := rep.Idle
	if idle == nil {
		t.Fatal("no idle-connection result")
	}
	for _, side := range []string{"floor", "proxy"} {
		if sd := idle.Sides[side]; sd.RSSBeforeMiB <= 0 || sd.RSSAfterMiB <= 0 {
			t.Errorf("idle connections, %s: %+v", side, sd)
		}
	}
	// Targets: batched (throughput, CPU), consume (throughput, CPU),
	// roundtrip (p50, p99), dedup cost idempotent and legacy, peak RSS,
	// memory, idle connections.
	if len(rep.Targets) != 11 {
		t.Errorf("got %d targets, want 11: %+v", len(rep.Targets), rep.Targets)
	}
	for _, tg := range rep.Targets {
		if tg.Result != "met" && tg.Result != "NOT met" && tg.Result != "reported" {
			t.Errorf("target %q: result %q", tg.Name, tg.Result)
		}
	}

	out := filepath.Join(dir, "results")
	if err := report.WriteResults(out, rep); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(out, "results.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Targets", "A/A ÷ direct", "floor ÷ direct", "proxy ÷ direct", "proxy CPU ms/MB", "| batched | kfake |",
		"| consume | kfake-store |", "proxy added p99", "stalled phases", "## What deduplication costs", "## Lost acknowledgements", "## Memory per tracked", "## Memory per idle client connection", "results.svg"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("results.md lacks %q", want)
		}
	}
	t.Logf("results.md:\n%s", md)
	svg, err := os.ReadFile(filepath.Join(out, "results.svg"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(svg), "<svg") || !strings.Contains(string(svg), "<rect") || strings.Contains(string(svg), "NaN") {
		t.Errorf("results.svg is not a chart:\n%.500s", svg)
	}
	var back report.Report
	b, err := os.ReadFile(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &back); err != nil || len(back.Rows) != len(rep.Rows) {
		t.Errorf("results.json: %v, %d rows", err, len(back.Rows))
	}
}

// childPIDs lists the live processes whose parent is this one.
func childPIDs() []int {
	var kids []int
	ents, _ := os.ReadDir("/proc")
	me := strconv.Itoa(os.Getpid())
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 1 && f[1] == me && f[0] != "Z" {
			kids = append(kids, pid)
		}
	}
	return kids
}

// TestTLSCostTiny runs the TLS cost scenario at a tiny size: both proxy
// processes serve every record, the TLS one over TLS on both legs, and the
// report's figures are finite.
func TestTLSCostTiny(t *testing.T) {
	if testing.Short() {
		testskip.Skip(t, "builds and runs the proxy process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	cfg := defaultConfig()
	cfg.Producers, cfg.Reps, cfg.Duration = 2, 1, 300*time.Millisecond
	var err error
	if cfg.ProxyBin, err = proc.BuildProxy(ctx, dir); err != nil {
		t.Fatal(err)
	}
	res, err := runTLSCost(ctx, cfg, dir, 512, slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]report.Side{"plain": res.Plain, "tls": res.TLS} {
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

// TestPipelineRealCluster runs the produce rows against a cluster named
// only by the environment (-upstreams cluster, DEDUPPROXY_TEST_UPSTREAM),
// as against a real one: here a kfake that requires TLS and SCRAM-SHA-256,
// which the bench and its load children reach only through
// internal/testcluster. The proxy gets the cluster's TLS and SASL, the
// producers authenticate through it, the floor is left out (it cannot
// relay TLS), dropped acknowledgements are caught, and the topics the run
// created are deleted.
func TestPipelineRealCluster(t *testing.T) {
	if testing.Short() {
		testskip.Skip(t, "builds and runs the proxy process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	c, root := testcluster.StandIn(t, 1, true)

	cfg := defaultConfig()
	cfg.Log = slog.New(slog.NewTextHandler(t.Output(), nil))
	cfg.Upstreams = []string{"cluster"}
	cfg.Sizes = []int{512}
	cfg.BatchBytes = 4096
	cfg.Producers = 2
	cfg.Duration = 3 * time.Second
	cfg.Records = 300
	cfg.Reps = 1
	cfg.LostAckRate = 0.2
	cfg.Recovery = 10 * time.Millisecond
	cfg.RoundTrip, cfg.MemProducers, cfg.DedupCostSize, cfg.ConsumeMB = 0, 0, 0, 0
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	rep, err := Run(ctx, cfg, dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Rows) != 2 {
		t.Fatalf("%d rows, want batched and lostack", len(rep.Rows))
	}
	for _, row := range rep.Rows {
		if row.Upstream != "cluster" {
			t.Errorf("%s row against %s", row.Scenario, row.Upstream)
		}
		for _, target := range row.Targets {
			if s := row.Sides[target]; s.Acked == 0 || s.Acked != s.Sent || s.Failed != 0 {
				t.Errorf("%s %s: acked %d of %d sent, %d failed", row.Scenario, target, s.Acked, s.Sent, s.Failed)
			}
		}
		if row.Scenario == "batched" && strings.Join(row.Targets, ",") != "direct,A/A,proxy" {
			t.Errorf("batched targets %v, want direct, A/A and proxy (no floor before TLS)", row.Targets)
		}
		if row.Scenario == "lostack" && row.Sides["proxy"].AcksDropped == 0 {
			t.Errorf("lostack: no acknowledgement dropped")
		}
	}
	adm, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DialTLSConfig(&tls.Config{RootCAs: root.Pool}),
		kgo.SASL(scram.Auth{User: testcluster.StandInUser, Pass: testcluster.StandInPassword}.AsSha256Mechanism()))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	topics, err := kadm.NewClient(adm).ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for name := range topics {
		if strings.HasPrefix(name, "dedupproxy-bench-") {
			t.Errorf("topic %s left on the cluster", name)
		}
	}
}
