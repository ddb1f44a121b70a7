package seqstate

import (
	"runtime"
	"testing"
	"time"
)

func newLegacy(t testing.TB, cfg LegacyConfig) *LegacyTable {
	t.Helper()
	lt, err := NewLegacyTable(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return lt
}

// TestLegacyRetryRule walks the retry rule of docs/legacy.md: a copy from
// another connection waits while the original is in flight and is a
// duplicate once it was appended; the same content on the connection that
// gets the acknowledgement is new data.
func TestLegacyRetryRule(t *testing.T) {
	lt := newLegacy(t, LegacyConfig{Shards: 1})
	now := time.Unix(1700000000, 0)
	const id, x, y, z = 0xabc, 1, 2, 3
	step := func(what string, conn uint64, want LegacyDecision, wantOff int64) {
		t.Helper()
		r := lt.Check(id, 0, conn, now)
		if r.Decision != want || (want == LegacyDuplicate && r.BaseOffset != wantOff) {
			t.Fatalf("%s: %v offset %d, want %v offset %d", what, r.Decision, r.BaseOffset, want, wantOff)
		}
	}
	step("first", x, LegacyNew, 0)
	step("retry from y while in flight", y, LegacyInFlight, 0)
	step("pipelined copy on x (new data)", x, LegacyNew, 0)
	lt.Commit(id, x, 10, 5, now)
	step("retry from y, one copy still in flight", y, LegacyInFlight, 0)
	lt.Commit(id, x, 11, 5, now)
	step("retry from y after both appended", y, LegacyDuplicate, 11)
	step("y again: it has the acknowledgement now (new data)", y, LegacyNew, 0)
	lt.Release(id, y)
	step("after y's copy was not appended, z's copy is new", z, LegacyNew, 0)
	lt.Commit(id, z, 12, 5, now)
	step("x retries z's batch", x, LegacyDuplicate, 12)
	// Window: an acknowledged batch is forgotten after it.
	now = now.Add(DefaultLegacyWindow)
	step("after the window", y, LegacyNew, 0)
}

// TestLegacyTimedOutAppendAnsweredWithoutOffset: an append whose response
// carried no offset (REQUEST_TIMED_OUT) is still an append: its retry is a
// duplicate with offset -1.
func TestLegacyTimedOutAppendAnsweredWithoutOffset(t *testing.T) {
	lt := newLegacy(t, LegacyConfig{Shards: 1})
	now := time.Unix(1700000000, 0)
	lt.Check(7, 0, 1, now)
	lt.Commit(7, 1, -1, -1, now)
	if r := lt.Check(7, 0, 2, now); r.Decision != LegacyDuplicate || r.BaseOffset != -1 {
		t.Fatalf("retry of a timed-out append: %+v", r)
	}
}

// TestLegacyBounded: the table never holds more than MaxIdentities, counts
// evictions of live entries, and a stale Commit/Release after an eviction
// is harmless.
func TestLegacyBounded(t *testing.T) {
	lt := newLegacy(t, LegacyConfig{MaxIdentities: 64, Shards: 4})
	now := time.Unix(1700000000, 0)
	for id := uint64(1); id <= 1000; id++ {
		lt.Check(id, 0, 1, now)
		lt.Commit(id, 1, int64(id), 0, now)
	}
	if n := lt.Len(); n > 64 {
		t.Fatalf("%d identities kept, cap 64", n)
	}
	if lt.Evictions() == 0 {
		t.Fatal("no evictions counted")
	}
	lt.Commit(1, 1, 5, 0, now)
	lt.Release(2, 1)
	if r := lt.Check(1000, 0, 2, now); r.Decision != LegacyDuplicate || r.BaseOffset != 1000 {
		t.Fatalf("newest identity: %+v", r)
	}
}

var sinkLegacy LegacyResult

// TestLegacyNoAllocs pins the steady state: check, commit and the
// duplicate answer allocate nothing once the table is sized.
func TestLegacyNoAllocs(t *testing.T) {
	lt := newLegacy(t, LegacyConfig{MaxIdentities: 1 << 12})
	now := time.Unix(1700000000, 0)
	id := uint64(1)
	for ; id < 1<<13; id++ { // grown to its cap (lazyRing)
		lt.Check(id, 0, 1, now)
	}
	allocs := testing.AllocsPerRun(10000, func() {
		id++
		sinkLegacy = lt.Check(id, 0, 1, now)
		lt.Commit(id, 1, int64(id), 0, now)
		sinkLegacy = lt.Check(id, 0, 2, now)
	})
	if sinkLegacy.Decision != LegacyDuplicate {
		t.Fatalf("last check: %+v", sinkLegacy)
	}
	if allocs != 0 {
		t.Fatalf("%v allocations per legacy batch", allocs)
	}
}

// BenchmarkLegacyCheckCommit is the legacy decision's cost per batch:
// check a new identity, commit it.
func BenchmarkLegacyCheckCommit(b *testing.B) {
	lt := newLegacy(b, LegacyConfig{})
	now := time.Unix(1700000000, 0)
	id := uint64(1)
	b.ReportAllocs()
	for b.Loop() {
		id++
		lt.Check(id*0x9e3779b97f4a7c15, 0, 1, now)
		lt.Commit(id*0x9e3779b97f4a7c15, 1, int64(id), 0, now)
	}
}

// BenchmarkLegacyMemory reports bytes per remembered identity with the
// table full (target: at most 64).
func BenchmarkLegacyMemory(b *testing.B) {
	const n = 1 << 20
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		lt := newLegacy(b, LegacyConfig{MaxIdentities: n})
		now := time.Unix(1700000000, 0)
		for id := uint64(1); id <= n; id++ {
			lt.Check(id*0x9e3779b97f4a7c15, 0, 1, now)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/n, "B/identity")
		runtime.KeepAlive(lt)
	}
}

