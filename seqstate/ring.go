package seqstate

import (
	"fmt"
	"math/bits"
	"time"
)

// ringIndex is the storage of the tables that remember recent batches or
// keys for a while (KeyTable): entries live in a ring in
// insertion order, which is also expiry order (an entry lives a fixed time
// after it was last touched, and a touched entry is not moved: it is
// overwritten a little early at worst, which only forgets a retry its
// client has most likely given up on), indexed by an open-addressing table
// of ring slots: uint32 words, slot+1 or 0 for empty, at most half full,
// linear probing, backward-shift deletion. Each slot's id (never 0; 0 marks
// a free slot) is kept beside the ring rather than in the entry, so probing
// reads a dense array and needs nothing of E. Ring and index are sized once,
// so the steady state allocates nothing: the entry plus 16 bytes each.
//
// It is not safe for concurrent use; each table shards it under mutexes.
type ringIndex[E any] struct {
	index []uint32
	mask  uint32
	ids   []uint64 // ids[slot] is ring[slot]'s id, 0 when free
	ring  []E
	n     int    // entries indexed
	head  uint32 // next ring slot to write
}

func (r *ringIndex[E]) init(capacity int) {
	size := 1 << bits.Len(uint(2*capacity-1)) // at most half full
	r.index = make([]uint32, size)
	r.mask = uint32(size - 1)
	r.ids = make([]uint64, capacity)
	r.ring = make([]E, capacity)
}

// home is where id's probe starts. Ids are hashes already; the xor-shift
// and multiply only keep structured ids (tests) from clustering.
func (r *ringIndex[E]) home(id uint64) uint32 {
	id ^= id >> 31
	return uint32((id*0xbf58476d1ce4e5b9)>>32) & r.mask
}

// find returns the index position holding id, or -1.
func (r *ringIndex[E]) find(id uint64) int {
	for i := r.home(id); ; i = (i + 1) & r.mask {
		w := r.index[i]
		if w == 0 {
			return -1
		}
		if r.ids[w-1] == id {
			return int(i)
		}
	}
}

// get returns the ring slot of id.
func (r *ringIndex[E]) get(id uint64) (uint32, bool) {
	if p := r.find(id); p >= 0 {
		return r.index[p] - 1, true
	}
	return 0, false
}

// del removes the index word at position i, shifting back the words of
// its probe run that would no longer be found.
func (r *ringIndex[E]) del(i uint32) {
	for j := (i + 1) & r.mask; ; j = (j + 1) & r.mask {
		w := r.index[j]
		if w == 0 {
			break
		}
		if (j-r.home(r.ids[w-1]))&r.mask >= (j-i)&r.mask {
			r.index[i] = w
			i = j
		}
	}
	r.index[i] = 0
	r.n--
}

// forget removes id.
func (r *ringIndex[E]) forget(id uint64) {
	if p := r.find(id); p >= 0 {
		slot := r.index[p] - 1
		r.del(uint32(p))
		var zero E
		r.ring[slot], r.ids[slot] = zero, 0
	}
}

// push writes e with id, which must be absent, at the ring's head,
// forgetting the entry that was there; it returns that entry and whether
// there was one.
func (r *ringIndex[E]) push(id uint64, e E) (old E, evicted bool) {
	if prev := r.ids[r.head]; prev != 0 {
		old, evicted = r.ring[r.head], true
		r.forget(prev)
	}
	r.ring[r.head], r.ids[r.head] = e, id
	i := r.home(id)
	for r.index[i] != 0 {
		i = (i + 1) & r.mask
	}
	r.index[i] = r.head + 1
	r.n++
	if r.head++; int(r.head) == len(r.ring) {
		r.head = 0
	}
	return old, evicted
}

// ringLayout is how a ring-backed table is sharded: shards (a power of
// two) of per entries each, the shard of an id picked by a Fibonacci hash
// shifted right by shift.
type ringLayout struct {
	shards int
	per    int
	shift  uint
}

// newRingLayout validates a ring-backed table's capacity, lifetime and
// shard count (0: as for Config.Shards), naming the fields capName and
// lifeName in errors that wrap errInvalid.
func newRingLayout(capacity int, life time.Duration, shards int, capName, lifeName string, errInvalid error) (ringLayout, error) {
	if shards == 0 {
		c := Config{MaxEntries: capacity}
		c.EnsureDefaults()
		shards = c.Shards
	}
	switch {
	case capacity < 1 || capacity > 1<<30:
		return ringLayout{}, fmt.Errorf("%w: %s %d not in [1, 2^30]", errInvalid, capName, capacity)
	case life < 0:
		return ringLayout{}, fmt.Errorf("%w: %s %v is negative", errInvalid, lifeName, life)
	case shards < 1 || shards&(shards-1) != 0 || shards > capacity:
		return ringLayout{}, fmt.Errorf("%w: Shards %d is not a power of two in [1, %s]", errInvalid, shards, capName)
	}
	return ringLayout{shards: shards, per: (capacity + shards - 1) / shards, shift: uint(64 - bits.TrailingZeros(uint(shards)))}, nil
}

// shardOf returns the shard index of id.
func (l ringLayout) shardOf(id uint64) int {
	if l.shift == 64 {
		return 0
	}
	return int((id * 0x9e3779b97f4a7c15) >> l.shift)
}

// A lazy ring is a ringIndex that starts with no storage and grows toward
// its capacity, so the tables that size one per shard from a cap (KeyTable:
// tens of MiB at its defaults) cost nothing until used and then
// only what they hold. Growth happens only where the ring would first wrap,
// when every slot below head has been written in order: doubling it there
// and carrying on at the old length puts each entry in the slot a full-sized
// ring would have, so what is forgotten, and when, is unchanged.

// lazyRingStart is a lazy ring's first size (capped by its capacity).
const lazyRingStart = 64

// emptyRingIndex is the index of a lazy ring before its first push: one
// empty word, so lookups and forget find nothing without a nil check. It is
// never written: push is only reached through pushGrow, which sizes the
// ring first, and del only after a find succeeded.
var emptyRingIndex = []uint32{0}

// initLazy makes r an empty lazy ring.
func (r *ringIndex[E]) initLazy() {
	*r = ringIndex[E]{index: emptyRingIndex}
}

// pushGrow is push on a lazy ring of the given capacity.
func (r *ringIndex[E]) pushGrow(id uint64, e E, capacity int) (old E, evicted bool) {
	if r.ring == nil {
		r.init(min(lazyRingStart, capacity))
	}
	old, evicted = r.push(id, e)
	if r.head == 0 && len(r.ring) < capacity {
		r.grow(min(2*len(r.ring), capacity))
	}
	return old, evicted
}

// grow resizes a ring whose head has just wrapped to capacity slots, and
// moves head to the first new slot.
func (r *ringIndex[E]) grow(capacity int) {
	head := len(r.ring)
	ring := make([]E, capacity)
	copy(ring, r.ring)
	ids := make([]uint64, capacity)
	copy(ids, r.ids)
	size := 1 << bits.Len(uint(2*capacity-1)) // at most half full, as init
	r.index, r.mask = make([]uint32, size), uint32(size-1)
	r.ring, r.ids = ring, ids
	for slot, id := range ids[:head] {
		if id == 0 {
			continue
		}
		i := r.home(id)
		for r.index[i] != 0 {
			i = (i + 1) & r.mask
		}
		r.index[i] = uint32(slot) + 1
	}
	r.head = uint32(head)
}
