package decide

import (
	"hash/maphash"
	"sync"
	"sync/atomic"

	"github.com/dedupproxy/dedupproxy/seqstate"
)

// Legacy producers (producer id -1) carry no sequence numbers; the proxy
// tells their retries from new data by one rule (docs/legacy.md, "The
// rule"): a record of a batch is a retry when the same client instance
// already sent the same record to the same topic within the window and may
// not hold its acknowledgement — the connection it went on closed or broke,
// its answer was an error or never reached the client, or it is still in
// flight on another connection to the same partition (then the request
// waits for its outcome). Records of different client instances are never
// retries of each other.
//
// The state is one object per client instance: its connections, each with
// the batches it sent that a retry may still need (those in flight and
// those of its answered requests it keeps, see keepRequests), and the batches whose
// acknowledgement the client may not hold (disowned), indexed by record.

// KeepRequests is how many answered requests of a connection keep their
// batches at least: when the connection breaks, answers written before it
// may not have been read (one traced run lost 22 written answers with its
// connection). An answered batch is also kept until its request's timeout
// (plus a margin) has passed since its answer was written: a client that
// had not read it by then would have given up on the connection. Only past
// both is an answer taken as read. (librdkafka, after a lost answer, sends
// every failed batch again at once; the proxy answers them at once, and
// more than 64 answers written in one burst were lost with the next break:
// decide/testdata/librdkafka.txt.)
const KeepRequests = 64

// maxHeldRequests bounds the answered requests a connection keeps for their
// hold: a connection sending thousands of requests a second keeps its last
// 1,024, not a timeout's worth.
const maxHeldRequests = 1024

type Phase uint8

const (
	InFlight Phase = iota // forwarded, no answer yet
	Appended              // the broker appended it
	Unknown               // the broker connection broke before its answer: the log will tell
)

// Record offsets with a meaning of their own.
const (
	OffUnknown = -1 // appended, offset not known
	OffPending = -2 // sent upstream, not answered yet
)

// Rec is one record of a batch: its hash (0 once it answered for a retry,
// or was not written) and its offset.
type Rec struct {
	Hash uint64
	Off  int64
}

// Batch is one legacy Batch a connection sent, or the part of it the proxy
// answered itself.
type Batch struct {
	gen        uint32
	Inst       *Instance
	Conn       *Conn // holds its acknowledgement; nil once disowned
	req        uint64
	Topic      seqstate.TopicID
	Partition       int32
	Phase      Phase
	delivered  bool  // its answer was written to its connection
	late       bool  // written later than half its request's timeout after it arrived (lateAnswer)
	Whole      bool  // compressed: its one rec stands for the whole batch
	Exact      bool  // its records' hashes include their timestamps (recHash)
	inFifo     bool  // referenced by conn.fifo
	inDisowned bool  // referenced by inst.disowned
	resolvable bool  // appended with offUnknown records the log may settle
	Until      int64 // ns: append time plus the window (0 while in flight)
	hold       int64 // ns: kept with its connection until then once answered (see keepRequests)
	AppendTime int64 // the broker's log append time, -1 for CreateTime
	After      int64 // the highest offset answered for its partition before it was sent: it lies past it
	Recs       []Rec
}

type Ref struct {
	B   *Batch
	gen uint32
}

func (r Ref) Live() bool { return r.B != nil && r.B.gen == r.gen }

// Conn is a client connection's legacy state. Get one with an `EvConnect` step.
type Conn struct {
	id        ConnID
	Principal uint32
	Inst      *Instance
	Named     bool // its client named its software (Client.Software)
	Restamps  bool // and that software stamps a resend anew (restampingSoftware)
	Open      bool
	gone      atomic.Bool // Disconnect was called: read without the instance lock (Gone)
	Reqs      uint64      // requests that registered batches
	fifo      []*Batch    // registered batches, oldest first
}

// ID returns the connection's number.
func (c *Conn) ID() ConnID { return c.id }

type instKey struct {
	principal uint32
	id        string
	host      [16]byte
}

type partKey struct {
	topic seqstate.TopicID
	part  int32
}

