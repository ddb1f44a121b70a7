package seqstate

import (
	"errors"
	"go/parser"
	"go/token"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestDecisionString(t *testing.T) {
	t.Parallel()
	want := map[Decision]string{
		Accept: "accept", Duplicate: "duplicate", InFlight: "in_flight", OutOfOrder: "out_of_order",
		Fenced: "fenced", SequenceReuse: "sequence_reuse", Invalid: "invalid", 0: "Decision(0)", 99: "Decision(99)",
	}
	for d, s := range want {
		if got := d.String(); got != s {
			t.Errorf("Decision(%d).String() = %q, want %q", d, got, s)
		}
	}
}

// TestSequenceArithmetic pins DefaultRecordBatch.incrementSequence and
// ProducerAppendInfo.inSequence at the Integer.MAX_VALUE wrap.
func TestSequenceArithmetic(t *testing.T) {
	t.Parallel()
	cases := []struct {
		b    Batch
		last int32
	}{
		{Batch{FirstSeq: 0, Count: 1}, 0},
		{Batch{FirstSeq: 0, Count: 5}, 4},
		{Batch{FirstSeq: math.MaxInt32, Count: 1}, math.MaxInt32},
		{Batch{FirstSeq: math.MaxInt32, Count: 2}, 0},
		{Batch{FirstSeq: math.MaxInt32 - 1, Count: 4}, 1},
		{Batch{FirstSeq: 1, Count: math.MaxInt32}, math.MaxInt32},
		{Batch{FirstSeq: 2, Count: math.MaxInt32}, 0},
	}
	for _, c := range cases {
		if got := c.b.LastSeq(); got != c.last {
			t.Errorf("%+v.LastSeq() = %d, want %d", c.b, got, c.last)
		}
	}
	if !inSequence(math.MaxInt32, 0) || !inSequence(-1, 0) || !inSequence(4, 5) {
		t.Error("inSequence rejects a valid successor")
	}
	if inSequence(math.MaxInt32, 1) || inSequence(4, 4) || inSequence(4, 6) || inSequence(-1, 1) {
		t.Error("inSequence accepts an invalid successor")
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()
	var c Config
	c.EnsureDefaults()
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	if c.RetainedBatches != 5 || c.ProducerIDExpiration != 24*time.Hour || c.Shards&(c.Shards-1) != 0 ||
		c.Shards < 4*runtime.GOMAXPROCS(0) {
		t.Errorf("unexpected defaults %+v", c)
	}
	bad := []Config{
		{MaxEntries: -1},
		{Shards: 3},
		{MaxEntries: 4, Shards: 8},
		{RetainedBatches: MaxRetainedBatches + 1},
		{RetainedBatches: -1},
		{ProducerIDExpiration: -time.Second},
		{MaxFencedProducers: -1},
		{MaxTopics: -1},
		{MaxEntries: math.MaxInt32, Shards: 2},
	}
	for _, b := range bad {
		if _, err := New(b); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig", b, err)
		}
	}
	// a small MaxEntries lowers the default shard count instead of failing
	if _, err := New(Config{MaxEntries: 1}); err != nil {
		t.Errorf("New(MaxEntries: 1) = %v", err)
	}
}

// topic interns name and returns its TopicID, as the proxy would after a
// Metadata response naming it. It panics if the name is refused.
func (t *Table) topic(name string) TopicID {
	t.InternTopics([]TopicRef{{Name: name}})
	id, ok := t.LookupTopic([]byte(name))
	if !ok {
		panic("topic " + name + " refused")
	}
	return id
}

// TestConcurrentProducers runs many goroutines on one table under -race. Each
// goroutine is one producer pipelining batches to a few partitions, with
// retries, duplicates, aborts and epoch bumps, and checks every decision
// against what Kafka would answer: producers share shards and locks but never
// state. A second group hammers shared keys, sweeps and interning to shake
// out races in eviction and expiry; the table's bookkeeping is checked at the
// end.
func TestConcurrentProducers(t *testing.T) {
	t.Parallel()
	tab, err := New(Config{MaxEntries: 4096, Shards: 4, ProducerIDExpiration: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	base := time.Unix(1_700_000_000, 0)
	const producers, rounds = 16, 300
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			pid := int64(p)
			topic := tab.topic("t" + strconv.Itoa(p%3))
			var epoch int16
			seq := [4]int32{}
			for r := range rounds {
				now := base.Add(time.Duration(r) * time.Millisecond)
				k := Key{ProducerID: pid, Topic: topic, Partition: int32(r % 4)}
				part := r % 4
				b1 := Batch{Epoch: epoch, FirstSeq: seq[part], Count: 3, Fingerprint: uint32(r) + 1}
				b2 := Batch{Epoch: epoch, FirstSeq: seq[part] + 3, Count: 2, Fingerprint: uint32(r) + 1000}
				expect(t, tab.Check(k, b1, now), Accept)
				expect(t, tab.Check(k, b2, now), Accept) // pipelined
				expect(t, tab.Check(k, b1, now), InFlight)
				tab.Commit(k, b1, int64(r)*10, int64(r), now)
				if r%5 == 0 { // b2 fails upstream; the client retries it
					tab.Abort(k, b2)
					expect(t, tab.Check(k, b2, now), Accept)
				}
				tab.Commit(k, b2, int64(r)*10+3, int64(r), now)
				got := tab.Check(k, b1, now)
				if got.Decision != Duplicate || got.BaseOffset != int64(r)*10 {
					t.Errorf("pid %d round %d: retry = %+v, want duplicate at %d", pid, r, got, r*10)
				}
				expect(t, tab.Check(k, Batch{Epoch: epoch, FirstSeq: seq[part] + 9, Count: 1}, now), OutOfOrder)
				seq[part] += 5
				if r%50 == 49 {
					epoch++
					seq = [4]int32{}
				}
			}
		})
	}
	for g := range 4 {
		wg.Go(func() {
			for r := range rounds * 4 {
				// a clock that stays before the producers' (base onwards), so
				// sweeps expire only these keys
				now := base.Add(-3*time.Hour + time.Duration(r)*8*time.Second)
				k := Key{ProducerID: 1000 + int64(r%7), Partition: int32(g)}
				b := Batch{Epoch: int16(r % 3), FirstSeq: int32(r % 11), Count: 1}
				tab.Check(k, b, now)
				tab.Decide(k, b, now)
				tab.Commit(k, b, 1, 1, now)
				tab.Abort(k, b)
				tab.ObserveInitProducerID(2000+int64(r%5), int16(r%4), now)
				name := "shared" + strconv.Itoa(r%9)
				tab.InternTopics([]TopicRef{{Name: name, ID: [16]byte{byte(r % 9), 1}}})
				if id, ok := tab.LookupTopic([]byte(name)); !ok {
					t.Errorf("topic %s not found after interning", name)
				} else if id2, ok := tab.LookupTopicID([16]byte{byte(r % 9), 1}); !ok || id2 != id {
					t.Errorf("topic %s: id %d, by topic ID %d, %v", name, id, id2, ok)
				}
				if r%50 == 0 {
					tab.Expire(now)
				}
				_ = tab.Len() + int(tab.Evictions()+tab.Expirations())
			}
		})
	}
	wg.Wait()
	tab.dumpAll(t) // checks shard bookkeeping
}

