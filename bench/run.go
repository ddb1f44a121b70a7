package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dedupproxy/dedupproxy/bench/load"
	"github.com/dedupproxy/dedupproxy/bench/proc"
	"github.com/dedupproxy/dedupproxy/bench/report"
	"github.com/dedupproxy/dedupproxy/internal/testcluster"
)

// Config is one benchmark run: what the results record (report.Config)
// and how to run it. The zero value is not useful; see defaultConfig and
// the flags in main.go, which document each field.
type Config struct {
	report.Config

	ProxyBin string `json:"-"` // prebuilt proxy; empty builds ./cmd/dedupproxy (deploy/build.sh)
	// PeerBin is another proxy's binary (grepplabs/kafka-proxy) measured
	// as the "peer" target of the rows and of the idle connections; empty
	// runs none. Peer names it in the report.
	PeerBin string       `json:"-"`
	Log     *slog.Logger `json:"-"`
	// cluster is the real cluster of the "cluster" upstream
	// (DEDUPPROXY_TEST_UPSTREAM; internal/testcluster), nil without one.
	cluster *testcluster.Cluster
}

func defaultConfig() Config {
	return Config{Config: report.Config{
		Upstreams: []string{"kfake"}, Sizes: []int{100, 1024, 10240},
		Producers: 4, Topics: 1, Partitions: 6, Linger: 5 * time.Millisecond,
		BatchBytes: 1_000_012, BufferBytes: 8 << 20, Acks: "all", Idempotent: true,
		Dedup: "enforce", ProduceSplice: true, LostAckRate: 0.05, Duration: 2 * time.Second, Reps: 5,
		RoundTrip: 1024, MemProducers: 2000, MemPartitions: 100, IdleConns: 4000, Recovery: 100 * time.Millisecond,
		DedupCostSize: 1024, DedupCostUpstream: "kfake", ConsumeMB: 200, ConsumeSize: 1024,
	}}
}

func describeMachine() report.Machine {
	m := report.Machine{NumCPU: runtime.NumCPU(), GoVersion: runtime.Version()}
	if out, err := exec.Command("go", "version").Output(); err == nil {
		m.GoVersion = strings.TrimSpace(string(out))
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = "Linux " + strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		if line, _, ok := strings.Cut(string(b), "\n"); ok {
			m.MemTotal = strings.Join(strings.Fields(line)[1:], " ")
		}
	}
	return m
}

// loadAvg reads /proc/loadavg (zeros where it cannot).
func loadAvg() (l [3]float64) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return l
	}
	for i, f := range strings.Fields(string(b)) {
		if i == 3 {
			break
		}
		l[i], _ = strconv.ParseFloat(f, 64)
	}
	return l
}

// Run runs every scenario of cfg and returns the report. dir holds the
// proxy binary and its config files.
func Run(ctx context.Context, cfg Config, dir string) (*report.Report, error) {
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	rep := &report.Report{Machine: describeMachine(), Config: cfg.Config, Started: time.Now(), LoadStart: loadAvg()}
	if cfg.ProxyBin == "" {
		log.Info("building the proxy", "dir", dir)
		bin, err := proc.BuildProxy(ctx, dir)
		if err != nil {
			return nil, err
		}
		cfg.ProxyBin = bin
	}
	topics := make([]string, cfg.Topics)
	for i := range topics {
		topics[i] = fmt.Sprintf("bench-%d", i)
	}
	if slices.Contains(cfg.Upstreams, "cluster") {
		c, err := testcluster.FromEnv(dir)
		if err != nil {
			return nil, err
		}
		if c == nil {
			return nil, fmt.Errorf("upstream cluster: set %s to the cluster's bootstrap brokers (docs/real-cluster.md)", testcluster.EnvUpstream)
		}
		cfg.cluster = c
		log.Info("produce rows against a real cluster", "cluster", c.Describe())
		// A real cluster keeps topics and may be shared: fresh names,
		// deleted at the end (stack).
		for i := range topics {
			topics[i] = testcluster.TopicName(fmt.Sprintf("dedupproxy-bench-%d", i))
		}
	}
	base := load.Spec{
		Producers: cfg.Producers, Topics: topics, Linger: cfg.Linger, BatchBytes: int32(cfg.BatchBytes),
		Acks: cfg.Acks, Idempotent: cfg.Idempotent, BufferBytes: cfg.BufferBytes,
		Duration: cfg.Duration, Records: cfg.Records, Recovery: cfg.Recovery, RetryRate: cfg.RetryRate,
	}
	reps := max(cfg.Reps, 1)
	for _, kind := range cfg.Upstreams {
		rows, err := runProduceRows(ctx, cfg, dir, kind, base, reps, log)
		if err != nil {
			return nil, fmt.Errorf("upstream %s: %w", kind, err)
		}
		rep.Rows = append(rep.Rows, rows...)
	}
	if cfg.ConsumeMB > 0 {
		row, err := runConsumeRow(ctx, cfg, dir, reps, log)
		if err != nil {
			return nil, fmt.Errorf("consume: %w", err)
		}
		rep.Rows = append(rep.Rows, row)
	}
	if cfg.DedupCostSize > 0 {
		for _, idem := range []bool{true, false} {
			row, err := runDedupCost(ctx, cfg, dir, base, idem, reps, log)
			if err != nil {
				return nil, fmt.Errorf("dedup cost (idempotent=%t): %w", idem, err)
			}
			rep.Rows = append(rep.Rows, row)
		}
	}
	if cfg.MemProducers > 0 {
		log.Info("memory scenario", "producers", cfg.MemProducers, "partitions", cfg.MemPartitions)
		m, err := runMemory(ctx, cfg, dir)
		if err != nil {
			return nil, fmt.Errorf("memory: %w", err)
		}
		rep.Memory = m
	}
	if cfg.IdleConns > 0 {
		log.Info("idle connections", "conns", cfg.IdleConns)
		m, err := runIdle(ctx, cfg, dir)
		if err != nil {
			return nil, fmt.Errorf("idle connections: %w", err)
		}
		rep.Idle = m
	}
	rep.Targets = report.EvaluateTargets(rep)
	rep.Took = time.Since(rep.Started).Round(time.Second).String()
	rep.LoadEnd = loadAvg()
	return rep, nil
}

