package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Config is one benchmark run. The zero value is not useful; see
// defaultConfig and the flags in main.go, which document each field.
type Config struct {
	Upstreams   []string      `json:"upstreams"` // kfake, sink
	Sizes       []int         `json:"record_sizes"`
	Producers   int           `json:"producers"`
	Topics      int           `json:"topics"`
	Partitions  int           `json:"partitions"`
	Linger      time.Duration `json:"linger"`
	BatchBytes  int           `json:"batch_bytes"`
	BufferBytes int64         `json:"buffer_bytes"`
	Acks        string        `json:"acks"`
	Idempotent  bool          `json:"idempotent"`
	Dedup       string        `json:"dedup"`
	RetryRate   float64       `json:"retry_rate"`   // lost acks in the throughput matrix
	LostAckRate float64       `json:"lostack_rate"` // the separate lost-ack scenario; 0 skips it
	Duration    time.Duration `json:"duration"`     // per phase
	Records     int64         `json:"records"`      // per phase, 0 = duration only
	Reps        int           `json:"reps"`         // direct/proxy pairs per row
	// Recovery sets kgo's retry backoff and metadata min age (0 keeps kgo's
	// defaults). After a cut connection kgo refreshes metadata before
	// retrying, by default at most every 5s, so each lost acknowledgement
	// would stall a producer for up to 5s — longer than a phase.
	Recovery      time.Duration `json:"recovery"`
	RoundTrip     int           `json:"roundtrip_size"`
	MemProducers  int           `json:"mem_producers"` // memory scenario; 0 skips it
	MemPartitions int           `json:"mem_partitions"`
	// DedupCostSize is the record size of the dedup-cost scenario (an
	// enforce and an off proxy, alternated); 0 skips it.
	DedupCostSize     int    `json:"dedupcost_size"`
	DedupCostUpstream string `json:"dedupcost_upstream"`

	ProxyBin string       `json:"-"` // prebuilt proxy; empty builds ./cmd/dedupproxy
	Log      *slog.Logger `json:"-"`
}

func defaultConfig() Config {
	return Config{
		Upstreams: []string{"kfake", "sink"}, Sizes: []int{100, 1024, 10240},
		Producers: 4, Topics: 1, Partitions: 6, Linger: 5 * time.Millisecond,
		BatchBytes: 1_000_012, BufferBytes: 8 << 20, Acks: "all", Idempotent: true,
		Dedup: "enforce", LostAckRate: 0.01, Duration: 3 * time.Second, Reps: 3,
		RoundTrip: 1024, MemProducers: 2000, MemPartitions: 100, Recovery: 100 * time.Millisecond,
		DedupCostSize: 1024, DedupCostUpstream: "sink",
	}
}

// Side is what one target (direct or proxy) achieved over all its phases
// of a row.
type Side struct {
	Sent      int64   `json:"sent"`
	Acked     int64   `json:"acked"`
	Failed    int64   `json:"failed"`
	Seconds   float64 `json:"seconds"`
	RecPerSec float64 `json:"records_per_sec"`
	MBPerSec  float64 `json:"mb_per_sec"`
	P50us     float64 `json:"p50_us"`
	P99us     float64 `json:"p99_us"`
	P999us    float64 `json:"p999_us"`
	// AcksDropped is how many Produce acknowledgements the shim dropped.
	AcksDropped int64 `json:"acks_dropped"`
}

