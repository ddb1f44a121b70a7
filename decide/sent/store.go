package sent

import (
	"hash/maphash"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/dedupproxy/dedupproxy/seqstate"
)

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

// Phase is what the broker did with a batch, as far as the proxy knows.
type Phase uint8

const (
	// InFlight: forwarded, no answer yet.
	InFlight Phase = iota
	// Appended: the broker appended it; its records' offsets are known,
	// or never will be.
	Appended
	// Resolving: appended, but answered with an error, which carries no
	// offsets: the partition's next tail read may tell them.
	Resolving
	// Unknown: the broker connection broke before its answer: the
	// partition's next tail read tells whether it was appended.
	Unknown
)

// Answer is where a batch's answer is.
type Answer uint8

const (
	// Unanswered: not yet written to its connection.
	Unanswered Answer = iota
	// Answered: written to its connection (or none is due: it was not
	// written upstream).
	Answered
	// AnsweredLate: written later than half its request's timeout after
	// the request arrived: its client may have given up on it by then.
	AnsweredLate
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

// Batch is one legacy batch a connection sent, or the part of it the
// proxy answered itself. Its state is its Phase (what the broker did with
// it), its Answer (where its answer is) and its Conn (whose
// acknowledgement it is; nil once disowned); inFifo and inDisowned only
// say which of its instance's lists hold it.
type Batch struct {
	gen        uint32
	Inst       *Instance
	Conn       *Conn // holds its acknowledgement; nil once disowned
	req        uint64
	Topic      seqstate.TopicID
	Partition  int32
	Phase      Phase
	Answer     Answer
	Whole      bool  // compressed: its one rec stands for the whole batch
	Exact      bool  // its records' hashes include their timestamps
	inFifo     bool  // referenced by conn.fifo
	inDisowned bool  // referenced by inst.disowned
	Until      int64 // ns: append time plus the window (0 while in flight)
	hold       int64 // ns: kept with its connection until then once answered (see KeepRequests)
	AppendTime int64 // the broker's log append time, -1 for CreateTime
	After      int64 // the highest offset answered for its partition before it was sent: it lies past it
	Recs       []Rec
	// waiters are the connections whose request waits for its outcome
	// (while InFlight).
	waiters Waiters
}

// Ref refers to a batch as it was when taken (Batch.Ref).
type Ref struct {
	B   *Batch
	gen uint32
}

// Live reports whether r's batch is still the one r was taken of: a batch
// let go is reused for another.
func (r Ref) Live() bool { return r.B != nil && r.B.gen == r.gen }

// Ref returns a reference to b as it is now.
func (b *Batch) Ref() Ref { return Ref{b, b.gen} }

// InLog reports whether the broker appended b (Appended or Resolving).
func (b *Batch) InLog() bool { return b.Phase == Appended || b.Phase == Resolving }

// ConnID is the proxy's number for a client connection.
type ConnID uint64

// Conn is a client connection's state: the batches it sent that a retry
// may still need. Get one with Store.Connect.
type Conn struct {
	id        ConnID
	Principal uint32
	Inst      *Instance
	Named     bool // its client named its software (ApiVersions v3+)
	Restamps  bool // and that software stamps a resend anew (docs/legacy.md, "What a record is")
	Open      bool
	gone      atomic.Bool // Disconnect was called: read without the instance lock (Gone)
	Reqs      uint64      // requests that registered batches
	fifo      []*Batch    // registered batches, oldest first
}

type instKey struct {
	principal uint32
	id        string
	host      [16]byte
}

type partKey struct {
	topic seqstate.TopicID
	part  int32
}

// Instance is one client instance's legacy state. Its lock is its own:
// no other client instance waits on the work its requests cause.
type Instance struct {
	mu    sync.Mutex
	key   instKey
	ls    *Store
	pu    *principalUse
	held  atomic.Int64 // records held in its batches (read without mu by makeRoom)
	conns int          // open connections
	// users counts its open connections and the callers about to use it
	// (pin): only an instance with none is evicted. Added to only under
	// its shard's lock, so that an eviction, which looks under that lock
	// alone, never takes an instance someone is about to use.
	users atomic.Int32
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
	sweepAt  int64        // ns: no disowned batch's window ends before
	lastSeen atomic.Int64 // ns (read by evictIdle without the instance's lock)
	open     []*Conn      // its open connections
	free     []*Batch     // forgotten batches kept for reuse
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
// map, and is never held with another.
type legacyShard struct {
	mu    sync.Mutex
	ls    *Store
	insts map[instKey]*Instance
	_     [40]byte
}

const legacyShards = 16

// Store is the legacy records remembered, per client instance. Make one
// with Init; it is safe for concurrent use.
type Store struct {
	shards [legacyShards]legacyShard
	seed   maphash.Seed
	byHost bool // the client's host is part of its instance (decide.ScopeInstance)
	// Window is how long (ns) a batch's records may be answered as
	// retried, from its append; MaxRecords bounds the records held.
	Window     int64
	MaxRecords int64
	held       atomic.Int64  // records held in batches
	evicted    atomic.Uint64 // batches not kept for want of room
	principals               // what each principal holds (shares.go)
}

// Init makes ls ready: byHost says whether a client's host is part of its
// instance, window (ns) how long a batch's records may be answered as
// retried, maxRecords how many records it holds at most.
func (ls *Store) Init(byHost bool, window int64, maxRecords int) {
	ls.seed = maphash.MakeSeed()
	ls.byHost, ls.Window, ls.MaxRecords = byHost, window, int64(maxRecords)
	for i := range ls.shards {
		ls.shards[i].insts = map[instKey]*Instance{}
		ls.shards[i].ls = ls
	}
}

// Held returns the records held, and the batches not kept for want of
// room since Init.
func (ls *Store) Held() (held int64, evicted uint64) {
	return ls.held.Load(), ls.evicted.Load()
}

// NotKept counts a batch of n records of in not kept for want of room.
func (ls *Store) NotKept(in *Instance, n int) {
	ls.evicted.Add(1)
	in.pu.evicted.Add(uint64(n))
}

func (ls *Store) shardOf(k instKey) *legacyShard {
	var h maphash.Hash
	h.SetSeed(ls.seed)
	h.WriteString(k.id)
	h.Write(k.host[:])
	x := h.Sum64() ^ uint64(k.principal)*0x9e3779b97f4a7c15
	return &ls.shards[x%legacyShards]
}

// Connect returns the state of connection id, whose client is the
// principal's client clientID at host (left out unless byHost, see Init).
// named: its client named its software; restamps: that software stamps a
// resend anew.
func (ls *Store) Connect(id ConnID, principal uint32, clientID string, host netip.Addr, named, restamps bool, now int64) *Conn {
	k := instKey{principal: principal, id: clientID}
	if ls.byHost {
		k.host = host.As16()
	}
	in := ls.pin(k, now) // the pin is the connection's use, let go when it closes
	in.Lock()
	defer in.Unlock()
	in.conns++
	in.lastSeen.Store(now)
	conn := &Conn{id: id, Principal: principal, Inst: in, Named: named, Restamps: restamps, Open: true}
	in.open = append(in.open, conn)
	return conn
}

// pin returns k's instance, made if need be, with one more user: it is not
// evicted until that user lets go (users). Each lock it takes, it takes
// alone.
func (ls *Store) pin(k instKey, now int64) *Instance {
	sh := ls.shardOf(k)
	sh.lock()
	if in := sh.insts[k]; in != nil {
		in.users.Add(1)
		sh.unlock()
		return in
	}
	sh.unlock()
	pu := ls.use(k.principal)
	sh.lock()
	in := sh.insts[k]
	made := in == nil
	var victim *Instance
	if made {
		if len(sh.insts) >= maxInstancesPerShard {
			victim = sh.evictIdle()
		}
		in = &Instance{key: k, ls: ls, pu: pu, undelivered: map[partKey][]*Batch{}}
		in.lastSeen.Store(now)
		sh.insts[k] = in
	}
	in.users.Add(1)
	sh.unlock()
	if !made {
		ls.drop(pu) // made meanwhile by another connection
	}
	if victim != nil {
		victim.clear()
		ls.drop(victim.pu)
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
	in.users.Add(-1)
	in.lastSeen.Store(now)
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
	sh.lock()
	defer sh.unlock()
	out := make([]*Instance, 0, len(sh.insts))
	for _, in := range sh.insts {
		out = append(out, in)
	}
	return out
}

// evictIdle removes from the shard, and returns, the instance without
// users (no open connection, no one about to use it) seen longest ago, or
// nil; call with the shard locked. The caller clears it once the shard is
// unlocked: no one can find it any more.
func (sh *legacyShard) evictIdle() *Instance {
	var victim *Instance
	for _, in := range sh.insts {
		if in.users.Load() == 0 && (victim == nil || in.lastSeen.Load() < victim.lastSeen.Load()) {
			victim = in
		}
	}
	if victim != nil {
		delete(sh.insts, victim.key)
	}
	return victim
}

// clear forgets an evicted instance's batches.
func (in *Instance) clear() {
	in.Lock()
	defer in.Unlock()
	for _, b := range in.disowned {
		b.inDisowned = false
		in.forget(b)
	}
	in.disowned, in.disownedRecs = nil, 0
	in.free = nil
}

// alloc takes a batch from the instance's free list.
func (in *Instance) alloc() *Batch {
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
	recs, waiters := b.Recs[:0], b.waiters[:0]
	clear(b.waiters)
	gen := b.gen + 1
	*b = Batch{gen: gen, Recs: recs, waiters: waiters}
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
	if b.InLog() && b.Until == 0 {
		b.Until = 1 // settled before it was registered: nothing to keep
	}
	if !b.inDisowned {
		b.inDisowned = true
		in.disowned = append(in.disowned, b)
		in.disownedRecs += len(b.Recs)
		in.indexDisowned(b)
		if b.InLog() {
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
		if b.Answer == Unanswered && b.Conn == conn {
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
		if b.InLog() && b.Until <= now {
			b.inDisowned = false
			in.disownedRecs -= len(b.Recs)
			in.forget(b)
			continue
		}
		if b.InLog() {
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
func (in *Instance) Lookup(topic seqstate.TopicID, h uint64, now int64, undo *[]Undo) (Candidate, bool) {
	if len(in.disowned) == 0 {
		return Candidate{}, false
	}
	if in.dirty || in.index.rebuild || len(in.index.slots) == 0 {
		in.reindex()
	}
	r, ok := in.index.find(idxKey(h, uint32(topic), -1), func(r *recRef) verdict {
		b := r.b
		if b.gen != r.gen || !b.inDisowned || b.Recs[r.i].Hash != h || b.InLog() && b.Until <= now {
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
func (in *Instance) SameParts(conn *Conn, topic seqstate.TopicID, part int32, h uint64, now int64, undo *[]Undo) (Candidate, bool) {
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
		case b.gen != r.gen || b.Answer != Unanswered || b.Conn == nil || (b.InLog() && b.Until <= now) || b.Recs[r.i].Hash != h:
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

// NewBatch returns a batch of conn, one of in's connections, to topic and
// partition with room for n records, not yet kept (Keep); whole: a
// compressed batch, whose one record stands for all; exact: its records'
// hashes include their timestamps.
func (in *Instance) NewBatch(conn *Conn, topic seqstate.TopicID, partition int32, whole, exact bool, n int) *Batch {
	b := in.alloc()
	if cap(b.Recs) < n {
		b.Recs = make([]Rec, 0, n) // sized exactly: 16 bytes a record
	}
	b.Inst, b.Conn, b.req = in, conn, conn.Reqs
	b.Topic, b.Partition, b.Whole, b.Exact = topic, partition, whole, exact
	b.After = -1
	return b
}

// Keep files b with its connection, not yet answered.
func (in *Instance) Keep(b *Batch) {
	b.Inst.account(int64(len(b.Recs)))
	b.inFifo = true
	b.Conn.fifo = append(b.Conn.fifo, b)
	k := partKey{b.Topic, b.Partition}
	in.undelivered[k] = append(in.undelivered[k], b)
	in.liveRecs += len(b.Recs)
	in.liveDirty = true
}

// Room reports whether n more records may be kept, first letting conn's
// oldest answered batches go when the store is full (their hold ignored:
// a miss, never a wrong answer).
func (ls *Store) Room(n int64, conn *Conn) bool {
	if ls.held.Load()+n <= ls.MaxRecords {
		return true
	}
	conn.Trim(1, ls, 0, true)
	return ls.held.Load()+n <= ls.MaxRecords
}

// Trim lets go the batches of conn's answered requests beyond the last
// keep whose hold has passed at now or that are beyond the last
// maxHeldRequests (all of them with force); call with the instance locked.
func (conn *Conn) Trim(keep uint64, ls *Store, now int64, force bool) {
	n := 0
	for _, b := range conn.fifo {
		if b.Answer == Unanswered || b.req+keep >= conn.Reqs || !force && b.hold > now && b.req+maxHeldRequests >= conn.Reqs {
			break
		}
		b.inFifo = false
		conn.Inst.forget(b)
		n++
	}
	if n > 0 {
		copy(conn.fifo, conn.fifo[n:])
		clear(conn.fifo[len(conn.fifo)-n:])
		conn.fifo = conn.fifo[:len(conn.fifo)-n]
	}
}

// letGoRead empties conn's fifo after a clean close: its client read every
// answer written, so only the batches whose answer was not written (in
// flight, or never sent), or was written late (lateAnswer), are ones it may
// not hold the acknowledgement of. Call with the instance locked.
func (conn *Conn) letGoRead() {
	in := conn.Inst
	for _, b := range conn.fifo {
		b.inFifo = false
		if b.Conn == conn && b.Answer != Answered {
			in.Disown(b)
		}
		in.forget(b)
	}
	clear(conn.fifo)
	conn.fifo = conn.fifo[:0]
}

// LetGo disowns the batches conn holds and empties its fifo: its client
// holds none of their acknowledgements. Call with the instance locked.
func (conn *Conn) LetGo() {
	in := conn.Inst
	for _, b := range conn.fifo {
		b.inFifo = false
		if b.Conn == conn {
			in.Disown(b)
		}
		in.forget(b)
	}
	clear(conn.fifo)
	conn.fifo = conn.fifo[:0]
}
