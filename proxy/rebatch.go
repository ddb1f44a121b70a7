package proxy

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// Re-batched legacy retries (docs/legacy.md). librdkafka puts the records
// of a failed request back in its partition queue and may send them again
// together with newer ones: the retry is a superset whose first records are
// exactly the lost batch's. The proxy recognises the prefix, answers it, and
// sends only the new records upstream, in a rebuilt batch.
//
// Such a retry follows a broken connection, so the candidates are the legacy
// batches of connections that closed: each session keeps the refs of its
// recent legacy batches (legacyRing) and hands them to the planner when it
// ends (orphanBatches).

// legacyRef is what a session remembers of a legacy batch whose
// acknowledgement goes to it.
type legacyRef struct {
	id        uint64
	topic     seqstate.TopicID
	partition int32
	count     int32  // records
	size      int32  // bytes of the records section
	first     uint64 // protocol.FirstRecordHash, 0 when compressed
}

// legacyRing keeps a session's last legacyRingSize legacy refs. readLoop
// adds them; another session may read them (suspectGone), hence the lock.
type legacyRing struct {
	mu   sync.Mutex
	buf  [legacyRingSize]legacyRef
	next int
	n    int
}

// legacyRingSize covers a client's requests in flight (5 for most clients;
// librdkafka pipelines more: 22 answers were seen lost with a broken
// connection) times the partitions each carries to one broker, for the
// producers that retry across partitions (kafkajs writes to every
// partition of a topic in one request): 32 bytes each, per connection. At
// most 64: unreadConn keeps one bit per ref.
const legacyRingSize = 64

func (r *legacyRing) add(ref legacyRef) {
	r.mu.Lock()
	r.buf[r.next] = ref
	r.next = (r.next + 1) % legacyRingSize
	r.n = min(r.n+1, legacyRingSize)
	r.mu.Unlock()
}

// refs appends a copy of the refs to dst, oldest first: the order their
// answers are written in (unread.go relies on it).
func (r *legacyRing) refs(dst []legacyRef) []legacyRef {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n < legacyRingSize {
		return append(dst, r.buf[:r.n]...)
	}
	dst = append(dst, r.buf[r.next:]...)
	return append(dst, r.buf[:r.next]...)
}

// orphanStore holds, per partition, the refs of legacy batches whose
// connection closed within the legacy window: the candidates for the prefix
// of a re-batched retry. Bounded, and consulted only while not empty.
type orphanStore struct {
	mu    sync.Mutex
	parts map[seqstate.Key]*orphanList // ProducerID -1
	n     atomic.Int64                 // len(parts), read without the lock
}

type orphanList struct {
	refs  [orphansPerPartition]legacyRef
	until [orphansPerPartition]int64 // expiry (ns); 0 marks a free slot
	next  int
}

const (
	orphansPerPartition = 8
	maxOrphanPartitions = 4096
)

// add records refs as orphaned until expiry.
func (o *orphanStore) add(refs []legacyRef, until int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.parts == nil {
		o.parts = map[seqstate.Key]*orphanList{}
	}
	for _, r := range refs {
		k := seqstate.Key{ProducerID: -1, Topic: r.topic, Partition: r.partition}
		l := o.parts[k]
		if l == nil {
			if len(o.parts) >= maxOrphanPartitions {
				for victim := range o.parts { // any one: a lost candidate only costs a possible dedup
					delete(o.parts, victim)
					break
				}
			}
			l = &orphanList{}
			o.parts[k] = l
		}
		if j := l.index(r.id); j >= 0 {
			// Added again (a session orphans its batches when its client
			// leaves and once more when its responses have drained).
			l.refs[j], l.until[j] = r, until
			continue
		}
		l.refs[l.next], l.until[l.next] = r, until
		l.next = (l.next + 1) % orphansPerPartition
	}
	o.n.Store(int64(len(o.parts)))
}

// index returns the slot holding the ref of batch id, or -1.
func (l *orphanList) index(id uint64) int {
	for j := range l.refs {
		if l.refs[j].id == id && id != 0 {
			return j
		}
	}
	return -1
}