func expect(t *testing.T, r Result, d Decision) {
	t.Helper()
	if r.Decision != d {
		t.Errorf("got %v, want %v", r.Decision, d)
	}
}

// TestLargeExpireSweep expires more than one lock hold's worth of entries.
func TestLargeExpireSweep(t *testing.T) {
	t.Parallel()
	tab, _ := New(Config{MaxEntries: 3 * expireBatch, Shards: 1, ProducerIDExpiration: time.Minute})
	now := time.Unix(0, 0)
	for i := range 3 * expireBatch {
		tab.Check(Key{ProducerID: int64(i)}, Batch{FirstSeq: 0, Count: 1}, now)
	}
	if n := tab.Expire(now.Add(time.Minute)); n != 3*expireBatch || tab.Len() != 0 || tab.Expirations() != uint64(n) {
		t.Fatalf("Expire = %d, Len = %d, Expirations = %d", n, tab.Len(), tab.Expirations())
	}
	tab.dumpAll(t)
}

// Sinks keep the compiler from optimising the measured calls away.
var (
	sinkResult Result
	sinkTopic  TopicID
)

// TestNoAllocs pins zero allocations on the hot paths for a known key:
// check-then-commit, duplicate detection, in-flight detection, abort and
// looking up a topic by name or ID, known or not (netip's TestNoAllocs
// style: each call is checked to have done what it should, so an early
// return cannot fake a pass).
func TestNoAllocs(t *testing.T) {
	tab, _ := New(Config{Shards: 4})
	now := time.Unix(1_700_000_000, 0)
	uuid := [16]byte{0: 0xab, 15: 0xcd}
	tab.InternTopics([]TopicRef{{Name: "orders", ID: uuid}})
	topic, _ := tab.LookupTopic([]byte("orders"))
	k := Key{ProducerID: 42, Topic: topic, Partition: 3}
	name := []byte("orders")
	tab.Commit(k, Batch{FirstSeq: 0, Count: 1}, 0, 0, now) // create the entry outside the measurement
	seq := int32(1)
	tab.ObserveInitProducerID(42, 0, now) // exercise the fence lookup too

	cases := []struct {
		name string
		f    func()
	}{
		{"check-then-commit", func() {
			b := Batch{FirstSeq: seq, Count: 1, Fingerprint: 7}
			sinkResult = tab.Check(k, b, now)
			if sinkResult.Decision != Accept {
				t.Fatalf("check: %v", sinkResult.Decision)
			}
			tab.Commit(k, b, int64(seq), 1, now)
			seq = incrementSequence(seq, 1)
		}},
		{"duplicate", func() {
			sinkResult = tab.Check(k, Batch{FirstSeq: seq - 1, Count: 1, Fingerprint: 7}, now)
			if sinkResult.Decision != Duplicate {
				t.Fatalf("duplicate: %v", sinkResult.Decision)
			}
		}},
		{"in-flight-then-abort", func() {
			b := Batch{FirstSeq: seq, Count: 1}
			if d := tab.Check(k, b, now).Decision; d != Accept {
				t.Fatalf("check: %v", d)
			}
			sinkResult = tab.Check(k, b, now)
			if sinkResult.Decision != InFlight {
				t.Fatalf("in flight: %v", sinkResult.Decision)
			}
			tab.Abort(k, b)
		}},
		{"decide", func() {
			sinkResult = tab.Decide(k, Batch{FirstSeq: seq, Count: 1}, now)
			if sinkResult.Decision != Accept {
				t.Fatalf("decide: %v", sinkResult.Decision)
			}
		}},
		{"topic", func() {
			a, ok1 := tab.LookupTopic(name)
			b, ok2 := tab.LookupTopicID(uuid)
			sinkTopic = a + b
			if !ok1 || !ok2 || sinkTopic != 2*k.Topic {
				t.Fatal("topic")
			}
		}},
		{"unknown-topic", func() {
			_, ok1 := tab.LookupTopic([]byte("unknown"))
			_, ok2 := tab.LookupTopicID([16]byte{1})
			if ok1 || ok2 {
				t.Fatal("unknown topic found")
			}
		}},
	}
	for _, c := range cases {
		if n := testing.AllocsPerRun(1000, c.f); n != 0 {
			t.Errorf("%s: %v allocs per run, want 0", c.name, n)
		}
	}
}

