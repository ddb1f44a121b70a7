package decide

import (
	"bufio"
	"encoding/binary"
	"flag"
	"fmt"
	"hash/crc32"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output in testdata/*.txt")

// The scripts in testdata/*.txt pin each rule of docs/legacy.md and
// docs/kafka-rules.md §12 and each client's retry shape, in the style of
// cockroachdb/datadriven:
//
//	# comment: the rule, and the docs section it comes from
//	command key=value ...
//	----
//	expected output
//	<blank line>
//
// Commands (records are named by their value; the same name is the same
// key, value and headers; r[1..3] is r1,r2,r3):
//
//	case name=N [window=2m] [scope=instance|client_id] [warm=true]
//	     [mode=enforce|observe|off] [match=auto|records|exact|off] [keys=HEADER]
//	connect conn=C [client=ID] [principal=P] [host=ADDR] [software=S] [core=old|NAME]
//	send req=R conn=C|none parts=P:r1,r2,...[;P:...] [acks=-1] [ts=T|T1,...]
//	     [pid=N epoch=E seq=S] [writer=kafkajs|kafka-go] [compressed] [timeout=5s] [at=D]
//	decide req=R [giveup] [at=D]        decide a waiting request again
//	answer req=R P=offset:O[:T]|P=error:E ... [at=D]   the broker's answer
//	                                    (T: its log append time, ms)
//	lost req=R [at=D]                   the broker connection broke
//	unsent req=R [at=D]                 a decided request never forwarded
//	deliver req=R [ok=false] [at=D]     the answer was written (or not)
//	close conn=C [at=D]
//	tail p=P [core=NAME] [batches=O:r1,r2;O:...] [ts=T] [compressed] [failed] [at=D]
//	handoff                             the node moves to a new core
//	handoff from=NAME to=NAME p=P,...   partitions P move between named cores
//	rewarm p=P [core=NAME]              the partition's tail is read again first
//	held                                the legacy records remembered
//
// A part of send, or a batch of tail, may carry its own fields after its
// records, each as |key=value: ts, pid, epoch, seq, writer (a part of
// send only), e.g. parts=0:a,b|ts=1000,1001;1:c|ts=1002. A named core
// (core=NAME) is made on first use with tables of its own: another
// replica, or the proxy after a restart (the simulation in sim/ writes
// its cores so).
//
// at=D sets the clock to a fixed base time plus D and stays set; record
// timestamps (ts, ms) count from the same base. Topic "t" has 4
// partitions. Run with -rewrite to regenerate expected output (only
// when the diff is understood).

type ddBlock struct {
	pre      []string
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

// TestScripts runs every scenario in testdata/*.txt.
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
					var r *runner
					for _, cb := range caseBlocks {
						cb.actual = run(t, &r, path, cb)
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

const scriptTopic = "t"

var ddBase = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

type scriptReq struct {
	core  *Core // the core that decided it
	req   Request
	plan  Plan
	names [][]string // per part, its records' names
}

type runner struct {
	core  *Core
	old   *Core // before the last handoff
	named map[string]*Core
	cfg   Config
	owner map[*Conn]*Core // the core each connection is of
	topic seqstate.TopicID
	now   time.Time
	conns map[int]*Conn
	reqs  map[int]*scriptReq
}

func argMap(t *testing.T, cmd string) map[string]string {
	m := map[string]string{}
	for _, f := range strings.Fields(cmd)[1:] {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			v = "true"
		}
		m[k] = v
	}
	return m
}

func run(t *testing.T, rp **runner, path string, b *ddBlock) string {
	t.Helper()
	args := argMap(t, b.cmd)
	fail := func(format string, a ...any) {
		t.Helper()
		t.Fatalf("%s:%d: %s", path, b.line, fmt.Sprintf(format, a...))
	}
	get := func(k, def string) string {
		if v, ok := args[k]; ok {
			return v
		}
		if def == "" {
			fail("missing %s=", k)
		}
		return def
	}
	num := func(k, def string) int64 {
		v, err := strconv.ParseInt(get(k, def), 0, 64)
		if err != nil {
			fail("%s: %v", k, err)
		}
		return v
	}
	verb := strings.Fields(b.cmd)[0]
	if verb == "case" {
		tab, err := seqstate.New(seqstate.Config{})
		if err != nil {
			t.Fatal(err)
		}
		tab.InternTopics([]seqstate.TopicRef{{Name: scriptTopic, Partitions: 4}})
		topic, _ := tab.LookupTopic([]byte(scriptTopic))
		window, err := time.ParseDuration(get("window", "2m"))
		if err != nil {
			fail("window: %v", err)
		}
		cfg := Config{Table: tab, Window: window, Warm: get("warm", "false") == "true"}
		if get("scope", "instance") == "client_id" {
			cfg.Scope = ScopeClientID
		}
		s := &Settings{}
		switch get("mode", "enforce") {
		case "observe":
			s.Mode = Observe
		case "off":
			s.Mode = Off
		}
		switch get("match", "records") {
		case "records":
			s.Match = MatchRecords
		case "exact":
			s.Match = MatchExact
		case "off":
			s.Match = MatchOff
		}
		if h := get("keys", "-"); h != "-" {
			s.Topics = map[string]TopicSettings{scriptTopic: {KeyHeader: h}}
			if cfg.Keys, err = seqstate.NewKeyTable(seqstate.KeyConfig{}); err != nil {
				t.Fatal(err)
			}
		}
		*rp = &runner{core: New(cfg, s), cfg: cfg, named: map[string]*Core{}, owner: map[*Conn]*Core{}, topic: topic, now: ddBase, conns: map[int]*Conn{}, reqs: map[int]*scriptReq{}}
		return ""
	}
	r := *rp
	if r == nil {
		fail("no case")
	}
	if at, ok := args["at"]; ok {
		d, err := time.ParseDuration(at)
		if err != nil {
			fail("at: %v", err)
		}
		r.now = ddBase.Add(d)
	}
	reqOf := func() *scriptReq {
		sr := r.reqs[int(num("req", ""))]
		if sr == nil {
			fail("no request %s", args["req"])
		}
		return sr
	}
	switch verb {
	case "connect":
		host := netip.MustParseAddr(get("host", "127.0.0.1"))
		cl := Client{Principal: uint32(num("principal", "0")), ID: get("client", "a"), Host: host, Software: get("software", "-")}
		if cl.Software == "-" {
			cl.Software = ""
		}
		core := r.coreOf(t, args["core"])
		conn := core.connect(ConnID(num("conn", "")), cl, r.now)
		r.conns[int(num("conn", ""))], r.owner[conn] = conn, core
		return ""
	case "close":
		conn := r.conns[int(num("conn", ""))]
		how := Broken
		if args["clean"] == "true" {
			how = Clean
		}
		r.owner[conn].disconnect(conn, how, r.now)
		return ""
	case "send":
		sr := &scriptReq{core: r.core}
		r.reqs[int(num("req", ""))] = sr
		var conn *Conn
		if get("conn", "") != "none" {
			if conn = r.conns[int(num("conn", ""))]; conn == nil {
				fail("no connection %s", args["conn"])
			}
			sr.core = r.owner[conn]
		}
		sr.req = Request{Conn: conn, Version: 9, Acks: int16(num("acks", "-1"))}
		d, err := time.ParseDuration(get("timeout", "5s"))
		if err != nil {
			fail("timeout: %v", err)
		}
		sr.req.Timeout = d
		for pi, spec := range strings.Split(get("parts", ""), ";") {
			spec, opts := partOptions(t, spec, args)
			ps, recs, ok := strings.Cut(spec, ":")
			if !ok {
				fail("part %q: want P:r1,r2", spec)
			}
			part, _ := strconv.Atoi(ps)
			names := recordNames(t, recs)
			optNum := func(k, def string) int64 {
				v, err := strconv.ParseInt(opts(k, def), 0, 64)
				if err != nil {
					fail("%s: %v", k, err)
				}
				return v
			}
			raw := scriptBatch(names, tsList(t, opts("ts", "1000"), len(names)), optNum("pid", "-1"), int16(optNum("epoch", "0")), int32(optNum("seq", "0")), args["compressed"] == "true")
			// A client's own way of writing a batch without a producer id
			// (docs/clients.md): kafkajs writes epoch 0, kafka-go
			// partition leader epoch -1.
			switch opts("writer", "-") {
			case "kafkajs":
				binary.BigEndian.PutUint16(raw[51:], 0) // producer epoch
				raw = fixCRC(raw)
			case "kafka-go":
				binary.BigEndian.PutUint32(raw[12:], 0xffffffff) // partition leader epoch
			}
			sr.names = append(sr.names, names)
			var h protocol.BatchHeader
			if _, err := protocol.ReadBatch(raw, &h); err != nil {
				fail("batch: %v", err)
			}
			sr.req.Parts = append(sr.req.Parts, Part{TI: 0, PI: pi, Topic: r.topic, Partition: int32(part), Header: h, Records: raw})
		}
		var fx Effects
		sr.core.decide(&sr.req, &sr.plan, r.now, &fx)
		return r.printPlan(sr) + printWake(fx.Wake)
	case "decide":
		sr := reqOf()
		sr.req.GiveUp = args["giveup"] == "true"
		var fx Effects
		sr.core.decide(&sr.req, &sr.plan, r.now, &fx)
		return r.printPlan(sr) + printWake(fx.Wake)
	case "answer":
		sr := reqOf()
		resp := kmsg.NewPtrProduceResponse()
		resp.SetVersion(sr.req.Version)
		rt := kmsg.NewProduceResponseTopic()
		rt.Topic = scriptTopic
		for i, p := range sr.req.Parts {
			if sr.plan.Parts[i].Act == Answer {
				continue
			}
			v, ok := args[strconv.Itoa(int(p.Partition))]
			if !ok {
				continue // not in the answer: lost
			}
			rp := kmsg.NewProduceResponseTopicPartition()
			rp.Partition, rp.LogAppendTime, rp.LogStartOffset = p.Partition, -1, 0
			kind, val, _ := strings.Cut(v, ":")
			val, at, timed := strings.Cut(val, ":")
			n, _ := strconv.ParseInt(val, 10, 64)
			if timed {
				ms, err := strconv.ParseInt(at, 10, 64)
				if err != nil {
					fail("answer %q: %v", v, err)
				}
				rp.LogAppendTime = ddBase.UnixMilli() + ms
			}
			switch kind {
			case "offset":
				rp.BaseOffset = n
			case "error":
				rp.ErrorCode, rp.BaseOffset = int16(n), -1
			default:
				fail("answer %q", v)
			}
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
		body := resp.AppendTo(nil)
		var sc protocol.ProduceResponseScanner
		wake, err := sr.core.outcome(&sr.plan, &sc, body, r.now, nil)
		if err != nil {
			fail("outcome: %v", err)
		}
		return r.printAnswers(sr) + printWake(wake)
	case "lost":
		sr := reqOf()
		return printWake(sr.core.lost(&sr.plan, r.now, nil))
	case "unsent":
		sr := reqOf()
		return printWake(sr.core.unsent(&sr.plan, r.now, nil))
	case "deliver":
		sr := reqOf()
		sr.core.delivered(&sr.plan, get("ok", "true") == "true", r.now)
		return ""
	case "handoff":
		if from, ok := args["from"]; ok {
			// Partitions p move from one named core to another (a node
			// changing replicas).
			var parts []int32
			for _, ps := range strings.Split(get("p", ""), ",") {
				if ps == "-" {
					continue
				}
				p, err := strconv.Atoi(ps)
				if err != nil {
					fail("p: %v", err)
				}
				parts = append(parts, int32(p))
			}
			want := func(_ seqstate.TopicID, p int32) bool { return slices.Contains(parts, p) }
			hs := r.coreOf(t, from).handOff(want, r.now, nil)
			return fmt.Sprintf("handed %d batches", r.coreOf(t, get("to", "")).takeOver(hs, r.now))
		}
		// The node moves to another replica: a new core takes what this
		// one hands off; connections made from now on are the new one's
		// (core=old makes one of the old).
		next := New(r.cfg, r.core.Settings())
		hs := r.core.handOff(func(seqstate.TopicID, int32) bool { return true }, r.now, nil)
		n := next.takeOver(hs, r.now)
		r.old, r.core = r.core, next
		return fmt.Sprintf("handed %d batches", n)
	case "rewarm":
		r.coreOf(t, args["core"]).rewarm(r.topic, int32(num("p", "")))
		return ""
	case "held":
		held, _ := r.core.LegacyRecords()
		return fmt.Sprintf("held %d records", held)
	case "tail":
		k := TailKey{Topic: r.topic, Partition: int32(num("p", ""))}
		core := r.coreOf(t, args["core"])
		if args["failed"] == "true" {
			return printWake(core.tailFailed(k, r.now, nil))
		}
		var records []byte
		if spec := get("batches", "-"); spec != "-" {
			for _, bs := range strings.Split(spec, ";") {
				bs, opts := partOptions(t, bs, args)
				os, recs, _ := strings.Cut(bs, ":")
				off, _ := strconv.ParseInt(os, 10, 64)
				names := recordNames(t, recs)
				optNum := func(k, def string) int64 {
					v, err := strconv.ParseInt(opts(k, def), 0, 64)
					if err != nil {
						fail("%s: %v", k, err)
					}
					return v
				}
				raw := scriptBatch(names, tsList(t, opts("ts", "1000"), len(names)), optNum("pid", "-1"), int16(optNum("epoch", "0")), int32(optNum("seq", "0")), args["compressed"] == "true")
				binary.BigEndian.PutUint64(raw, uint64(off))
				records = append(records, raw...)
			}
		}
		return printWake(core.tailRead(k, records, r.now, nil))
	}
	fail("unknown command %q", verb)
	return ""
}

// partOptions splits a part of send, or a batch of tail, into its spec
// (P:records) and its own fields (|key=value), which take the place of the
// command's: opts(key, def) reads one.
func partOptions(t *testing.T, spec string, args map[string]string) (string, func(k, def string) string) {
	fields := strings.Split(spec, "|")
	own := map[string]string{}
	for _, f := range fields[1:] {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			t.Fatalf("part %q: want |key=value", spec)
		}
		own[k] = v
	}
	return fields[0], func(k, def string) string {
		if v, ok := own[k]; ok {
			return v
		}
		if v, ok := args[k]; ok {
			return v
		}
		return def
	}
}

// coreOf returns the core a command names: the case's (""), the one before
// the last plain handoff ("old"), or a named one, made on first use with
// tables of its own (another replica, or a restarted proxy).
func (r *runner) coreOf(t *testing.T, name string) *Core {
	switch name {
	case "":
		return r.core
	case "old":
		return r.old
	}
	if c, ok := r.named[name]; ok {
		return c
	}
	tab, err := seqstate.New(seqstate.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tab.InternTopics([]seqstate.TopicRef{{Name: scriptTopic, Partitions: 4}})
	if topic, _ := tab.LookupTopic([]byte(scriptTopic)); topic != r.topic {
		t.Fatalf("core %s numbers topic %s %d, not %d", name, scriptTopic, topic, r.topic)
	}
	cfg := r.cfg
	cfg.Table = tab
	c := New(cfg, r.core.Settings())
	r.named[name] = c
	return c
}

// recordNames reads a list of record names; NAME[A..B] stands for NAMEA,
// ..., NAMEB (a long batch in one word).
func recordNames(t *testing.T, spec string) []string {
	var out []string
	for _, n := range strings.Split(spec, ",") {
		base, rng, ok := strings.Cut(strings.TrimSuffix(n, "]"), "[")
		if !ok {
			out = append(out, n)
			continue
		}
		from, to, _ := strings.Cut(rng, "..")
		a, err1 := strconv.Atoi(from)
		b, err2 := strconv.Atoi(to)
		if err1 != nil || err2 != nil || a > b {
			t.Fatalf("records %q: want NAME[A..B]", n)
		}
		for i := a; i <= b; i++ {
			out = append(out, base+strconv.Itoa(i))
		}
	}
	return out
}

// tsList reads record timestamps, in ms after the scripts' base time.
func tsList(t *testing.T, spec string, n int) []int64 {
	var out []int64
	for _, s := range strings.Split(spec, ",") {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("ts %q: %v", spec, err)
		}
		out = append(out, ddBase.UnixMilli()+v)
	}
	for len(out) < n {
		out = append(out, out[len(out)-1])
	}
	return out[:n]
}

func printWake(w []ConnID) string {
	if len(w) == 0 {
		return ""
	}
	slices.Sort(w)
	w = slices.Compact(w)
	s := make([]string, len(w))
	for i, c := range w {
		s[i] = strconv.Itoa(int(c))
	}
	return "wake conn " + strings.Join(s, ",")
}

func (r *runner) printPlan(sr *scriptReq) string {
	pl := &sr.plan
	switch pl.Status {
	case Wait:
		var on []string
		for _, k := range pl.waitOn {
			on = append(on, fmt.Sprintf("p%d", k.Partition))
		}
		sort.Strings(on)
		if len(pl.waitFor) > 0 {
			on = append([]string{"batches in flight"}, on...)
		}
		if len(on) == 0 {
			return "decide again at once"
		}
		return fmt.Sprintf("wait %s on %s", pl.Until.Sub(r.now), strings.Join(on, ","))
	case ReadTails:
		var ts []string
		for _, k := range pl.Tails {
			ts = append(ts, fmt.Sprintf("p%d", k.Partition))
		}
		return "read tails " + strings.Join(ts, ",")
	}
	var lines []string
	for i, p := range sr.req.Parts {
		pp := &pl.Parts[i]
		var s string
		switch pp.Act {
		case Forward:
			s = "forward"
		case Answer:
			s = "answer " + printLocal(pp.Local)
		case Rebuild:
			var kept []string
			b := pl.Rebuilt[pp.At:pp.End]
			var h protocol.BatchHeader
			protocol.ReadBatch(b, &h)
			ids, _ := protocol.AppendRecordIDs(nil, b, &h)
			for _, id := range ids {
				for _, n := range sr.names[i] {
					if nameHash(n) == id.Hash {
						kept = append(kept, n)
						break
					}
				}
			}
			s = "rebuild keep=" + strings.Join(kept, ",")
		}
		v := pp.Verdict
		var why []string
		if v.Pass >= 0 {
			why = append(why, passNames[v.Pass])
		} else if v.Rule != RuleNone {
			why = append(why, v.Rule.String())
		}
		if v.Dropped > 0 {
			why = append(why, fmt.Sprintf("%d of %d records", v.Dropped, v.Records))
		}
		if v.Would != pp.Act {
			why = append(why, "would "+actNames[v.Would])
		}
		if v.Original >= 0 {
			why = append(why, fmt.Sprintf("original %d", v.Original))
		}
		if len(why) > 0 {
			s += " (" + strings.Join(why, ", ") + ")"
		}
		lines = append(lines, fmt.Sprintf("p%d %s", p.Partition, s))
	}
	if pl.Reuse {
		lines = append(lines, "reuse")
	}
	return strings.Join(lines, "\n")
}

var actNames = [...]string{Forward: "forward", Answer: "answer", Rebuild: "rebuild"}

var passNames = [NumPass]string{"legacy-off", "invalid", "old-format", "unknown-topic", "unauthenticated", "dedup-off", "keys-compressed"}

func (r *runner) printAnswers(sr *scriptReq) string {
	var lines []string
	for i, p := range sr.req.Parts {
		if pp := &sr.plan.Parts[i]; pp.Act == Rebuild {
			lines = append(lines, fmt.Sprintf("p%d answered %s", p.Partition, printLocal(pp.Local)))
		}
	}
	return strings.Join(lines, "\n")
}

func printLocal(l protocol.LocalPartitionResult) string {
	if l.ErrorCode != 0 {
		return fmt.Sprintf("error=%d", l.ErrorCode)
	}
	return fmt.Sprintf("offset=%d", l.BaseOffset)
}

// nameHash is the hash of a record named n (a null key, value n, no
// headers), as protocol.AppendRecordIDs computes it.
func nameHash(n string) uint64 {
	b := scriptBatch([]string{n}, []int64{0}, -1, 0, 0, false)
	var h protocol.BatchHeader
	protocol.ReadBatch(b, &h)
	ids, _ := protocol.AppendRecordIDs(nil, b, &h)
	return ids[0].Hash
}

// scriptBatch builds a v2 record batch of records with the given values
// and absolute timestamps (ms).
func scriptBatch(values []string, ts []int64, pid int64, epoch int16, seq int32, compressed bool) []byte {
	b := kmsg.RecordBatch{Magic: 2, ProducerID: pid, ProducerEpoch: epoch, FirstSequence: seq,
		NumRecords: int32(len(values)), LastOffsetDelta: int32(len(values) - 1), FirstTimestamp: ts[0], MaxTimestamp: slices.Max(ts)}
	if pid < 0 {
		b.ProducerEpoch, b.FirstSequence = -1, -1
	}
	if compressed {
		b.Attributes = 1 // gzip: the bytes are not checked here, only the flag
	}
	for i, v := range values {
		rec := []byte{0}
		rec = binary.AppendVarint(rec, ts[i]-ts[0])
		rec = binary.AppendVarint(rec, int64(i))
		rec = binary.AppendVarint(rec, -1)
		rec = binary.AppendVarint(rec, int64(len(v)))
		rec = append(rec, v...)
		rec = binary.AppendVarint(rec, 0)
		b.Records = append(binary.AppendVarint(b.Records, int64(len(rec))), rec...)
	}
	raw := b.AppendTo(nil)
	binary.BigEndian.PutUint32(raw[8:], uint32(len(raw)-12))
	binary.BigEndian.PutUint32(raw[17:], crc32.Checksum(raw[21:], crc32.MakeTable(crc32.Castagnoli)))
	return raw
}

// fixCRC recomputes a batch's CRC-32C after a header field changed.
func fixCRC(raw []byte) []byte {
	binary.BigEndian.PutUint32(raw[17:], crc32.Checksum(raw[21:], crc32.MakeTable(crc32.Castagnoli)))
	return raw
}

// FuzzTailRead: applying a partition's tail never panics on any bytes a
// broker could return, and leaves the partition warm.
func FuzzTailRead(f *testing.F) {
	legacy := scriptBatch([]string{"a", "b", "c"}, []int64{ddBase.UnixMilli(), ddBase.UnixMilli(), ddBase.UnixMilli()}, -1, 0, 0, false)
	idem := scriptBatch([]string{"x", "y"}, []int64{ddBase.UnixMilli(), ddBase.UnixMilli()}, 7, 0, 0, false)
	both := append(append([]byte(nil), legacy...), idem...)
	f.Add(both)
	f.Add(both[:len(both)-5])
	f.Add(legacy[:20])
	f.Add([]byte{})
	tab, err := seqstate.New(seqstate.Config{})
	if err != nil {
		f.Fatal(err)
	}
	tab.InternTopics([]seqstate.TopicRef{{Name: scriptTopic, Partitions: 1}})
	topic, _ := tab.LookupTopic([]byte(scriptTopic))
	c := New(Config{Table: tab, Warm: true}, &Settings{})
	f.Fuzz(func(t *testing.T, records []byte) {
		k := TailKey{Topic: topic}
		c.tailRead(k, records, ddBase, nil)
		p, sh := c.parts.get(partKeyOf(topic, 0))
		w := p.warm
		sh.mu.Unlock()
		if w != warm {
			t.Fatalf("partition left %v after its tail was read", w)
		}
	})
}