// Instance is one client Instance's legacy state. Its lock is its own:
// no other client Instance waits on the work its requests cause.
type Instance struct {
	mu    sync.Mutex
	key   instKey
	ls    *Store
	pu    *principalUse
	held  atomic.Int64 // records held in its batches (read without mu by makeRoom)
	conns int          // open connections
	// undelivered lists, per partition, the batches not yet answered to
	// their connection: a batch to the same partition from another
	// connection may be their retry.
	undelivered map[partKey][]*Batch
	// disowned are the batches whose acknowledgement the client may not
	// hold, each until its window ends (in flight ones until their
	// outcome); index finds their records.
	disowned     []*Batch
	disownedRecs int // records in disowned batches
	// index finds disowned records: added to as batches are disowned,
	// rebuilt (dirty) when full of entries of batches since let go; those
	// are skipped by lookups meanwhile.
	index    recIndex
	dirty    bool
	sweepAt  int64 // ns: no disowned batch's window ends before
	lastSeen int64
	open     []*Conn  // its open connections
	free     []*Batch // forgotten batches kept for reuse
	// live indexes the records of undelivered batches, built when a young
	// connection looks one up (see youngRequests) and the batches changed
	// since; entries of batches answered since are skipped.
	live      recIndex
	liveDirty bool
	liveRecs  int // records in undelivered batches
}

// youngRequests bounds the requests of a connection whose records are
// looked up among the batches not yet answered to the instance's other
// connections: a client that gives up on a connection resends at once on
// its next one, before newer records (librdkafka requeues the failed ones
// first), so only a connection's first requests can be such a resend. Past
// them, a connection costs no lookup.
const youngRequests = 256

// legacyShard holds a share of the instances; its lock guards only the
// map (taken before an instance's, never after).
type legacyShard struct {
	mu    sync.Mutex
	ls    *Store
	insts map[instKey]*Instance
	_     [40]byte
}

const legacyShards = 16

type Store struct {
	shards     [legacyShards]legacyShard
	seed       maphash.Seed
	Scope      Scope
	Window     int64 // ns
	MaxRecords int64
	held       atomic.Int64  // records held in batches
	evicted    atomic.Uint64 // batches not kept for want of room
	principals               // what each principal holds (shares.go)
}

func (ls *Store) init(scope Scope, window int64, maxRecords int) {
	ls.seed = maphash.MakeSeed()
	ls.Scope, ls.Window, ls.MaxRecords = scope, window, int64(maxRecords)
	for i := range ls.shards {
		ls.shards[i].insts = map[instKey]*Instance{}
		ls.shards[i].ls = ls
	}
}

func (ls *Store) shardOf(k instKey) *legacyShard {
	var h maphash.Hash
	h.SetSeed(ls.seed)
	h.WriteString(k.id)
	h.Write(k.host[:])
	x := h.Sum64() ^ uint64(k.principal)*0x9e3779b97f4a7c15
	return &ls.shards[x%legacyShards]
}

