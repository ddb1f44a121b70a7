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
// retried batch came from by its first record. A partition's tail read
// from the log is kept the same way, as if one connection had sent it
// (logConn): after a restart the connection is unknown, and the batches
// after X in X's partition are the ones its client may also resend.
type unreadStore struct {
	mu    sync.RWMutex // read for each legacy batch while anything is kept
	conns map[uint64]*unreadConn
	order [maxUnreadConns]uint64 // conn ids, oldest first from next
	next  int
	// byFirst maps a first record hash to the connection, and byFirstLog
	// to the partition tail (logConn), that answered it last.
	byFirst, byFirstLog map[uint64]uint64
	// gone holds the batches disowned, until their expiry: a batch is
	// kept both for its connection and for its partition's tail, and is
	// disowned once.
	gone  map[uint64]int64
	n     atomic.Int64 // len(conns), read without the lock
	until atomic.Int64 // the latest expiry kept (ns)
}

// live reports whether anything kept may not have expired at now.
func (u *unreadStore) live(now time.Time) bool {
	return u.n.Load() > 0 && now.UnixNano() < u.until.Load()
}

type unreadConn struct {
	refs     []legacyRef // answer (or log) order, oldest first
	disowned uint64      // bit i: refs[i] is already disowned
	until    int64       // expiry (ns)
}

// maxUnreadConns bounds the connections and partition tails kept; the
// oldest is dropped first.
const maxUnreadConns = 256

// maxGoneAge: past it, a disowned batch's record in unreadStore.gone may
// be dropped to make room.
const maxGoneAge = 10 * time.Minute

// logConn is the key of partition k's tail in the store: session ids count
// up from 1 and never reach the top bit.
func logConn(k seqstate.Key) uint64 {
	return 1<<63 | uint64(k.Topic)<<32 | uint64(uint32(k.Partition))
}

// add records the refs of connection conn, which closed or is suspected
// gone, until expiry. Added again, the refs are replaced (a session hands
// them over when its client leaves and again when its answers drained).
func (u *unreadStore) add(conn uint64, refs []legacyRef, until int64) {
	u.put(conn, refs, until, true)
}

// addLog appends refs, read in log order from partition k's tail, to those
// kept for it; a ref kept already stays where it is.
func (u *unreadStore) addLog(k seqstate.Key, refs []legacyRef, until int64) {
	u.put(logConn(k), refs, until, false)
}