// Row compares direct and proxy for one scenario, upstream and record size.
type Row struct {
	Scenario   string  `json:"scenario"` // batched, roundtrip, lostack
	Upstream   string  `json:"upstream"`
	RecordSize int     `json:"record_size"`
	Producers  int     `json:"producers"`
	Acks       string  `json:"acks"`
	Idempotent bool    `json:"idempotent"`
	Dedup      string  `json:"dedup"`
	RetryRate  float64 `json:"retry_rate"`

	Direct Side `json:"direct"`
	Proxy  Side `json:"proxy"`

	// Proxy ÷ direct of each figure.
	RatioRecPerSec float64 `json:"ratio_records_per_sec"`
	RatioMBPerSec  float64 `json:"ratio_mb_per_sec"`
	RatioP50       float64 `json:"ratio_p50"`
	RatioP99       float64 `json:"ratio_p99"`
	RatioP999      float64 `json:"ratio_p999"`
	// Proxy − direct latency.
	AddedP50us  float64 `json:"added_p50_us"`
	AddedP99us  float64 `json:"added_p99_us"`
	AddedP999us float64 `json:"added_p999_us"`

	// Read from the proxy process (/proc) during its timed phases.
	ProxyCPUSeconds float64 `json:"proxy_cpu_seconds"`
	ProxyCPUmsPerMB float64 `json:"proxy_cpu_ms_per_mb"`
	ProxyCPUsPerGB  float64 `json:"proxy_cpu_s_per_gb"`
	ProxyPeakRSSMiB float64 `json:"proxy_peak_rss_mib"`
	// Scraped from the proxy's /metrics during its phases.
	Duplicates    float64 `json:"duplicates"`      // batches_total{outcome="duplicate"}
	InFlightWaits float64 `json:"in_flight_waits"` // batches_total{outcome="in_flight_wait"}
}

// MemoryResult is the proxy's memory per tracked (producer, partition).
type MemoryResult struct {
	Producers       int     `json:"producers"`
	Partitions      int     `json:"partitions"`
	Entries         float64 `json:"entries"`       // dedupproxy_seqstate_entries growth
	EntriesTotal    float64 `json:"entries_total"` // and its value at the end
	RSSBeforeMiB    float64 `json:"rss_before_mib"`
	RSSAfterMiB     float64 `json:"rss_after_mib"`
	RSSPerEntry     float64 `json:"rss_bytes_per_entry"`
	HeapPerEntry    float64 `json:"heap_inuse_bytes_per_entry"` // go_memstats_heap_inuse_bytes growth ÷ entries
	ExpectedEntries int     `json:"expected_entries"`           // producers × partitions, less the warm-up producer's
}

// Report is a whole run.
type Report struct {
	Machine Machine       `json:"machine"`
	Command string        `json:"command"`
	Config  Config        `json:"config"`
	Rows    []Row         `json:"rows"`
	Memory  *MemoryResult `json:"memory,omitempty"`
	// DedupCost compares dedup enforce with off, for idempotent producers.
	DedupCost *DedupCostResult `json:"dedup_cost,omitempty"`
	// LegacyDedupCost is DedupCost for legacy producers (idempotence off).
	LegacyDedupCost *DedupCostResult `json:"legacy_dedup_cost,omitempty"`
	Targets         []Target         `json:"targets"`
	Started         time.Time        `json:"started"`
	Took            string           `json:"took"`
}

// Machine describes where the numbers come from.
type Machine struct {
	NumCPU    int    `json:"nproc"`
	CPUModel  string `json:"cpu_model"`
	GoVersion string `json:"go_version"`
	Kernel    string `json:"kernel"`
	MemTotal  string `json:"mem_total"`
}

func describeMachine() Machine {
	m := Machine{NumCPU: runtime.NumCPU(), GoVersion: runtime.Version()}
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

// upstream is a running kfake cluster or sink.
type upstream struct {
	addrs []string
	close func()
}

func startUpstream(kind string, topics []string, partitions int) (*upstream, error) {
	switch kind {
	case "kfake":
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(partitions), topics...))
		if err != nil {
			return nil, err
		}
		return &upstream{addrs: c.ListenAddrs(), close: c.Close}, nil
	case "sink":
		s, err := StartSink("127.0.0.1:0", int32(partitions))
		if err != nil {
			return nil, err
		}
		return &upstream{addrs: []string{s.Addr()}, close: s.Close}, nil
	}
	return nil, fmt.Errorf("upstream %q: want kfake or sink", kind)
}

// scenario is one row: the load, its upstream, the shim's drop rate.
type scenario struct {
	name      string
	upstream  string
	dedup     string
	retryRate float64
	load      loadSpec
}

