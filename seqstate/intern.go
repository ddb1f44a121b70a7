package seqstate

import (
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
)

// TopicRef is one topic of a Metadata response: its name and, from Metadata
// v10 on, its topic ID. An all-zero ID means the ID is unknown.
type TopicRef struct {
	Name string
	ID   [16]byte
}

// interner maps topic names, and topic IDs, to dense TopicIDs.
//
// Lookups take no lock and allocate nothing. Names and IDs live in two
// append-only open-addressing hash tables (probeTable) whose slots are atomic
// pointers to immutable entries: a reader loads the current slot array and
// probes it; a slot, once set, never changes. Writers (InternTopics) hold mu.
// A table more than half full doubles: the writer builds the new slot array
// and publishes it whole, so each new name costs amortized O(1) (one
// rehash per doubling), never a copy of everything interned so far.
//
// TopicIDs are handed out in interning order (0, 1, 2, ...), so they do not
// depend on the hash seed; names are never forgotten.
type interner struct {
	seed  maphash.Seed
	max   int
	names probeTable[nameEntry]
	ids   probeTable[idEntry]
	// list maps a TopicID to its name. The writer appends to all, within
	// its capacity or into a new array, and then publishes the longer
	// slice; a reader only reads below the length it loaded, where the
	// writer never writes again.
	list    atomic.Pointer[[]string]
	refused atomic.Uint64

	mu  sync.Mutex // serializes writers
	all []string   // the writer's copy of *list
}

type nameEntry struct {
	name string
	id   TopicID
}

type idEntry struct {
	uuid [16]byte
	id   TopicID
}

// probeTable is an append-only hash table with linear probing, at most half
// full. Readers call load and probe the slots without locking; writers,
// serialized by the interner's mutex, call insert.
type probeTable[E any] struct {
	slots atomic.Pointer[[]atomic.Pointer[E]] // length a power of two
	n     int                                 // entries; writers only
}

func (p *probeTable[E]) init() {
	s := make([]atomic.Pointer[E], 16)
	p.slots.Store(&s)
}

func (p *probeTable[E]) load() []atomic.Pointer[E] { return *p.slots.Load() }

// insert adds e, which must be absent, whose hash is h; hash rehashes
// entries when the table grows.
func (p *probeTable[E]) insert(e *E, h uint64, hash func(*E) uint64) {
	slots := p.load()
	if (p.n+1)*2 > len(slots) {
		next := make([]atomic.Pointer[E], 2*len(slots))
		for i := range slots {
			if old := slots[i].Load(); old != nil {
				place(next, old, hash(old))
			}
		}
		p.slots.Store(&next)
		slots = next
	}
	place(slots, e, h)
	p.n++
}

func place[E any](slots []atomic.Pointer[E], e *E, h uint64) {
	mask := uint64(len(slots) - 1)
	i := h & mask
	for slots[i].Load() != nil {
		i = (i + 1) & mask
	}
	slots[i].Store(e)
}

func (in *interner) init(maxTopics int) {
	in.seed = maphash.MakeSeed()
	in.max = maxTopics
	in.names.init()
	in.ids.init()
	in.list.Store(new([]string))
}

func (in *interner) hashName(e *nameEntry) uint64 { return maphash.String(in.seed, e.name) }
func (in *interner) hashID(e *idEntry) uint64     { return maphash.Bytes(in.seed, e.uuid[:]) }

// lookupName finds a name still in a request buffer. Comparing an entry's
// name with string(name) does not allocate.
func (in *interner) lookupName(name []byte) (TopicID, bool) {
	h := maphash.Bytes(in.seed, name)
	slots := in.names.load()
	mask := uint64(len(slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		e := slots[i].Load()
		if e == nil {
			return 0, false
		}
		if e.name == string(name) {
			return e.id, true
		}
	}
}

// findName is lookupName for a string.
func (in *interner) findName(name string, h uint64) (TopicID, bool) {
	slots := in.names.load()
	mask := uint64(len(slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		e := slots[i].Load()
		if e == nil {
			return 0, false
		}
		if e.name == name {
			return e.id, true
		}
	}
}

func (in *interner) lookupID(uuid [16]byte) (TopicID, bool) {
	h := maphash.Bytes(in.seed, uuid[:])
	slots := in.ids.load()
	mask := uint64(len(slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		e := slots[i].Load()
		if e == nil {
			return 0, false
		}
		if e.uuid == uuid {
			return e.id, true
		}
	}
}

// intern adds the names and IDs of refs it does not know yet; see
// Table.InternTopics.
func (in *interner) intern(refs []TopicRef) (added int) {
	in.mu.Lock()
	defer in.mu.Unlock()
	for i := range refs {
		r := &refs[i]
		if r.Name == "" {
			continue
		}
		h := maphash.String(in.seed, r.Name)
		id, known := in.findName(r.Name, h)
		if !known {
			if len(in.all) >= in.max {
				in.refused.Add(1)
				continue
			}
			// The name is copied: the caller's may alias a reused buffer.
			name := strings.Clone(r.Name)
			id = TopicID(len(in.all))
			// Publish the name for TopicName before the lookup tables can
			// return its TopicID.
			in.all = append(in.all, name)
			all := in.all
			in.list.Store(&all)
			in.names.insert(&nameEntry{name: name, id: id}, h, in.hashName)
		}
		newID := false
		if r.ID != ([16]byte{}) {
			if _, ok := in.lookupID(r.ID); !ok {
				if in.ids.n >= in.max {
					in.refused.Add(1)
				} else {
					e := &idEntry{uuid: r.ID, id: id}
					in.ids.insert(e, in.hashID(e), in.hashID)
					newID = true
				}
			}
		}
		if !known || newID {
			added++
		}
	}
	return added
}

func (in *interner) name(id TopicID) (string, bool) {
	names := *in.list.Load()
	if int(id) >= len(names) {
		return "", false
	}
	return names[id], true
}

func (in *interner) count() int { return len(*in.list.Load()) }
