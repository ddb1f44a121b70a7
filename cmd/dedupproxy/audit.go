package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/dedupproxy/dedupproxy/audit"
	"github.com/dedupproxy/dedupproxy/clock"
	"github.com/dedupproxy/dedupproxy/config"
	"github.com/dedupproxy/dedupproxy/internal/upstream"
	"github.com/dedupproxy/dedupproxy/proxy"
)

// auditFlags are dedupproxy audit's own flags, beside the cluster's
// (flags.defineUpstream).
type auditFlags struct {
	*flags
	topic, partitions, from, to *string
	window, keyWindow, progress *time.Duration
	keyHeader                   *string
	examples, maxTracked        *int
	json                        *bool
}

func newAuditFlags() *auditFlags {
	fs := flag.NewFlagSet("dedupproxy audit", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	a := &auditFlags{flags: &flags{fs: fs, strFlags: map[string]strFlag{}, clusterOnly: true}}
	a.defineUpstream(fs, "bootstrap brokers of the cluster to read, `HOST:PORT[,HOST:PORT...]` (default: upstream of --config)")
	a.topic = fs.String("topic", "", "the `topic` to read (required)")
	a.partitions = fs.String("partitions", "", "`list` of partitions to read, comma-separated (default: all)")
	a.from = fs.String("from", "", "read records from this `time` on: RFC 3339 (2026-12-01T08:00:00Z) or a duration ago (24h) (default: the topic's start)")
	a.to = fs.String("to", "", "read records up to this `time`, as --from (default: the end when the scan starts)")
	a.window = fs.Duration("window", 0, "a record identical to an earlier one (key, value, headers) at most this `duration` after it is a copy (default: dedup.legacy.window of --config, else 2m)")
	a.keyHeader = fs.String("key-header", "", "also count records repeating the idempotency key in this `header` (default: the topic's dedup.topics.<topic>.idempotency_key.header in --config, else none)")
	a.keyWindow = fs.Duration("key-window", 0, "a key repeated at most this `duration` after the earlier record counts (default: dedup.keys.ttl of --config, else 24h)")
	a.examples = fs.Int("examples", audit.DefaultExamples, "how many copies to show")
	a.maxTracked = fs.Int("max-tracked", audit.DefaultMaxTracked, fmt.Sprintf("`records` remembered at once per table (about %d bytes each; the memory bound)", audit.BytesPerTracked))
	a.progress = fs.Duration("progress", 5*time.Second, "how often to print progress to stderr; 0 for never")
	a.json = fs.Bool("json", false, "print the report as JSON")
	return a
}

func (a *auditFlags) usage(w io.Writer) {
	fmt.Fprint(w, `dedupproxy audit: count the duplicates a topic already holds.

Usage:
  dedupproxy audit --topic TOPIC [--upstream HOST:PORT | --config FILE] [flags]

Reads the topic (or the records of a time range) from the cluster with the
same connection settings as the proxy (--config, or the --upstream* flags:
TLS, SASL), and reports records identical in key, value and headers within
--window of each other, and records repeating an idempotency key header:
counts per partition and per producer id, the time between copies, and
examples. Run it before putting the proxy in front of producers, and after.
Progress goes to stderr, the report to stdout. docs/audit.md tells how to
read it. Exit codes: 0 done, 2 a configuration error, 1 a failure while
reading.

`)
	printFlags(w, a.fs, auditFlagGroups)
}

// auditFlagGroups order dedupproxy audit's help. TestAuditHelp fails when a
// flag is in no group.
var auditFlagGroups = []flagGroup{
	{title: "What to read", flags: []string{"topic", "partitions", "from", "to"}},
	{title: "What counts", flags: []string{"window", "key-header", "key-window"}},
	{title: "Output", flags: []string{"examples", "json", "progress", "max-tracked"}},
	{title: "The cluster", flags: []string{"config", "upstream"},
		note: "--upstream, or the upstream of --config; flags win over the file. The embedded cluster lives " +
			"inside a proxy process and cannot be read from another: for a local trial run dedupproxy cluster " +
			"and pass its address."},
	{title: "TLS and SASL to the cluster", flags: []string{"upstream-tls", "upstream-tls-ca", "upstream-tls-cert",
		"upstream-tls-key", "upstream-tls-server-name", "upstream-sasl-mechanism", "upstream-sasl-user",
		"upstream-sasl-password-file"},
		note: "As the proxy's own connections: every --upstream-tls-* flag implies --upstream-tls; " +
			"--upstream-sasl-mechanism needs --upstream-sasl-user and --upstream-sasl-password-file. " +
			"The user needs Describe and Read on the topic."},
}

// runAudit is dedupproxy audit.
func runAudit(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := newAuditFlags()
	cfg, err := a.load(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		a.usage(stdout)
		return 0
	case err != nil:
		fmt.Fprintln(stderr, "dedupproxy audit:", err)
		if a.parseErr {
			fmt.Fprintln(stderr, "Run 'dedupproxy audit --help' for its flags.")
		}
		return 2
	case len(cfg.Upstream) == 0 || cfg.Upstream[0] == config.EmbeddedUpstream:
		fmt.Fprintln(stderr, "dedupproxy audit: no cluster to read: the embedded cluster lives inside a proxy process and cannot be read from another. "+
			"Pass the cluster's brokers (--upstream HOST:PORT, or upstream in --config); for a local trial, run dedupproxy cluster and pass its bootstrap address.")
		return 2
	}
	s, err := a.settings(cfg, clock.Real.Now())
	if err != nil {
		fmt.Fprintln(stderr, "dedupproxy audit:", err)
		return 2
	}
	opts, err := upstream.ClientOpts(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "dedupproxy audit:", err)
		return 2
	}
	if *a.progress > 0 {
		s.ProgressEvery = *a.progress
		s.Progress = func(p audit.Progress) { fmt.Fprintln(stderr, progressLine(p)) }
	}
	rep, err := audit.Scan(ctx, opts, s)
	if err != nil {
		fmt.Fprintln(stderr, "dedupproxy audit:", err)
		return 1
	}
	if *a.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(rep)
	} else {
		err = rep.WriteText(stdout)
	}
	if err != nil {
		fmt.Fprintln(stderr, "dedupproxy audit:", err)
		return 1
	}
	return 0
}

