// Package load is the bench's load generator: kgo producers or a consumer
// running one measured phase against a set of seeds, and the latency
// histogram it fills. A load child process runs it (bench/proc); the TLS
// scenario runs it in the bench process.
package load

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dedupproxy/dedupproxy/internal/testcluster"
)

// Histogram is a lock-free log-linear latency histogram: 128 linear
// sub-buckets per power of two of nanoseconds, so a quantile is within
// 0.8% of the true value. Millions of records per phase cannot each be kept.
type Histogram struct {
	counts [64 * histSub]atomic.Uint64
}

const histSubBits = 7
const histSub = 1 << histSubBits

func bucketIndex(ns int64) int {
	if ns < histSub {
		if ns < 0 {
			ns = 0
		}
		return int(ns)
	}
	exp := bits.Len64(uint64(ns)) - histSubBits // >= 1
	sub := int(ns>>(exp-1)) - histSub           // 0..histSub-1
	return exp*histSub + sub
}

// bucketValue is the midpoint of bucket i.
func bucketValue(i int) int64 {
	exp, sub := i/histSub, i%histSub
	if exp == 0 {
		return int64(sub)
	}
	lo := int64(histSub+sub) << (exp - 1)
	return lo + (int64(1)<<(exp-1))/2
}

// Record counts one latency.
func (h *Histogram) Record(d time.Duration) { h.counts[bucketIndex(int64(d))].Add(1) }

// Merge adds o's counts to h.
func (h *Histogram) Merge(o *Histogram) {
	for i := range o.counts {
		if c := o.counts[i].Load(); c > 0 {
			h.counts[i].Add(c)
		}
	}
}

// Total is the number of latencies counted.
func (h *Histogram) Total() uint64 {
	var n uint64
	for i := range h.counts {
		n += h.counts[i].Load()
	}
	return n
}

// Sparse is h as (bucket index, count) pairs of its non-empty buckets: how
// a load child hands its histogram to the bench.
func (h *Histogram) Sparse() [][2]uint64 {
	var out [][2]uint64
	for i := range h.counts {
		if c := h.counts[i].Load(); c > 0 {
			out = append(out, [2]uint64{uint64(i), c})
		}
	}
	return out
}

// FromSparse is the histogram of Sparse's pairs; pairs naming a bucket
// that does not exist are left out.
func FromSparse(pairs [][2]uint64) *Histogram {
	h := new(Histogram)
	for _, b := range pairs {
		if b[0] < uint64(len(h.counts)) {
			h.counts[b[0]].Store(b[1])
		}
	}
	return h
}

// Quantile returns the q-quantile (0 < q <= 1), or 0 with no samples.
func (h *Histogram) Quantile(q float64) time.Duration {
	n := h.Total()
	if n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(n)))
	if rank == 0 {
		rank = 1
	}
	var seen uint64
	for i := range h.counts {
		seen += h.counts[i].Load()
		if seen >= rank {
			return time.Duration(bucketValue(i))
		}
	}
	return 0
}

// Spec is what one measured phase runs.
type Spec struct {
	Producers   int
	Topics      []string
	RecordSize  int
	Linger      time.Duration
	BatchBytes  int32
	Acks        string // all, leader, none
	Idempotent  bool
	BufferBytes int64         // per producer, bounds queueing latency
	Duration    time.Duration // phase length bound
	Records     int64         // record bound (all producers); 0 = none
	RoundTrip   bool          // one producer, one record per ProduceSync
	Recovery    time.Duration // retry backoff and metadata min age; 0 = kgo's defaults
	// Seeds are the bootstrap addresses (a load child's; Run takes
	// them as an argument).
	Seeds []string
	// RetryRate makes a load child dial through a fault shim dropping
	// this fraction of Produce acknowledgements; 0 dials directly.
	RetryRate float64
	// Consume reads ConsumeRecords records of Topics[0] from the start
	// instead of producing, bounded by Duration.
	Consume        bool
	ConsumeRecords int64
	// Cluster: Seeds are the real cluster of DEDUPPROXY_TEST_UPSTREAM, and
	// the producers reach it with its TLS and SASL; SASL: they reach a
	// relay in front of it (the proxy, the floor) and authenticate with
	// its SASL through it. The load child reads the cluster from the
	// environment it inherits.
	Cluster, SASL bool
	// OnStart runs after warm-up, right before the timed window, so
	// process figures (CPU, peak RSS) exclude client set-up.
	OnStart func() `json:"-"`
}

