package decide

import (
	"time"

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
	for i := range c.legacy.shards {
		for _, in := range c.legacy.shards[i].all() {
			in.mu.Lock()
			for _, b := range in.disowned {
				if b.Phase != Appended || b.resolvable || b.Until <= ns || !want(b.Topic, b.Partition) {
					continue
				}
				h := Handed{
					Principal: in.key.principal, ClientID: in.key.id, Host: in.key.host,
					Topic: b.Topic, Partition: b.Partition, Whole: b.Whole,
					Left: time.Duration(b.Until - ns), AppendTime: b.AppendTime,
				}
				live := false
				for j := range b.Recs {
					r := &b.Recs[j]
					h.Hashes = append(h.Hashes, r.Hash)
					h.Offsets = append(h.Offsets, max(r.Off, OffUnknown))
					live = live || r.Hash != 0
					r.Hash = 0
				}
				if live {
					dst = append(dst, h)
				}
			}
			in.mu.Unlock()
		}
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
		k := instKey{principal: h.Principal, id: h.ClientID}
		if c.legacy.Scope == ScopeInstance {
			k.host = h.Host
		}
		if c.legacy.held.Load()+int64(len(h.Hashes)) > c.legacy.MaxRecords {
			c.legacy.evicted.Add(1)
			continue
		}
		sh := c.legacy.shardOf(k)
		sh.mu.Lock()
		in := sh.instance(k, ns)
		in.mu.Lock()
		sh.mu.Unlock()
		b := in.NewBatch()
		b.Recs = b.Recs[:0]
		for j, hash := range h.Hashes {
			b.Recs = append(b.Recs, Rec{Hash: hash, Off: max(h.Offsets[j], OffUnknown)})
		}
		b.Inst, b.Conn = in, nil
		b.Topic, b.Partition, b.Whole = h.Topic, h.Partition, h.Whole
		b.Phase, b.AppendTime, b.Until = Appended, h.AppendTime, ns+int64(h.Left)
		b.delivered = true
		in.account(int64(len(b.Recs)))
		in.Disown(b)
		in.mu.Unlock()
		taken++
	}
	return taken
}