// TestImports enforces the package contract (lint as a test, pebble style):
// only the standard library and golang-lru's simplelru; no prometheus, slog,
// net or log; and no time.Now, because time is an argument.
func TestImports(t *testing.T) {
	t.Parallel()
	files, _ := filepath.Glob("*.go")
	fset := token.NewFileSet()
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			first, _, _ := strings.Cut(p, "/")
			switch {
			case p == "github.com/hashicorp/golang-lru/v2/simplelru":
			case strings.Contains(first, "."):
				t.Errorf("%s imports %s: only stdlib and simplelru are allowed", path, p)
			case p == "log" || p == "log/slog" || p == "net" || strings.HasPrefix(p, "net/"):
				t.Errorf("%s imports %s: seqstate does no I/O or logging", path, p)
			}
		}
	}
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		data, err := readFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(data, "\n") {
			code, _, _ := strings.Cut(line, "//")
			if strings.Contains(code, "time.Now") {
				t.Errorf("%s:%d calls time.Now: time must be an argument", path, i+1)
			}
		}
	}
}

func readFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	return string(b), err
}

// TestIndexChurn inserts, forgets, evicts and expires many keys in one small
// shard, so the index grows, wraps and shifts runs back on removal; the
// index, LRU links and slab bookkeeping are checked throughout (dumpAll).
func TestIndexChurn(t *testing.T) {
	t.Parallel()
	tab, _ := New(Config{MaxEntries: 3000, Shards: 1, ProducerIDExpiration: time.Hour})
	rng := rand.New(rand.NewPCG(1, 2))
	now := time.Unix(0, 0)
	for i := range 200_000 {
		k := Key{ProducerID: int64(rng.IntN(2000)), Topic: TopicID(rng.IntN(3)), Partition: int32(rng.IntN(2))}
		switch rng.IntN(4) {
		case 0, 1: // create, or append in sequence
			tab.Commit(k, Batch{FirstSeq: int32(i), Count: 1}, 1, 1, now)
		case 2: // forget: a committed batch that does not follow the tail
			tab.Commit(k, Batch{FirstSeq: int32(i) + 5, Count: 1}, 1, 1, now)
		case 3:
			now = now.Add(time.Duration(rng.IntN(100)) * time.Second)
		}
		if i%10_000 == 0 {
			tab.Expire(now)
			tab.dumpAll(t)
		}
	}
	tab.dumpAll(t)
	if tab.Evictions() == 0 || tab.Expirations() == 0 || tab.Len() == 0 {
		t.Errorf("evictions %d, expirations %d, len %d", tab.Evictions(), tab.Expirations(), tab.Len())
	}
}

