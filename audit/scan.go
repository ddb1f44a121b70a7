package audit

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dedupproxy/dedupproxy/clock"
)

// ScanSettings say what to read and what counts as a copy.
type ScanSettings struct {
	Settings
	Topic string
	// Partitions to read; empty: all.
	Partitions []int32
	// From and To bound the records counted by timestamp, both included;
	// zero: the topic's start, and its end when the scan starts. A
	// partition is read from the first offset whose timestamp is at or
	// after From (Kafka's ListOffsets by time) up to the first whose
	// timestamp is past To + Window (a retry keeps its original's
	// timestamp but is appended later); records read whose own timestamp
	// is outside the range are skipped.
	From, To time.Time
	// Progress, when set, is called every ProgressEvery (default 5s)
	// during the scan and once at its end, from Scan's goroutine.
	Progress      func(Progress)
	ProgressEvery time.Duration
	// IdleTimeout ends the reading of partitions that yield no record for
	// this long short of their end offset: their last offsets hold no
	// record (transaction markers, compaction) or the cluster does not
	// answer. Default 5s.
	IdleTimeout time.Duration
	// Clock times the scan (progress, idle partitions, elapsed time);
	// nil: the real clock.
	Clock clock.Clock
}

// Progress is how far a scan has come.
type Progress struct {
	Records, Expected  int64 // read so far; offsets in the range (an upper bound of the records)
	Copies, KeyRepeats int64
	Bytes              int64
	Elapsed            time.Duration
	Done, Partitions   int // partitions read to their end, of those with records to read
}

// Fetch bounds: the consumer holds at most a few fetches of fetchMaxBytes
// besides the finder's tables.
const (
	fetchMaxBytes     = 8 << 20
	fetchPartitionMax = 1 << 20
	maxFetches        = 2
)

// ErrNoTopic: the topic does not exist or cannot be described.
var ErrNoTopic = errors.New("audit: no such topic")

// Scan reads the topic with a franz-go consumer made from opts (the seed
// brokers, TLS and SASL: see internal/upstream) and returns what it found.
// It reads committed records only (read_committed), as consumers see them.
func Scan(ctx context.Context, opts []kgo.Opt, s ScanSettings) (Report, error) {
	clk := s.Clock
	if clk == nil {
		clk = clock.Real
	}
	start := clk.Now()
	if s.ProgressEvery <= 0 {
		s.ProgressEvery = 5 * time.Second
	}
	if s.IdleTimeout <= 0 {
		s.IdleTimeout = 10 * time.Second
	}
	admCl, err := kgo.NewClient(opts...)
	if err != nil {
		return Report{}, err
	}
	adm := kadm.NewClient(admCl)
	starts, ends, err := offsetRange(ctx, adm, s)
	admCl.Close()
	if err != nil {
		return Report{}, err
	}

	f := NewFinder(s.Settings)
	consume := map[int32]kgo.Offset{}
	var expected int64
	for p, from := range starts {
		if to := ends[p]; from < to {
			consume[p] = kgo.NewOffset().At(from)
			expected += to - from
			f.Expect(p)
		}
	}
	rep := func() Report {
		r := f.Report()
		r.Topic, r.From, r.To, r.Elapsed = s.Topic, s.From, s.To, clk.Now().Sub(start)
		return r
	}
	if len(consume) == 0 {
		return rep(), nil
	}

	cl, err := kgo.NewClient(append(slices.Clip(opts),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{s.Topic: consume}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// Transaction markers take offsets: seeing them tells a
		// partition that ends in one that it has been read to its end.
		kgo.KeepControlRecords(),
		kgo.FetchMaxBytes(fetchMaxBytes),
		kgo.FetchMaxPartitionBytes(fetchPartitionMax),
		kgo.MaxConcurrentFetches(maxFetches),
		kgo.FetchMaxWait(500*time.Millisecond),
	)...)
	if err != nil {
		return Report{}, err
	}
	defer cl.Close()

	next := map[int32]int64{} // next offset to read, per partition still read
	for p := range consume {
		next[p] = starts[p]
	}
	var (
		read     int64
		lastRec  = clk.Now()
		lastTell = clk.Now()
		rec      Record
		stopped  []string
	)
	tell := func() {
		if s.Progress == nil {
			return
		}
		r := f.Report()
		s.Progress(Progress{Records: read, Expected: expected, Copies: r.Copies, KeyRepeats: r.KeyRepeats,
			Bytes: r.Bytes, Elapsed: clk.Now().Sub(start), Done: len(consume) - len(next), Partitions: len(consume)})
	}
	fromMs, toMs := s.From.UnixMilli(), s.To.UnixMilli()
	for len(next) > 0 {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		fs := cl.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return rep(), err
		}
		var ferr error
		fs.EachError(func(_ string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && ferr == nil {
				ferr = fmt.Errorf("fetch partition %d: %w", p, err)
			}
		})
		if ferr != nil {
			return rep(), ferr
		}
		fs.EachRecord(func(r *kgo.Record) {
			to, reading := next[r.Partition]
			if !reading || r.Offset < to {
				return // a partition already read to its end, or a record read twice
			}
			lastRec = clk.Now()
			end := ends[r.Partition]
			if r.Offset >= end {
				f.Done(r.Partition)
				delete(next, r.Partition)
				return
			}
			next[r.Partition] = r.Offset + 1
			ms := r.Timestamp.UnixMilli()
			if r.Attrs.IsControl() {
				// A transaction marker: not a record consumers see.
			} else if read++; (s.From.IsZero() || ms >= fromMs) && (s.To.IsZero() || ms <= toMs) {
				rec = Record{Partition: r.Partition, Offset: r.Offset, Timestamp: r.Timestamp, ProducerID: r.ProducerID,
					Key: r.Key, Value: r.Value, Headers: rec.Headers[:0]}
				for _, h := range r.Headers {
					rec.Headers = append(rec.Headers, Header{Key: h.Key, Value: h.Value})
				}
				f.Add(&rec)
			}
			if r.Offset+1 >= end {
				f.Done(r.Partition)
				delete(next, r.Partition)
			}
		})
		if clk.Now().Sub(lastRec) >= s.IdleTimeout {
			for _, p := range slices.Sorted(maps.Keys(next)) {
				stopped = append(stopped, fmt.Sprintf("partition %d: read up to offset %d of %d; no record came for %s (the last offsets were compacted away, or the cluster did not answer)",
					p, next[p], ends[p], s.IdleTimeout))
				f.Done(p)
			}
			clear(next)
		}
		if clk.Now().Sub(lastTell) >= s.ProgressEvery {
			lastTell = clk.Now()
			tell()
		}
	}
	tell()
	r := rep()
	r.Incomplete = stopped
	return r, nil
}

