package audit

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Kinds of Example.
const (
	KindCopy      = "copy"       // identical key, value and headers
	KindKeyRepeat = "key repeat" // the same idempotency key
)

// Report is what an audit found.
type Report struct {
	Topic string `json:"topic"`
	// From and To are the time range asked for (zero: the whole topic).
	From time.Time `json:"from,omitzero"`
	To   time.Time `json:"to,omitzero"`
	// Window, KeyHeader and KeyWindow are the settings the counts are for.
	Window     time.Duration `json:"window_ns"`
	KeyHeader  string        `json:"key_header,omitempty"`
	KeyWindow  time.Duration `json:"key_window_ns,omitempty"`
	MaxTracked int           `json:"max_tracked"`

	Records int64 `json:"records"`
	Bytes   int64 `json:"bytes"` // keys, values and headers
	// First and Last are the oldest and newest record timestamps read.
	First time.Time `json:"first,omitzero"`
	Last  time.Time `json:"last,omitzero"`

	// Copies counts records identical to an earlier one within Window;
	// SamePartition and SameProducer count those whose earlier record is
	// in the same partition, and has the same producer id.
	Copies        int64 `json:"copies"`
	SamePartition int64 `json:"same_partition"`
	SameProducer  int64 `json:"same_producer"`
	// KeyRepeats counts records repeating an earlier record's idempotency
	// key within KeyWindow; WithoutKey, records without the header.
	KeyRepeats int64 `json:"key_repeats"`
	WithoutKey int64 `json:"without_key"`
	// Forgotten counts records let go, for the memory bound, before their
	// window ended: when above zero the counts are a lower bound (raise
	// MaxTracked).
	Forgotten int64 `json:"forgotten"`
	// Tracked is how many records the tables remember at the end.
	Tracked int `json:"tracked"`

	Gaps       GapStats          `json:"time_between_copies"`
	Partitions []PartitionCounts `json:"partitions"`
	// Producers lists the producer ids with copies or key repeats, most
	// first; -1 is every producer without idempotence. Past maxProducers
	// ids, the rest are summed in one entry with Others set.
	Producers []ProducerCounts `json:"producers"`
	Examples  []Example        `json:"examples"`

	// Incomplete names partitions not read to their end, and why.
	Incomplete []string      `json:"incomplete,omitempty"`
	Elapsed    time.Duration `json:"elapsed_ns"`
}

// PartitionCounts is one partition's share.
type PartitionCounts struct {
	Partition   int32 `json:"partition"`
	Records     int64 `json:"records"`
	FirstOffset int64 `json:"first_offset"`
	LastOffset  int64 `json:"last_offset"`
	Copies      int64 `json:"copies"`
	KeyRepeats  int64 `json:"key_repeats"`
}

// ProducerCounts is one producer id's share of the copies.
type ProducerCounts struct {
	ProducerID int64 `json:"producer_id"`
	Others     bool  `json:"others,omitempty"`
	Copies     int64 `json:"copies"`
	KeyRepeats int64 `json:"key_repeats"`
}

// GapStats is the time between a copy and the record it repeats.
type GapStats struct {
	Min    time.Duration `json:"min_ns"`
	Median time.Duration `json:"median_ns"` // within a factor of 2
	P99    time.Duration `json:"p99_ns"`    // within a factor of 2
	Max    time.Duration `json:"max_ns"`
}

// Example is one copy and the record it repeats.
type Example struct {
	Kind              string        `json:"kind"`
	Partition         int32         `json:"partition"`
	Offset            int64         `json:"offset"`
	ProducerID        int64         `json:"producer_id"`
	Timestamp         time.Time     `json:"timestamp"`
	EarlierPartition  int32         `json:"earlier_partition"`
	EarlierOffset     int64         `json:"earlier_offset"`
	EarlierProducerID int64         `json:"earlier_producer_id"`
	Apart             time.Duration `json:"apart_ns"`
	Key               string        `json:"key"`   // the first 64 bytes
	Value             string        `json:"value"` // the first 64 bytes
	KeyHeader         string        `json:"key_header,omitempty"`
}