// TestOneProducerManyPartitions: MaxEntries caps the table, not a shard, so
// a producer on more partitions than MaxEntries/Shards, all in its one
// shard, keeps every entry and its retries are duplicates. (With a
// per-shard cap of 1024/8 = 128 it evicted its own entries, and a retry was
// accepted and forwarded again.)
func TestOneProducerManyPartitions(t *testing.T) {
	t.Parallel()
	tab, _ := New(Config{MaxEntries: 1024, Shards: 8})
	now := time.Unix(1_700_000_000, 0)
	topic := tab.topic("orders")
	const partitions = 200
	for p := range partitions {
		k := Key{ProducerID: 7, Topic: topic, Partition: int32(p)}
		b := Batch{FirstSeq: 0, Count: 3, Fingerprint: 11}
		expect(t, tab.Check(k, b, now), Accept)
		tab.Commit(k, b, int64(100+p), 5, now)
	}
	for p := range partitions {
		k := Key{ProducerID: 7, Topic: topic, Partition: int32(p)}
		r := tab.Check(k, Batch{FirstSeq: 0, Count: 3, Fingerprint: 11}, now)
		if r.Decision != Duplicate || r.BaseOffset != int64(100+p) {
			t.Fatalf("partition %d: retry = %+v, want duplicate at %d", p, r, 100+p)
		}
	}
	if tab.Len() != partitions || tab.Evictions() != 0 {
		t.Errorf("Len %d, Evictions %d; want %d, 0", tab.Len(), tab.Evictions(), partitions)
	}
	tab.dumpAll(t)
}

// pidsByShard returns, for each shard, the first n producer ids at or after
// from that it holds.
func pidsByShard(tab *Table, from int64, n int) [][]int64 {
	out := make([][]int64, len(tab.shards))
	for pid, full := from, 0; full < len(out); pid++ {
		s := tab.shardIndex(pid)
		if len(out[s]) < n {
			if out[s] = append(out[s], pid); len(out[s]) == n {
				full++
			}
		}
	}
	return out
}