// Run runs every scenario of cfg and returns the report. dir holds the
// proxy binary and its config files.
func Run(ctx context.Context, cfg Config, dir string) (*Report, error) {
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	rep := &Report{Machine: describeMachine(), Config: cfg, Started: time.Now()}
	if cfg.ProxyBin == "" {
		log.Info("building the proxy", "dir", dir)
		bin, err := buildProxy(ctx, dir)
		if err != nil {
			return nil, err
		}
		cfg.ProxyBin = bin
	}
	topics := make([]string, cfg.Topics)
	for i := range topics {
		topics[i] = fmt.Sprintf("bench-%d", i)
	}
	base := loadSpec{
		Producers: cfg.Producers, Topics: topics, Linger: cfg.Linger, BatchBytes: int32(cfg.BatchBytes),
		Acks: cfg.Acks, Idempotent: cfg.Idempotent, BufferBytes: cfg.BufferBytes,
		Duration: cfg.Duration, Records: cfg.Records, Recovery: cfg.Recovery,
	}
	var scenarios []scenario
	for _, up := range cfg.Upstreams {
		for _, size := range cfg.Sizes {
			l := base
			l.RecordSize = size
			scenarios = append(scenarios, scenario{"batched", up, cfg.Dedup, cfg.RetryRate, l})
		}
		if cfg.RoundTrip > 0 {
			// One record per round trip, acks=all, no linger: the latency
			// the proxy adds to each request.
			l := base
			l.RecordSize, l.RoundTrip, l.Linger, l.Acks = cfg.RoundTrip, true, 0, "all"
			if l.Records > 0 {
				l.Records = max(l.Records/10, 10)
			}
			scenarios = append(scenarios, scenario{"roundtrip", up, cfg.Dedup, 0, l})
		}
		if cfg.LostAckRate > 0 {
			// Lost acknowledgements with idempotent producers: real
			// retries, which the proxy (enforce) or the broker must catch.
			l := base
			l.RecordSize, l.Idempotent, l.Acks = 1024, true, "all"
			scenarios = append(scenarios, scenario{"lostack", up, "enforce", cfg.LostAckRate, l})
		}
	}
	for _, sc := range scenarios {
		log.Info("scenario", "name", sc.name, "upstream", sc.upstream, "record_size", sc.load.RecordSize,
			"retry_rate", sc.retryRate, "dedup", sc.dedup)
		row, err := runScenario(ctx, cfg, dir, sc, log)
		if err != nil {
			return nil, fmt.Errorf("%s/%s/%dB: %w", sc.name, sc.upstream, sc.load.RecordSize, err)
		}
		rep.Rows = append(rep.Rows, row)
	}
	if cfg.DedupCostSize > 0 {
		log.Info("dedup cost scenario", "upstream", cfg.DedupCostUpstream, "record_size", cfg.DedupCostSize)
		dc, err := runDedupCost(ctx, cfg, dir, cfg.DedupCostUpstream, cfg.DedupCostSize, true /* idempotent */, log)
		if err != nil {
			return nil, fmt.Errorf("dedup cost: %w", err)
		}
		rep.DedupCost = dc
		ldc, err := runDedupCost(ctx, cfg, dir, cfg.DedupCostUpstream, cfg.DedupCostSize, false /* legacy */, log)
		if err != nil {
			return nil, fmt.Errorf("legacy dedup cost: %w", err)
		}
		rep.LegacyDedupCost = ldc
	}
	if cfg.MemProducers > 0 {
		log.Info("memory scenario", "producers", cfg.MemProducers, "partitions", cfg.MemPartitions)
		m, err := runMemory(ctx, cfg, dir)
		if err != nil {
			return nil, fmt.Errorf("memory: %w", err)
		}
		rep.Memory = m
	}
	rep.Targets = evaluateTargets(rep)
	rep.Took = time.Since(rep.Started).Round(time.Second).String()
	return rep, nil
}

// phaseAcc accumulates one target's phases.
type phaseAcc struct {
	sent, acked, failed, dropped int64
	elapsed                      time.Duration
	hist                         histogram
}