// Result is what one phase measured, client side.
type Result struct {
	Sent, Acked, Failed int64
	Bytes               int64 // record value bytes acknowledged or consumed
	AckedInWindow       int64 // produce: acknowledged before the phase's deadline
	Elapsed             time.Duration
	Hist                *Histogram
	FirstErr            error
}

// maxRecordsPerPhase bounds a phase in count even when only a duration was
// asked for.
const maxRecordsPerPhase = 200_000_000

// Run drives spec.Producers kgo clients at seeds (dialing through dial
// when set) until the duration or record bound, then flushes.
func Run(ctx context.Context, seeds []string, dial func(context.Context, string, string) (net.Conn, error), spec Spec) (Result, error) {
	if spec.Consume {
		return runConsume(ctx, seeds, spec)
	}
	res := Result{Hist: new(Histogram)}
	producers := spec.Producers
	if spec.RoundTrip {
		producers = 1
	}
	clients := make([]*kgo.Client, 0, producers)
	defer func() {
		for _, cl := range clients {
			cl.Close()
		}
	}()
	value := make([]byte, spec.RecordSize)
	for i := range value {
		value[i] = byte('a' + i%26)
	}
	phase := time.Now().UnixNano() // names this phase's producers
	for p := range producers {
		opts := []kgo.Opt{
			kgo.SeedBrokers(seeds...),
			// Each producer is a service of its own, in each phase: its
			// own client id, so its own client instance to the proxy
			// (docs/legacy.md, "Scope"). A phase's producers are long-lived
			// services whose connections stay open; the same instance
			// reconnecting every phase would have the proxy look each
			// record up among those of its closed connections (the
			// reconnect row of docs/legacy.md, "Bounded and cheap",
			// BenchmarkDecideLegacyAfterReconnect).
			kgo.ClientID(fmt.Sprintf("bench-%d-producer-%d", phase, p)),
			kgo.ProducerLinger(spec.Linger),
			kgo.ProducerBatchMaxBytes(spec.BatchBytes),
			kgo.ProducerBatchCompression(kgo.NoCompression()),
			kgo.MaxBufferedBytes(int(spec.BufferBytes)),
			kgo.RecordDeliveryTimeout(60 * time.Second),
			kgo.RetryTimeout(30 * time.Second),
		}
		switch spec.Acks {
		case "all":
			opts = append(opts, kgo.RequiredAcks(kgo.AllISRAcks()))
		case "leader":
			opts = append(opts, kgo.RequiredAcks(kgo.LeaderAck()))
		case "none":
			opts = append(opts, kgo.RequiredAcks(kgo.NoAck()))
		default:
			return res, fmt.Errorf("acks %q: want all, leader or none", spec.Acks)
		}
		if !spec.Idempotent || spec.Acks != "all" {
			opts = append(opts, kgo.DisableIdempotentWrite()) // kgo requires acks=all for idempotence
		}
		if spec.Recovery > 0 {
			opts = append(opts, kgo.RetryBackoffFn(func(int) time.Duration { return spec.Recovery }),
				kgo.MetadataMinAge(spec.Recovery))
		}
		if os.Getenv("BENCH_KGO_LOG") != "" { // client-side debugging of a run
			opts = append(opts, kgo.WithLogger(kgo.BasicLogger(os.Stderr, kgo.LogLevelDebug, nil)))
		}
		if dial != nil {
			opts = append(opts, kgo.Dialer(dial))
		}
		if spec.Cluster || spec.SASL {
			more, err := clusterOpts(spec.Cluster)
			if err != nil {
				return res, err
			}
			opts = append(opts, more...)
		}
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			return res, err
		}
		clients = append(clients, cl)
		// Warm up outside the measurement: metadata, connections and the
		// producer id (InitProducerId) for every topic.
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		for _, t := range spec.Topics {
			if err := cl.ProduceSync(wctx, &kgo.Record{Topic: t, Value: value}).FirstErr(); err != nil {
				cancel()
				return res, fmt.Errorf("warm-up produce: %w", err)
			}
		}
		cancel()
	}

	limit := spec.Records
	if limit <= 0 || limit > maxRecordsPerPhase {
		limit = maxRecordsPerPhase
	}
	// claimed enforces the record bound across producers; issued counts
	// records actually handed to kgo, which after Flush must equal acked +
	// failed (every promise has run).
	// inWindow counts acknowledgements that arrived before the deadline: a
	// phase with none stalled (see report.Side.Stalled).
	var claimed, issued, acked, failed, inWindow atomic.Int64
	var errOnce sync.Once
	if spec.OnStart != nil {
		spec.OnStart()
	}
	start := time.Now()
	deadline := start.Add(spec.Duration)
	var wg sync.WaitGroup
	for p, cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := p; ; i++ {
				now := time.Now()
				if now.After(deadline) || ctx.Err() != nil || claimed.Add(1) > limit {
					return
				}
				rec := &kgo.Record{Topic: spec.Topics[i%len(spec.Topics)], Value: value}
				if !spec.Idempotent {
					// Legacy records are deduplicated by content
					// (docs/legacy.md): a producer of a later phase
					// (the same client instance, its connections
					// closed in between) sending the same records
					// would be taken for a retry. A header makes each
					// record unique, in this phase and across phases,
					// without moving it to another partition.
					rec.Headers = []kgo.RecordHeader{{Key: "n", Value: binary.BigEndian.AppendUint64(
						binary.BigEndian.AppendUint64(nil, uint64(start.UnixNano())), uint64(i)<<16|uint64(p))}}
				}
				issued.Add(1)
				if spec.RoundTrip {
					err := cl.ProduceSync(ctx, rec).FirstErr()
					res.Hist.Record(time.Since(now))
					if err != nil {
						failed.Add(1)
						errOnce.Do(func() { res.FirstErr = err })
						continue
					}
					acked.Add(1)
					if time.Now().Before(deadline) {
						inWindow.Add(1)
					}
					continue
				}
				cl.Produce(ctx, rec, func(_ *kgo.Record, err error) {
					res.Hist.Record(time.Since(now))
					if err != nil {
						failed.Add(1)
						errOnce.Do(func() { res.FirstErr = err })
						return
					}
					acked.Add(1)
					if time.Now().Before(deadline) {
						inWindow.Add(1)
					}
				})
			}
		}()
	}
	wg.Wait()
	fctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	for _, cl := range clients {
		if err := cl.Flush(fctx); err != nil {
			return res, fmt.Errorf("flush: %w", err)
		}
	}
	res.Elapsed = time.Since(start)
	res.Sent = issued.Load()
	res.Acked, res.Failed, res.AckedInWindow = acked.Load(), failed.Load(), inWindow.Load()
	res.Bytes = res.Acked * int64(spec.RecordSize)
	if res.Acked == 0 {
		return res, errors.Join(errors.New("no record acknowledged"), res.FirstErr)
	}
	return res, nil
}

