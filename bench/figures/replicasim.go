package figures

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/dedupproxy/dedupproxy/bench/proc"
	"github.com/dedupproxy/dedupproxy/bench/report"
)

// ReplicasMain is `go run ./bench replicas`: the replicas design note's
// simulation (docs/replicas.md, "At 100 brokers"). It scales the figures
// this bench measured on one proxy — memory per tracked (producer,
// partition), per legacy record, CPU per MB produced, the cost of warming a
// partition from its tail — to a cluster of many brokers, partitions and
// producers served by R replicas, and prints, per replica count, what each
// replica holds and burns and what a replica restart costs in warm-up
// reads. Nothing it prints is guessed: every input is either a measured
// figure read from bench/results (named in the output) or a stated
// assumption given as a flag.
func ReplicasMain(_ context.Context, args []string, stdout io.Writer, _ *slog.Logger) error {
	fs := flag.NewFlagSet("bench replicas", flag.ContinueOnError)
	d := defaultReplicaModel()
	var m replicaModel
	fs.IntVar(&m.Brokers, "brokers", d.Brokers, "broker nodes in the cluster")
	fs.IntVar(&m.Partitions, "partitions", d.Partitions, "partitions, spread evenly over the brokers' leadership")
	fs.IntVar(&m.Producers, "producers", d.Producers, "producer clients")
	fs.Float64Var(&m.PartitionsPerProducer, "partitions-per-producer", d.PartitionsPerProducer, "partitions each producer writes to: one tracked (producer, partition) entry each")
	fs.Float64Var(&m.MBps, "mbps", d.MBps, "records produced through the proxies, MB/s (1 GB/s)")
	fs.Float64Var(&m.LegacyShare, "legacy-share", d.LegacyShare, "share of the bytes written by legacy producers (producer id -1)")
	fs.Float64Var(&m.RecordKB, "record-kb", d.RecordKB, "average legacy record size, KB: legacy records per second = legacy MB/s ÷ this")
	fs.DurationVar(&m.Hold, "hold", d.Hold, "how long a connection keeps its answered legacy records: the request timeout (librdkafka's and Java's 30 s) plus 1 s (docs/legacy.md, The rule)")
	fs.DurationVar(&m.Window, "window", d.Window, "dedup.legacy.window; a warm-up reads back twice this (docs/warm.md)")
	fs.IntVar(&m.WarmMaxBytes, "warm-max-bytes", d.WarmMaxBytes, "dedup.warm.max_bytes: the most a warm-up reads of one partition")
	fs.Float64Var(&m.FetchMBps, "broker-fetch-mbps", d.FetchMBps, "assumption: MB/s one broker serves to a replica's tail reads (page cache)")
	fs.Float64Var(&m.CoresPerReplica, "cores", d.CoresPerReplica, "assumption: cores a replica has for applying warm-up reads")
	fs.Float64Var(&m.ConnsPerProducer, "conns-per-producer", d.ConnsPerProducer, "connections each producer holds open to the proxies (one per broker it writes to)")
	replicas := fs.String("replicas", "3,5,10,20,50", "replica counts to compare, comma-separated")
	results := fs.String("results", "", "bench results directory with results.json and micro.md (default: bench/results of the module)")
	out := fs.String("out", "", "also write the report (markdown) to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dir := *results
	if dir == "" {
		root, err := proc.ModuleRoot()
		if err != nil {
			return err
		}
		dir = filepath.Join(root, "bench", "results")
	}
	in, err := readMeasured(dir)
	if err != nil {
		return err
	}
	var counts []int
	for _, s := range strings.Split(*replicas, ",") {
		r, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || r < 1 || r > m.Brokers {
			return fmt.Errorf("-replicas %q: want counts between 1 and the broker count", s)
		}
		counts = append(counts, r)
	}
	var b strings.Builder
	writeReplicaReport(&b, m, in, counts)
	io.WriteString(stdout, b.String())
	if *out != "" {
		return os.WriteFile(*out, []byte(b.String()), 0o644)
	}
	return nil
}

// defaultReplicaModel is the cluster docs/replicas.md, "At 100 brokers",
// describes: the defaults of go run ./bench replicas.
func defaultReplicaModel() replicaModel {
	return replicaModel{Brokers: 100, Partitions: 100000, Producers: 1000000, PartitionsPerProducer: 1, MBps: 1000,
		LegacyShare: 0.5, RecordKB: 1, Hold: 31 * time.Second, Window: 2 * time.Minute, WarmMaxBytes: 4 << 20,
		FetchMBps: 200, CoresPerReplica: 2, ConnsPerProducer: 1}
}

// replicaModel is the cluster and the assumptions.
type replicaModel struct {
	Brokers, Partitions, Producers int
	PartitionsPerProducer, MBps    float64
	LegacyShare, RecordKB          float64
	Hold, Window                   time.Duration
	WarmMaxBytes                   int
	FetchMBps, CoresPerReplica     float64
	ConnsPerProducer               float64
}

// measured are the figures read from the bench's committed results.
type measured struct {
	EntryBytes  float64 // RSS per tracked (producer, partition): results.json memory
	RecordBytes float64 // per legacy record remembered, indexed: micro.md LegacyMemory
	CPUmsPerMB  float64 // the proxy's CPU per MB produced, 1 KiB records: results.json
	ConnKiB     float64 // RSS per idle client connection: results.json idle (64 KiB of read buffers before it was measured)
	WarmMsPerMB float64 // reading and applying a 4 MiB tail, per MB: micro.md WarmPartition
	WarmFixedMs float64 // the same, the part that does not grow with the tail (1 MiB vs 4 MiB)
	Source      string
}

var microRow = regexp.MustCompile(`^\| (\S+) \| ([0-9.e+]+) [^|]*\|[^|]*\|[^|]*\|(.*)\|$`)

// readMeasured reads the figures from dir's results.json and micro.md.
func readMeasured(dir string) (measured, error) {
	var in measured
	raw, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		return in, err
	}
	var res struct {
		Started string `json:"started"`
		Memory  struct {
			RSSPerEntry float64 `json:"rss_bytes_per_entry"`
		} `json:"memory"`
		Idle *report.IdleResult `json:"idle"`
		Rows []struct {
			Scenario   string `json:"scenario"`
			RecordSize int    `json:"record_size"`
			Sides      map[string]struct {
				CPUmsPerMB float64 `json:"cpu_ms_per_mb"`
			} `json:"sides"`
		} `json:"rows"`
	}
	if err := json.Unmarshal(raw, &res); err != nil {
		return in, fmt.Errorf("results.json: %w", err)
	}
	in.EntryBytes = res.Memory.RSSPerEntry
	in.ConnKiB = 64 // two 32 KiB read buffers, what a connection held before the bench measured it
	if res.Idle != nil && res.Idle.Sides["proxy"].PerConnKiB > 0 {
		in.ConnKiB = res.Idle.Sides["proxy"].PerConnKiB
	}
	for _, r := range res.Rows {
		if r.Scenario == "batched" && r.RecordSize == 1024 {
			in.CPUmsPerMB = r.Sides["proxy"].CPUmsPerMB
		}
	}
	f, err := os.Open(filepath.Join(dir, "micro.md"))
	if err != nil {
		return in, err
	}
	defer f.Close()
	warm := map[string][2]float64{} // tail → ns/op, bytes/op
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m := microRow.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		ns, _ := strconv.ParseFloat(m[2], 64)
		other := m[3]
		switch {
		case strings.HasPrefix(m[1], "WarmPartition/"):
			if v, ok := unitValue(other, "bytes/op"); ok {
				warm[m[1]] = [2]float64{ns, v}
			}
		case m[1] == "LegacyMemory":
			if v, ok := unitValue(other, "B/record"); ok {
				in.RecordBytes = v
			}
		}
	}
	small, big := warm["WarmPartition/tail=1MiB"], warm["WarmPartition/tail=4MiB"]
	if big[1] > small[1] && small[1] > 0 {
		// Two points: a fixed part (round trips, set-up) and a part per MB.
		perByte := (big[0] - small[0]) / (big[1] - small[1])
		in.WarmMsPerMB = perByte * 1e6 / 1e6
		in.WarmFixedMs = math.Max(0, small[0]-perByte*small[1]) / 1e6
	}
	if in.EntryBytes == 0 || in.RecordBytes == 0 || in.CPUmsPerMB == 0 || in.WarmMsPerMB == 0 {
		return in, errors.New("bench results lack a figure the simulation needs (results.json memory and 1 KiB batched row, micro.md LegacyMemory and WarmPartition): run go run ./bench and go run ./bench micro -out bench/results/micro.md")
	}
	in.Source = fmt.Sprintf("bench/results of %s", res.Started)
	return in, nil
}

