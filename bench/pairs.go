package main

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"time"

	"github.com/dedupproxy/dedupproxy/bench/load"
	"github.com/dedupproxy/dedupproxy/bench/proc"
	"github.com/dedupproxy/dedupproxy/bench/report"
)

// endpoint is one target of a row: where the load connects, and the
// process measured while it runs.
type endpoint struct {
	name  string
	seeds []string
	pid   int    // 0: no process of its own (direct)
	admin string // proxy /metrics, or ""
	// cluster: the seeds are the real cluster's (its TLS and SASL);
	// sasl: a relay in front of it (SASL only, relayed).
	cluster, sasl bool
}

// phase is what one phase of one target measured.
type phase struct {
	res     load.Result
	dropped int64
	cpu     time.Duration
	sys     time.Duration // of which in the kernel
	hwm     int64
	metrics map[string]float64 // batches_total deltas by outcome
}

var outcomes = []string{"duplicate", "in_flight_wait", "accepted", "legacy_accepted"}

// runPairs runs reps repetitions of one phase per endpoint, in order on
// even repetitions and in reverse on odd ones, so each target goes first
// against the reference in half of its pairs and machine drift hits all
// alike. Each phase is a fresh load process.
func runPairs(ctx context.Context, spec load.Spec, eps []endpoint, reps int, log *slog.Logger, label string) ([][]phase, error) {
	out := make([][]phase, reps)
	for rep := range reps {
		out[rep] = make([]phase, len(eps))
		order := make([]int, len(eps))
		for i := range order {
			order[i] = i
		}
		if rep%2 == 1 {
			slices.Reverse(order)
		}
		for _, i := range order {
			ep := eps[i]
			ph, err := runPhase(ctx, spec, ep)
			if err != nil {
				return nil, fmt.Errorf("%s phase %d: %w", ep.name, rep, err)
			}
			out[rep][i] = ph
			r := ph.res
			log.Info("phase", "row", label, "rep", rep, "target", ep.name, "acked", r.Acked, "failed", r.Failed,
				"mb_per_s", fmt.Sprintf("%.1f", float64(r.Bytes)/1e6/r.Elapsed.Seconds()),
				"p50", r.Hist.Quantile(0.5).Round(time.Microsecond), "p99", r.Hist.Quantile(0.99).Round(time.Microsecond),
				"cpu_ms", ph.cpu.Milliseconds(), "sys_ms", ph.sys.Milliseconds(), "acked_in_window", r.AckedInWindow)
			if r.Failed > 0 {
				log.Warn("records failed", "target", ep.name, "first_err", r.FirstErr)
			}
		}
	}
	return out, nil
}

func runPhase(ctx context.Context, spec load.Spec, ep endpoint) (phase, error) {
	ph := phase{metrics: map[string]float64{}}
	spec.Seeds, spec.Cluster, spec.SASL = ep.seeds, ep.cluster, ep.sasl
	l, err := proc.StartLoad(ctx, spec)
	if err != nil {
		return ph, err
	}
	var before proc.Stats
	var mBefore string
	// Scrape first: serving /metrics costs the proxy CPU, which must stay
	// outside the timed window.
	if ep.admin != "" {
		if mBefore, err = proc.Scrape(ctx, ep.admin); err != nil {
			l.Kill()
			return ph, err
		}
	}
	if ep.pid != 0 {
		proc.ResetPeak(ep.pid)
		if before, err = proc.ReadStats(ep.pid); err != nil {
			l.Kill()
			return ph, err
		}
	}
	res, dropped, err := l.Run(ctx, spec.Duration+2*time.Minute)
	if err != nil {
		return ph, err
	}
	ph.res, ph.dropped = res, dropped
	if ep.pid != 0 {
		after, err := proc.ReadStats(ep.pid)
		if err != nil {
			return ph, fmt.Errorf("read /proc of %s: %w", ep.name, err)
		}
		ph.cpu, ph.sys, ph.hwm = after.CPU-before.CPU, after.Sys-before.Sys, after.HWM
	}
	if ep.admin != "" {
		mAfter, err := proc.Scrape(ctx, ep.admin)
		if err != nil {
			return ph, err
		}
		for _, o := range outcomes {
			l := `outcome="` + o + `"`
			ph.metrics[o] = proc.MetricValue(mAfter, "dedupproxy_batches_total", l) - proc.MetricValue(mBefore, "dedupproxy_batches_total", l)
		}
	}
	return ph, nil
}

