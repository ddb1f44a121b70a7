package seqstate

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output in testdata/*.txt")

// The scripts in testdata/*.txt are in the style of cockroachdb/datadriven:
//
//	# comment (the rule and its Kafka source)
//	command key=value ...
//	----
//	expected output
//	<blank line>
//
// "case name=..." starts a named subtest with a fresh table. Commands:
//
//	case name=N [retained=5] [max=1024] [shards=1] [expiry=24h] [fences=16]
//	check|decide pid= epoch= seq= n= [fp=0] [topic=t] [part=0] [at=D]
//	commit pid= epoch= seq= n= offset= ts= [fp=0] [topic] [part] [at=D]
//	abort pid= epoch= seq= n= [topic] [part]
//	init pid= epoch= [at=D]
//	expire at=D
//	state pid= [topic] [part]
//	stats
//
// at=D sets the clock to a fixed base time plus D and stays set. commit,
// abort and state print the key's window; check prints the decision.
// Run with -rewrite to regenerate expected output (only when the diff is
// understood).

type ddBlock struct {
	pre      []string // comment and blank lines before the command
	cmd      string
	line     int
	expected string
	actual   string
}

func parseScript(t *testing.T, path string) (blocks []*ddBlock, trailer []string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	var pre []string
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			pre = append(pre, line)
			continue
		}
		b := &ddBlock{pre: pre, cmd: line, line: n}
		pre = nil
		if !sc.Scan() || sc.Text() != "----" {
			t.Fatalf("%s:%d: want ---- after command", path, n)
		}
		n++
		var out []string
		for sc.Scan() {
			n++
			if sc.Text() == "" {
				break
			}
			out = append(out, sc.Text())
		}
		b.expected = strings.Join(out, "\n")
		blocks = append(blocks, b)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return blocks, pre
}

func writeScript(t *testing.T, path string, blocks []*ddBlock, trailer []string) {
	var sb strings.Builder
	for _, b := range blocks {
		for _, p := range b.pre {
			sb.WriteString(p + "\n")
		}
		sb.WriteString(b.cmd + "\n----\n")
		if b.actual != "" {
			sb.WriteString(b.actual + "\n")
		}
		sb.WriteString("\n")
	}
	for _, p := range trailer {
		if p != "" {
			sb.WriteString(p + "\n")
		}
	}
	out := strings.TrimRight(sb.String(), "\n") + "\n"
	if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestScripts runs every rule scenario in testdata/*.txt; each "case" is a
// subtest named after the rule it pins.
func TestScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, path := range files {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".txt"), func(t *testing.T) {
			blocks, trailer := parseScript(t, path)
			for i := 0; i < len(blocks); {
				b := blocks[i]
				if !strings.HasPrefix(b.cmd, "case ") {
					t.Fatalf("%s:%d: script must start with case", path, b.line)
				}
				j := i + 1
				for j < len(blocks) && !strings.HasPrefix(blocks[j].cmd, "case ") {
					j++
				}
				caseBlocks := blocks[i:j]
				t.Run(argMap(t, b.cmd)["name"], func(t *testing.T) {
					var r *ddRunner
					for _, cb := range caseBlocks {
						cb.actual = runCommand(t, &r, path, cb)
						if !*rewrite && cb.actual != cb.expected {
							t.Errorf("%s:%d: %s\nwant:\n%s\ngot:\n%s", path, cb.line, cb.cmd, cb.expected, cb.actual)
						}
					}
				})
				i = j
			}
			if *rewrite {
				writeScript(t, path, blocks, trailer)
			}
		})
	}
}

type ddRunner struct {
	t   *Table
	now time.Time
}

var ddBase = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

func argMap(t *testing.T, cmd string) map[string]string {
	m := map[string]string{}
	for _, f := range strings.Fields(cmd)[1:] {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			t.Fatalf("bad argument %q in %q", f, cmd)
		}
		m[k] = v
	}
	return m
}

func runCommand(t *testing.T, rp **ddRunner, path string, b *ddBlock) string {
	t.Helper()
	args := argMap(t, b.cmd)
	used := map[string]bool{}
	get := func(k, def string) string {
		used[k] = true
		if v, ok := args[k]; ok {
			return v
		}
		if def == "" {
			t.Fatalf("%s:%d: missing %s=", path, b.line, k)
		}
		return def
	}
	num := func(k, def string) int64 {
		v, err := strconv.ParseInt(get(k, def), 0, 64)
		if err != nil {
			t.Fatalf("%s:%d: %s: %v", path, b.line, k, err)
		}
		return v
	}
	dur := func(k, def string) time.Duration {
		v, err := time.ParseDuration(get(k, def))
		if err != nil {
			t.Fatalf("%s:%d: %s: %v", path, b.line, k, err)
		}
		return v
	}
	verb := strings.Fields(b.cmd)[0]
	if verb == "case" {
		get("name", "")
		tab, err := New(Config{
			MaxEntries:           int(num("max", "1024")),
			Shards:               int(num("shards", "1")),
			RetainedBatches:      int(num("retained", "5")),
			ProducerIDExpiration: dur("expiry", "24h"),
			MaxFencedProducers:   int(num("fences", "16")),
		})
		if err != nil {
			t.Fatalf("%s:%d: %v", path, b.line, err)
		}
		*rp = &ddRunner{t: tab, now: ddBase}
		return ""
	}
	r := *rp
	if _, ok := args["at"]; ok {
		r.now = ddBase.Add(dur("at", ""))
	}
	key := func() Key {
		return Key{
			ProducerID: num("pid", ""),
			Topic:      r.t.topic(get("topic", "t")),
			Partition:  int32(num("part", "0")),
		}
	}
	batch := func() Batch {
		return Batch{
			Epoch:       int16(num("epoch", "")),
			FirstSeq:    int32(num("seq", "")),
			Count:       int32(num("n", "")),
			Fingerprint: uint32(num("fp", "0")),
		}
	}
	var out string
	switch verb {
	case "check", "decide":
		k, bt := key(), batch()
		var res Result
		if verb == "check" {
			res = r.t.Check(k, bt, r.now)
		} else {
			res = r.t.Decide(k, bt, r.now)
		}
		out = formatResult(res)
	case "commit":
		k, bt := key(), batch()
		r.t.Commit(k, bt, num("offset", ""), num("ts", ""), r.now)
		out = r.t.dumpKey(k)
	case "abort":
		k, bt := key(), batch()
		r.t.Abort(k, bt)
		out = r.t.dumpKey(k)
	case "init":
		r.t.ObserveInitProducerID(num("pid", ""), int16(num("epoch", "")), r.now)
		out = "ok"
	case "expire":
		n := r.t.Expire(r.now)
		out = fmt.Sprintf("expired=%d len=%d", n, r.t.Len())
	case "state":
		out = r.t.dumpKey(key())
	case "stats":
		out = fmt.Sprintf("len=%d evictions=%d expirations=%d", r.t.Len(), r.t.Evictions(), r.t.Expirations())
	default:
		t.Fatalf("%s:%d: unknown command %q", path, b.line, verb)
	}
	for k := range args {
		if !used[k] && k != "at" {
			t.Fatalf("%s:%d: unused argument %s", path, b.line, k)
		}
	}
	return out
}

func formatResult(r Result) string {
	if r.Decision == Duplicate {
		return fmt.Sprintf("duplicate offset=%d ts=%d", r.BaseOffset, r.MaxTimestamp)
	}
	if r.BaseOffset != -1 || r.MaxTimestamp != -1 {
		return fmt.Sprintf("%s offset=%d ts=%d (offsets must be -1)", r.Decision, r.BaseOffset, r.MaxTimestamp)
	}
	return r.Decision.String()
}

// dumpKey renders k's entry without touching recency or expiry.
func (t *Table) dumpKey(k Key) string {
	s := t.shard(k.ProducerID)
	s.mu.Lock()
	defer s.mu.Unlock()
	idx, ok := s.peek(k)
	if !ok {
		return "unknown"
	}
	e := s.entry(idx)
	var sb strings.Builder
	fmt.Fprintf(&sb, "epoch=%d", e.h.epoch)
	for i := 0; i < int(e.h.n); i++ {
		sl := e.at(i)
		fmt.Fprintf(&sb, " [%d..%d", e.firstOf(i), sl.lastSeq())
		if sl.pending() {
			sb.WriteString(" pending")
		} else {
			off, ts := e.offsets(e.pos(i))
			fmt.Fprintf(&sb, " off=%d ts=%d", off, ts)
		}
		if sl.fingerprint != 0 {
			fmt.Fprintf(&sb, " fp=%d", sl.fingerprint)
		}
		sb.WriteString("]")
	}
	return sb.String()
}
