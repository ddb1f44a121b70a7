package seqstate

import (
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

var benchNow = time.Unix(1_700_000_000, 0)

// BenchmarkCheckCommit is the proxy's hot path for a known producer: Check a
// new in-sequence batch, then Commit it when the upstream confirms. One op is
// one Check plus one Commit.
//
// Medians of 5 interleaved runs of both test binaries on the 2-core VM,
// 24-byte slots and the general path vs 16-byte slots with appendNext and
// commitNewest (see the package documentation, Speed):
//
//	retained=1    80 ns  ->  65 ns
//	retained=5    80 ns  ->  64 ns
//	retained=16   83 ns  ->  61 ns
//
// The target is 50 ns. BenchmarkShardLockFloor, the two shard
// lock/unlock pairs every Check+Commit needs, is ~33 ns of it here; the
// proxy now takes them once per request instead (BenchmarkRequest). In 15
// alternated runs, retained=5 took a median of 52 ns on the code before
// the per-request API and 47 ns after, a gap this VM's noise may account
// for (its MRU-hit path did not change).
func BenchmarkCheckCommit(b *testing.B) {
	for _, retained := range []int{1, 5, 16} {
		b.Run(fmt.Sprintf("retained=%d", retained), func(b *testing.B) {
			tab, _ := New(Config{RetainedBatches: retained})
			k := Key{ProducerID: 42, Topic: tab.topic("orders"), Partition: 3}
			seq := int32(0)
			b.ReportAllocs()
			for b.Loop() {
				bt := Batch{FirstSeq: seq, Count: 10, Fingerprint: 7}
				if tab.Check(k, bt, benchNow).Decision != Accept {
					b.Fatal("not accepted")
				}
				tab.Commit(k, bt, int64(seq), 1, benchNow)
				seq = incrementSequence(seq, 10)
			}
		})
	}
}

// BenchmarkRequest is the proxy's hot path per Produce request, for a known
// producer: a request of n batches (one per partition, as clients send
// them) decided with CheckBatches, then settled with SettleBatches, each
// one shard lock acquisition. One op is one request; ns/batch is the
// check+commit cost per batch.
//
// Medians (minimums) of 15 alternated runs on the shared 2-core VM, the
// issue's target being 50 ns per batch:
//
//	batches=1    47.9 ns/batch (46.0)
//	batches=8    50.4 ns/batch (45.9)
//
// The package documentation (Speed) says where the time goes.
func BenchmarkRequest(b *testing.B) {
	for _, n := range []int{1, 8} {
		b.Run(fmt.Sprintf("batches=%d", n), func(b *testing.B) {
			tab, _ := New(Config{})
			topic := tab.topic("orders")
			ops := make([]Op, n)
			outs := make([]Outcome, n)
			for i := range ops {
				k := Key{ProducerID: 42, Topic: topic, Partition: int32(i)}
				ops[i] = Op{Key: k, Batch: Batch{Count: 10, Fingerprint: 7}}
				outs[i] = Outcome{Key: k, Batch: ops[i].Batch, Appended: true, MaxTimestamp: 1}
			}
			seq := int32(0)
			b.ReportAllocs()
			for b.Loop() {
				// What the proxy sets per batch: the sequence from the
				// request, the offset from the response.
				for i := range ops {
					ops[i].Batch.FirstSeq = seq
				}
				tab.CheckBatches(ops, benchNow)
				for i := range outs {
					if ops[i].Result.Decision != Accept {
						b.Fatal("not accepted")
					}
					outs[i].Batch.FirstSeq, outs[i].BaseOffset = seq, int64(seq)
				}
				tab.SettleBatches(outs, benchNow)
				seq = incrementSequence(seq, 10)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/batch")
		})
	}
}

// BenchmarkShardLockFloor is the part of BenchmarkCheckCommit no table layout
// can remove: Check and Commit each lock and unlock their shard's mutex once,
// two uncontended lock/unlock pairs per op (each an atomic read-modify-write,
// a full barrier on amd64). On the 2-core VM this was measured on, that alone
// is ~33 ns of the 50 ns a Check+Commit pair may cost (a hot path run
// for every idempotent batch).
func BenchmarkShardLockFloor(b *testing.B) {
	tab, _ := New(Config{})
	s := tab.shard(42)
	b.ReportAllocs()
	for b.Loop() {
		s.mu.Lock()
		s.live++
		s.mu.Unlock()
		s.mu.Lock()
		s.live--
		s.mu.Unlock()
	}
}

// BenchmarkDuplicate is a retry of the oldest retained batch: the full
// window is scanned.
//
// Medians as for BenchmarkCheckCommit (unchanged by the 16-byte slots):
//
//	retained=5    36 ns  ->  38 ns
//	retained=16   48 ns  ->  48 ns
func BenchmarkDuplicate(b *testing.B) {
	for _, retained := range []int{5, 16} {
		b.Run(fmt.Sprintf("retained=%d", retained), func(b *testing.B) {
			tab, _ := New(Config{RetainedBatches: retained})
			k := Key{ProducerID: 42, Topic: tab.topic("orders"), Partition: 3}
			for i := range retained {
				tab.Commit(k, Batch{FirstSeq: int32(i * 10), Count: 10}, int64(i), 1, benchNow)
			}
			oldest := Batch{FirstSeq: 0, Count: 10}
			b.ReportAllocs()
			b.ReportMetric(1, "dups/op")
			for b.Loop() {
				if tab.Check(k, oldest, benchNow).Decision != Duplicate {
					b.Fatal("not a duplicate")
				}
			}
		})
	}
}

// BenchmarkCheckCommitParallel runs check-then-commit from every P
// (-cpu 1,2 sweeps GOMAXPROCS), each goroutine one producer on its own keys,
// as connections of different producers would. ns/op is per Check+Commit
// pair across all goroutines, so it should fall as cores are added.
func BenchmarkCheckCommitParallel(b *testing.B) {
	for _, partitions := range []int{1, 100} {
		b.Run(fmt.Sprintf("partitions=%d", partitions), func(b *testing.B) {
			tab, _ := New(Config{})
			topic := tab.topic("orders")
			var nextPID atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				pid := nextPID.Add(1)
				seqs := make([]int32, partitions)
				for i := range partitions { // create the entries outside the loop
					tab.Commit(Key{ProducerID: pid, Topic: topic, Partition: int32(i)}, Batch{FirstSeq: 0, Count: 1}, 0, 0, benchNow)
					seqs[i] = 1
				}
				i := 0
				for pb.Next() {
					k := Key{ProducerID: pid, Topic: topic, Partition: int32(i)}
					bt := Batch{FirstSeq: seqs[i], Count: 1}
					if tab.Check(k, bt, benchNow).Decision != Accept {
						panic("not accepted")
					}
					tab.Commit(k, bt, 1, 1, benchNow)
					seqs[i]++
					if i++; i == partitions {
						i = 0
					}
				}
			})
		})
	}
}