// offsetRange returns, per partition to read, the first offset and the
// end offset (exclusive).
func offsetRange(ctx context.Context, adm *kadm.Client, s ScanSettings) (starts, ends map[int32]int64, err error) {
	topics, err := adm.ListTopics(ctx, s.Topic)
	if err != nil {
		return nil, nil, fmt.Errorf("describe topic %s: %w", s.Topic, err)
	}
	td, ok := topics[s.Topic]
	if !ok || td.Err != nil {
		if ok {
			err = td.Err
		}
		return nil, nil, fmt.Errorf("%w: %s: %v", ErrNoTopic, s.Topic, err)
	}
	want := map[int32]bool{}
	for _, p := range s.Partitions {
		if _, ok := td.Partitions[p]; !ok {
			return nil, nil, fmt.Errorf("topic %s has no partition %d (it has %d)", s.Topic, p, len(td.Partitions))
		}
		want[p] = true
	}
	pick := func(l kadm.ListedOffsets, what string) (map[int32]int64, error) {
		if err := l.Error(); err != nil {
			return nil, fmt.Errorf("list %s offsets of %s: %w", what, s.Topic, err)
		}
		out := map[int32]int64{}
		l.Each(func(o kadm.ListedOffset) {
			if o.Topic == s.Topic && (len(want) == 0 || want[o.Partition]) {
				out[o.Partition] = o.Offset
			}
		})
		return out, nil
	}
	var l kadm.ListedOffsets
	if s.From.IsZero() {
		l, err = adm.ListStartOffsets(ctx, s.Topic)
	} else {
		l, err = adm.ListOffsetsAfterMilli(ctx, s.From.UnixMilli(), s.Topic)
	}
	if err == nil {
		starts, err = pick(l, "start")
	}
	if err != nil {
		return nil, nil, err
	}
	if l, err = adm.ListCommittedOffsets(ctx, s.Topic); err == nil {
		ends, err = pick(l, "end")
	}
	if err != nil {
		return nil, nil, err
	}
	if !s.To.IsZero() {
		// A retry is appended after records newer than it (it keeps its
		// original's timestamp), so the range is read up to the first
		// record a window past To, and filtered by timestamp.
		var after map[int32]int64
		window := s.Window
		if window <= 0 {
			window = DefaultWindow
		}
		if l, err = adm.ListOffsetsAfterMilli(ctx, s.To.Add(window).UnixMilli()+1, s.Topic); err == nil {
			after, err = pick(l, "end-of-range")
		}
		if err != nil {
			return nil, nil, err
		}
		for p, o := range after {
			ends[p] = min(ends[p], o)
		}
	}
	return starts, ends, nil
}