// TestGlobalCapOvershoot walks the documented worst case: one shard holds
// all MaxEntries entries, then each other (empty) shard inserts one, which
// the cap allows because an insert only evicts from its own shard. That is
// MaxEntries+Shards-1, and no insert goes beyond it: every shard now holds
// an entry and evicts its own least recently used one.
func TestGlobalCapOvershoot(t *testing.T) {
	t.Parallel()
	const maxEntries, shards = 64, 4
	tab, _ := New(Config{MaxEntries: maxEntries, Shards: shards})
	now := time.Unix(0, 0)
	pids := pidsByShard(tab, 0, 3)
	b := Batch{FirstSeq: 0, Count: 1}
	for p := range maxEntries {
		tab.Check(Key{ProducerID: pids[0][0], Partition: int32(p)}, b, now)
	}
	if tab.Len() != maxEntries || tab.Evictions() != 0 {
		t.Fatalf("Len %d, Evictions %d", tab.Len(), tab.Evictions())
	}
	for s := 1; s < shards; s++ {
		tab.Check(Key{ProducerID: pids[s][0]}, b, now)
	}
	if tab.Len() != maxEntries+shards-1 || tab.Evictions() != 0 {
		t.Fatalf("Len %d, Evictions %d; want %d, 0", tab.Len(), tab.Evictions(), maxEntries+shards-1)
	}
	for s := range shards {
		for _, pid := range pids[s][1:] {
			tab.Check(Key{ProducerID: pid, Partition: 1000}, b, now)
			if tab.Len() != maxEntries+shards-1 {
				t.Fatalf("Len %d after an insert into shard %d", tab.Len(), s)
			}
		}
	}
	if tab.Evictions() != 2*shards {
		t.Errorf("Evictions %d, want %d", tab.Evictions(), 2*shards)
	}
	// Each shard evicted its own least recently used entries: shard 0 its
	// first two partitions, the others their first producer.
	for p, want := range []bool{false, false, true} {
		if got := tab.Decide(Key{ProducerID: pids[0][0], Partition: int32(p)}, Batch{FirstSeq: 5, Count: 1}, now).Decision == OutOfOrder; got != want {
			t.Errorf("shard 0 partition %d held: %v, want %v", p, got, want)
		}
	}
	tab.dumpAll(t)
}

// TestGlobalCapFlood: goroutines insert distinct producer ids, each a new
// entry, into a small table; the table never holds more than
// MaxEntries+Shards-1 entries (Len is exact at every moment), and at the
// end it is full and consistent.
func TestGlobalCapFlood(t *testing.T) {
	t.Parallel()
	const maxEntries, shards, workers, perWorker = 256, 8, 4, 20_000
	tab, _ := New(Config{MaxEntries: maxEntries, Shards: shards})
	now := time.Unix(0, 0)
	var wg sync.WaitGroup
	var peak atomic.Int64
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				k := Key{ProducerID: int64(w*perWorker + i), Partition: int32(i % 3)}
				tab.Check(k, Batch{FirstSeq: int32(i % 5), Count: 1}, now)
				n := int64(tab.Len())
				if n > maxEntries+shards-1 {
					t.Errorf("Len %d > MaxEntries+Shards-1 = %d", n, maxEntries+shards-1)
					return
				}
				if n > peak.Load() {
					peak.Store(n) // racy maximum; only logged
				}
			}
		})
	}
	wg.Wait()
	tab.dumpAll(t) // total ≤ MaxEntries+Shards-1, per-shard bookkeeping
	if tab.Len() < maxEntries || tab.Evictions() < workers*perWorker-maxEntries-shards {
		t.Errorf("Len %d, Evictions %d", tab.Len(), tab.Evictions())
	}
	t.Logf("Len %d, peak seen %d, evictions %d", tab.Len(), peak.Load(), tab.Evictions())
}

