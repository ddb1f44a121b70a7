package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/dedupproxy/dedupproxy/audit"
	"github.com/dedupproxy/dedupproxy/internal/testpki"
)

// auditT0 is when the planted records were "written" (their timestamps).
var auditT0 = time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)

// planted is a topic's records with known copies: what the audit must find.
type planted struct {
	records    []*kgo.Record
	copies     int64 // identical to an earlier record within 2 minutes
	samePart   int64
	keyRepeats int64 // same idempotency-key header within 24 h
	withoutKey int64
	perPart    map[int32]int64 // copies per partition
}

// plantDuplicates builds 300 unique records over 3 partitions, 10 a
// second, each with an idempotency-key header, and plants among them:
// copies in the same partition 500 ms later (a retry on a new connection),
// copies in another partition 1 s later (a client that re-partitions its
// retry), an identical record 10 minutes later (beyond the 2-minute
// window: not a copy), a record differing from an earlier one only in a
// header value (not a copy), and records repeating an earlier record's key
// with another value (key repeats), plus records without the header.
func plantDuplicates() planted {
	pl := planted{perPart: map[int32]int64{}}
	at := func(ms int) time.Time { return auditT0.Add(time.Duration(ms) * time.Millisecond) }
	mk := func(p int32, ms int, key, value, id string) *kgo.Record {
		r := &kgo.Record{Partition: p, Timestamp: at(ms), Key: []byte(key), Value: []byte(value)}
		if id != "" {
			r.Headers = []kgo.RecordHeader{{Key: "source", Value: []byte("billing")}, {Key: "idempotency-key", Value: []byte(id)}}
		}
		return r
	}
	var orig []*kgo.Record
	for i := 0; i < 300; i++ {
		orig = append(orig, mk(int32(i%3), i*100, fmt.Sprintf("acct-%d", i%17), fmt.Sprintf("charge %d", i), fmt.Sprintf("op-%d", i)))
	}
	pl.records = append(pl.records, orig...)
	copyOf := func(r *kgo.Record, p int32, laterMs int) *kgo.Record {
		c := *r
		c.Partition = p
		c.Timestamp = r.Timestamp.Add(time.Duration(laterMs) * time.Millisecond)
		c.Headers = append([]kgo.RecordHeader(nil), r.Headers...)
		return &c
	}
	for _, i := range []int{10, 11, 12, 150, 298} { // same partition, 0.5 s later
		pl.records = append(pl.records, copyOf(orig[i], orig[i].Partition, 500))
		pl.copies++
		pl.samePart++
		pl.keyRepeats++ // the copy repeats the key too
		pl.perPart[orig[i].Partition]++
	}
	for _, i := range []int{40, 41} { // another partition, 1 s later
		p := (orig[i].Partition + 1) % 3
		pl.records = append(pl.records, copyOf(orig[i], p, 1000))
		pl.copies++
		pl.keyRepeats++
		pl.perPart[p]++
	}
	// 10 minutes later: beyond the window, but within the key window.
	pl.records = append(pl.records, copyOf(orig[5], orig[5].Partition, 10*60*1000))
	pl.keyRepeats++
	// A header value differs: not a copy, and a new key.
	d := copyOf(orig[60], orig[60].Partition, 200)
	d.Headers[1].Value = []byte("op-60-b")
	pl.records = append(pl.records, d)
	// The same key, other content: key repeats only.
	for _, i := range []int{70, 71, 72} {
		pl.records = append(pl.records, mk(orig[i].Partition, i*100+3000, "other", "refund", fmt.Sprintf("op-%d", i)))
		pl.keyRepeats++
	}
	// No header at all.
	for i := 0; i < 4; i++ {
		pl.records = append(pl.records, mk(int32(i%3), 40_000+i, "k", fmt.Sprintf("heartbeat %d", i), ""))
		pl.withoutKey++
	}
	return pl
}