// candidates copies into dst the live orphans of partition k holding fewer
// than n records, dropping expired ones.
func (o *orphanStore) candidates(dst []legacyRef, k seqstate.Key, n int32, now int64) []legacyRef {
	if o.n.Load() == 0 {
		return dst
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	l := o.parts[k]
	if l == nil {
		return dst
	}
	live := 0
	for i := range l.refs {
		switch {
		case l.until[i] == 0:
		case l.until[i] <= now:
			l.until[i] = 0
		default:
			live++
			if l.refs[i].count < n {
				dst = append(dst, l.refs[i])
			}
		}
	}
	if live == 0 {
		delete(o.parts, k)
		o.n.Store(int64(len(o.parts)))
	}
	return dst
}

// orphanBatches is called when session conn ends: its legacy batches may
// now be retried elsewhere, to another partition (LegacyTable.Orphan) or
// re-batched with newer records (the orphan store).
func (pn *planner) orphanBatches(conn uint64, refs []legacyRef, now time.Time) {
	if pn.legacy == nil || len(refs) == 0 {
		return
	}
	var ids, buf [legacyRingSize]uint64
	for i, r := range refs {
		ids[i] = r.id
	}
	inflight := pn.legacy.Orphan(conn, ids[:len(refs)], buf[:0])
	pn.unread.add(conn, refs, now.Add(pn.legacyWindow).UnixNano())
	pn.orphans.add(refs, now.Add(pn.legacyWindow).UnixNano())
	// Batches still in flight: their partition waits for them (settle.go).
	for _, id := range inflight {
		for _, r := range refs {
			if r.id == id {
				pn.settleInFlight(conn, r)
				break
			}
		}
	}
}

// settleInFlight makes the partition of batch r, if still in flight from
// conn, wait for its outcome before deciding anything else (settle.go).
func (pn *planner) settleInFlight(conn uint64, r legacyRef) {
	if !pn.legacy.InFlightFrom(r.id, conn) {
		return
	}
	k := seqstate.Key{Topic: r.topic, Partition: r.partition}
	pn.settling.add(k, r.id)
	pn.warm.forget(k)
	if !pn.legacy.InFlightFrom(r.id, conn) { // settled meanwhile
		pn.settling.settled(k, r.id)
	}
}

// suspectGone is called when a batch arrives that is in flight from
// connection conn, whose refs are given: its client has given up on it (it
// retried elsewhere) even if the proxy has not yet seen that connection
// close, which can come later than the retry. Its batches in flight are
// waited for as if it had left.
func (pn *planner) suspectGone(conn uint64, refs []legacyRef) {
	if pn.legacy == nil {
		return
	}
	pn.unread.add(conn, refs, time.Now().Add(pn.legacyWindow).UnixNano())
	for _, r := range refs {
		pn.settleInFlight(conn, r)
	}
}

// settle records that pl's batches are no longer in flight (settle.go).
func (pn *planner) settle(pl *producePlan) {
	if pn.settling.n.Load() == 0 {
		return
	}
	for i := range pl.decisions {
		if d := &pl.decisions[i]; d.legacy {
			pn.settling.settled(d.key, d.ident)
		}
	}
}

// undelivered is called for a Produce plan whose answer did not reach its
// client (the client had gone, or its connection failed): the legacy
// batches it appended are unacknowledged, so the partition is read again
// before the next decision and their records are stamped (resent.go); and
// none of its batches is in flight any longer (settle.go).
func (pn *planner) undelivered(pl *producePlan) {
	if pn.legacy == nil {
		return
	}
	for i := range pl.decisions {
		d := &pl.decisions[i]
		if !d.legacy {
			continue
		}
		if d.legacyAppended {
			pn.legacy.Disown(d.ident, pl.conn)
			pn.warm.forget(d.key)
		}
	}
	pn.settle(pl)
}

// matchRebatch looks for a re-batched retry: a prefix of decision i's batch
// that is an orphaned batch appended in the same partition. On a match the
// decision becomes actRebatch, forwarding only the records after the
// prefix, rebuilt into pl.rebuilt.
func (pn *planner) matchRebatch(pl *producePlan, i int, part *protocol.ProducePartition, bh *protocol.BatchHeader, now time.Time) {
	d := &pl.decisions[i]
	var buf [orphansPerPartition]legacyRef
	cands := pn.orphans.candidates(buf[:0], d.key, bh.NumRecords, now.UnixNano())
	checked := false
	for _, c := range cands {
		// Cheapest test first: the first record, then the prefix
		// (isResend), then the batch's CRC (only a batch the broker
		// would accept is cut).
		if c.first == 0 || c.first != d.first || !pn.isResend(d.key, part, bh, c) {
			continue
		}
		if !checked {
			if protocol.BatchValid(part.Records, bh) != 0 {
				return
			}
			checked = true
		}
		r, ok := pn.legacy.MatchRetry(c.id, d.key.Partition, pl.conn, now)
		if !ok {
			continue
		}
		start := len(pl.rebuilt)
		out, err := protocol.DropLeadingRecords(pl.rebuilt, part.Records, bh, int(c.count))
		if err != nil {
			continue
		}
		pl.rebuilt = out
		d.act = actRebatch
		d.prefix = c
		d.prefixResult = r
		d.rebuiltAt, d.rebuiltEnd = start, len(out)
		return
	}
}

// isResend reports whether the batch (part, bh) of partition k holds the
// records of ref: all of them, or as its first records. Cheapest test
// first: the prefix's byte length (walking record lengths), then its hash;
// callers have compared the first record.
func (pn *planner) isResend(k seqstate.Key, part *protocol.ProducePartition, bh *protocol.BatchHeader, ref legacyRef) bool {
	if ref.count > bh.NumRecords {
		return false
	}
	var id uint64
	exact := pn.matchFor(k.Topic) == MatchExact
	if ref.count == bh.NumRecords {
		id = protocol.MixIdentity(protocol.RecordsIdentity(part.Records, bh, exact), uint32(k.Topic), k.Principal)
	} else {
		if exact {
			return false // exact identities cover whole batches only
		}
		size, ok := protocol.PrefixLen(part.Records, bh, int(ref.count))
		if !ok || int32(size) != ref.size {
			return false
		}
		id = protocol.MixIdentity(protocol.PrefixIdentity(part.Records, bh, int(ref.count), size), uint32(k.Topic), k.Principal)
	}
	return id == ref.id
}
