package decide

import (
	"time"

	"github.com/dedupproxy/dedupproxy/decide/sent"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// Handed is a legacy batch whose acknowledgement its client may not hold,
// moved from one replica's core to another's when a broker node changes
// hands (docs/replicas.md, "Legacy state at a handover"). A replica that
// took a node over knows the batches decided before only from the log,
// where a retry stamped anew (kafka-go, kafkajs) matches nothing; handed
// over, they answer for it as they would have where they were decided.
type Handed struct {
	// Principal and Topic are in the numbering of the core that handed
	// the batch off; the caller maps them to names and back.
	Principal  uint32
	ClientID   string
	Host       [16]byte // zero with ScopeClientID
	Topic      seqstate.TopicID
	Partition  int32
	Whole      bool
	Left       time.Duration // of its window
	AppendTime int64         // the broker's log append time, -1 for CreateTime
	Hashes     []uint64      // per record; 0 for one used up or not written
	Offsets    []int64       // per record; -1 unknown
}

// HandOff removes from the core, and appends to dst, the batches of the
// partitions want accepts whose acknowledgement their client may not hold.
// Moved, not copied: once handed off, a record answers for a retry only
// where it went, so that no record answers for two. Call it once the
// node's requests in flight have been answered: batches still in flight,
// or whose outcome the log must settle, stay (a miss at worst).
func (c *Core) handOff(want func(topic seqstate.TopicID, partition int32) bool, now time.Time, dst []Handed) []Handed {
	ns := now.UnixNano()
	for _, in := range c.legacy.Instances() {
		in.Lock()
		principal, clientID, host := in.Key()
		for _, b := range in.Disowned() {
			if b.Phase != sent.Appended || b.Until <= ns || !want(b.Topic, b.Partition) {
				continue
			}
			h := Handed{
				Principal: principal, ClientID: clientID, Host: host,
				Topic: b.Topic, Partition: b.Partition, Whole: b.Whole,
				Left: time.Duration(b.Until - ns), AppendTime: b.AppendTime,
			}
			live := false
			for j := range b.Recs {
				r := &b.Recs[j]
				h.Hashes = append(h.Hashes, r.Hash)
				h.Offsets = append(h.Offsets, max(r.Off, sent.OffUnknown))
				live = live || r.Hash != 0
				r.Hash = 0
			}
			if live {
				dst = append(dst, h)
			}
		}
		in.Unlock()
	}
	return dst
}

// TakeOver adds batches another replica's core handed off, with principals
// and topics already in this core's numbering: each is a batch of its
// client instance whose acknowledgement the client may not hold, matchable
// by a retry until its window ends. Past Config.MaxRecords a batch is not
// taken (counted as evicted: a miss). It returns how many were taken.
func (c *Core) takeOver(hs []Handed, now time.Time) int {
	ns := now.UnixNano()
	taken := 0
	for i := range hs {
		h := &hs[i]
		if h.Left <= 0 || len(h.Hashes) == 0 || len(h.Hashes) != len(h.Offsets) {
			continue
		}
		if c.legacy.Adopt(h.Principal, h.ClientID, h.Host, h.Topic, h.Partition, h.Whole, h.Hashes, h.Offsets, h.AppendTime, ns+int64(h.Left), ns) {
			taken++
		}
	}
	return taken
}