// produce writes records in order with a legacy (non-idempotent) producer,
// to the partition each names.
func produce(t *testing.T, opts []kgo.Opt, topic string, records []*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(append(opts, kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.DisableIdempotentWrite(), kgo.MaxBufferedRecords(1))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, r := range records {
		r.Topic = topic
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

// runAuditJSON runs dedupproxy audit with args plus --json and decodes the
// report.
func runAuditJSON(t *testing.T, args ...string) audit.Report {
	t.Helper()
	code, out, errOut := runOut(append([]string{"audit", "--json", "--progress", "0"}, args...)...)
	if code != 0 {
		t.Fatalf("audit %v: exit %d: %s", args, code, errOut)
	}
	var rep audit.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("audit --json: %v\n%s", err, out)
	}
	return rep
}

// TestAuditPlantedDuplicates: dedupproxy audit, reading a kfake topic over
// real sockets, finds exactly the planted copies and key repeats, per
// partition and in total, and shows the summary table.
func TestAuditPlantedDuplicates(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(2), kfake.SeedTopics(3, "payments"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pl := plantDuplicates()
	produce(t, []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}, "payments", pl.records)
	upstream := strings.Join(c.ListenAddrs(), ",")

	rep := runAuditJSON(t, "--upstream", upstream, "--topic", "payments", "--key-header", "idempotency-key")
	if rep.Records != int64(len(pl.records)) || rep.Copies != pl.copies || rep.SamePartition != pl.samePart ||
		rep.KeyRepeats != pl.keyRepeats || rep.WithoutKey != pl.withoutKey || rep.Forgotten != 0 || len(rep.Incomplete) != 0 {
		t.Fatalf("records %d copies %d (same partition %d) key repeats %d without key %d forgotten %d incomplete %v;\nwant %d %d (%d) %d %d 0 none",
			rep.Records, rep.Copies, rep.SamePartition, rep.KeyRepeats, rep.WithoutKey, rep.Forgotten, rep.Incomplete,
			len(pl.records), pl.copies, pl.samePart, pl.keyRepeats, pl.withoutKey)
	}
	for _, p := range rep.Partitions {
		if p.Copies != pl.perPart[p.Partition] {
			t.Errorf("partition %d: %d copies, want %d", p.Partition, p.Copies, pl.perPart[p.Partition])
		}
	}
	if rep.SameProducer != rep.Copies || len(rep.Producers) != 1 || rep.Producers[0].ProducerID != -1 {
		t.Errorf("producers %+v, same producer %d: want every copy from producer id -1", rep.Producers, rep.SameProducer)
	}
	if rep.Gaps.Min != 500*time.Millisecond || rep.Gaps.Max != time.Second {
		t.Errorf("time between copies %+v, want min 500ms max 1s", rep.Gaps)
	}
	if len(rep.Examples) != audit.DefaultExamples || rep.Examples[0].Kind != audit.KindCopy || rep.Examples[0].Value == "" {
		t.Errorf("examples %+v", rep.Examples)
	}

	// A wider window takes the record written again 10 minutes later too;
	// no key header: no key counts.
	wide := runAuditJSON(t, "--upstream", upstream, "--topic", "payments", "--window", "15m")
	if wide.Copies != pl.copies+1 || wide.KeyRepeats != 0 || wide.KeyHeader != "" {
		t.Errorf("--window 15m: copies %d key repeats %d, want %d 0", wide.Copies, wide.KeyRepeats, pl.copies+1)
	}

	// A time range: the first 10 seconds hold originals 0-99, the copies
	// of 10, 11, 12, 40 and 41, and the variant of 60. The copies were
	// appended after newer records: they are read all the same.
	part := runAuditJSON(t, "--upstream", upstream, "--topic", "payments",
		"--from", auditT0.Format(time.RFC3339), "--to", auditT0.Add(10*time.Second-time.Millisecond).Format(time.RFC3339Nano))
	if part.Copies != 5 || part.Records != 106 {
		t.Errorf("first 10 s: %d records, %d copies; want 106 and 5", part.Records, part.Copies)
	}
	// Partition 0 alone: one of its copies repeats a record of partition
	// 2, which is not read.
	one := runAuditJSON(t, "--upstream", upstream, "--topic", "payments", "--partitions", "0")
	if len(one.Partitions) != 1 || one.Partitions[0].Partition != 0 || one.Copies != pl.perPart[0]-1 {
		t.Errorf("--partitions 0: %+v, %d copies; want only partition 0 and %d copies", one.Partitions, one.Copies, pl.perPart[0]-1)
	}

	// The text report: the summary table and the examples.
	code, out, errOut := runOut("audit", "--upstream", upstream, "--topic", "payments", "--key-header", "idempotency-key", "--progress", "1ms")
	if code != 0 {
		t.Fatalf("audit: exit %d: %s", code, errOut)
	}
	t.Logf("the report (docs/audit.md shows it):\n%s", out)
	for _, want := range []string{
		fmt.Sprintf(`Audit of topic payments \(the whole topic\): %d records`, len(pl.records)),
		fmt.Sprintf(`\ncopies \(same key, value and headers within 2m0s\) +%d +2.22 %% of the records\n`, pl.copies),
		fmt.Sprintf(`\nkey repeats \(header idempotency-key within 24h0m0s\) +%d +`, pl.keyRepeats),
		`\n +partition +records +offsets +copies +key repeats\n +0 +107 +0-106 +3 +4\n`,
		`\n +producer id +copies +key repeats\n +-1 \(no idempotence\) +7 +11\n`,
		`\nExamples:\n  copy: partition \d offset \d+ \(producer -1\) repeats partition \d offset \d+ \(producer -1\), 500ms apart\n`,
	} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(errOut, "audit: ") || !strings.Contains(errOut, "partitions done") {
		t.Errorf("no progress on stderr with --progress 1ms: %q", errOut)
	}

	// Mistakes.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--upstream", upstream, "--topic", "nope"}, "no such topic"},
		{[]string{"--upstream", upstream}, "--topic is required"},
		{[]string{"--topic", "payments"}, "no cluster to read"},
		{[]string{"--upstream", upstream, "--topic", "payments", "--partitions", "7"}, "has no partition 7"},
		{[]string{"--upstream", upstream, "--topic", "payments", "--from", "yesterday"}, "neither an RFC 3339 time"},
		{[]string{"--upstream", upstream, "--topic", "payments", "--windwo", "1m"}, "did you mean --window?"},
	} {
		code, _, errOut := runOut(append([]string{"audit", "--progress", "0"}, tc.args...)...)
		if code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("audit %v: exit %d, stderr %q; want an error with %q", tc.args, code, errOut, tc.want)
		}
	}
}

