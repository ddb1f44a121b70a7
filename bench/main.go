// Command bench measures what dedupproxy costs: franz-go producers write
// through the proxy and directly to the same upstream in the same run,
// alternating the two, and the report gives each figure side by side with
// its proxy/direct ratio. See bench/README.md.
//
//	go run ./bench [flags]          # end-to-end run; writes bench/results/
//	go run ./bench micro [flags]    # hot-path micro-benchmarks, summarized
//	go run ./bench tls [flags]      # what TLS on both legs costs the proxy
//	go run ./bench replicas [flags] # replicas at 100 brokers: the simulation (docs/replicas.md)
//
// The end-to-end run re-executes this binary for its upstream, floor relay
// and load-generator processes (bench/proc, child.go).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dedupproxy/dedupproxy/bench/figures"
	"github.com/dedupproxy/dedupproxy/bench/micro"
	"github.com/dedupproxy/dedupproxy/bench/proc"
	"github.com/dedupproxy/dedupproxy/bench/report"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if proc.IsChild() {
		stop()
		os.Exit(proc.ChildMain(os.Args[1:]))
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	var err error
	if len(os.Args) > 1 && os.Args[1] == "micro" {
		err = micro.Main(ctx, os.Args[2:], os.Stdout, log)
	} else if len(os.Args) > 1 && os.Args[1] == "tls" {
		err = tlsMain(ctx, os.Args[2:], os.Stdout, log)
	} else if len(os.Args) > 1 && os.Args[1] == "replicas" {
		err = figures.ReplicasMain(ctx, os.Args[2:], os.Stdout, log)
	} else {
		err = runMain(ctx, os.Args[1:], os.Stdout, log)
	}
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		log.Error("bench failed", "err", err)
		stop()
		os.Exit(1)
	}
}

func runMain(ctx context.Context, args []string, stdout io.Writer, log *slog.Logger) error {
	cfg := defaultConfig()
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	upstreams := fs.String("upstreams", strings.Join(cfg.Upstreams, ","), "upstreams of the produce rows, each its own process: kfake (in-memory Kafka with produce blackholed: acknowledged, not stored) and/or sink (answers at once, keeps nothing); or cluster: the real cluster of DEDUPPROXY_TEST_UPSTREAM and its TLS and SASL variables (docs/real-cluster.md)")
	sizes := fs.String("sizes", "100,1024,10240", "record value sizes in bytes, comma-separated")
	fs.IntVar(&cfg.Producers, "producers", cfg.Producers, "concurrent kgo producer clients in batched phases")
	fs.IntVar(&cfg.Topics, "topics", cfg.Topics, "topics written round-robin")
	fs.IntVar(&cfg.Partitions, "partitions", cfg.Partitions, "partitions per topic")
	fs.DurationVar(&cfg.Linger, "linger", cfg.Linger, "kgo ProducerLinger in batched phases")
	fs.IntVar(&cfg.BatchBytes, "batch-bytes", cfg.BatchBytes, "kgo ProducerBatchMaxBytes")
	fs.Int64Var(&cfg.BufferBytes, "buffer-bytes", cfg.BufferBytes, "kgo MaxBufferedBytes per producer: bounds queueing in the closed loop")
	fs.StringVar(&cfg.Acks, "acks", cfg.Acks, "all, leader or none (idempotence needs all)")
	fs.BoolVar(&cfg.Idempotent, "idempotent", cfg.Idempotent, "idempotent producers (producer ids and sequences, what the proxy deduplicates)")
	fs.StringVar(&cfg.Dedup, "dedup", cfg.Dedup, "proxy dedup mode: enforce, observe or off")
	fs.BoolVar(&cfg.ProduceSplice, "produce-splice", cfg.ProduceSplice, "the proxy's produce_splice, on by default as in the proxy: records of large idempotent batches spliced socket to socket (Linux); -produce-splice=false measures the copy path")
	fs.Float64Var(&cfg.RetryRate, "retry-rate", cfg.RetryRate, "fraction of Produce acknowledgements the fault shim drops (cutting the connection) in batched phases; 0 runs without the shim")
	fs.Float64Var(&cfg.LostAckRate, "lostack-rate", cfg.LostAckRate, "drop rate of the separate lost-ack scenario (1 KiB, idempotent, enforce); 0 skips it")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "length of each phase (one target, one repetition)")
	fs.Int64Var(&cfg.Records, "records", cfg.Records, "records per phase (all producers); 0 = only -duration bounds a phase; whichever comes first ends it")
	fs.IntVar(&cfg.Reps, "reps", cfg.Reps, "repetitions per row, the pairs each ratio is the median of (the committed results use 5); each runs direct, A/A, floor, proxy, reversed on odd repetitions")
	fs.IntVar(&cfg.RoundTrip, "roundtrip-size", cfg.RoundTrip, "record size of the round-trip latency scenario (1 record per ProduceSync, acks=all); 0 skips it")
	fs.IntVar(&cfg.MemProducers, "mem-producers", cfg.MemProducers, "idempotent producers in the memory scenario (sink upstream); 0 skips it")
	fs.IntVar(&cfg.MemPartitions, "mem-partitions", cfg.MemPartitions, "partitions each memory-scenario producer writes")
	fs.IntVar(&cfg.IdleConns, "idle-conns", cfg.IdleConns, "client connections of the idle-connection scenario (one ApiVersions each, then idle), opened to the proxy and to the floor relay; 0 skips it")
	fs.DurationVar(&cfg.Recovery, "recovery", cfg.Recovery, "kgo retry backoff and metadata min age, how fast producers recover from a lost acknowledgement; 0 keeps kgo's defaults (metadata refresh at most every 5s)")
	fs.IntVar(&cfg.DedupCostSize, "dedupcost-size", cfg.DedupCostSize, "record size of the dedup-cost scenario (an enforce and an off proxy, same load, alternated); 0 skips it")
	fs.StringVar(&cfg.DedupCostUpstream, "dedupcost-upstream", cfg.DedupCostUpstream, "upstream of the dedup-cost scenario: sink or kfake")
	fs.IntVar(&cfg.ConsumeMB, "consume-mb", cfg.ConsumeMB, "MB pre-filled into a kfake that keeps records and read back per phase in the consume row; 0 skips it")
	fs.IntVar(&cfg.ConsumeSize, "consume-size", cfg.ConsumeSize, "record size of the consume row")
	fs.StringVar(&cfg.PeerBin, "peer-bin", "", "another proxy's binary (grepplabs/kafka-proxy, built from its source: bench/README.md, \"The peer\") measured beside the floor relay and the proxy; empty runs none")
	fs.StringVar(&cfg.Peer, "peer-name", "kafka-proxy v0.4.3", "what the report calls the -peer-bin proxy")
	fs.StringVar(&cfg.ProxyBin, "proxy-bin", "", "prebuilt dedupproxy binary; empty builds ./cmd/dedupproxy with deploy/build.sh into a temporary directory")
	out := fs.String("out", "bench/results", "directory for results.md, results.svg and results.json; empty writes none")
	timeout := fs.Duration("timeout", 20*time.Minute, "bound on the whole run")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	cfg.Upstreams = nil // empty: no produce rows
	if *upstreams != "" {
		cfg.Upstreams = strings.Split(*upstreams, ",")
	}
	cfg.Sizes = nil
	for _, s := range strings.Split(*sizes, ",") {
		if *sizes == "" {
			break // no batched rows
		}
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("-sizes: bad size %q", s)
		}
		cfg.Sizes = append(cfg.Sizes, n)
	}
	if cfg.PeerBin == "" {
		cfg.Peer = ""
	}
	if err := cfg.validate(); err != nil {
		return err
	}
	cfg.Log = log
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	dir, err := os.MkdirTemp("", "dedupproxy-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	rep, err := Run(ctx, cfg, dir)
	if err != nil {
		return err
	}
	rep.Command = strings.TrimSpace("go run ./bench " + strings.Join(args, " "))
	report.WriteMarkdown(stdout, rep)
	if *out != "" {
		if err := report.WriteResults(*out, rep); err != nil {
			return err
		}
		log.Info("wrote results", "dir", *out)
	}
	return nil
}

