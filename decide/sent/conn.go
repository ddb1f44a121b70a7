package sent

import (
	"fmt"
	"slices"

	"github.com/dedupproxy/dedupproxy/decide/internal/lockcheck"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// Lock locks in: every method of an instance, its connections and its
// batches but the few that say otherwise is called with it locked. The
// core holds one of its locks at a time (docs/architecture.md, "Locks"); a
// lockcheck build checks it here and at the locks below.
func (in *Instance) Lock() { lockcheck.Take("client instance"); in.mu.Lock() }

// Unlock unlocks in.
func (in *Instance) Unlock() { in.mu.Unlock(); lockcheck.Drop() }

func (sh *legacyShard) lock()   { lockcheck.Take("instance map shard"); sh.mu.Lock() }
func (sh *legacyShard) unlock() { sh.mu.Unlock(); lockcheck.Drop() }
func (ps *principals) lock()    { lockcheck.Take("principals"); ps.pmu.Lock() }
func (ps *principals) unlock()  { ps.pmu.Unlock(); lockcheck.Drop() }

// Seen records that in's client was active at now (ns): the longest idle
// instance is the first forgotten past the store's bounds.
func (in *Instance) Seen(now int64) { in.lastSeen.Store(now) }

// AnyDisowned reports whether in holds a batch whose acknowledgement its
// client may not hold.
func (in *Instance) AnyDisowned() bool { return len(in.disowned) > 0 }

// Disowned returns in's batches whose acknowledgement its client may not
// hold; valid until in is unlocked.
func (in *Instance) Disowned() []*Batch { return in.disowned }

// Key returns who in's client is: its principal, client id and host (zero
// unless the store's instances are by host).
func (in *Instance) Key() (principal uint32, clientID string, host [16]byte) {
	return in.key.principal, in.key.id, in.key.host
}

// Waiters are the connections whose request waits for something (an
// outcome, a tail read): registered under the lock of the state that
// settles it, they cannot miss it; the step that settles it names them to
// wake.
type Waiters []ConnID

// Add registers connection id, once.
func (w *Waiters) Add(id ConnID) {
	if !slices.Contains(*w, id) {
		*w = append(*w, id)
	}
}

// Take appends the waiters to wake and forgets them.
func (w *Waiters) Take(wake []ConnID) []ConnID {
	wake = append(wake, *w...)
	clear(*w)
	*w = (*w)[:0]
	return wake
}

// Await registers connection id as waiting for b's outcome (b is
// InFlight); call with b's instance locked, which its outcome is settled
// under.
func (b *Batch) Await(id ConnID) { b.waiters.Add(id) }

// Woken appends b's waiters to wake and forgets them: call it when b leaves
// InFlight, with the state they look at settled.
func (b *Batch) Woken(wake []ConnID) []ConnID { return b.waiters.Take(wake) }

// ID returns the connection's number.
func (c *Conn) ID() ConnID { return c.id }

// Gone reports whether Close was called for c; safe without its
// instance's lock.
func (c *Conn) Gone() bool { return c.gone.Load() }

// Close records that conn closed (clean: its client read every answer
// written on it) or broke: every batch it sent that a retry may still need
// is from now on one whose acknowledgement its client may not hold
// (batches in flight become so when their outcome arrives), but, after a
// clean close, those whose answer was written in time. It reports false
// when conn was closed before. It locks conn's instance.
func (ls *Store) Close(conn *Conn, clean bool, now int64) bool {
	in := conn.Inst
	in.Lock()
	defer in.Unlock()
	if !conn.Open {
		return false
	}
	conn.Open = false
	conn.gone.Store(true)
	in.closed(conn, now)
	if clean {
		conn.letGoRead()
	} else {
		conn.LetGo()
	}
	in.Sweep(now, ls.Window)
	return true
}

// Siblings appends to dst the other open connections of conn's instance.
// It locks the instance.
func (in *Instance) Siblings(conn *Conn, dst []ConnID) []ConnID {
	in.Lock()
	defer in.Unlock()
	for _, o := range in.open {
		if o != conn {
			dst = append(dst, o.id)
		}
	}
	return dst
}

// Sibling returns the open connection id of conn's instance other than
// conn, or nil. It locks the instance.
func (in *Instance) Sibling(conn *Conn, id ConnID) *Conn {
	in.Lock()
	defer in.Unlock()
	for _, o := range in.open {
		if o.id == id && o != conn {
			return o
		}
	}
	return nil
}

// Deliver records where b's answer is: written now (late: later than half
// its request's timeout after the request arrived), and kept with its
// connection until hold (ns) at least. A batch answered before keeps its
// first answer.
func (in *Instance) Deliver(b *Batch, late bool, hold int64) {
	if b.Answer != Unanswered {
		return
	}
	b.Answer, b.hold = Answered, hold
	if late {
		b.Answer = AnsweredLate
	}
	in.DropUndelivered(b)
}

// Adopt adds a batch another store let go of (a replica's handover) to
// the instance of the principal's client clientID at host: one whose
// acknowledgement its client may not hold, to topic and partition, whose
// records have hashes (0: used up) and offsets (-1 unknown), appended at
// appendTime, matchable until until (ns). It reports false when the store
// has no room for it (counted as not kept).
func (ls *Store) Adopt(principal uint32, clientID string, host [16]byte, topic seqstate.TopicID, partition int32, whole bool,
	hashes []uint64, offsets []int64, appendTime, until, now int64) bool {
	if ls.held.Load()+int64(len(hashes)) > ls.MaxRecords {
		ls.evicted.Add(1)
		return false
	}
	k := instKey{principal: principal, id: clientID}
	if ls.byHost {
		k.host = host
	}
	in := ls.pin(k, now)
	in.Lock()
	defer in.Unlock()
	defer in.users.Add(-1)
	b := in.alloc()
	b.Recs = b.Recs[:0]
	for j, hash := range hashes {
		b.Recs = append(b.Recs, Rec{Hash: hash, Off: max(offsets[j], OffUnknown)})
	}
	b.Inst, b.Conn = in, nil
	b.Topic, b.Partition, b.Whole = topic, partition, whole
	b.Phase, b.AppendTime, b.Until, b.Answer = Appended, appendTime, until, Answered
	in.account(int64(len(b.Recs)))
	in.Disown(b)
	return true
}

// Check reports the first way in's record counts disagree with the batches
// it lists, or nil; for tests (it walks every batch). Call with in locked.
func (in *Instance) Check() error {
	n := 0
	for _, l := range in.undelivered {
		for _, b := range l {
			n += len(b.Recs)
		}
	}
	if n != in.liveRecs {
		return fmt.Errorf("%d undelivered records listed, liveRecs %d", n, in.liveRecs)
	}
	d := 0
	for _, b := range in.disowned {
		d += len(b.Recs)
	}
	if d != in.disownedRecs {
		return fmt.Errorf("%d disowned records listed, disownedRecs %d", d, in.disownedRecs)
	}
	return nil
}

// IndexSteps returns the slots probed and records visited in the index of
// in's disowned records since it was made: for the tests that bound the
// work per record (docs/security.md, "Bounded work").
func (in *Instance) IndexSteps() uint64 { return in.index.steps }
