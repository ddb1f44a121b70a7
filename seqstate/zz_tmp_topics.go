package seqstate

import "sync"

// TEMPORARY shim until the interner rework lands; deleted on merge.

type TopicRef struct {
	Name string
	ID   [16]byte
}

func (t *Table) InternTopics(refs []TopicRef) int {
	for _, r := range refs {
		id := t.topics.intern(r.Name)
		if r.ID != ([16]byte{}) {
			tmpIDsMu.Lock()
			tmpIDs[r.ID] = id
			tmpIDsMu.Unlock()
		}
	}
	return len(refs)
}

func (t *Table) LookupTopic(name []byte) (TopicID, bool) { return t.topics.lookupBytes(name) }

func (t *Table) LookupTopicID(id [16]byte) (TopicID, bool) {
	tmpIDsMu.Lock()
	defer tmpIDsMu.Unlock()
	v, ok := tmpIDs[id]
	return v, ok
}

var tmpIDsMu sync.Mutex
var tmpIDs = map[[16]byte]TopicID{}
