package owner

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output in testdata/*.txt")

// The scripts in testdata/*.txt pin each transition of docs/replicas.md
// ("The handover protocol") and the orderings of a handover, in the style
// of cockroachdb/datadriven:
//
//	# comment: the rule, and the docs section it comes from
//	command key=value ...
//	----
//	expected output (the effects, one a line)
//	<blank line>
//
// Commands:
//
//	case name=N self=S count=C [owners=N:I,...] [drain=10s] [peer-timeout=500ms]
//	     [quiet=300ms] [take-state=false] [layout=L] [replicas=a,b,...] [inc=I]
//	seen node=N                      a node first seen
//	read peer=P [phase=serving] [inc=pP] [serving=N,...] [released=N:I,...]
//	     [from=N:I,...] [yields=I:INC,...] [layout=L|-] [replicas=a,b,...]
//	                                 a peer's status (layout=-: none, an old version)
//	unreachable peer=P               a peer did not answer
//	drained node=N                   a node's Produce requests in flight are answered
//	taken node=N                     a node's take ended
//	handover [until=D]               SIGTERM (until: the bound, from the base time)
//	redirected                       a redirect was answered
//	tick                             time passed
//	show                             the machine's state
//	published                        this replica's status
//	foreign node=N                   the verdict for a Produce request of a node not served
//
// Every command takes at=D: the clock moves to a fixed base time plus D
// and stays there. A case starts at the base time with inc=me, layout=L and
// replicas r0..r(C-1); peers read with no layout= publish the same. Run
// with -rewrite to regenerate expected output (only when the diff is
// understood).

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
				t.Run(argMap(b.cmd)["name"], func(t *testing.T) {
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

var ddBase = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

type runner struct {
	m   *Machine
	cfg Config
	now time.Time
}

func argMap(cmd string) map[string]string {
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
	args := argMap(b.cmd)
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
	num := func(k, def string) int {
		v, err := strconv.Atoi(get(k, def))
		if err != nil {
			fail("%s: %v", k, err)
		}
		return v
	}
	dur := func(k, def string) time.Duration {
		d, err := time.ParseDuration(get(k, def))
		if err != nil {
			fail("%s: %v", k, err)
		}
		return d
	}
	ids := func(k string) []int32 {
		var out []int32
		for _, f := range strings.Split(get(k, "-"), ",") {
			if f == "-" || f == "" {
				continue
			}
			v, err := strconv.Atoi(f)
			if err != nil {
				fail("%s: %v", k, err)
			}
			out = append(out, int32(v))
		}
		return out
	}
	pairs := func(k string) map[int32]int {
		out := map[int32]int{}
		for _, f := range strings.Split(get(k, "-"), ",") {
			if f == "-" || f == "" {
				continue
			}
			a, b, _ := strings.Cut(f, ":")
			x, err1 := strconv.Atoi(a)
			y, err2 := strconv.Atoi(b)
			if err1 != nil || err2 != nil {
				fail("%s: want N:I, got %q", k, f)
			}
			out[int32(x)] = y
		}
		return out
	}
	verb := strings.Fields(b.cmd)[0]
	if verb == "case" {
		count := num("count", "3")
		replicas := make([]string, count)
		for i := range replicas {
			replicas[i] = "r" + strconv.Itoa(i)
		}
		if v := get("replicas", "-"); v != "-" {
			replicas = strings.Split(v, ",")
		}
		owners := map[int32]int{}
		for id, i := range pairs("owners") {
			owners[id] = i
		}
		cfg := Config{Self: num("self", "0"), Count: count, Owners: owners, Incarnation: get("inc", "me"),
			Replicas: replicas, Layout: get("layout", "L"),
			DrainTimeout: dur("drain", "10s"), PeerTimeout: dur("peer-timeout", "500ms"), Quiet: dur("quiet", "300ms"),
			TakeState: get("take-state", "true") == "true"}
		*rp = &runner{m: New(cfg, ddBase), cfg: cfg, now: ddBase}
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
	var ev Event
	switch verb {
	case "seen":
		ev = Seen{Node: int32(num("node", ""))}
	case "read":
		p := num("peer", "")
		phase, ok := ParsePhase(get("phase", "serving"))
		if !ok {
			fail("phase %q", args["phase"])
		}
		st := Status{Index: p, Incarnation: get("inc", "p"+strconv.Itoa(p)), Phase: phase, Serving: ids("serving"),
			Released: pairs("released"), From: pairs("from"), Yields: map[int]string{},
			Replicas: r.cfg.Replicas, Layout: r.cfg.Layout}
		for _, f := range strings.Split(get("yields", "-"), ",") {
			if f == "-" || f == "" {
				continue
			}
			a, inc, _ := strings.Cut(f, ":")
			i, err := strconv.Atoi(a)
			if err != nil {
				fail("yields: %v", err)
			}
			st.Yields[i] = inc
		}
		switch l := get("layout", "="); l {
		case "=":
		case "-":
			st.Layout, st.Replicas = "", nil
		default:
			st.Layout = l
		}
		if v := get("replicas", "-"); v != "-" {
			st.Replicas = strings.Split(v, ",")
		}
		ev = PeerStatus{Peer: p, Status: st}
	case "unreachable":
		ev = PeerUnreachable{Peer: num("peer", ""), Err: errors.New("connection refused")}
	case "drained":
		ev = Drained{Node: int32(num("node", ""))}
	case "taken":
		ev = Taken{Node: int32(num("node", ""))}
	case "handover":
		ev = HandOver{Until: ddBase.Add(dur("until", "1h"))}
	case "redirected":
		ev = Redirected{}
	case "tick":
		ev = Tick{}
	case "show":
		return show(r)
	case "published":
		return published(r.m.Status())
	case "foreign":
		id := int32(num("node", ""))
		return fmt.Sprintf("%s (redirect target %d)", r.m.Foreign(id), r.m.RedirectTarget(id))
	default:
		fail("unknown command %q", verb)
	}
	var lines []string
	for _, e := range r.m.Step(ev, r.now) {
		lines = append(lines, e.String())
	}
	return strings.Join(lines, "\n")
}

// show dumps the machine: phase, nodes, readiness, whether it is busy and
// its next deadline.
func show(r *runner) string {
	m := r.m
	var lines []string
	lines = append(lines, "phase "+m.Phase().String())
	for _, id := range m.sortedIDs() {
		n := m.nodes[id]
		s := fmt.Sprintf("node %d (owner %d): %s", id, n.owner, n.state)
		if n.target >= 0 {
			s += fmt.Sprintf(" to %d", n.target)
		}
		if n.from >= 0 {
			s += fmt.Sprintf(" from %d", n.from)
		}
		if n.fetching {
			s += " fetching"
		}
		if id >= 0 {
			s += fmt.Sprintf(", advertised at %d", m.Advertised(id))
		}
		lines = append(lines, s)
	}
	if err := m.Ready(); err != nil {
		lines = append(lines, "not ready: "+err.Error())
	} else {
		lines = append(lines, "ready")
	}
	owned, serving, covered := m.Count()
	lines = append(lines, fmt.Sprintf("owned %d, serving %d, covered %d; peers reachable %d; busy %v", owned, serving, covered, m.Reachable(), m.Busy()))
	if at, ok := m.Deadline(r.now); ok {
		lines = append(lines, "deadline "+at.Sub(ddBase).String())
	}
	if done, all := m.HandedOver(); done {
		lines = append(lines, fmt.Sprintf("handed over, all %v", all))
	}
	return strings.Join(lines, "\n")
}

func published(st Status) string {
	pairs := func(m map[int32]int) string {
		ids := make([]int32, 0, len(m))
		for id := range m {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		parts := make([]string, len(ids))
		for i, id := range ids {
			parts[i] = fmt.Sprintf("%d:%d", id, m[id])
		}
		return strings.Join(parts, ",")
	}
	peers := make([]int, 0, len(st.Yields))
	for p := range st.Yields {
		peers = append(peers, p)
	}
	slices.Sort(peers)
	yields := make([]string, len(peers))
	for i, p := range peers {
		yields[i] = fmt.Sprintf("%d:%s", p, st.Yields[p])
	}
	return fmt.Sprintf("index %d incarnation %s phase %s serving %v released [%s] from [%s] yields [%s] replicas %s layout %s",
		st.Index, st.Incarnation, st.Phase, st.Serving, pairs(st.Released), pairs(st.From), strings.Join(yields, ","),
		strings.Join(st.Replicas, ","), st.Layout)
}