// BenchmarkTableMemory fills a table with 1,000,000 producer-partitions, each
// holding a full window of committed batches (the steady state of an active
// producer), and reports the heap per entry (HeapAlloc delta after GC, the
// whole table: LRU elements, its map, slabs). It then measures a duplicate
// lookup on a random entry of the large table, where cache misses dominate.
//
// B/entry is deterministic for a given shard count (8 here, GOMAXPROCS 2):
//
//	                simplelru, 32 B slots   intrusive LRU, 24 B   16 B slots
//	retained=1      184.1 B/entry           91.7 B/entry          83.6 B/entry
//	retained=5      312.2 B/entry           189.2 B/entry         148.6 B/entry
//
// The first memory target, 150 B/entry with 5 retained batches, is met;
// a later one, 100 B, is not (the package documentation, Layout, says
// where the 148.6 B go and why; docs/performance.md lists what was
// weighed). Neither the per-request API nor the growing first page (see
// shard.addRoom) changed a byte of it.
func BenchmarkTableMemory(b *testing.B) {
	const entries = 1_000_000
	for _, retained := range []int{1, 5} {
		b.Run(fmt.Sprintf("entries=1M/retained=%d", retained), func(b *testing.B) {
			runtime.GC()
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			// MaxEntries is table-wide, so the table holds them all
			tab, _ := New(Config{MaxEntries: entries, RetainedBatches: retained})
			topic := tab.topic("orders")
			key := func(i int) Key { return Key{ProducerID: int64(i / 100), Topic: topic, Partition: int32(i % 100)} }
			for i := range entries {
				k := key(i)
				for j := range retained {
					tab.Commit(k, Batch{FirstSeq: int32(j), Count: 1, Fingerprint: 9}, int64(j), 1, benchNow)
				}
			}
			runtime.GC()
			runtime.GC()
			runtime.ReadMemStats(&after)
			if tab.Len() != entries || tab.Evictions() != 0 {
				b.Fatalf("len %d, evictions %d", tab.Len(), tab.Evictions())
			}
			perEntry := float64(after.HeapAlloc-before.HeapAlloc) / entries
			x := uint64(1)
			b.ReportAllocs()
			for b.Loop() {
				x = x*6364136223846793005 + 1442695040888963407
				if tab.Check(key(int(x>>33)%entries), Batch{FirstSeq: 0, Count: 1, Fingerprint: 9}, benchNow).Decision != Duplicate {
					b.Fatal("not a duplicate")
				}
			}
			b.ReportMetric(perEntry, "B/entry")
			runtime.KeepAlive(tab)
		})
	}
}

