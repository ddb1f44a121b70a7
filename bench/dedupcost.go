package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// DedupCostResult compares two proxy processes in front of the same
// upstream, one with dedup enforce and one with dedup off, under the same
// load, their phases alternated: what deciding every batch costs.
type DedupCostResult struct {
	Upstream string `json:"upstream"`
	// Producers is idempotent or legacy (idempotence off, producer id -1,
	// deduplicated by identity: docs/legacy.md).
	Producers  string `json:"producers"`
	RecordSize int    `json:"record_size"`
	Reps       int    `json:"reps"`

	Enforce Side `json:"enforce"`
	Off     Side `json:"off"`

	EnforceCPUmsPerMB float64 `json:"enforce_cpu_ms_per_mb"`
	OffCPUmsPerMB     float64 `json:"off_cpu_ms_per_mb"`
	// CPURatio is enforce ÷ off CPU per MB; the target is ≤ 1.05.
	CPURatio float64 `json:"cpu_ratio"`
	// Decided is dedupproxy_batches_total{outcome="accepted"} (legacy:
	// "legacy_accepted") on the enforce proxy: proof that it decided the
	// batches.
	Decided float64 `json:"decided"`
}

// runDedupCost runs the batched load at size through an enforce proxy and an
// off proxy, 2×reps phases, alternating which goes first.
func runDedupCost(ctx context.Context, cfg Config, dir, upstreamKind string, size int, idempotent bool, log *slog.Logger) (*DedupCostResult, error) {
	topics := make([]string, cfg.Topics)
	for i := range topics {
		topics[i] = fmt.Sprintf("bench-%d", i)
	}
	load := loadSpec{
		Producers: cfg.Producers, Topics: topics, Linger: cfg.Linger, BatchBytes: int32(cfg.BatchBytes),
		Acks: "all", Idempotent: idempotent, BufferBytes: cfg.BufferBytes,
		Duration: cfg.Duration, Records: cfg.Records, Recovery: cfg.Recovery, RecordSize: size,
	}
	up, err := startUpstream(upstreamKind, topics, cfg.Partitions)
	if err != nil {
		return nil, err
	}
	defer up.close()
	modes := []string{"enforce", "off"}
	var procs [2]*proxyProc
	for i, mode := range modes {
		px, err := startProxy(ctx, cfg.ProxyBin, dir, up.addrs, mode)
		if err != nil {
			return nil, err
		}
		defer px.stop()
		procs[i] = px
	}
	var accs [2]phaseAcc
	var cpu [2]time.Duration
	res := &DedupCostResult{Upstream: upstreamKind, Producers: "idempotent", RecordSize: size, Reps: max(cfg.Reps, 1)}
	accepted := `outcome="accepted"`
	if !idempotent {
		res.Producers, accepted = "legacy", `outcome="legacy_accepted"`
	}
	for rep := range res.Reps {
		order := []int{0, 1}
		if rep%2 == 1 {
			order = []int{1, 0}
		}
		for _, i := range order {
			px := procs[i]
			var before procStats
			var metricsBefore string
			l := load
			l.OnStart = func() {
				before, _ = readProc(px.pid)
				metricsBefore, _ = scrape(ctx, px.admin)
			}
			r, err := runLoad(ctx, []string{px.bootstrap}, nil, l)
			if err != nil {
				return nil, fmt.Errorf("dedup %s phase: %w", modes[i], err)
			}
			after, err := readProc(px.pid)
			if err != nil {
				return nil, err
			}
			cpu[i] += after.cpu - before.cpu
			if i == 0 {
				metricsAfter, err := scrape(ctx, px.admin)
				if err != nil {
					return nil, err
				}
				res.Decided += metricValue(metricsAfter, "dedupproxy_batches_total", accepted) -
					metricValue(metricsBefore, "dedupproxy_batches_total", accepted)
			}
			a := &accs[i]
			a.sent += r.Sent
			a.acked += r.Acked
			a.failed += r.Failed
			a.elapsed += r.Elapsed
			a.hist.merge(r.Hist)
			log.Info("dedup cost phase", "producers", res.Producers, "dedup", modes[i], "rep", rep, "acked", r.Acked,
				"cpu_ms", (after.cpu - before.cpu).Milliseconds())
		}
	}
	res.Enforce, res.Off = accs[0].side(size), accs[1].side(size)
	perMB := func(c time.Duration, acked int64) float64 {
		mb := float64(acked) * float64(size) / 1e6
		if mb == 0 {
			return 0
		}
		return c.Seconds() * 1e3 / mb
	}
	res.EnforceCPUmsPerMB = perMB(cpu[0], accs[0].acked)
	res.OffCPUmsPerMB = perMB(cpu[1], accs[1].acked)
	res.CPURatio = ratio(res.EnforceCPUmsPerMB, res.OffCPUmsPerMB)
	return res, nil
}
