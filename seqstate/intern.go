package seqstate

import (
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
)

// TopicRef is one topic of a Metadata response: its name, from Metadata
// v10 on its topic ID (all zero: unknown), and its partition count (0:
// unknown).
type TopicRef struct {
	Name       string
	ID         [16]byte
	Partitions int32
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
// depend on the hash seed; names are never forgotten. A topic is one
// incarnation of a name: a name seen with a new topic ID after it had
// another (the topic was deleted and recreated) gets a new TopicID, so
// nothing known of the old topic applies to the new one.
type interner struct {
	seed  maphash.Seed
	max   int
	names probeTable[nameEntry]
	ids   probeTable[idEntry]
	// list maps a TopicID to its topic. The writer appends to all, within
	// its capacity or into a new array, and then publishes the longer
	// slice; a reader only reads below the length it loaded, where the
	// writer never writes again.
	list    atomic.Pointer[[]*topicEntry]
	refused atomic.Uint64

	mu  sync.Mutex    // serializes writers
	all []*topicEntry // the writer's copy of *list
}

type nameEntry struct {
	name string
	id   atomic.Uint32 // the TopicID of the name's current incarnation
}

// topicEntry is one TopicID's topic.
type topicEntry struct {
	name       string
	uuid       [16]byte     // its topic ID once known; written by the writer only
	partitions atomic.Int32 // its partition count once known
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
	in.list.Store(new([]*topicEntry))
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
			return TopicID(e.id.Load()), true
		}
	}
}

// findName is lookupName for a string, returning its entry.
func (in *interner) findName(name string, h uint64) *nameEntry {
	slots := in.names.load()
	mask := uint64(len(slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		e := slots[i].Load()
		if e == nil || e.name == name {
			return e
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
		ne := in.findName(r.Name, h)
		_, idKnown := in.lookupID(r.ID)
		idKnown = idKnown || r.ID == ([16]byte{})
		var te *topicEntry
		if ne != nil {
			te = in.all[ne.id.Load()]
		}
		// A known name with a topic ID never seen, while its current
		// incarnation has another: the topic was recreated. (An old ID
		// from a broker that lags is known, and changes nothing.)
		recreated := te != nil && !idKnown && te.uuid != ([16]byte{})
		added0 := added
		if te == nil || recreated {
			if len(in.all) >= in.max {
				in.refused.Add(1)
				continue
			}
			// The name is copied: the caller's may alias a reused buffer.
			te = &topicEntry{name: strings.Clone(r.Name)}
			id := uint32(len(in.all))
			// Publish the topic for TopicName before the lookup tables can
			// return its TopicID.
			in.all = append(in.all, te)
			all := in.all
			in.list.Store(&all)
			if ne == nil {
				ne = &nameEntry{name: te.name}
				ne.id.Store(id)
				in.names.insert(ne, h, in.hashName)
			} else {
				ne.id.Store(id)
			}
			added++
		}
		if !idKnown {
			if in.ids.n >= in.max {
				in.refused.Add(1)
			} else {
				e := &idEntry{uuid: r.ID, id: TopicID(ne.id.Load())}
				in.ids.insert(e, in.hashID(e), in.hashID)
				te.uuid = r.ID
				if added == added0 {
					added++
				}
			}
		}
		if r.Partitions > 0 && (r.ID == ([16]byte{}) || r.ID == te.uuid) {
			te.partitions.Store(r.Partitions)
		}
	}
	return added
}

func (in *interner) name(id TopicID) (string, bool) {
	topics := *in.list.Load()
	if int(id) >= len(topics) {
		return "", false
	}
	return topics[id].name, true
}

// partitions returns id's partition count, 0 when unknown.
func (in *interner) partitions(id TopicID) int32 {
	topics := *in.list.Load()
	if int(id) >= len(topics) {
		return 0
	}
	return topics[id].partitions.Load()
}

func (in *interner) count() int { return len(*in.list.Load()) }
