package proxy

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// Answers lost with their connection (docs/legacy.md, "Answers written to a
// connection that broke"). An answer the proxy wrote to a client's socket
// may still never be read: the connection breaks with it in a buffer. The
// client then retries every request it holds no answer for, and librdkafka
// batches those records again at other boundaries, so batch identities no
// longer match. Which answers were lost cannot be seen when the connection
// closes, but the client's first retry shows it: a client reads its answers
// in order, so if it resends batch X it read neither X's answer nor any
// written after it on that connection. Those batches are then treated as
// unacknowledged (Disown): their partitions are read again and their
// records stamped (resent.go), and the records the client sends again are
// not written twice.

// unreadStore keeps, for recently closed (or suspected) connections, their
// legacy refs in the order they were answered, and finds the connection a
// retried batch came from by its first record.
type unreadStore struct {
	mu      sync.Mutex
	conns   map[uint64]*unreadConn
	order   [maxUnreadConns]uint64 // conn ids, oldest first from next
	next    int
	byFirst map[uint64]uint64 // first record hash -> conn
	n       atomic.Int64      // len(conns), read without the lock
}

type unreadConn struct {
	refs     []legacyRef // answer order, oldest first
	disowned uint64      // bit i: refs[i] is already disowned
	until    int64       // expiry (ns)
}

// maxUnreadConns bounds the connections kept; the oldest is dropped first.
const maxUnreadConns = 256

// add records the refs of connection conn, which closed or is suspected
// gone, until expiry. Added again, the refs are replaced (a session hands
// them over when its client leaves and again when its answers drained).
func (u *unreadStore) add(conn uint64, refs []legacyRef, until int64) {
	if len(refs) == 0 {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.conns == nil {
		u.conns, u.byFirst = map[uint64]*unreadConn{}, map[uint64]uint64{}
	}
	uc := u.conns[conn]
	if uc == nil {
		if old := u.order[u.next]; old != 0 {
			u.drop(old)
		}
		u.order[u.next] = conn
		u.next = (u.next + 1) % maxUnreadConns
		uc = &unreadConn{}
		u.conns[conn] = uc
	}
	// Bits follow refs by identity, not position: the new refs may have
	// moved along the ring.
	var disowned uint64
	for i, r := range refs {
		if j := uc.index(r.id); j >= 0 && uc.disowned&(1<<j) != 0 {
			disowned |= 1 << i
		}
	}
	uc.refs = append(uc.refs[:0], refs...)
	uc.disowned, uc.until = disowned, until
	for _, r := range refs {
		if r.first != 0 {
			u.byFirst[r.first] = conn
		}
	}
	u.n.Store(int64(len(u.conns)))
}

// drop forgets connection conn. Call with mu held.
func (u *unreadStore) drop(conn uint64) {
	uc := u.conns[conn]
	if uc == nil {
		return
	}
	for _, r := range uc.refs {
		if u.byFirst[r.first] == conn {
			delete(u.byFirst, r.first)
		}
	}
	delete(u.conns, conn)
	for i, c := range u.order {
		if c == conn {
			u.order[i] = 0
		}
	}
}

func (uc *unreadConn) index(id uint64) int {
	for i := range uc.refs {
		if uc.refs[i].id == id {
			return i
		}
	}
	return -1
}

// candidate returns the ref answered on a kept connection whose first
// record hash is first, in partition k, and that connection.
func (u *unreadStore) candidate(k seqstate.Key, first uint64, now int64) (legacyRef, uint64, bool) {
	if u.n.Load() == 0 || first == 0 {
		return legacyRef{}, 0, false
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	conn, ok := u.byFirst[first]
	if !ok {
		return legacyRef{}, 0, false
	}
	uc := u.conns[conn]
	if uc == nil || uc.until <= now {
		u.drop(conn)
		u.n.Store(int64(len(u.conns)))
		return legacyRef{}, 0, false
	}
	for _, r := range uc.refs {
		if r.first == first && r.topic == k.Topic && r.partition == k.Partition {
			return r, conn, true
		}
	}
	return legacyRef{}, 0, false
}

// unreadFrom marks batch id of connection conn, and every batch answered
// on conn after it, as disowned, and returns in dst those not marked
// before.
func (u *unreadStore) unreadFrom(conn, id uint64, dst []legacyRef) []legacyRef {
	u.mu.Lock()
	defer u.mu.Unlock()
	uc := u.conns[conn]
	if uc == nil {
		return dst
	}
	i := uc.index(id)
	if i < 0 {
		return dst
	}
	for ; i < len(uc.refs); i++ {
		if uc.disowned&(1<<i) == 0 {
			uc.disowned |= 1 << i
			dst = append(dst, uc.refs[i])
		}
	}
	return dst
}

// noteRetry is called, before its partitions are warmed, for each legacy
// batch of a Produce request (partition k, records part.Records with header
// bh). When the batch resends, whole or as its first records, one answered
// on a connection now closed or suspected, that answer and every later one
// on that connection went unread: those batches are disowned and their
// partitions forgotten, so the warm-up that follows reads them from the log
// and stamps their records.
func (pn *planner) noteRetry(k seqstate.Key, part *protocol.ProducePartition, bh *protocol.BatchHeader, now time.Time) {
	if pn.unread.n.Load() == 0 || bh.NumRecords <= 0 {
		return
	}
	first := protocol.FirstRecordHash(part.Records, bh)
	ref, conn, ok := pn.unread.candidate(k, first, now.UnixNano())
	if !ok || ref.count > bh.NumRecords {
		return
	}
	// The first record is cheap evidence; the records are proof.
	var id uint64
	exact := pn.matchFor(k.Topic) == MatchExact
	if ref.count == bh.NumRecords {
		id = protocol.MixIdentity(protocol.RecordsIdentity(part.Records, bh, exact), uint32(k.Topic))
	} else {
		if exact {
			return // a prefix cannot be matched exactly (rebatch.go)
		}
		size, ok := protocol.PrefixLen(part.Records, bh, int(ref.count))
		if !ok || int32(size) != ref.size {
			return
		}
		id = protocol.MixIdentity(protocol.PrefixIdentity(part.Records, bh, int(ref.count), size), uint32(k.Topic))
	}
	if id != ref.id {
		return
	}
	var buf [legacyRingSize]legacyRef
	lost := pn.unread.unreadFrom(conn, ref.id, buf[:0])
	for _, r := range lost {
		// Closed: Orphan moved its entries to no connection; suspected:
		// they are still conn's. Either way an entry answered since on
		// another connection, or in flight, is left alone.
		pn.legacy.Disown(r.id, 0)
		pn.legacy.Disown(r.id, conn)
		pn.warm.forget(seqstate.Key{Topic: r.topic, Partition: r.partition})
	}
	pn.metrics.legacyUnread.Add(float64(len(lost)))
}