// stack starts an upstream of kind, a floor relay and a proxy in front of
// it, each its own process, and returns the four targets of a row: direct,
// direct again (the A/A row: the noise floor of the measurement itself),
// floor and proxy. stop ends all three processes.
func stack(ctx context.Context, cfg Config, dir, kind string, topics []string, partitions int, dedup string) (eps []endpoint, stop func(), err error) {
	var stops []func()
	stop = func() {
		for _, f := range slices.Backward(stops) {
			f()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	real := kind == "cluster"
	var up *proc.Upstream
	if real {
		up, err = clusterUpstream(ctx, cfg.cluster, topics, partitions)
	} else {
		up, err = proc.StartUpstream(ctx, kind, topics, partitions)
	}
	if err != nil {
		return nil, stop, err
	}
	stops = append(stops, up.Close)
	extra := cfg.proxyExtra()
	if real {
		extra = append(extra, cfg.cluster.ProxyYAML())
	}
	px, err := proc.StartProxy(ctx, cfg.ProxyBin, dir, up.Addrs, dedup, extra...)
	if err != nil {
		return nil, stop, err
	}
	stops = append(stops, px.Stop)
	eps = []endpoint{
		{name: "direct", seeds: up.Addrs, cluster: real},
		{name: "A/A", seeds: up.Addrs, cluster: real},
		{name: "proxy", seeds: []string{px.Bootstrap}, pid: px.Pid, admin: px.Admin, sasl: real},
	}
	// The floor relay reads frames in plaintext: it cannot stand in front
	// of a cluster that speaks TLS (its rows then have no floor).
	if real && cfg.cluster.Config.UpstreamTLS.Enabled {
		return eps, stop, nil
	}
	fl, err := proc.StartFloor(ctx, up.Addrs[0])
	if err != nil {
		return nil, stop, err
	}
	stops = append(stops, fl.Close)
	floor := endpoint{name: "floor", seeds: fl.Addrs, pid: fl.Pid, sasl: real}
	eps = []endpoint{eps[0], eps[1], floor, eps[2]}
	if cfg.PeerBin != "" && !real {
		pe, err := proc.StartPeer(ctx, cfg.PeerBin, up.Addrs[0])
		if err != nil {
			return nil, stop, fmt.Errorf("peer: %w", err)
		}
		stops = append(stops, pe.Stop)
		eps = append(eps, endpoint{name: "peer", seeds: []string{pe.Addr}, pid: pe.Pid})
	}
	return eps, stop, nil
}

// clusterUpstream is the real cluster as an upstream: topics created on
// it, and deleted by close.
func clusterUpstream(ctx context.Context, c *testcluster.Cluster, topics []string, partitions int) (*proc.Upstream, error) {
	for _, t := range topics {
		if err := c.CreateTopic(ctx, t, int32(partitions)); err != nil {
			return nil, err
		}
	}
	return &proc.Upstream{Addrs: c.Config.Upstream, Close: func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, t := range topics {
			c.DeleteTopic(ctx, t)
		}
	}}, nil
}

// endpointNamed returns the endpoint of eps named name.
func endpointNamed(eps []endpoint, name string) endpoint {
	for _, ep := range eps {
		if ep.name == name {
			return ep
		}
	}
	return endpoint{}
}

func baseRow(scenario, upstream string, l load.Spec, dedup string) report.Row {
	r := report.Row{Scenario: scenario, Upstream: upstream, RecordSize: l.RecordSize, Producers: l.Producers,
		Acks: l.Acks, Idempotent: l.Idempotent, Dedup: dedup, RetryRate: l.RetryRate}
	if l.RoundTrip {
		r.Producers = 1
	}
	return r
}

// runProduceRows runs the batched rows (one per size), the round-trip row
// and the lost-ack row against one upstream process.
func runProduceRows(ctx context.Context, cfg Config, dir, kind string, base load.Spec, reps int, log *slog.Logger) ([]report.Row, error) {
	eps, stop, err := stack(ctx, cfg, dir, kind, base.Topics, cfg.Partitions, cfg.Dedup)
	if err != nil {
		return nil, err
	}
	defer stop()
	var rows []report.Row
	run := func(row report.Row, l load.Spec, eps []endpoint, reps int) error {
		label := fmt.Sprintf("%s/%s/%s", row.Scenario, kind, report.SizeLabel(l.RecordSize))
		log.Info("row", "row", label, "pairs", reps)
		phases, err := runPairs(ctx, l, eps, reps, log, label)
		if err != nil {
			return fmt.Errorf("%s: %w", label, err)
		}
		fillRow(&row, eps, phases)
		rows = append(rows, row)
		return nil
	}
	for _, size := range cfg.Sizes {
		l := base
		l.RecordSize = size
		if err := run(baseRow("batched", kind, l, cfg.Dedup), l, eps, reps); err != nil {
			return nil, err
		}
	}
	if cfg.RoundTrip > 0 {
		// One record per round trip, acks=all, no linger: the latency
		// each hop adds to a request.
		l := base
		l.RecordSize, l.RoundTrip, l.Linger, l.Acks, l.RetryRate = cfg.RoundTrip, true, 0, "all", 0
		if l.Records > 0 {
			l.Records = max(l.Records/10, 10)
		}
		if err := run(baseRow("roundtrip", kind, l, cfg.Dedup), l, eps, reps); err != nil {
			return nil, err
		}
	}
	if cfg.LostAckRate > 0 {
		// Lost acknowledgements with idempotent producers: real retries,
		// which the proxy or the broker must catch. A correctness row,
		// one pair: its counts matter, not its ratio.
		l := base
		l.RecordSize, l.Idempotent, l.Acks, l.RetryRate = 1024, true, "all", cfg.LostAckRate
		if err := run(baseRow("lostack", kind, l, cfg.Dedup), l, []endpoint{eps[0], endpointNamed(eps, "proxy")}, 1); err != nil {
			return nil, err
		}
	}
	return rows, nil
}

// runConsumeRow pre-fills a topic on a kfake that keeps records (produce
// is not blackholed) and then reads all of it from the start, per phase,
// directly, directly again, through the floor and through the proxy.
func runConsumeRow(ctx context.Context, cfg Config, dir string, reps int, log *slog.Logger) (report.Row, error) {
	const topic = "consume"
	size := cfg.ConsumeSize
	records := int64(cfg.ConsumeMB) * 1_000_000 / int64(size)
	eps, stop, err := stack(ctx, cfg, dir, "kfake-store", []string{topic}, cfg.Partitions, cfg.Dedup)
	if err != nil {
		return report.Row{}, err
	}
	defer stop()
	// Large batches whatever -batch-bytes says: the fill is set-up, and
	// what the consumers fetch is then a few large record batches per
	// partition, as from a real log.
	fill := load.Spec{Producers: cfg.Producers, Topics: []string{topic}, RecordSize: size, Linger: cfg.Linger,
		BatchBytes: 1_000_012, Acks: "all", Idempotent: true, BufferBytes: cfg.BufferBytes,
		Duration: 10 * time.Minute, Records: records, Recovery: cfg.Recovery}
	log.Info("consume: pre-filling", "records", records, "record_size", size)
	ph, err := runPhase(ctx, fill, eps[0])
	if err != nil {
		return report.Row{}, fmt.Errorf("pre-fill: %w", err)
	}
	// Each producer warms up with one record per topic before the timed
	// window.
	total := ph.res.Acked + int64(fill.Producers*len(fill.Topics))
	if ph.res.Failed > 0 {
		return report.Row{}, fmt.Errorf("pre-fill: %d records failed: %v", ph.res.Failed, ph.res.FirstErr)
	}
	l := load.Spec{Topics: []string{topic}, RecordSize: size, Consume: true, ConsumeRecords: total,
		Duration: 2 * time.Minute}
	row := report.Row{Scenario: "consume", Upstream: "kfake-store", RecordSize: size, Acks: "n/a", Dedup: cfg.Dedup}
	label := "consume/kfake-store/" + report.SizeLabel(size)
	phases, err := runPairs(ctx, l, eps, reps, log, label)
	if err != nil {
		return row, err
	}
	fillRow(&row, eps, phases)
	return row, nil
}

// runMemory measures the proxy's memory per tracked (producer, partition):
// MemProducers idempotent kgo producers each write one record to each of
// MemPartitions partitions of the sink through the proxy, so the table
// gains producers × partitions entries. Producers run a few at a time and
// close when done, so connection buffers do not pile up in the figure.
func runMemory(ctx context.Context, cfg Config, dir string) (*report.MemoryResult, error) {
	const topic = "mem"
	up, err := proc.StartUpstream(ctx, "sink", []string{topic}, cfg.MemPartitions)
	if err != nil {
		return nil, err
	}
	defer up.Close()
	px, err := proc.StartProxy(ctx, cfg.ProxyBin, dir, up.Addrs, "enforce")
	if err != nil {
		return nil, err
	}
	defer px.Stop()
	m := &report.MemoryResult{Producers: cfg.MemProducers, Partitions: cfg.MemPartitions,
		ExpectedEntries: (cfg.MemProducers - 1) * cfg.MemPartitions}

	produceAll := func() error {
		cl, err := kgo.NewClient(kgo.SeedBrokers(px.Bootstrap), kgo.DefaultProduceTopic(topic),
			kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0),
			kgo.RequiredAcks(kgo.AllISRAcks()))
		if err != nil {
			return err
		}
		defer cl.Close()
		recs := make([]*kgo.Record, cfg.MemPartitions)
		for p := range recs {
			recs[p] = &kgo.Record{Partition: int32(p), Value: []byte("x")}
		}
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return cl.ProduceSync(pctx, recs...).FirstErr()
	}
	// One producer first, so the "before" figure includes a warmed-up
	// proxy (listeners, pools, a first table shard touched).
	if err := produceAll(); err != nil {
		return nil, err
	}
	before, err := proc.ReadStats(px.Pid)
	if err != nil {
		return nil, err
	}
	mBefore, err := proc.Scrape(ctx, px.Admin)
	if err != nil {
		return nil, err
	}
	const parallel = 4
	var wg sync.WaitGroup
	errs := make(chan error, parallel)
	next := make(chan struct{})
	for range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				if err := produceAll(); err != nil {
					select {
					case errs <- err:
					default:
					}
					return
				}
			}
		}()
	}