func (c *Config) validate() error {
	for _, u := range c.Upstreams {
		if u != "kfake" && u != "sink" && u != "cluster" {
			return fmt.Errorf("-upstreams: %q is not kfake, sink or cluster", u)
		}
	}
	switch {
	case c.Producers < 1 || c.Producers > 1024:
		return errors.New("-producers: want 1..1024")
	case c.Topics < 1 || c.Partitions < 1:
		return errors.New("-topics and -partitions must be at least 1")
	case c.Dedup != "enforce" && c.Dedup != "observe" && c.Dedup != "off":
		return fmt.Errorf("-dedup %q: want enforce, observe or off", c.Dedup)
	case c.Acks != "all" && c.Acks != "leader" && c.Acks != "none":
		return fmt.Errorf("-acks %q: want all, leader or none", c.Acks)
	case c.RetryRate < 0 || c.RetryRate >= 1 || c.LostAckRate < 0 || c.LostAckRate >= 1:
		return errors.New("-retry-rate and -lostack-rate: want 0 <= rate < 1")
	case c.RetryRate > 0 && c.Acks == "none":
		return errors.New("-retry-rate needs acknowledgements to drop: acks=none has none")
	case c.Duration <= 0 || c.Duration > 10*time.Minute:
		return errors.New("-duration: want 0 < d <= 10m")
	case c.ConsumeMB < 0 || (c.ConsumeMB > 0 && c.ConsumeSize < 1):
		return errors.New("-consume-mb: want >= 0, with -consume-size >= 1")
	case c.DedupCostUpstream != "kfake" && c.DedupCostUpstream != "sink":
		return fmt.Errorf("-dedupcost-upstream %q: want kfake or sink", c.DedupCostUpstream)
	case c.Reps < 1 || c.Reps > 100:
		return errors.New("-reps: want 1..100")
	case c.IdleConns < 0 || c.IdleConns > 8000:
		return errors.New("-idle-conns: want 0..8000")
	case c.MemProducers < 0 || c.MemProducers > 100_000 || (c.MemProducers > 0 && c.MemPartitions < 1):
		return errors.New("-mem-producers: want 0..100000, with -mem-partitions >= 1")
	}
	return nil
}
