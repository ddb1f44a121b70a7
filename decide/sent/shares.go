package sent

import (
	"sync"
	"sync/atomic"
)

// Fair shares of the legacy records remembered (docs/security.md, "Fair
// shares"). Config.MaxRecords bounds them in all; no client can make room
// for itself at the cost of others while it holds more than its share:
//
//   - a principal's share is MaxRecords over the principals holding records;
//   - an instance's share is its principal's share over the principal's
//     instances holding records.
//
// While there is room, anyone may take it. When a request needs room the
// store has not, it is taken from the largest holder: the principal holding
// most, and in it the instance holding most — unless the requester holds
// more than its share, whose room then comes from its own principal, or
// from itself. A holder gives up its answered batches first (they matter
// only if a connection breaks), then its oldest batches whose
// acknowledgement its client may not hold; never a batch in flight. What
// is let go costs a missed retry, never a wrong answer.

// principalUse is what one principal holds.
type principalUse struct {
	id      uint32
	held    atomic.Int64  // records its instances hold
	evicted atomic.Uint64 // records let go for want of room, or never kept
	holding atomic.Int32  // its instances holding records
	insts   int           // its instances (under principals.pmu)
}

// principals tracks what each principal holds.
type principals struct {
	pmu     sync.Mutex
	princ   map[uint32]*principalUse
	holding atomic.Int32 // principals holding records
}

// use returns principal id's use, counting one more instance of it.
func (ps *principals) use(id uint32) *principalUse {
	ps.lock()
	defer ps.unlock()
	if ps.princ == nil {
		ps.princ = map[uint32]*principalUse{}
	}
	pu := ps.princ[id]
	if pu == nil {
		pu = &principalUse{id: id}
		ps.princ[id] = pu
	}
	pu.insts++
	return pu
}

// drop counts one instance of pu fewer, forgetting pu with its last.
func (ps *principals) drop(pu *principalUse) {
	ps.lock()
	defer ps.unlock()
	if pu.insts--; pu.insts == 0 && ps.princ[pu.id] == pu {
		delete(ps.princ, pu.id)
	}
}

// account adds n records (n < 0: takes them) to what in, its principal
// and the store hold.
func (in *Instance) account(n int64) {
	if n == 0 {
		return
	}
	ls := in.ls
	ls.held.Add(n)
	switch h := in.held.Add(n); {
	case n > 0 && h == n:
		in.pu.holding.Add(1)
	case h == 0:
		in.pu.holding.Add(-1)
	}
	switch h := in.pu.held.Add(n); {
	case n > 0 && h == n:
		ls.holding.Add(1)
	case h == 0:
		ls.holding.Add(-1)
	}
}

// MakeRoom lets records of the holder the shares name go until n more
// records fit, or no holder may give any (then the request's batches may
// go unremembered: a miss). Call it with no instance locked: it locks the
// holders it takes from, one at a time.
func (ls *Store) MakeRoom(n int64, in *Instance) {
	// Each round frees at least a 64th of the store, so the scan it
	// starts with is paid once per that many records.
	chunk := max(n, ls.MaxRecords/64)
	for range 8 {
		if ls.held.Load()+n <= ls.MaxRecords {
			return
		}
		v := ls.victim(n, in)
		if v == nil || v.evict(chunk) == 0 {
			return
		}
	}
}

// victim returns the instance whose records make room for n records of
// in, by the shares (see the top of this file), or nil.
func (ls *Store) victim(n int64, in *Instance) *Instance {
	nP := int64(max(ls.holding.Load(), 1))
	if in.pu.held.Load() == 0 {
		nP++
	}
	var from *principalUse // the principal to take from; nil: the largest
	if in.pu.held.Load()+n > ls.MaxRecords/nP {
		from = in.pu
	}
	all := ls.Instances()
	if from == nil {
		for _, o := range all {
			if o.held.Load() > 0 && (from == nil || o.pu.held.Load() > from.held.Load()) {
				from = o.pu
			}
		}
		if from == nil {
			return nil
		}
	}
	if from == in.pu {
		nI := int64(max(from.holding.Load(), 1))
		if in.held.Load() == 0 {
			nI++
		}
		share := max(from.held.Load(), ls.MaxRecords/nP) / nI
		if in.held.Load()+n > share {
			return in // over its own share: its own records go
		}
	}
	var v *Instance
	for _, o := range all {
		if o.pu == from && o.held.Load() > 0 && (v == nil || o.held.Load() > v.held.Load()) {
			v = o
		}
	}
	return v
}

// Instances returns every instance.
func (ls *Store) Instances() []*Instance {
	var all []*Instance
	for i := range ls.shards {
		all = append(all, ls.shards[i].all()...)
	}
	return all
}

// evict lets at least want of in's records go, answered batches first,
// then the oldest whose acknowledgement its client may not hold; it
// returns how many went.
func (in *Instance) evict(want int64) int64 {
	in.Lock()
	defer in.Unlock()
	before := in.held.Load()
	for _, conn := range in.open {
		if before-in.held.Load() >= want {
			break
		}
		conn.Trim(0, in.ls, 0, true)
	}
	if before-in.held.Load() < want {
		kept := in.disowned[:0]
		for _, b := range in.disowned {
			if before-in.held.Load() >= want || b.Phase != Appended {
				kept = append(kept, b)
				continue
			}
			b.inDisowned = false
			in.disownedRecs -= len(b.Recs)
			in.forget(b)
		}
		clear(in.disowned[len(kept):])
		in.disowned = kept
	}
	freed := before - in.held.Load()
	in.pu.evicted.Add(uint64(freed))
	return freed
}

// PrincipalUse is what one principal's client instances hold of the legacy
// records remembered, and how many of theirs were let go or never kept for
// want of room.
type PrincipalUse struct {
	Principal uint32
	Held      int64
	Evicted   uint64
}

// Use appends to dst what each principal with client instances holds.
func (ps *principals) Use(dst []PrincipalUse) []PrincipalUse {
	ps.lock()
	defer ps.unlock()
	for _, pu := range ps.princ {
		dst = append(dst, PrincipalUse{Principal: pu.id, Held: pu.held.Load(), Evicted: pu.evicted.Load()})
	}
	return dst
}
