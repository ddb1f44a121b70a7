package seqstate

import (
	"sync"
	"sync/atomic"
)

// interner maps topic names to dense TopicIDs. Reads are lock-free: they load
// an immutable snapshot. A new name copies the snapshot under a mutex, which
// costs O(names) but happens once per topic; topics are few and long-lived,
// while lookups happen on every Produce.
type interner struct {
	mu   sync.Mutex
	snap atomic.Pointer[internSnapshot]
}

type internSnapshot struct {
	ids   map[string]TopicID
	names []string
}

func (in *interner) init() {
	in.snap.Store(&internSnapshot{ids: map[string]TopicID{}})
}

func (in *interner) intern(name string) TopicID {
	if id, ok := in.snap.Load().ids[name]; ok {
		return id
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	old := in.snap.Load()
	if id, ok := old.ids[name]; ok {
		return id
	}
	id := TopicID(len(old.names))
	next := &internSnapshot{
		ids:   make(map[string]TopicID, len(old.ids)+1),
		names: append(old.names[:len(old.names):len(old.names)], name),
	}
	for k, v := range old.ids {
		next.ids[k] = v
	}
	next.ids[name] = id
	in.snap.Store(next)
	return id
}

// lookupBytes relies on the compiler not allocating for m[string(b)].
func (in *interner) lookupBytes(name []byte) (TopicID, bool) {
	id, ok := in.snap.Load().ids[string(name)]
	return id, ok
}

func (in *interner) name(id TopicID) (string, bool) {
	names := in.snap.Load().names
	if int(id) >= len(names) {
		return "", false
	}
	return names[id], true
}