// WriteText writes the report for a reader: what was read, the counts,
// then a short table per partition and per producer, and the examples.
func (r Report) WriteText(w io.Writer) error {
	var b strings.Builder
	span := "the whole topic"
	if !r.From.IsZero() || !r.To.IsZero() {
		span = fmt.Sprintf("records from %s to %s", timeOr(r.From, "the start"), timeOr(r.To, "the end"))
	}
	fmt.Fprintf(&b, "Audit of topic %s (%s): %s records, %s, in %s.\n", r.Topic, span,
		thousands(r.Records), byteSize(r.Bytes), r.Elapsed.Round(time.Millisecond))
	if r.Records > 0 {
		fmt.Fprintf(&b, "Record timestamps from %s to %s.\n", r.First.Format(time.RFC3339), r.Last.Format(time.RFC3339))
	}
	for _, s := range r.Incomplete {
		fmt.Fprintf(&b, "NOT READ TO THE END: %s\n", s)
	}
	b.WriteString("\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "copies (same key, value and headers within %s)\t%s\t%s of the records\n", r.Window, thousands(r.Copies), percent(r.Copies, r.Records))
	if r.Copies > 0 {
		fmt.Fprintf(tw, "  of which in the same partition\t%s\n", thousands(r.SamePartition))
		fmt.Fprintf(tw, "  of which from the same producer id\t%s\n", thousands(r.SameProducer))
		fmt.Fprintf(tw, "  time between copies\tmin %s, median ≈%s, p99 ≈%s, max %s\n", r.Gaps.Min, r.Gaps.Median, r.Gaps.P99, r.Gaps.Max)
	}
	if r.KeyHeader != "" {
		fmt.Fprintf(tw, "key repeats (header %s within %s)\t%s\t%s of the records\n", r.KeyHeader, r.KeyWindow, thousands(r.KeyRepeats), percent(r.KeyRepeats, r.Records))
		fmt.Fprintf(tw, "  records without the header\t%s\n", thousands(r.WithoutKey))
	}
	tw.Flush()
	if r.Forgotten > 0 {
		fmt.Fprintf(&b, "\n%s records were forgotten inside their window (the memory bound, --max-tracked %d): the counts are a lower bound.\n",
			thousands(r.Forgotten), r.MaxTracked)
	}

	b.WriteString("\n")
	tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "partition\trecords\toffsets\tcopies\t")
	if r.KeyHeader != "" {
		fmt.Fprintf(tw, "key repeats\t")
	}
	fmt.Fprintln(tw)
	for _, p := range r.Partitions {
		fmt.Fprintf(tw, "%d\t%s\t%d-%d\t%s\t", p.Partition, thousands(p.Records), p.FirstOffset, p.LastOffset, thousands(p.Copies))
		if r.KeyHeader != "" {
			fmt.Fprintf(tw, "%s\t", thousands(p.KeyRepeats))
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()

	if len(r.Producers) > 0 {
		b.WriteString("\n")
		tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "producer id\tcopies\t")
		if r.KeyHeader != "" {
			fmt.Fprintf(tw, "key repeats\t")
		}
		fmt.Fprintln(tw)
		for _, p := range r.Producers {
			fmt.Fprintf(tw, "%s\t%s\t", producerName(p), thousands(p.Copies))
			if r.KeyHeader != "" {
				fmt.Fprintf(tw, "%s\t", thousands(p.KeyRepeats))
			}
			fmt.Fprintln(tw)
		}
		tw.Flush()
	}

	if len(r.Examples) > 0 {
		b.WriteString("\nExamples:\n")
		for _, e := range r.Examples {
			fmt.Fprintf(&b, "  %s: partition %d offset %d (producer %d) repeats partition %d offset %d (producer %d), %s apart\n",
				e.Kind, e.Partition, e.Offset, e.ProducerID, e.EarlierPartition, e.EarlierOffset, e.EarlierProducerID, e.Apart)
			fmt.Fprintf(&b, "    key %s value %s", strconv.Quote(e.Key), strconv.Quote(e.Value))
			if e.KeyHeader != "" {
				fmt.Fprintf(&b, " %s %s", r.KeyHeader, strconv.Quote(e.KeyHeader))
			}
			b.WriteString("\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func producerName(p ProducerCounts) string {
	switch {
	case p.Others:
		return "others"
	case p.ProducerID < 0:
		return "-1 (no idempotence)"
	}
	return strconv.FormatInt(p.ProducerID, 10)
}

func timeOr(t time.Time, zero string) string {
	if t.IsZero() {
		return zero
	}
	return t.UTC().Format(time.RFC3339)
}

func percent(n, of int64) string {
	if of == 0 {
		return "0 %"
	}
	return strconv.FormatFloat(100*float64(n)/float64(of), 'g', 3, 64) + " %"
}

// thousands writes n with thin separators: 1,234,567.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		s = "-" + s
	}
	return s
}

func byteSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