// BenchmarkTableFresh is the heap of a default table (New(Config{}), 8
// shards here) holding 64 entries of distinct producer ids, spread over all
// its shards, as in a proxy serving a few producers: B/table is the
// HeapAlloc delta after GC, B/64entries the part the entries add to the
// empty table. One op builds such a table.
//
//	                 full 4096-entry first pages   first page growing from 8
//	B/table          4,527,664                     17,504
//	B/64entries      4,522,680                     12,536
func BenchmarkTableFresh(b *testing.B) {
	const producers = 64
	build := func(tab *Table) {
		topic := tab.topic("orders")
		for pid := range producers {
			tab.Commit(Key{ProducerID: int64(pid), Topic: topic}, Batch{FirstSeq: 0, Count: 1}, 0, 1, benchNow)
		}
	}
	runtime.GC()
	runtime.GC()
	var before, empty, after runtime.MemStats
	runtime.ReadMemStats(&before)
	tab, _ := New(Config{})
	runtime.GC()
	runtime.ReadMemStats(&empty)
	build(tab)
	runtime.GC()
	runtime.ReadMemStats(&after)
	if tab.Len() != producers {
		b.Fatalf("len %d", tab.Len())
	}
	b.ReportAllocs()
	for b.Loop() {
		t, _ := New(Config{})
		build(t)
	}
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc), "B/table")
	b.ReportMetric(float64(after.HeapAlloc-empty.HeapAlloc), "B/64entries")
	runtime.KeepAlive(tab)
}

// BenchmarkTopic looks up a known topic among 1000, by name from a request
// buffer and by topic ID, as the proxy does for every partition of every
// Produce.
func BenchmarkTopic(b *testing.B) {
	tab, _ := New(Config{})
	refs := make([]TopicRef, 1000)
	for i := range refs {
		refs[i] = TopicRef{Name: fmt.Sprintf("topic-%d", i), ID: [16]byte{byte(i), byte(i >> 8), 15: 1}}
	}
	tab.InternTopics(refs)
	b.Run("name", func(b *testing.B) {
		name := []byte("topic-500")
		b.ReportAllocs()
		for b.Loop() {
			sinkTopic, _ = tab.LookupTopic(name)
		}
	})
	b.Run("id", func(b *testing.B) {
		id := refs[500].ID
		b.ReportAllocs()
		for b.Loop() {
			sinkTopic, _ = tab.LookupTopicID(id)
		}
	})
}

// BenchmarkInternTopics interns n new topics (name and ID) into an empty
// table, one per InternTopics call, the worst case (a Metadata response that
// names many topics interns them in one call). Each new name costs amortized
// O(1). B/name is the heap the interned topics keep (HeapAlloc delta after
// GC, names of 9 to 11 bytes included); the slot arrays double, so it varies
// with n.
//
// On the shared 2-core VM (3 runs each, ns/name):
//
//	names     this interner   two plain Go maps (gomap)   the interner it replaced
//	1,000     280-520         225-230                     21,000
//	10,000    510-720         310-350                     375,000
//	100,000   690-820         360-400                     (not run: quadratic)
//
// The replaced interner copied its whole map for every new name. The rise
// from 1,000 names is the tables outgrowing the CPU caches, as for the Go
// maps, not a cost that grows with n: 10,000 to 100,000 is flat.
func BenchmarkInternTopics(b *testing.B) {
	for _, n := range []int{1_000, 10_000, 100_000} {
		refs := make([]TopicRef, n)
		for i := range refs {
			refs[i] = TopicRef{Name: fmt.Sprintf("topic-%d", i), ID: [16]byte{byte(i), byte(i >> 8), byte(i >> 16), 15: 1}}
		}
		b.Run(fmt.Sprintf("names=%d", n), func(b *testing.B) {
			build := func() *Table {
				tab, _ := New(Config{MaxEntries: 1, MaxTopics: n})
				for i := range refs {
					tab.InternTopics(refs[i : i+1])
				}
				return tab
			}
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			tab := build()
			runtime.GC()
			runtime.ReadMemStats(&after)
			if tab.Topics() != n || tab.TopicsRefused() != 0 {
				b.Fatalf("topics %d, refused %d", tab.Topics(), tab.TopicsRefused())
			}
			heap := float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
			runtime.KeepAlive(tab)
			b.ReportAllocs()
			for b.Loop() {
				build()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/name")
			b.ReportMetric(heap, "B/name")
		})
		// The same inserts into two plain Go maps, for scale: a hash table
		// of n names gets slower per insert as it outgrows the caches.
		b.Run(fmt.Sprintf("names=%d/gomap", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				names, ids := map[string]TopicID{}, map[[16]byte]TopicID{}
				for i, r := range refs {
					if _, ok := names[r.Name]; !ok {
						names[strings.Clone(r.Name)] = TopicID(i)
					}
					if _, ok := ids[r.ID]; !ok {
						ids[r.ID] = TopicID(i)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/name")
		})
	}
}
