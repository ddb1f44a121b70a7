// Package report is the bench's results: what a run measured (Report, its
// rows and sides, the memory and idle-connection figures, the run's
// Config), the performance targets held against it, and its writing as
// results.md, results.svg and results.json (bench/README.md). It runs
// nothing; package main measures and fills it in.
package report

import (
	"math"
	"slices"
	"time"
)

// Side is what one target (direct, its A/A twin, the floor relay, the
// proxy) achieved over all its phases of a row.
type Side struct {
	Phases    int     `json:"phases"`
	Sent      int64   `json:"sent"`
	Acked     int64   `json:"acked"` // produce: acknowledged; consume: records read
	Failed    int64   `json:"failed"`
	Seconds   float64 `json:"seconds"`
	RecPerSec float64 `json:"records_per_sec"`
	MBPerSec  float64 `json:"mb_per_sec"`
	P50us     float64 `json:"p50_us"`
	P99us     float64 `json:"p99_us"`
	P999us    float64 `json:"p999_us"`
	// AcksDropped is how many Produce acknowledgements the shim dropped.
	AcksDropped int64 `json:"acks_dropped"`
	// Stalled counts phases in which no record was acknowledged before the
	// phase's deadline: the producers filled their buffers and then waited
	// seconds for a first acknowledgement. It happens to every target,
	// direct included, under heavy load from other jobs (cause not found
	// yet: kgo or kfake), and such a phase drags its pairs' ratios.
	Stalled int `json:"stalled_phases"`
	// The target's own process (floor, proxy), from /proc during its
	// timed phases; zero for direct.
	CPUSeconds float64 `json:"cpu_seconds"`
	SysSeconds float64 `json:"sys_seconds"` // of CPUSeconds, in the kernel
	CPUmsPerMB float64 `json:"cpu_ms_per_mb"`
	PeakRSSMiB float64 `json:"peak_rss_mib"`
}

// Spread is a per-pair figure over a row's repetitions: its median and the
// smallest and largest pair. N counts the pairs that had the figure.
type Spread struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