func (u *unreadStore) put(conn uint64, refs []legacyRef, until int64, replace bool) {
	if len(refs) == 0 {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.conns == nil {
		u.conns, u.byFirst, u.byFirstLog, u.gone = map[uint64]*unreadConn{}, map[uint64]uint64{}, map[uint64]uint64{}, map[uint64]int64{}
	}
	if len(u.gone) >= maxUnreadConns*legacyRingSize {
		for id, t := range u.gone {
			if t <= until-int64(maxGoneAge) {
				delete(u.gone, id)
			}
		}
		if len(u.gone) >= maxUnreadConns*legacyRingSize {
			// A burst: forgetting which batches were disowned costs at
			// most one more read of their partitions.
			clear(u.gone)
		}
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
	var kept [2 * legacyRingSize]legacyRef
	list := kept[:0]
	if !replace {
		list = append(list, uc.refs...)
	}
	for _, r := range refs {
		if replace || uc.index(r.id) < 0 {
			list = append(list, r)
		}
	}
	list = list[max(0, len(list)-legacyRingSize):]
	// Bits follow refs by identity, not position.
	var disowned uint64
	for i, r := range list {
		if j := uc.index(r.id); j >= 0 && uc.disowned&(1<<j) != 0 {
			disowned |= 1 << i
		}
	}
	byFirst := u.byFirst
	if conn&(1<<63) != 0 {
		byFirst = u.byFirstLog
	}
	u.unindex(byFirst, conn, uc) // the refs replaced or trimmed must not stay indexed
	uc.refs = append(uc.refs[:0], list...)
	uc.disowned, uc.until = disowned, max(uc.until, until)
	if until > u.until.Load() {
		u.until.Store(until) // under mu: no lost update
	}
	for _, r := range uc.refs {
		if r.first != 0 {
			byFirst[r.first] = conn
		}
	}
	u.n.Store(int64(len(u.conns)))
}

// unindex removes from byFirst the refs of uc that point to conn. Call with
// mu held.
func (u *unreadStore) unindex(byFirst map[uint64]uint64, conn uint64, uc *unreadConn) {
	for _, r := range uc.refs {
		if byFirst[r.first] == conn {
			delete(byFirst, r.first)
		}
	}
}

// drop forgets connection conn. Call with mu held.
func (u *unreadStore) drop(conn uint64) {
	uc := u.conns[conn]
	if uc == nil {
		return
	}
	u.unindex(u.byFirst, conn, uc)
	u.unindex(u.byFirstLog, conn, uc)
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

// candidates appends to dst the kept refs whose first record hash is
// first, in partition k: the one a connection answered last and the one
// read last from the partition's log, each with its connection.
func (u *unreadStore) candidates(dst []unreadRef, k seqstate.Key, first uint64, now int64) []unreadRef {
	if first == 0 {
		return dst
	}
	u.mu.RLock()
	defer u.mu.RUnlock()
	for _, byFirst := range [2]map[uint64]uint64{u.byFirst, u.byFirstLog} {
		conn, ok := byFirst[first]
		if !ok {
			continue
		}
		uc := u.conns[conn]
		if uc == nil || uc.until <= now {
			continue // dropped in turn by put
		}
		for _, r := range uc.refs {
			if r.first == first && r.topic == k.Topic && r.partition == k.Partition {
				dst = append(dst, unreadRef{r, conn})
				break
			}
		}
	}
	return dst
}

type unreadRef struct {
	legacyRef
	conn uint64
}

// unreadFrom marks every batch answered on connection conn after batch id,
// and id too if self, as disowned, and returns in dst those not marked
// before.
func (u *unreadStore) unreadFrom(conn, id uint64, self bool, dst []legacyRef) []legacyRef {
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
	if !self {
		i++
	}
	for ; i < len(uc.refs); i++ {
		if uc.disowned&(1<<i) != 0 {
			continue
		}
		uc.disowned |= 1 << i
		if _, ok := u.gone[uc.refs[i].id]; !ok {
			u.gone[uc.refs[i].id] = uc.until
			dst = append(dst, uc.refs[i])
		}
	}
	return dst
}

// noteRetry is called, before its partitions are warmed, for each legacy
// batch of a Produce request (partition k, records part.Records with header
// bh, first record hash first). When the batch resends, whole or as its first records, one answered
// on a connection now closed or suspected, that answer and every later one
// on that connection went unread: those batches are disowned and their
// partitions forgotten, so the warm-up that follows reads them from the log
// and stamps their records. It returns how many it disowned.
func (pn *planner) noteRetry(k seqstate.Key, part *protocol.ProducePartition, bh *protocol.BatchHeader, first uint64, now time.Time) (n int) {
	if !pn.unread.live(now) || bh.NumRecords <= 0 {
		return 0
	}
	var cands [2]unreadRef
	for _, c := range pn.unread.candidates(cands[:0], k, first, now.UnixNano()) {
		if pn.isResend(k, part, bh, c.legacyRef) {
			// Resent whole, the batch itself is answered by its identity;
			// resent as a prefix, its records are followed one by one too.
			n += pn.unreadFrom(c.conn, c.id, c.count < bh.NumRecords)
		}
	}
	return n
}

// unreadFrom disowns every batch of connection (or partition tail) conn
// answered after batch id, and id too if self, and forgets their
// partitions so that they are read and their records stamped before the
// next decision. It returns how many it disowned.
func (pn *planner) unreadFrom(conn, id uint64, self bool) int {
	var buf [legacyRingSize]legacyRef
	lost := pn.unread.unreadFrom(conn, id, self, buf[:0])
	for _, r := range lost {
		// Closed: Orphan moved its entries to no connection; suspected:
		// they are still conn's; read from the log: no connection.
		// Either way an entry answered since on another connection, or
		// in flight, is left alone.
		pn.legacy.Disown(r.id, 0)
		if conn&(1<<63) == 0 {
			pn.legacy.Disown(r.id, conn)
		}
		pn.warm.forget(seqstate.Key{Topic: r.topic, Partition: r.partition})
	}
	pn.metrics.legacyUnread.Add(float64(len(lost)))
	return len(lost)
}

// siblingRequests: a connection's first Produce requests are also checked
// against the batches in flight from the other connections of its client
// (noteSiblingRetry).
const siblingRequests = 16

// noteSiblingRetry: librdkafka times a request out, reconnects and resends
// its records before the proxy has read the old connection's close, and
// the first batch it resends may already hold more than the original: the
// original's records, then newer ones. A legacy batch of one of a new
// connection's first requests that resends a batch still in flight from
// another connection of the same client (sibs: same address and client id)
// makes that connection suspected (planner.suspectGone): its batches in
// flight make their partitions settle, so this request waits for them and
// is then decided against their records (settle.go, resent.go).
func (c *session) noteSiblingRetry(sibs []*session, k seqstate.Key, part *protocol.ProducePartition, bh *protocol.BatchHeader, first uint64) {
	pn := c.s.planner
	if first == 0 {
		return
	}
	var buf [legacyRingSize]legacyRef
	for _, sib := range sibs {
		if sib.suspected.Load() || sib.clientLeft.Load() {
			continue // already settling what it left in flight
		}
		for _, r := range sib.legacyIDs.refs(buf[:0]) {
			if r.first == first && r.topic == k.Topic && r.partition == k.Partition &&
				pn.isResend(k, part, bh, r) && pn.legacy.InFlightFrom(r.id, sib.id) {
				sib.suspectGone()
				break
			}
		}
	}
}