// unitValue finds "<number> ± ... <unit>" in a micro.md "other" cell.
func unitValue(cell, unit string) (float64, bool) {
	for _, part := range strings.Split(cell, ";") {
		part = strings.TrimSpace(part)
		if !strings.HasSuffix(part, unit) {
			continue
		}
		f := strings.Fields(part)
		if len(f) == 0 {
			return 0, false
		}
		v, err := strconv.ParseFloat(f[0], 64)
		return v, err == nil
	}
	return 0, false
}

// replicaFigures is what one replica count gives.
type replicaFigures struct {
	R                     int
	NodesMax              int     // the most brokers one replica owns
	EntriesMB, LegacyMB   float64 // tables of the busiest replica
	ConnMB                float64 // connection buffers of the busiest replica
	Cores                 float64 // CPU at the modelled rate, busiest replica
	MovedPartitions       int     // partitions of one replica's nodes
	WarmGB                float64 // read at one restart: by the takeovers, then again by the replica
	FetchSeconds, CPUSecs float64
	WarmSeconds           float64 // one warm-up wave, the slower of fetching and applying
	FirstBatchWaitMs      float64 // a partition's first batch after the move, when its broker is idle
	TailMB                float64 // read of one partition
	LegacyRecordsHeld     float64 // per replica: records whose answer may not have been read
}