// TestLegacyRetryToAnotherPartition: kafkajs assigns keyless records to
// partitions round-robin on every attempt, so a retry can carry the same
// records to another partition. Once the original's connection has closed
// that is a retry, answered with offset -1 (the records are in the
// original's partition); while it is open it is new data (a record
// broadcast to every partition).
func TestLegacyRetryToAnotherPartition(t *testing.T) {
	lt := newLegacy(t, LegacyConfig{Shards: 1})
	now := time.Unix(1700000000, 0)
	const id = 0xfeed
	if r := lt.Check(id, 0, 1, now); r.Decision != LegacyNew || !r.Tracked {
		t.Fatalf("first: %+v", r)
	}
	if r := lt.Check(id, 1, 2, now); r.Decision != LegacyNew || r.Tracked || r.Moved {
		t.Fatalf("same records to another partition while in flight: %+v", r)
	}
	lt.Commit(id, 1, 40, 9, now)
	if r := lt.Check(id, 2, 3, now); r.Decision != LegacyNew || !r.Tracked || !r.Moved || r.LogAppendTime != 9 {
		t.Fatalf("broadcast to another partition from a live producer: %+v", r)
	}
	lt.Commit(id, 3, 50, 9, now)
	lt.Orphan(3, []uint64{id}, nil)
	if r := lt.Check(id, 0, 4, now); r.Decision != LegacyDuplicate || r.BaseOffset != -1 || r.LogAppendTime != 9 {
		t.Fatalf("moved retry after the connection closed: %+v", r)
	}
	if r := lt.Check(id, 2, 5, now); r.Decision != LegacyDuplicate || r.BaseOffset != 50 {
		t.Fatalf("retry to the original partition: %+v", r)
	}
}

// TestLegacyOrphanLeavesInFlight: a session orphans its batches as soon as
// its client leaves, while some are still in flight upstream. Those keep
// their connection, so their Commit still lands; the second Orphan, once
// the responses have drained, hands them over.
func TestLegacyOrphanLeavesInFlight(t *testing.T) {
	lt := newLegacy(t, LegacyConfig{Shards: 1})
	now := time.Unix(1700000000, 0)
	const id = 0xbeef
	lt.Check(id, 0, 1, now)
	lt.Orphan(1, []uint64{id}, nil)
	lt.Commit(id, 1, 40, 9, now)
	if r := lt.Check(id, 0, 2, now); r.Decision != LegacyDuplicate || r.BaseOffset != 40 {
		t.Fatalf("retry after an early orphan and the commit: %+v", r)
	}
	lt.Check(id, 1, 3, now) // conn 2 has it now and is open: new, elsewhere
	lt.Commit(id, 3, 50, 9, now)
	lt.Orphan(3, []uint64{id}, nil)
	if r := lt.Check(id, 2, 4, now); r.Decision != LegacyDuplicate || r.BaseOffset != -1 {
		t.Fatalf("moved retry after the connection's orphan: %+v", r)
	}
}

