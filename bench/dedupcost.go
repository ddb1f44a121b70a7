package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/dedupproxy/dedupproxy/bench/load"
	"github.com/dedupproxy/dedupproxy/bench/proc"
	"github.com/dedupproxy/dedupproxy/bench/report"
)

// runDedupCost compares two proxy processes in front of one upstream, one
// with dedup off (the reference) and one with dedup enforce, under the same
// batched load (idempotent or legacy producers), reps alternated pairs:
// what deciding every batch costs, as the per-pair ratio of their CPU per
// MB. The off proxy is also measured twice per repetition (A/A), for the
// noise of that ratio.
func runDedupCost(ctx context.Context, cfg Config, dir string, base load.Spec, idempotent bool, reps int, log *slog.Logger) (report.Row, error) {
	kind := cfg.DedupCostUpstream
	l := base
	l.RecordSize, l.Idempotent, l.Acks, l.RetryRate = cfg.DedupCostSize, idempotent, "all", 0
	row := baseRow("dedupcost", kind, l, "enforce÷off")
	up, err := proc.StartUpstream(ctx, kind, l.Topics, cfg.Partitions)
	if err != nil {
		return row, err
	}
	defer up.Close()
	var eps []endpoint
	for _, mode := range []string{"off", "enforce"} {
		px, err := proc.StartProxy(ctx, cfg.ProxyBin, dir, up.Addrs, mode, cfg.proxyExtra()...)
		if err != nil {
			return row, err
		}
		defer px.Stop()
		eps = append(eps, endpoint{name: mode, seeds: []string{px.Bootstrap}, pid: px.Pid, admin: px.Admin})
	}
	// A/A: the off proxy against itself, the noise of a CPU-per-MB ratio.
	aa := eps[0]
	aa.name = "A/A"
	eps = []endpoint{eps[0], aa, eps[1]}
	producers := "idempotent"
	if !idempotent {
		producers = "legacy"
	}
	label := fmt.Sprintf("dedupcost/%s/%s/%s", producers, kind, report.SizeLabel(l.RecordSize))
	log.Info("row", "row", label, "pairs", reps)
	phases, err := runPairs(ctx, l, eps, reps, log, label)
	if err != nil {
		return row, err
	}
	fillRow(&row, eps, phases)
	return row, nil
}
