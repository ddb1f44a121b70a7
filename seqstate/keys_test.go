package seqstate

import (
	"testing"
	"time"
)

// TestKeyTable: a written key is found within its TTL with its first
// offset, a different hi half is another key, the table is bounded.
func TestKeyTable(t *testing.T) {
	kt, err := NewKeyTable(KeyConfig{MaxKeys: 64, TTL: time.Hour, Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1700000000, 0)
	if _, ok := kt.Lookup(1, 2, now); ok {
		t.Fatal("empty table found a key")
	}
	kt.Commit(1, 2, 10, now)
	kt.Commit(1, 2, 11, now) // a repeat keeps the first offset
	if off, ok := kt.Lookup(1, 2, now); !ok || off != 10 {
		t.Fatalf("lookup: %d %v", off, ok)
	}
	if _, ok := kt.Lookup(1, 3, now); ok {
		t.Fatal("another key with the same low half matched")
	}
	if _, ok := kt.Lookup(1, 2, now.Add(time.Hour)); ok {
		t.Fatal("found after its TTL")
	}
	for i := uint64(100); i < 1100; i++ {
		kt.Commit(i*0x9e3779b97f4a7c15, i, int64(i), now)
	}
	if n := kt.Len(); n > 64 {
		t.Fatalf("%d keys kept, cap 64", n)
	}
	if kt.Evictions() == 0 {
		t.Fatal("no evictions counted")
	}
	if n := testing.AllocsPerRun(1000, func() {
		kt.Commit(77, 1, 1, now)
		kt.Lookup(77, 1, now)
	}); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}

// TestKeyTableTake: a key taken answers once; another key sharing its low
// half is left alone; an expired key is not taken.
func TestKeyTableTake(t *testing.T) {
	kt, err := NewKeyTable(KeyConfig{MaxKeys: 64, TTL: time.Hour, Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1700000000, 0)
	kt.Commit(1, 2, 10, now)
	if _, ok := kt.Take(1, 3, now); ok {
		t.Fatal("took another key with the same low half")
	}
	if off, ok := kt.Take(1, 2, now); !ok || off != 10 {
		t.Fatalf("take: %d %v", off, ok)
	}
	if _, ok := kt.Take(1, 2, now); ok {
		t.Fatal("a key answered twice")
	}
	kt.Commit(5, 6, 20, now)
	if _, ok := kt.Take(5, 6, now.Add(time.Hour)); ok {
		t.Fatal("took a key after its TTL")
	}
	if n := testing.AllocsPerRun(1000, func() {
		kt.Commit(77, 1, 1, now)
		kt.Take(77, 1, now)
	}); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}

// TestKeyTableLazy: a new table takes nothing for its cap (DefaultMaxKeys
// is about 40 MiB full) and grows only to it.
func TestKeyTableLazy(t *testing.T) {
	kt, err := NewKeyTable(KeyConfig{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1700000000, 0)
	if _, ok := kt.Lookup(1, 2, now); ok {
		t.Fatal("found a key in an empty table")
	}
	for i := range kt.shards {
		if kt.shards[i].ring != nil {
			t.Fatalf("shard %d sized before its first key", i)
		}
	}
	kt, err = NewKeyTable(KeyConfig{MaxKeys: 512, TTL: time.Hour, Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 5000; i++ {
		kt.Commit(i*0x9e3779b97f4a7c15, i, int64(i), now)
	}
	for i := range kt.shards {
		if n := len(kt.shards[i].ring); n != 256 {
			t.Fatalf("shard %d holds %d slots, want 256", i, n)
		}
	}
}