// fillRow aggregates phases (from runPairs over eps) into row.
func fillRow(row *report.Row, eps []endpoint, phases [][]phase) {
	row.Pairs = len(phases)
	row.Sides = map[string]report.Side{}
	row.Throughput, row.AddedP50us, row.AddedP99us = map[string]report.Spread{}, map[string]report.Spread{}, map[string]report.Spread{}
	row.CPURatio, row.CPUmsPerMB = map[string]report.Spread{}, map[string]report.Spread{}
	row.Targets = nil
	mbps := func(ph phase) float64 { return float64(ph.res.Bytes) / 1e6 / ph.res.Elapsed.Seconds() }
	// A phase with no CPU tick (10 ms) or no byte has no CPU per MB:
	// it is left out of the spreads, never reported as 0.
	cpuPerMB := func(ph phase) float64 {
		if ph.res.Bytes == 0 || ph.cpu == 0 {
			return math.NaN()
		}
		return ph.cpu.Seconds() * 1e3 / (float64(ph.res.Bytes) / 1e6)
	}
	for i, ep := range eps {
		row.Targets = append(row.Targets, ep.name)
		var s report.Side
		var hist load.Histogram
		var bytes int64
		var cpu, sys time.Duration
		var hwm int64
		var thr, p50, p99, cpuR, cpuMB []float64
		for _, rep := range phases {
			ph, ref := rep[i], rep[0]
			s.Phases++
			s.Sent += ph.res.Sent
			s.Acked += ph.res.Acked
			s.Failed += ph.res.Failed
			s.Seconds += ph.res.Elapsed.Seconds()
			s.AcksDropped += ph.dropped
			if ph.res.AckedInWindow == 0 {
				s.Stalled++
			}
			bytes += ph.res.Bytes
			cpu += ph.cpu
			sys += ph.sys
			hwm = max(hwm, ph.hwm)
			hist.Merge(ph.res.Hist)
			if ep.pid != 0 {
				cpuMB = append(cpuMB, cpuPerMB(ph))
			}
			if ep.admin != "" && (ep.name == "proxy" || ep.name == "enforce") {
				row.Duplicates += ph.metrics["duplicate"]
				row.InFlightWaits += ph.metrics["in_flight_wait"]
				row.Decided += ph.metrics["accepted"] + ph.metrics["legacy_accepted"]
			}
			if i == 0 {
				continue
			}
			thr = append(thr, report.Ratio(mbps(ph), mbps(ref)))
			if ph.res.Hist.Total() > 0 && ref.res.Hist.Total() > 0 {
				p50 = append(p50, us(ph.res.Hist.Quantile(0.5))-us(ref.res.Hist.Quantile(0.5)))
				p99 = append(p99, us(ph.res.Hist.Quantile(0.99))-us(ref.res.Hist.Quantile(0.99)))
			}
			if ep.pid != 0 && eps[0].pid != 0 {
				cpuR = append(cpuR, report.Ratio(cpuPerMB(ph), cpuPerMB(ref)))
			}
		}
		if s.Seconds > 0 {
			s.RecPerSec = float64(s.Acked) / s.Seconds
			s.MBPerSec = float64(bytes) / 1e6 / s.Seconds
		}
		s.P50us, s.P99us, s.P999us = us(hist.Quantile(0.5)), us(hist.Quantile(0.99)), us(hist.Quantile(0.999))
		if ep.pid != 0 {
			s.CPUSeconds, s.SysSeconds = cpu.Seconds(), sys.Seconds()
			if bytes > 0 {
				s.CPUmsPerMB = cpu.Seconds() * 1e3 / (float64(bytes) / 1e6)
			}
			s.PeakRSSMiB = float64(hwm) / (1 << 20)
			row.CPUmsPerMB[ep.name] = report.SpreadOf(cpuMB)
		}
		row.Sides[ep.name] = s
		if i > 0 {
			row.Throughput[ep.name] = report.SpreadOf(thr)
			if len(p50) > 0 {
				row.AddedP50us[ep.name], row.AddedP99us[ep.name] = report.SpreadOf(p50), report.SpreadOf(p99)
			}
			if len(cpuR) > 0 {
				row.CPURatio[ep.name] = report.SpreadOf(cpuR)
			}
		}
	}
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// phaseAcc accumulates one target's phases run in this process (the TLS
// cost scenario).
type phaseAcc struct {
	sent, acked, failed, dropped int64
	elapsed                      time.Duration
	hist                         load.Histogram
}

func (a *phaseAcc) side(size int) report.Side {
	s := report.Side{Sent: a.sent, Acked: a.acked, Failed: a.failed, Seconds: a.elapsed.Seconds(), AcksDropped: a.dropped}
	if s.Seconds > 0 {
		s.RecPerSec = float64(a.acked) / s.Seconds
		s.MBPerSec = float64(a.acked) * float64(size) / 1e6 / s.Seconds
	}
	s.P50us = us(a.hist.Quantile(0.50))
	s.P99us = us(a.hist.Quantile(0.99))
	s.P999us = us(a.hist.Quantile(0.999))
	return s
}