// TestCompaction: when most of a shard's entries expire, the shard compacts
// (shard.compact): the survivors, which sat at the top of the slab, move
// down, and the slab pages and index shrink. Their LRU order, batches and
// offsets, wide ones included, are unchanged.
func TestCompaction(t *testing.T) {
	t.Parallel()
	const n, survivors = 5000, 100
	tab, _ := New(Config{MaxEntries: n, Shards: 1, ProducerIDExpiration: time.Hour})
	base := time.Unix(1_700_000_000, 0)
	for i := range n {
		k := Key{ProducerID: int64(i)}
		now := base.Add(time.Duration(i) * time.Second)
		tab.Commit(k, Batch{FirstSeq: 0, Count: 2}, int64(i), 1, now)
		// 1<<40 apart from the first offset: one of the two goes wide
		tab.Commit(k, Batch{FirstSeq: 2, Count: 2}, int64(i)+1<<40, 2, now)
	}
	entries := regexp.MustCompile(`\{[^}]*\}`)
	before := entries.FindAllString(tab.dumpAll(t), -1)
	s := &tab.shards[0].shard
	pages, index, wide := len(s.pages), len(s.index), len(s.wide)
	if wide != n {
		t.Fatalf("%d wide values, want %d", wide, n)
	}
	// Everything but the last survivors expires.
	if got := tab.Expire(base.Add(time.Hour + (n-survivors-1)*time.Second)); got != n-survivors {
		t.Fatalf("expired %d, want %d", got, n-survivors)
	}
	after := entries.FindAllString(tab.dumpAll(t), -1) // checks the bookkeeping
	if !slices.Equal(after, before[n-survivors:]) {
		t.Fatalf("entries changed by compaction:\nbefore %v\nafter  %v", before[n-survivors:], after)
	}
	if s.used > 2*survivors || len(s.pages) >= pages || len(s.index) >= index || len(s.wide) != survivors {
		t.Errorf("after compaction: used %d, pages %d (was %d), index %d (was %d), wide %d",
			s.used, len(s.pages), pages, len(s.index), index, len(s.wide))
	}
	now := base.Add(n * time.Second) // the survivors are live
	for i := n - survivors; i < n; i++ {
		k := Key{ProducerID: int64(i)}
		if r := tab.Check(k, Batch{FirstSeq: 0, Count: 2}, now); r.Decision != Duplicate || r.BaseOffset != int64(i) {
			t.Fatalf("pid %d first batch: %+v", i, r)
		}
		if r := tab.Check(k, Batch{FirstSeq: 2, Count: 2}, now); r.Decision != Duplicate || r.BaseOffset != int64(i)+1<<40 {
			t.Fatalf("pid %d second batch: %+v", i, r)
		}
	}
	tab.dumpAll(t)
}

// TestCompactionBoundsMemory: a large producer's entries move from shard to
// shard (it restarts with a new producer id, and the old entries expire);
// without compaction every shard would keep a slab for all of them.
func TestCompactionBoundsMemory(t *testing.T) {
	t.Parallel()
	const maxEntries, shards, partitions = 4096, 4, 3000
	tab, _ := New(Config{MaxEntries: maxEntries, Shards: shards, ProducerIDExpiration: time.Hour})
	now := time.Unix(0, 0)
	pids := pidsByShard(tab, 1, 1)
	for round := range 2 * shards {
		pid := pids[round%shards][0]
		for p := range partitions {
			tab.Commit(Key{ProducerID: pid, Partition: int32(p)}, Batch{FirstSeq: int32(round), Count: 1}, 1, 1, now)
		}
		now = now.Add(time.Hour)
		tab.Expire(now)
	}
	used := 0
	for i := range tab.shards {
		used += int(tab.shards[i].used)
	}
	if tab.Len() != 0 || used > 2*tab.Len()+shards*compactMinUsed {
		t.Errorf("Len %d, slab entries handed out %d", tab.Len(), used)
	}
	tab.dumpAll(t)
}