func (a *phaseAcc) side(size int) Side {
	s := Side{Sent: a.sent, Acked: a.acked, Failed: a.failed, Seconds: a.elapsed.Seconds(), AcksDropped: a.dropped}
	if s.Seconds > 0 {
		s.RecPerSec = float64(a.acked) / s.Seconds
		s.MBPerSec = float64(a.acked) * float64(size) / 1e6 / s.Seconds
	}
	s.P50us = us(a.hist.quantile(0.50))
	s.P99us = us(a.hist.quantile(0.99))
	s.P999us = us(a.hist.quantile(0.999))
	return s
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// runScenario starts the upstream and a proxy process in front of it, then
// alternates direct and proxied phases (direct first on even repetitions,
// proxy first on odd ones) so machine drift hits both alike.
func runScenario(ctx context.Context, cfg Config, dir string, sc scenario, log *slog.Logger) (Row, error) {
	row := Row{Scenario: sc.name, Upstream: sc.upstream, RecordSize: sc.load.RecordSize, Producers: sc.load.Producers,
		Acks: sc.load.Acks, Idempotent: sc.load.Idempotent, Dedup: sc.dedup, RetryRate: sc.retryRate}
	if sc.load.RoundTrip {
		row.Producers = 1
	}
	up, err := startUpstream(sc.upstream, sc.load.Topics, cfg.Partitions)
	if err != nil {
		return row, err
	}
	defer up.close()
	px, err := startProxy(ctx, cfg.ProxyBin, dir, up.addrs, sc.dedup)
	if err != nil {
		return row, err
	}
	defer px.stop()
	var dial func(context.Context, string, string) (net.Conn, error)
	var shim *Shim
	if sc.retryRate > 0 {
		shim = NewShim(sc.retryRate)
		defer shim.Close()
		dial = shim.Dial
	}

	var direct, proxied phaseAcc
	var cpu time.Duration
	var peak int64
	for rep := range max(cfg.Reps, 1) {
		order := []bool{false, true}
		if rep%2 == 1 {
			order = []bool{true, false}
		}
		for _, viaProxy := range order {
			acc, seeds := &direct, up.addrs
			if viaProxy {
				acc, seeds = &proxied, []string{px.bootstrap}
			}
			load := sc.load
			var before procStats
			var metricsBefore string
			var dropped0 int64
			load.OnStart = func() {
				if shim != nil {
					_, dropped0 = shim.Counts()
				}
				if viaProxy {
					resetPeak(px.pid)
					before, _ = readProc(px.pid)
					metricsBefore, _ = scrape(ctx, px.admin)
				}
			}
			res, err := runLoad(ctx, seeds, dial, load)
			if err != nil {
				return row, fmt.Errorf("%s phase: %w", target(viaProxy), err)
			}
			if viaProxy {
				after, err := readProc(px.pid)
				if err != nil {
					return row, fmt.Errorf("read the proxy's /proc: %w", err)
				}
				cpu += after.cpu - before.cpu
				peak = max(peak, after.hwm)
				metricsAfter, err := scrape(ctx, px.admin)
				if err != nil {
					return row, err
				}
				for _, m := range []struct {
					dst   *float64
					label string
				}{{&row.Duplicates, `outcome="duplicate"`}, {&row.InFlightWaits, `outcome="in_flight_wait"`}} {
					*m.dst += metricValue(metricsAfter, "dedupproxy_batches_total", m.label) -
						metricValue(metricsBefore, "dedupproxy_batches_total", m.label)
				}
			}
			if shim != nil {
				_, d := shim.Counts()
				acc.dropped += d - dropped0
			}
			acc.sent += res.Sent
			acc.acked += res.Acked
			acc.failed += res.Failed
			acc.elapsed += res.Elapsed
			acc.hist.merge(res.Hist)
			log.Info("phase", "scenario", sc.name, "upstream", sc.upstream, "size", sc.load.RecordSize, "rep", rep,
				"target", target(viaProxy), "acked", res.Acked, "failed", res.Failed,
				"rec_per_s", int(float64(res.Acked)/res.Elapsed.Seconds()),
				"p50", res.Hist.quantile(0.5).Round(time.Microsecond), "p99", res.Hist.quantile(0.99).Round(time.Microsecond))
			if res.Failed > 0 {
				log.Warn("records failed", "target", target(viaProxy), "first_err", res.FirstErr)
			}
		}
	}
	row.Direct = direct.side(sc.load.RecordSize)
	row.Proxy = proxied.side(sc.load.RecordSize)
	row.RatioRecPerSec = ratio(row.Proxy.RecPerSec, row.Direct.RecPerSec)
	row.RatioMBPerSec = ratio(row.Proxy.MBPerSec, row.Direct.MBPerSec)
	row.RatioP50 = ratio(row.Proxy.P50us, row.Direct.P50us)
	row.RatioP99 = ratio(row.Proxy.P99us, row.Direct.P99us)
	row.RatioP999 = ratio(row.Proxy.P999us, row.Direct.P999us)
	row.AddedP50us = row.Proxy.P50us - row.Direct.P50us
	row.AddedP99us = row.Proxy.P99us - row.Direct.P99us
	row.AddedP999us = row.Proxy.P999us - row.Direct.P999us
	row.ProxyCPUSeconds = cpu.Seconds()
	mb := float64(proxied.acked) * float64(sc.load.RecordSize) / 1e6
	if mb > 0 {
		row.ProxyCPUmsPerMB = cpu.Seconds() * 1e3 / mb
		row.ProxyCPUsPerGB = cpu.Seconds() / (mb / 1e3)
	}
	row.ProxyPeakRSSMiB = float64(peak) / (1 << 20)
	return row, nil
}

func target(viaProxy bool) string {
	if viaProxy {
		return "proxy"
	}
	return "direct"
}

// ratio is a/b, or NaN when b is 0 (reported as "n/a", never as a
// misleading infinity).
func ratio(a, b float64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return a / b
}

// runMemory measures the proxy's memory per tracked (producer, partition):
// MemProducers idempotent kgo producers each write one record to each of
// MemPartitions partitions of the sink through the proxy, so the table
// gains producers × partitions entries. Producers run a few at a time and
// close when done, so connection buffers do not pile up in the figure.
func runMemory(ctx context.Context, cfg Config, dir string) (*MemoryResult, error) {
	const topic = "mem"
	up, err := startUpstream("sink", []string{topic}, cfg.MemPartitions)
	if err != nil {
		return nil, err
	}
	defer up.close()
	px, err := startProxy(ctx, cfg.ProxyBin, dir, up.addrs, "enforce")
	if err != nil {
		return nil, err
	}
	defer px.stop()
	m := &MemoryResult{Producers: cfg.MemProducers, Partitions: cfg.MemPartitions,
		ExpectedEntries: (cfg.MemProducers - 1) * cfg.MemPartitions}

	produceAll := func() error {
		cl, err := kgo.NewClient(kgo.SeedBrokers(px.bootstrap), kgo.DefaultProduceTopic(topic),
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
	before, err := readProc(px.pid)
	if err != nil {
		return nil, err
	}
	mBefore, err := scrape(ctx, px.admin)
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
	after, err := readProc(px.pid)
	if err != nil {
		return nil, err
	}
	mAfter, err := scrape(ctx, px.admin)
	if err != nil {
		return nil, err
	}
	entriesBefore := metricValue(mBefore, "dedupproxy_seqstate_entries")
	m.EntriesTotal = metricValue(mAfter, "dedupproxy_seqstate_entries")
	grown := m.EntriesTotal - entriesBefore
	m.Entries = grown
	m.RSSBeforeMiB = float64(before.rss) / (1 << 20)
	m.RSSAfterMiB = float64(after.rss) / (1 << 20)
	if grown <= 0 {
		return m, errors.New("dedupproxy_seqstate_entries did not grow")
	}
	m.RSSPerEntry = float64(after.rss-before.rss) / grown
	m.HeapPerEntry = (metricValue(mAfter, "go_memstats_heap_inuse_bytes") - metricValue(mBefore, "go_memstats_heap_inuse_bytes")) / grown
	return m, nil
}