func simulate(m replicaModel, in measured, r int) replicaFigures {
	f := replicaFigures{R: r}
	// Brokers go to replicas by node id mod R: the busiest replica owns
	// ceil(B/R) of them, and its share of partitions, producers and bytes.
	f.NodesMax = (m.Brokers + r - 1) / r
	share := float64(f.NodesMax) / float64(m.Brokers)
	entries := float64(m.Producers) * m.PartitionsPerProducer * share
	f.EntriesMB = entries * in.EntryBytes / 1e6
	// A connection keeps the records of its answered requests for their
	// hold (docs/legacy.md): at most the legacy records of that long,
	// counted at the indexed size (an upper bound: a live one takes 16 B).
	legacyRecordsPerSec := m.MBps * m.LegacyShare * 1000 / m.RecordKB
	f.LegacyRecordsHeld = legacyRecordsPerSec * m.Hold.Seconds() * share
	f.LegacyMB = f.LegacyRecordsHeld * in.RecordBytes / 1e6
	// What an idle connection costs, measured (a busy one holds its
	// requests and responses in flight besides).
	f.ConnMB = float64(m.Producers) * m.ConnsPerProducer * share * in.ConnKiB * 1024 / 1e6
	f.Cores = m.MBps * share * in.CPUmsPerMB / 1000
	// A restart: the replica's nodes move to its peers, whose first batch
	// on each partition reads its tail, and come back, read again.
	f.MovedPartitions = int(float64(m.Partitions) * share)
	perPartitionMBps := m.MBps / float64(m.Partitions)
	tailMB := math.Min(float64(m.WarmMaxBytes)/1e6, perPartitionMBps*2*m.Window.Seconds())
	f.TailMB = tailMB
	moveMB := float64(f.MovedPartitions) * tailMB
	f.WarmGB = 2 * moveMB / 1000
	// One wave (the takeover's, or the return's): the brokers of the
	// moved nodes serve the reads, the replicas apply them.
	f.FetchSeconds = moveMB / (float64(f.NodesMax) * m.FetchMBps)
	takeovers := float64(min(r-1, f.NodesMax))
	if takeovers < 1 {
		takeovers = 1
	}
	f.CPUSecs = moveMB*in.WarmMsPerMB/1000 + float64(f.MovedPartitions)*in.WarmFixedMs/1000
	f.WarmSeconds = math.Max(f.FetchSeconds, f.CPUSecs/(takeovers*m.CoresPerReplica))
	f.FirstBatchWaitMs = in.WarmFixedMs + tailMB*in.WarmMsPerMB
	return f
}