// TestSettleBatchesDropped: an abort names the pending batches it takes
// with it, each with its sequence range and fingerprint, and nothing else.
func TestSettleBatchesDropped(t *testing.T) {
	t.Parallel()
	tab, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(0, 0)
	k := Key{ProducerID: 7, Partition: 1}
	b0 := Batch{Epoch: 2, FirstSeq: 0, Count: 3, Fingerprint: 11}
	b1 := Batch{Epoch: 2, FirstSeq: 3, Count: 2, Fingerprint: 12}
	b2 := Batch{Epoch: 2, FirstSeq: 5, Count: 4, Fingerprint: 13}
	for _, b := range []Batch{b0, b1, b2} {
		if r := tab.Check(k, b, now); r.Decision != Accept {
			t.Fatalf("Check(%+v) = %v", b, r.Decision)
		}
	}
	tab.Commit(k, b0, 100, 1, now)
	got := tab.SettleBatchesDropped([]Outcome{{Key: k, Batch: b1}}, now, nil)
	if want := []Op{{Key: k, Batch: b2}}; !slices.Equal(got, want) {
		t.Fatalf("dropped %+v, want %+v", got, want)
	}
	if r := tab.Decide(k, b2, now); r.Decision != OutOfOrder {
		t.Errorf("the dropped batch is %v, want out_of_order (no longer pending)", r.Decision)
	}
	// An abort that drops nothing adds nothing; a commit neither.
	if got := tab.SettleBatchesDropped([]Outcome{{Key: k, Batch: b2}, {Key: k, Batch: b0, Appended: true, BaseOffset: 100}}, now, got[:0]); len(got) != 0 {
		t.Errorf("dropped %+v, want nothing", got)
	}
}

// TestCommitLogged: a batch read back from the log that the window has
// moved past changes nothing (Commit forgets the entry, its batch in
// flight with it); one the window holds committed without an offset takes
// the log's; one that follows the window is committed as Commit does.
func TestCommitLogged(t *testing.T) {
	t.Parallel()
	now := time.Unix(0, 0)
	k := Key{ProducerID: 7, Partition: 1}
	batch := func(seq int32) Batch { return Batch{Epoch: 0, FirstSeq: seq, Count: 1, Fingerprint: uint32(seq) + 1} }
	fill := func() *Table {
		tab, err := New(Config{})
		if err != nil {
			t.Fatal(err)
		}
		for seq := int32(0); seq < 6; seq++ {
			tab.Check(k, batch(seq), now)
			tab.Commit(k, batch(seq), int64(seq), 1, now)
		}
		tab.Check(k, batch(6), now) // in flight
		return tab
	}
	tab := fill()
	tab.CommitLogged(k, Batch{FirstSeq: 0, Count: 1}, 0, 1, now)
	if r := tab.Decide(k, batch(6), now); r.Decision != InFlight {
		t.Errorf("after a logged batch the window moved past, the batch in flight is %v, want in_flight", r.Decision)
	}
	tab = fill()
	tab.Commit(k, Batch{FirstSeq: 0, Count: 1}, 0, 1, now)
	if r := tab.Decide(k, batch(6), now); r.Decision != Accept {
		t.Errorf("Commit of a batch the window moved past: %v, want accept (the entry forgotten)", r.Decision)
	}

	tab, _ = New(Config{})
	tab.Check(k, batch(0), now)
	tab.Commit(k, batch(0), -1, 5, now) // REQUEST_TIMED_OUT
	tab.CommitLogged(k, Batch{FirstSeq: 0, Count: 1}, 40, 5, now)
	if r := tab.Decide(k, batch(0), now); r.Decision != Duplicate || r.BaseOffset != 40 {
		t.Errorf("after the log gave its offset: %+v, want a duplicate at 40", r)
	}
	tab.CommitLogged(k, Batch{FirstSeq: 0, Count: 1}, 41, 5, now)
	if r := tab.Decide(k, batch(0), now); r.BaseOffset != 40 {
		t.Errorf("a known offset changed to %d", r.BaseOffset)
	}
	tab.CommitLogged(k, Batch{FirstSeq: 1, Count: 1}, 42, 6, now)
	if r := tab.Decide(k, batch(1), now); r.Decision != Duplicate || r.BaseOffset != 42 {
		t.Errorf("a logged batch after the window: %+v, want a duplicate at 42", r)
	}
}