// settings turns the flags into what to scan; the config file supplies the
// windows and the topic's key header unless a flag sets them.
func (a *auditFlags) settings(cfg proxy.Config, now time.Time) (audit.ScanSettings, error) {
	s := audit.ScanSettings{Topic: *a.topic}
	if s.Topic == "" {
		return s, errors.New("--topic is required")
	}
	for _, p := range splitList(*a.partitions) {
		n, err := strconv.ParseInt(p, 10, 32)
		if err != nil || n < 0 {
			return s, fmt.Errorf("--partitions: %q is not a partition number", p)
		}
		s.Partitions = append(s.Partitions, int32(n))
	}
	var err error
	if s.From, err = parseWhen(*a.from, now); err != nil {
		return s, fmt.Errorf("--from: %w", err)
	}
	if s.To, err = parseWhen(*a.to, now); err != nil {
		return s, fmt.Errorf("--to: %w", err)
	}
	if !s.From.IsZero() && !s.To.IsZero() && s.To.Before(s.From) {
		return s, fmt.Errorf("--to %s is before --from %s", s.To.Format(time.RFC3339), s.From.Format(time.RFC3339))
	}
	s.Window = cfg.Dedup.Legacy.Window
	if *a.window > 0 {
		s.Window = *a.window
	}
	s.KeyWindow = cfg.Dedup.Keys.TTL
	if *a.keyWindow > 0 {
		s.KeyWindow = *a.keyWindow
	}
	if tc, ok := cfg.Dedup.Topics[s.Topic]; ok && tc.IdempotencyKey != nil {
		s.KeyHeader = tc.IdempotencyKey.Header
		if s.KeyHeader == "" {
			s.KeyHeader = config.DefaultKeyHeader
		}
	}
	if *a.keyHeader != "" {
		s.KeyHeader = *a.keyHeader
	}
	s.Examples = *a.examples
	if s.Examples == 0 {
		s.Examples = -1
	}
	if *a.maxTracked <= 0 {
		return s, errors.New("--max-tracked must be above 0")
	}
	s.MaxTracked = *a.maxTracked
	return s, nil
}

// parseWhen reads a time as RFC 3339, or as a duration before now.
func parseWhen(v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("%q: a duration ago must be positive", v)
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time (2026-12-01T08:00:00Z) nor a duration ago (24h)", v)
	}
	return t, nil
}

// progressLine is one line of progress for stderr.
func progressLine(p audit.Progress) string {
	var b strings.Builder
	fmt.Fprintf(&b, "audit: %d of at most %d records", p.Records, p.Expected)
	if p.Expected > 0 {
		fmt.Fprintf(&b, " (%.0f %%)", 100*float64(p.Records)/float64(p.Expected))
	}
	fmt.Fprintf(&b, ", %d copies, %d key repeats, partitions done %d/%d, %.1f MB/s", p.Copies, p.KeyRepeats, p.Done, p.Partitions,
		float64(p.Bytes)/1e6/max(p.Elapsed.Seconds(), 1e-3))
	if p.Records > 0 && p.Expected > p.Records {
		left := time.Duration(float64(p.Elapsed) * float64(p.Expected-p.Records) / float64(p.Records))
		fmt.Fprintf(&b, ", at most %s left", left.Round(time.Second))
	}
	return b.String()
}