func writeReplicaReport(w io.Writer, m replicaModel, in measured, counts []int) {
	fmt.Fprintf(w, "# Replicas at scale: the simulation\n\n")
	fmt.Fprintf(w, "Generated by `go run ./bench replicas` (bench/figures/replicasim.go); docs/replicas.md explains it.\n\n")
	fmt.Fprintf(w, "Cluster: %d brokers, %d partitions, %d producers writing %.0f partition(s) each, %.0f MB/s through the proxies, %.0f %% of it from legacy producers in %.0f KB records, each kept %s after its answer; dedup.legacy.window %s, dedup.warm.max_bytes %d.\n\n",
		m.Brokers, m.Partitions, m.Producers, m.PartitionsPerProducer, m.MBps, m.LegacyShare*100, m.RecordKB, m.Hold, m.Window, m.WarmMaxBytes)
	fmt.Fprintf(w, "Measured (%s): %.0f B of RSS per tracked (producer, partition); %.0f B per legacy record remembered; %.3f ms of proxy CPU per MB produced (1 KiB records, dedup enforced); a partition's warm-up costs %.2f ms plus %.2f ms per MB of tail read (BenchmarkWarmPartition, kfake in the same process, so an upper bound for the proxy's part).\n\n",
		in.Source, in.EntryBytes, in.RecordBytes, in.CPUmsPerMB, in.WarmFixedMs, in.WarmMsPerMB)
	fmt.Fprintf(w, "Assumed: a broker serves %.0f MB/s of tail reads to the replicas; a replica applies them on %.0f cores; %.0f connection(s) per producer, each costing %.1f KiB of RSS (an idle connection, measured; one busy holds its requests and responses in flight besides).\n\n",
		m.FetchMBps, m.CoresPerReplica, m.ConnsPerProducer, in.ConnKiB)
	fmt.Fprintf(w, "Per replica, the busiest (it owns ⌈brokers ÷ R⌉ nodes):\n\n")
	fmt.Fprintf(w, "| replicas | nodes | producer table | legacy records held | connections | CPU at %.0f MB/s |\n|---|---|---|---|---|---|\n", m.MBps)
	for _, r := range counts {
		f := simulate(m, in, r)
		fmt.Fprintf(w, "| %d | %d | %s | %s (%.2g records) | %s | %.2f cores |\n", r, f.NodesMax, mb(f.EntriesMB), mb(f.LegacyMB), f.LegacyRecordsHeld, mb(f.ConnMB), f.Cores)
	}
	fmt.Fprintf(w, "\nOne replica restarted (a rolling upgrade does this R times): its nodes' partitions are warmed by the replicas that cover them, then again by the replica when it takes them back. A wave takes the slower of the brokers serving the tails and the replicas applying them; a partition's first batch after a move waits for its own warm-up:\n\n")
	fmt.Fprintf(w, "| replicas | partitions moved | tail read per partition | read per restart | one wave: fetching | one wave: applying (CPU) | one wave | first batch's wait, idle broker |\n|---|---|---|---|---|---|---|---|\n")
	for _, r := range counts {
		f := simulate(m, in, r)
		fmt.Fprintf(w, "| %d | %d | %.2f MB | %.1f GB | %.1f s | %.0f CPU-s | %.1f s | %.0f ms |\n", r, f.MovedPartitions, f.TailMB, f.WarmGB, f.FetchSeconds, f.CPUSecs, f.WarmSeconds, f.FirstBatchWaitMs)
	}
}

func mb(v float64) string {
	if v >= 1000 {
		return fmt.Sprintf("%.1f GB", v/1000)
	}
	return fmt.Sprintf("%.0f MB", v)
}