// SpreadOf is the median, min and max of xs, leaving out NaN and
// infinities (pairs without the figure).
func SpreadOf(xs []float64) Spread {
	xs = slices.DeleteFunc(slices.Clone(xs), func(x float64) bool { return math.IsNaN(x) || math.IsInf(x, 0) })
	if len(xs) == 0 {
		return Spread{}
	}
	slices.Sort(xs)
	med := xs[len(xs)/2]
	if len(xs)%2 == 0 {
		med = (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
	}
	return Spread{Median: med, Min: xs[0], Max: xs[len(xs)-1], N: len(xs)}
}

// Row compares the targets of one scenario, upstream and record size. The
// first target is the reference (direct, or dedup off); every per-pair
// figure compares a target with the reference's phase of the same
// repetition.
type Row struct {
	Scenario   string  `json:"scenario"` // batched, roundtrip, consume, lostack, dedupcost
	Upstream   string  `json:"upstream"`
	RecordSize int     `json:"record_size"`
	Producers  int     `json:"producers"` // 0: one consumer
	Acks       string  `json:"acks"`
	Idempotent bool    `json:"idempotent"`
	Dedup      string  `json:"dedup"`
	RetryRate  float64 `json:"retry_rate"`
	Pairs      int     `json:"pairs"`

	Targets []string        `json:"targets"` // reference first
	Sides   map[string]Side `json:"sides"`
	// Per pair, target ÷ reference MB/s, target − reference latency, and
	// target ÷ reference CPU per MB (when both are measured processes).
	Throughput map[string]Spread `json:"throughput_ratio"`
	AddedP50us map[string]Spread `json:"added_p50_us"`
	AddedP99us map[string]Spread `json:"added_p99_us"`
	CPURatio   map[string]Spread `json:"cpu_per_mb_ratio,omitempty"`
	// Per phase CPU per MB of each measured target.
	CPUmsPerMB map[string]Spread `json:"cpu_ms_per_mb,omitempty"`

	// Scraped from the proxy's (dedup cost: the enforce proxy's) /metrics.
	Duplicates    float64 `json:"duplicates"`      // batches_total{outcome="duplicate"}
	InFlightWaits float64 `json:"in_flight_waits"` // batches_total{outcome="in_flight_wait"}
	Decided       float64 `json:"decided"`         // outcome accepted or legacy_accepted
}

// Ratio is a/b, or NaN when b is 0 (dropped from spreads, never reported as
// a misleading infinity).
func Ratio(a, b float64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return a / b
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

// Config is what a run was asked for, as results.json records it. The
// bench's flags (bench/main.go) document each field.
type Config struct {
	Upstreams   []string      `json:"upstreams"` // kfake (produce blackholed), sink
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
	// ProduceSplice is the proxy's produce_splice (records of large
	// idempotent batches moved socket to socket), on by default as in the
	// proxy; false measures the copy path.
	ProduceSplice bool          `json:"produce_splice"`
	RetryRate     float64       `json:"retry_rate"`   // lost acks in the throughput matrix
	LostAckRate   float64       `json:"lostack_rate"` // the separate lost-ack scenario; 0 skips it
	Duration      time.Duration `json:"duration"`     // per phase
	Records       int64         `json:"records"`      // per phase, 0 = duration only
	Reps          int           `json:"reps"`         // direct/proxy pairs per row
	// Recovery sets kgo's retry backoff and metadata min age (0 keeps kgo's
	// defaults). After a cut connection kgo refreshes metadata before
	// retrying, by default at most every 5s, so each lost acknowledgement
	// would stall a producer for up to 5s — longer than a phase.
	Recovery      time.Duration `json:"recovery"`
	RoundTrip     int           `json:"roundtrip_size"`
	MemProducers  int           `json:"mem_producers"` // memory scenario; 0 skips it
	MemPartitions int           `json:"mem_partitions"`
	// IdleConns is how many idle client connections the idle-connection
	// scenario opens to the proxy and to the floor relay; 0 skips it.
	IdleConns int `json:"idle_conns"`
	// DedupCostSize is the record size of the dedup-cost scenario (an
	// enforce and an off proxy, alternated); 0 skips it.
	DedupCostSize     int    `json:"dedupcost_size"`
	DedupCostUpstream string `json:"dedupcost_upstream"`
	// ConsumeMB is how many MB of ConsumeSize records the consume row
	// pre-fills (kfake keeping records) and then reads per phase; 0
	// skips it.
	ConsumeMB   int `json:"consume_mb"`
	ConsumeSize int `json:"consume_record_size"`
	// Peer names the peer proxy measured beside ours (-peer-name), if any.
	Peer string `json:"peer,omitempty"`
}

// Report is a whole run.
type Report struct {
	Machine Machine       `json:"machine"`
	Command string        `json:"command"`
	Config  Config        `json:"config"`
	Rows    []Row         `json:"rows"`
	Memory  *MemoryResult `json:"memory,omitempty"`
	Idle    *IdleResult   `json:"idle,omitempty"`
	Targets []Target      `json:"targets"`
	Started time.Time     `json:"started"`
	Took    string        `json:"took"`
	// LoadStart and LoadEnd are the machine's load averages (1, 5 and 15
	// minutes) when the run started and ended: how quiet it was.
	LoadStart [3]float64 `json:"loadavg_start"`
	LoadEnd   [3]float64 `json:"loadavg_end"`
}

// Machine describes where the numbers come from.
type Machine struct {
	NumCPU    int    `json:"nproc"`
	CPUModel  string `json:"cpu_model"`
	GoVersion string `json:"go_version"`
	Kernel    string `json:"kernel"`
	MemTotal  string `json:"mem_total"`
}

// IdleResult is what an idle client connection costs the proxy and the
// floor relay in memory: n connections that each sent one ApiVersions and
// read its answer, then stay open, measured from outside by RSS.
type IdleResult struct {
	Conns int                 `json:"conns"`
	Sides map[string]IdleSide `json:"sides"` // floor, proxy
}

// IdleSide is one process's RSS before the connections and with them open.
type IdleSide struct {
	RSSBeforeMiB float64 `json:"rss_before_mib"`
	RSSAfterMiB  float64 `json:"rss_after_mib"`
	// PerConnKiB is the RSS growth ÷ connections (KiB = 1024 B).
	PerConnKiB float64 `json:"rss_kib_per_conn"`
}

// IdleWarmConns are opened, used and closed before the "before" figure,
// so it includes a process that has served connections (pools, listeners,
// first allocations) rather than one that never has.
const IdleWarmConns = 64