feed:
	for range cfg.MemProducers - 1 {
		select {
		case next <- struct{}{}:
		case err := <-errs:
			close(next)
			wg.Wait()
			return nil, err
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		return nil, err
	default:
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	after, err := proc.ReadStats(px.Pid)
	if err != nil {
		return nil, err
	}
	mAfter, err := proc.Scrape(ctx, px.Admin)
	if err != nil {
		return nil, err
	}
	entriesBefore := proc.MetricValue(mBefore, "dedupproxy_seqstate_entries")
	m.EntriesTotal = proc.MetricValue(mAfter, "dedupproxy_seqstate_entries")
	grown := m.EntriesTotal - entriesBefore
	m.Entries = grown
	m.RSSBeforeMiB = float64(before.RSS) / (1 << 20)
	m.RSSAfterMiB = float64(after.RSS) / (1 << 20)
	if grown <= 0 {
		return m, errors.New("dedupproxy_seqstate_entries did not grow")
	}
	m.RSSPerEntry = float64(after.RSS-before.RSS) / grown
	m.HeapPerEntry = (proc.MetricValue(mAfter, "go_memstats_heap_inuse_bytes") - proc.MetricValue(mBefore, "go_memstats_heap_inuse_bytes")) / grown
	return m, nil
}

// proxyExtra is the proxy configuration the flags add to the measured
// proxies.
func (c *Config) proxyExtra() []string {
	if !c.ProduceSplice {
		return []string{"produce_splice: false\n"}
	}
	return nil
}