// runConsume reads spec.ConsumeRecords records of spec.Topics[0] from the
// start with one kgo consumer. The client is made after OnStart, so its
// first connections are inside the timed window: a few round trips against
// a phase that fetches hundreds of MB.
func runConsume(ctx context.Context, seeds []string, spec Spec) (Result, error) {
	res := Result{Hist: new(Histogram)}
	if spec.OnStart != nil {
		spec.OnStart()
	}
	start := time.Now()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumeTopics(spec.Topics[0]),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		return res, err
	}
	defer cl.Close()
	pctx, cancel := context.WithTimeout(ctx, spec.Duration)
	defer cancel()
	for res.Acked < spec.ConsumeRecords {
		fs := cl.PollFetches(pctx)
		if err := pctx.Err(); err != nil {
			return res, fmt.Errorf("consumed %d of %d records: %w", res.Acked, spec.ConsumeRecords, err)
		}
		fs.EachError(func(_ string, _ int32, err error) {
			if res.FirstErr == nil {
				res.FirstErr = err
			}
			res.Failed++
		})
		fs.EachRecord(func(r *kgo.Record) {
			res.Acked++
			res.Bytes += int64(len(r.Value))
		})
	}
	res.Elapsed = time.Since(start)
	res.Sent, res.AckedInWindow = res.Acked, res.Acked
	return res, nil
}

// ClusterFromEnv is the real cluster of the environment a load child
// inherits (DEDUPPROXY_TEST_UPSTREAM).
func ClusterFromEnv() (*testcluster.Cluster, error) {
	dir, err := os.MkdirTemp("", "dedupproxy-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir) // clients hold the password in memory
	c, err := testcluster.FromEnv(dir)
	if err == nil && c == nil {
		err = fmt.Errorf("%s is not set", testcluster.EnvUpstream)
	}
	return c, err
}

// clusterOpts are the options that reach the real cluster of the
// environment: its TLS and SASL when direct, its SASL alone through a
// relay.
func clusterOpts(direct bool) ([]kgo.Opt, error) {
	c, err := ClusterFromEnv()
	if err != nil {
		return nil, err
	}
	if direct {
		return c.ClientOpts()
	}
	if mech := c.ClientSASL(); mech != nil {
		return []kgo.Opt{kgo.SASL(mech)}, nil
	}
	return nil, nil
}