// TestLegacyLazy: a new table allocates nothing for its cap, answers every
// call on an empty shard, and once used grows only as far as its cap.
func TestLegacyLazy(t *testing.T) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	lt := newLegacy(t, LegacyConfig{}) // DefaultMaxIdentities: ~16 MiB full
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapInuse) - int64(before.HeapInuse); grew > 256<<10 {
		t.Errorf("a new table takes %d KiB of heap", grew>>10)
	}
	now := time.Unix(1700000000, 0)
	if n := testing.AllocsPerRun(100, func() {
		lt.Commit(5, 1, 0, 0, now)
		lt.Release(5, 1)
		lt.Disown(5, 1)
		lt.Adopt(5, 1, now)
		lt.InFlightFrom(5, 1)
		lt.MatchRetry(5, 0, 1, now)
		lt.Orphan(1, []uint64{5}, nil)
	}); n != 0 {
		t.Errorf("%v allocations on an empty table", n)
	}
	for i := range lt.shards {
		if lt.shards[i].ring != nil {
			t.Fatalf("shard %d sized before its first batch", i)
		}
	}
	runtime.KeepAlive(lt)

	const max, shards = 1000, 4
	lt = newLegacy(t, LegacyConfig{MaxIdentities: max, Shards: shards})
	for id := uint64(1); id <= 10*max; id++ {
		lt.Check(id*0x9e3779b97f4a7c15, 0, 1, now)
	}
	for i := range lt.shards {
		if n := len(lt.shards[i].ring); n != max/shards {
			t.Fatalf("shard %d holds %d slots, want its share %d", i, n, max/shards)
		}
	}
	if n := lt.Len(); n > max {
		t.Fatalf("%d identities kept, cap %d", n, max)
	}
}

// TestLazyRingMatchesFullRing: a ring grown on demand keeps every entry in
// the slot a ring sized up front would, and forgets the same entries at the
// same pushes, whatever mix of pushes and forgets it sees; so the tables'
// eviction order is that of the full-sized ring.
func TestLazyRingMatchesFullRing(t *testing.T) {
	for _, capacity := range []int{1, 3, lazyRingStart - 1, lazyRingStart, lazyRingStart + 1, 300, 1024} {
		var full, lazy ringIndex[int]
		full.init(capacity)
		lazy.initLazy()
		rng := uint64(capacity)
		next := func(n uint64) uint64 { // xorshift: deterministic
			rng ^= rng << 13
			rng ^= rng >> 7
			rng ^= rng << 17
			return rng % n
		}
		ids := uint64(4 * capacity) // ids in play: some present, some not
		for step := 0; step < 20*capacity+200; step++ {
			id := 1 + next(ids)
			if next(4) == 0 {
				full.forget(id)
				lazy.forget(id)
			} else if _, ok := full.get(id); !ok {
				o1, e1 := full.push(id, step)
				o2, e2 := lazy.pushGrow(id, step, capacity)
				if o1 != o2 || e1 != e2 {
					t.Fatalf("cap %d step %d: full ring evicted (%d, %v), lazy (%d, %v)", capacity, step, o1, e1, o2, e2)
				}
			}
			if full.n != lazy.n || full.head != lazy.head {
				t.Fatalf("cap %d step %d: n %d/%d head %d/%d", capacity, step, full.n, lazy.n, full.head, lazy.head)
			}
			for id := uint64(1); id <= ids; id++ {
				s1, ok1 := full.get(id)
				s2, ok2 := lazy.get(id)
				if ok1 != ok2 || s1 != s2 || (ok1 && full.ring[s1] != lazy.ring[s2]) {
					t.Fatalf("cap %d step %d id %d: full (%d, %v), lazy (%d, %v)", capacity, step, id, s1, ok1, s2, ok2)
				}
			}
		}
		if len(lazy.ring) != capacity {
			t.Fatalf("cap %d: lazy ring ended with %d slots", capacity, len(lazy.ring))
		}
	}
}