// Connect returns the state of connection id of client cl.
func (ls *Store) Connect(id ConnID, cl Client, now int64) *Conn {
	k := instKey{principal: cl.Principal, id: cl.ID}
	if ls.Scope == ScopeInstance {
		k.host = cl.Host.As16()
	}
	sh := ls.shardOf(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	in := sh.instance(k, now)
	in.mu.Lock()
	defer in.mu.Unlock()
	in.conns++
	in.lastSeen = now
	conn := &Conn{id: id, Principal: cl.Principal, Inst: in, Named: cl.Software != "", Restamps: restampingSoftware[cl.Software], Open: true}
	in.open = append(in.open, conn)
	return conn
}

// instance returns k's instance, made if need be; call with the shard
// locked.
func (sh *legacyShard) instance(k instKey, now int64) *Instance {
	in := sh.insts[k]
	if in == nil {
		if len(sh.insts) >= maxInstancesPerShard {
			sh.evictIdle(now)
		}
		in = &Instance{key: k, ls: sh.ls, pu: sh.ls.use(k.principal), undelivered: map[partKey][]*Batch{}, lastSeen: now}
		sh.insts[k] = in
	}
	return in
}

// closed records that conn, one of the instance's connections, closed.
func (in *Instance) closed(conn *Conn, now int64) {
	for i, o := range in.open {
		if o == conn {
			in.open = append(in.open[:i], in.open[i+1:]...)
			break
		}
	}
	in.conns--
	in.lastSeen = now
	if in.conns < 2 {
		in.live, in.liveDirty = recIndex{}, true // one connection: nothing to look up
	}
}

// rebuildLive indexes the records of the undelivered batches anew.
func (in *Instance) rebuildLive() {
	in.live.reset(in.liveRecs)
	for _, l := range in.undelivered {
		for _, b := range l {
			for i, r := range b.Recs {
				if r.Hash != 0 {
					in.live.add(idxKey(r.Hash, uint32(b.Topic), b.Partition), recRef{b: b, gen: b.gen, i: int32(i)})
				}
			}
		}
	}
	in.liveDirty, in.live.rebuild = false, false
}

// maxInstancesPerShard bounds the client instances remembered (64 Ki in
// all); past it the longest idle one without connections is forgotten.
const maxInstancesPerShard = 4096

// all returns the shard's instances.
func (sh *legacyShard) all() []*Instance {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	out := make([]*Instance, 0, len(sh.insts))
	for _, in := range sh.insts {
		out = append(out, in)
	}
	return out
}

// evictIdle forgets the instance without connections seen longest ago;
// call with the shard locked (each instance's lock is taken after it).
func (sh *legacyShard) evictIdle(now int64) {
	var victim *Instance
	for _, in := range sh.insts {
		in.mu.Lock()
		if in.conns == 0 && (victim == nil || in.lastSeen < victim.lastSeen) {
			victim = in
		}
		in.mu.Unlock()
	}
	if victim == nil {
		return
	}
	victim.mu.Lock()
	for _, b := range victim.disowned {
		b.inDisowned = false
		victim.forget(b)
	}
	victim.disowned, victim.disownedRecs = nil, 0
	victim.free = nil
	victim.mu.Unlock()
	delete(sh.insts, victim.key)
	sh.ls.drop(victim.pu)
}

// NewBatch takes a batch from the instance's free list.
func (in *Instance) NewBatch() *Batch {
	if n := len(in.free); n > 0 {
		b := in.free[n-1]
		in.free = in.free[:n-1]
		return b
	}
	return &Batch{}
}

// forget frees b once nothing refers to it; call with the instance
// locked.
func (in *Instance) forget(b *Batch) {
	if b.inFifo || b.inDisowned {
		return
	}
	in.account(-int64(len(b.Recs)))
	if b.Inst != nil {
		b.Inst.DropUndelivered(b)
	}
	recs := b.Recs[:0]
	gen := b.gen + 1
	*b = Batch{gen: gen, Recs: recs}
	if len(in.free) < maxFreeBatches && cap(recs) <= maxFreeRecs {
		in.free = append(in.free, b)
	}
}

// maxFreeBatches and maxFreeRecs bound the batches an instance keeps for
// reuse, and the records each may keep room for.
const (
	maxFreeBatches = 32
	maxFreeRecs    = 4096
)

// Disown records that b's client may not hold its acknowledgement: its
// records are matchable by a retry from any connection of the instance
// until b's window ends.
func (in *Instance) Disown(b *Batch) {
	b.Conn = nil
	if b.Phase == Appended && b.Until == 0 {
		b.Until = 1 // settled before it was registered: nothing to keep
	}
	if !b.inDisowned {
		b.inDisowned = true
		in.disowned = append(in.disowned, b)
		in.disownedRecs += len(b.Recs)
		in.indexDisowned(b)
		if b.Phase == Appended {
			in.sweepAt = min(in.sweepAt, b.Until)
		}
	}
}

// indexDisowned adds b's records to the index, or marks it to be rebuilt
// when it is full, or mostly entries of batches let go since.
func (in *Instance) indexDisowned(b *Batch) {
	if in.dirty {
		return
	}
	if n := len(in.index.refs) + len(b.Recs); n > 2*in.disownedRecs+1024 {
		in.dirty = true
		return
	}
	for i, r := range b.Recs {
		if r.Hash != 0 {
			in.index.add(idxKey(r.Hash, uint32(b.Topic), -1), recRef{b: b, gen: b.gen, i: int32(i)})
		}
	}
}

// Undisown takes b back from the disowned batches: its client holds its
// acknowledgement after all.
func (in *Instance) Undisown(b *Batch) {
	if !b.inDisowned {
		return
	}
	b.inDisowned = false
	in.disownedRecs -= len(b.Recs)
	for i, x := range in.disowned {
		if x == b {
			copy(in.disowned[i:], in.disowned[i+1:])
			in.disowned[len(in.disowned)-1] = nil
			in.disowned = in.disowned[:len(in.disowned)-1]
			break
		}
	}
}

// Abandon disowns every batch of conn whose answer is not yet written: its
// client resent one of them on another connection. Batches conn sends
// later are its own again.
func (conn *Conn) Abandon(in *Instance) {
	for _, b := range conn.fifo {
		if !b.delivered && b.Conn == conn {
			in.Disown(b)
		}
	}
}

// DropUndelivered removes b from the undelivered lists.
func (in *Instance) DropUndelivered(b *Batch) {
	k := partKey{b.Topic, b.Partition}
	l := in.undelivered[k]
	for i, x := range l {
		if x == b {
			l = append(l[:i], l[i+1:]...)
			in.liveRecs -= len(b.Recs)
			in.liveDirty = true
			break
		}
	}
	in.undelivered[k] = l // kept when empty: the partition's next batch reuses it
}

// Sweep forgets the disowned batches whose window has ended, once one
// may have (lookups skip them meanwhile: sweeping only frees memory). A
// batch settled after it was disowned is swept at most a window late.
func (in *Instance) Sweep(now int64, window int64) {
	if now < in.sweepAt {
		return
	}
	next := now + window
	kept := in.disowned[:0]
	for _, b := range in.disowned {
		if b.Phase == Appended && b.Until <= now {
			b.inDisowned = false
			in.disownedRecs -= len(b.Recs)
			in.forget(b)
			continue
		}
		if b.Phase == Appended {
			next = min(next, b.Until)
		}
		kept = append(kept, b)
	}
	clear(in.disowned[len(kept):])
	in.disowned = kept
	in.sweepAt = next
}

// reindex rebuilds the index of disowned records.
func (in *Instance) reindex() {
	in.index.reset(in.disownedRecs)
	for _, b := range in.disowned {
		for i, r := range b.Recs {
			if r.Hash != 0 {
				in.index.add(idxKey(r.Hash, uint32(b.Topic), -1), recRef{b: b, gen: b.gen, i: int32(i)})
			}
		}
	}
	in.dirty, in.index.rebuild = false, false
}

// Candidate is a record a record of a new batch may repeat.
type Candidate struct {
	B *Batch
	I int32
}

// Lookup returns the first disowned record of topic with hash h that is
// not used up, or false.
func (in *Instance) Lookup(topic seqstate.TopicID, h uint64, now int64, undo *[]undo) (Candidate, bool) {
	if len(in.disowned) == 0 {
		return Candidate{}, false
	}
	if in.dirty || in.index.rebuild || len(in.index.slots) == 0 {
		in.reindex()
	}
	r, ok := in.index.find(idxKey(h, uint32(topic), -1), func(r *recRef) verdict {
		b := r.b
		if b.gen != r.gen || !b.inDisowned || b.Recs[r.i].Hash != h || b.Phase == Appended && b.Until <= now {
			return skipForGood
		}
		return take
	}, undo)
	if !ok {
		return Candidate{}, false
	}
	return Candidate{r.b, r.i}, true
}

// SameParts returns a record with hash h in a batch to (topic, part) not
// yet answered to another connection than conn: the client gave up on it
// and this is its retry.
func (in *Instance) SameParts(conn *Conn, topic seqstate.TopicID, part int32, h uint64, now int64, undo *[]undo) (Candidate, bool) {
	if in.conns < 2 || conn.Reqs >= youngRequests {
		return Candidate{}, false
	}
	if in.liveRecs == 0 {
		return Candidate{}, false
	}
	if in.liveDirty || in.live.rebuild || len(in.live.slots) == 0 {
		in.rebuildLive()
	}
	r, ok := in.live.find(idxKey(h, uint32(topic), part), func(r *recRef) verdict {
		b := r.b
		switch {
		case b.gen != r.gen || b.delivered || b.Conn == nil || (b.Phase == Appended && b.Until <= now) || b.Recs[r.i].Hash != h:
			return skipForGood
		case b.Conn == conn:
			return skipNow
		}
		return take
	}, undo)
	if !ok {
		return Candidate{}, false
	}
	return Candidate{r.b, r.i}, true
}

// AnyOtherUndelivered reports whether a batch to (topic, part) from another
// connection than conn is not yet answered.
func (in *Instance) AnyOtherUndelivered(conn *Conn, topic seqstate.TopicID, part int32) bool {
	if in.conns < 2 || conn.Reqs >= youngRequests {
		return false // no other connection, or not a young one (see youngRequests)
	}
	for _, b := range in.undelivered[partKey{topic, part}] {
		if b.Conn != conn && b.Conn != nil {
			return true
		}
	}
	return false
}
