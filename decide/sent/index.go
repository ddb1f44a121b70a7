package sent

// recIndex finds the records of a client instance's batches by key (a
// record's hash mixed with where it went, see idxKey). It is an
// open-addressing table of distinct keys, at most half full, each slot the
// head and tail of a chain of the records with that key, in the order they
// were added: a retry of identical records meets its originals in order.
//
// Work per lookup is bounded whatever a client sent (docs/security.md,
// "Bounded work"): identical records share one slot, so adding one costs
// O(1); a chain's head moves past records that can never match again (used
// up by a retry, let go, their window over), so a run of identical records
// matched one by one costs O(1) each; and a lookup passes over at most
// maxSkips records that may match later but not now (another connection's
// own), then gives up: a miss, never a wrong answer.
type recIndex struct {
	slots []idxSlot
	refs  []recRef
	keys  int    // slots in use
	dead  int    // refs passed for good (compacted away by a rebuild)
	epoch uint32 // bumped by reset: heads recorded before it are void
	// rebuild: a rollback could not restore a head (the index was rebuilt
	// meanwhile), so a record it gave back is missing: rebuild before use.
	rebuild bool
	// steps counts slots probed and records visited, for the tests that
	// bound the work per record.
	steps uint64
}

type idxSlot struct {
	key        uint64 // 0: empty
	head, tail int32  // refs index + 1; head 0: every record of the key passed (tail still the last)
}

type recRef struct {
	b    *Batch
	gen  uint32
	i    int32
	next int32 // refs index + 1 of the next record with the key, 0 for none
}

// maxSkips bounds the records a lookup passes over that may match another
// lookup (see recIndex).
const maxSkips = 64

// idxKey is the index key of a record with hash h sent to topic (and, for
// the index of records not yet answered, partition; -1 otherwise). Never 0.
func idxKey(h uint64, topic uint32, part int32) uint64 {
	x := h ^ (uint64(topic)+1)*0x9e3779b97f4a7c15 ^ (uint64(uint32(part))+1)*0xc2b2ae3d27d4eb4f
	x ^= x >> 29
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 32
	return x | 1
}

// reset empties the index, sized for about n records.
func (x *recIndex) reset(n int) {
	size := 16
	for size < 2*n {
		size *= 2
	}
	if cap(x.slots) >= size && cap(x.slots) <= 4*size {
		x.slots = x.slots[:size]
		clear(x.slots)
	} else {
		x.slots = make([]idxSlot, size)
	}
	clear(x.refs)
	x.refs = x.refs[:0]
	x.keys, x.dead = 0, 0
	x.epoch++
}

// slot returns the index of key's slot, or of the empty slot where it
// would go.
func (x *recIndex) slot(key uint64) int {
	mask := len(x.slots) - 1
	for j := int(key) & mask; ; j = (j + 1) & mask {
		x.steps++
		if s := &x.slots[j]; s.key == key || s.key == 0 {
			return j
		}
	}
}

// add appends a record with key at the tail of its chain.
func (x *recIndex) add(key uint64, r recRef) {
	if len(x.slots) == 0 || 2*(x.keys+1) > len(x.slots) {
		x.grow()
	}
	r.next = 0
	x.refs = append(x.refs, r)
	at := int32(len(x.refs))
	s := &x.slots[x.slot(key)]
	switch {
	case s.key == 0:
		*s = idxSlot{key: key, head: at, tail: at}
		x.keys++
	case s.head == 0:
		// Every record of the chain was passed: link behind the last
		// anyway, so that a head restored by a rollback still reaches it.
		if s.tail != 0 {
			x.refs[s.tail-1].next = at
		}
		s.head, s.tail = at, at
	default:
		x.refs[s.tail-1].next = at
		s.tail = at
	}
}

// grow doubles the slots, keeping every chain.
func (x *recIndex) grow() {
	old := x.slots
	x.slots = make([]idxSlot, max(16, 2*len(old)))
	for _, s := range old {
		if s.key != 0 {
			x.slots[x.slot(s.key)] = s
		}
	}
}

// verdict is what a lookup's test says of one record of a chain.
type verdict uint8

const (
	skipForGood verdict = iota // it can never match again
	skipNow                    // not for this lookup
	take                       // it matches
)

// find returns the first record with key that test takes, moving the
// chain's head past records that can never match again (each move
// recorded in *undos, so that a decision that ends up waiting can restore
// it), or false.
func (x *recIndex) find(key uint64, test func(*recRef) verdict, undos *[]Undo) (*recRef, bool) {
	if len(x.slots) == 0 {
		return nil, false
	}
	s := &x.slots[x.slot(key)]
	if s.key == 0 {
		return nil, false
	}
	skipped := 0
	atHead := true
	for j := s.head; j != 0; {
		x.steps++
		r := &x.refs[j-1]
		v := test(r)
		switch {
		case v == take:
			return r, true
		case v == skipForGood && atHead:
			*undos = append(*undos, Undo{ix: x, key: key, head: s.head, epoch: x.epoch})
			s.head = r.next
			x.dead++
		default:
			// Passed over, the head stays: such records are bounded
			// per lookup.
			atHead = false
			if skipped++; skipped >= maxSkips {
				return nil, false
			}
		}
		j = r.next
	}
	return nil, false
}

// restore puts back a chain head a lookup moved; if the index was rebuilt
// since, the rebuild left out what the head passed, so it is marked to be
// rebuilt again. The chain's slot is found by its key: records added
// since the lookup (a batch disowned while the same decision went on) may
// have grown the table, which moves every slot.
func (x *recIndex) restore(u *Undo) {
	if u.epoch != x.epoch {
		x.rebuild = true
		return
	}
	x.slots[x.slot(u.key)].head = u.head
	x.dead--
}

// Undo restores a record used up by a decision that ended in a wait: one
// of a client instance's records (Candidate.UseUp), or a chain head an
// index lookup moved (recIndex.find). Restore them in reverse: a chain
// head moved twice goes back to where it was first.
type Undo struct {
	b    *Batch
	gen  uint32
	i    int32
	hash uint64
	// A chain head instead: the chain's key (its slot may move,
	// recIndex.restore), where the head was and the index's epoch then.
	ix    *recIndex
	key   uint64
	head  int32
	epoch uint32
}

// Restore puts back what u took; call with its instance locked.
func (u *Undo) Restore() {
	if u.ix != nil {
		u.ix.restore(u)
	} else if u.b.gen == u.gen {
		u.b.Recs[u.i].Hash = u.hash
	}
}

// UseUp takes the record c for one retry, recording in *undos how to give
// it back; call with its instance locked.
func (c Candidate) UseUp(undos *[]Undo) {
	r := &c.B.Recs[c.I]
	*undos = append(*undos, Undo{b: c.B, gen: c.B.gen, i: c.I, hash: r.Hash})
	r.Hash = 0
}