// TestAuditSASLSSL: the audit reaches a cluster that requires TLS and
// SCRAM with the proxy's own settings, from flags or from the config
// file, which also names the topic's key header and the windows.
func TestAuditSASLSSL(t *testing.T) {
	dir := t.TempDir()
	root, err := testpki.NewCA("audit test root")
	if err != nil {
		t.Fatal(err)
	}
	broker, err := root.Issue("broker", testpki.Opts{Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "payments"),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{broker.TLS()}}),
		kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", "auditor", "s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	caFile, pwFile, cfgFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "pw"), filepath.Join(dir, "c.yaml")
	upstream := strings.Join(c.ListenAddrs(), ",")
	for path, b := range map[string]string{caFile: string(root.PEM), pwFile: "s3cret\n", cfgFile: fmt.Sprintf(`upstream: %s
upstream_tls:
  ca: %s
upstream_sasl:
  mechanism: SCRAM-SHA-256
  user: auditor
  password_file: %s
dedup:
  legacy:
    window: 15m
  topics:
    payments:
      idempotency_key: {}
`, upstream, caFile, pwFile)} {
		if err := os.WriteFile(path, []byte(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	pl := plantDuplicates()
	produce(t, []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...), kgo.DialTLSConfig(&tls.Config{RootCAs: root.Pool}),
		kgo.SASL(scram.Auth{User: "auditor", Pass: "s3cret"}.AsSha256Mechanism())}, "payments", pl.records)

	flags := runAuditJSON(t, "--upstream", upstream, "--topic", "payments", "--upstream-tls-ca", caFile,
		"--upstream-sasl-mechanism", "SCRAM-SHA-256", "--upstream-sasl-user", "auditor", "--upstream-sasl-password-file", pwFile)
	if flags.Copies != pl.copies || flags.Records != int64(len(pl.records)) {
		t.Errorf("with flags: %d records, %d copies; want %d, %d", flags.Records, flags.Copies, len(pl.records), pl.copies)
	}
	// The file: a 15-minute window and the topic's key header (the
	// default name, idempotency-key).
	file := runAuditJSON(t, "--config", cfgFile, "--topic", "payments")
	if file.Copies != pl.copies+1 || file.KeyRepeats != pl.keyRepeats || file.KeyHeader != "idempotency-key" {
		t.Errorf("with --config: copies %d key repeats %d header %q; want %d %d idempotency-key", file.Copies, file.KeyRepeats, file.KeyHeader, pl.copies+1, pl.keyRepeats)
	}
	// Without the credentials the cluster refuses, and the audit says so.
	code, _, errOut := runOut("audit", "--progress", "0", "--upstream", upstream, "--topic", "payments", "--upstream-tls-ca", caFile)
	if code == 0 || errOut == "" {
		t.Errorf("without SASL: exit %d, stderr %q; want a failure", code, errOut)
	}
}

// TestAuditTransactions: the audit reads what a read_committed consumer
// reads: records of an aborted transaction are not counted, and a
// partition that ends in a transaction marker is read to its end at once
// (the marker's offset tells it), not after the idle timeout.
func TestAuditTransactions(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.TransactionalID("audit-test"), kgo.DefaultProduceTopic("orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, tx := range []struct {
		values []string
		commit kgo.TransactionEndTry
	}{
		{[]string{"a", "a", "b"}, kgo.TryCommit}, // one copy
		{[]string{"b", "c", "c"}, kgo.TryAbort},  // aborted: not read
		{[]string{"d", "d"}, kgo.TryCommit},      // one copy; ends in a marker
	} {
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for _, v := range tx.values {
			if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte(v)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if err := cl.EndTransaction(ctx, tx.commit); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	rep := runAuditJSON(t, "--upstream", strings.Join(c.ListenAddrs(), ","), "--topic", "orders")
	if took := time.Since(start); rep.Records != 5 || rep.Copies != 2 || len(rep.Incomplete) != 0 || took > 5*time.Second {
		t.Errorf("%d records, %d copies, incomplete %v, in %s; want 5 records, 2 copies, read to the end at once",
			rep.Records, rep.Copies, rep.Incomplete, took)
	}
}
