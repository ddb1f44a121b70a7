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

// keepRequests is how many answered requests of a connection keep their
// batches at least: when the connection breaks, answers written before it
// may not have been read (one traced run lost 22 written answers with its
// connection). An answered batch is also kept until its request's timeout
// (plus a margin) has passed since its answer was written: a client that
// had not read it by then would have given up on the connection. Only past
// both is an answer taken as read. (librdkafka, after a lost answer, sends
// every failed batch again at once; the proxy answers them at once, and
// more than 64 answers written in one burst were lost with the next break:
// decide/testdata/librdkafka.txt.)
const keepRequests = 64

// maxHeldRequests bounds the answered requests a connection keeps for their
// hold: a connection sending thousands of requests a second keeps its last
// 1,024, not a timeout's worth.
const maxHeldRequests = 1024

type phase uint8

const (
	inFlight phase = iota // forwarded, no answer yet
	appended              // the broker appended it
	unknown               // the broker connection broke before its answer: the log will tell
)

// Record offsets with a meaning of their own.
const (
	offUnknown = -1 // appended, offset not known
	offPending = -2 // sent upstream, not answered yet
)

// rec is one record of a batch: its hash (0 once it answered for a retry,
// or was not written) and its offset.
type rec struct {
	hash uint64
	off  int64
}

// batch is one legacy batch a connection sent, or the part of it the proxy
// answered itself.
type batch struct {
	gen        uint32
	inst       *instance
	conn       *Conn // holds its acknowledgement; nil once disowned
	req        uint64
	topic      seqstate.TopicID
	part       int32
	phase      phase
	delivered  bool  // its answer was written to its connection
	late       bool  // written later than half its request's timeout after it arrived (lateAnswer)
	whole      bool  // compressed: its one rec stands for the whole batch
	exact      bool  // its records' hashes include their timestamps (recHash)
	inFifo     bool  // referenced by conn.fifo
	inDisowned bool  // referenced by inst.disowned
	resolvable bool  // appended with offUnknown records the log may settle
	until      int64 // ns: append time plus the window (0 while in flight)
	hold       int64 // ns: kept with its connection until then once answered (see keepRequests)
	appendTime int64 // the broker's log append time, -1 for CreateTime
	after      int64 // the highest offset answered for its partition before it was sent: it lies past it
	recs       []rec
}

type batchRef struct {
	b   *batch
	gen uint32
}

func (r batchRef) live() bool { return r.b != nil && r.b.gen == r.gen }

// Conn is a client connection's legacy state. Get one with an `EvConnect` step.
type Conn struct {
	id        ConnID
	principal uint32
	inst      *instance
	named     bool // its client named its software (Client.Software)
	restamps  bool // and that software stamps a resend anew (restampingSoftware)
	open      bool
	gone      atomic.Bool // Disconnect was called: read without the instance lock (Gone)
	reqs      uint64      // requests that registered batches
	fifo      []*batch    // registered batches, oldest first
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

// instance is one client instance's legacy state. Its lock is its own:
// no other client instance waits on the work its requests cause.
type instance struct {
	mu    sync.Mutex
	key   instKey
	ls    *legacyStore
	pu    *principalUse
	held  atomic.Int64 // records held in its batches (read without mu by makeRoom)
	conns int          // open connections
	// undelivered lists, per partition, the batches not yet answered to
	// their connection: a batch to the same partition from another
	// connection may be their retry.
	undelivered map[partKey][]*batch
	// disowned are the batches whose acknowledgement the client may not
	// hold, each until its window ends (in flight ones until their
	// outcome); index finds their records.
	disowned     []*batch
	disownedRecs int // records in disowned batches
	// index finds disowned records: added to as batches are disowned,
	// rebuilt (dirty) when full of entries of batches since let go; those
	// are skipped by lookups meanwhile.
	index    recIndex
	dirty    bool
	sweepAt  int64 // ns: no disowned batch's window ends before
	lastSeen int64
	open     []*Conn  // its open connections
	free     []*batch // forgotten batches kept for reuse
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
	ls    *legacyStore
	insts map[instKey]*instance
	_     [40]byte
}

const legacyShards = 16

type legacyStore struct {
	shards     [legacyShards]legacyShard
	seed       maphash.Seed
	scope      Scope
	window     int64 // ns
	maxRecords int64
	held       atomic.Int64  // records held in batches
	evicted    atomic.Uint64 // batches not kept for want of room
	principals               // what each principal holds (shares.go)
}

func (ls *legacyStore) init(scope Scope, window int64, maxRecords int) {
	ls.seed = maphash.MakeSeed()
	ls.scope, ls.window, ls.maxRecords = scope, window, int64(maxRecords)
	for i := range ls.shards {
		ls.shards[i].insts = map[instKey]*instance{}
		ls.shards[i].ls = ls
	}
}

func (ls *legacyStore) shardOf(k instKey) *legacyShard {
	var h maphash.Hash
	h.SetSeed(ls.seed)
	h.WriteString(k.id)
	h.Write(k.host[:])
	x := h.Sum64() ^ uint64(k.principal)*0x9e3779b97f4a7c15
	return &ls.shards[x%legacyShards]
}

// connect returns the state of connection id of client cl.
func (ls *legacyStore) connect(id ConnID, cl Client, now int64) *Conn {
	k := instKey{principal: cl.Principal, id: cl.ID}
	if ls.scope == ScopeInstance {
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
	conn := &Conn{id: id, principal: cl.Principal, inst: in, named: cl.Software != "", restamps: restampingSoftware[cl.Software], open: true}
	in.open = append(in.open, conn)
	return conn
}

// instance returns k's instance, made if need be; call with the shard
// locked.
func (sh *legacyShard) instance(k instKey, now int64) *instance {
	in := sh.insts[k]
	if in == nil {
		if len(sh.insts) >= maxInstancesPerShard {
			sh.evictIdle(now)
		}
		in = &instance{key: k, ls: sh.ls, pu: sh.ls.use(k.principal), undelivered: map[partKey][]*batch{}, lastSeen: now}
		sh.insts[k] = in
	}
	return in
}

// closed records that conn, one of the instance's connections, closed.
func (in *instance) closed(conn *Conn, now int64) {
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
func (in *instance) rebuildLive() {
	in.live.reset(in.liveRecs)
	for _, l := range in.undelivered {
		for _, b := range l {
			for i, r := range b.recs {
				if r.hash != 0 {
					in.live.add(idxKey(r.hash, uint32(b.topic), b.part), recRef{b: b, gen: b.gen, i: int32(i)})
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
func (sh *legacyShard) all() []*instance {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	out := make([]*instance, 0, len(sh.insts))
	for _, in := range sh.insts {
		out = append(out, in)
	}
	return out
}

// evictIdle forgets the instance without connections seen longest ago;
// call with the shard locked (each instance's lock is taken after it).
func (sh *legacyShard) evictIdle(now int64) {
	var victim *instance
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

// newBatch takes a batch from the instance's free list.
func (in *instance) newBatch() *batch {
	if n := len(in.free); n > 0 {
		b := in.free[n-1]
		in.free = in.free[:n-1]
		return b
	}
	return &batch{}
}

// forget frees b once nothing refers to it; call with the instance
// locked.
func (in *instance) forget(b *batch) {
	if b.inFifo || b.inDisowned {
		return
	}
	in.account(-int64(len(b.recs)))
	if b.inst != nil {
		b.inst.dropUndelivered(b)
	}
	recs := b.recs[:0]
	gen := b.gen + 1
	*b = batch{gen: gen, recs: recs}
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

// disown records that b's client may not hold its acknowledgement: its
// records are matchable by a retry from any connection of the instance
// until b's window ends.
func (in *instance) disown(b *batch) {
	b.conn = nil
	if b.phase == appended && b.until == 0 {
		b.until = 1 // settled before it was registered: nothing to keep
	}
	if !b.inDisowned {
		b.inDisowned = true
		in.disowned = append(in.disowned, b)
		in.disownedRecs += len(b.recs)
		in.indexDisowned(b)
		if b.phase == appended {
			in.sweepAt = min(in.sweepAt, b.until)
		}
	}
}

// indexDisowned adds b's records to the index, or marks it to be rebuilt
// when it is full, or mostly entries of batches let go since.
func (in *instance) indexDisowned(b *batch) {
	if in.dirty {
		return
	}
	if n := len(in.index.refs) + len(b.recs); n > 2*in.disownedRecs+1024 {
		in.dirty = true
		return
	}
	for i, r := range b.recs {
		if r.hash != 0 {
			in.index.add(idxKey(r.hash, uint32(b.topic), -1), recRef{b: b, gen: b.gen, i: int32(i)})
		}
	}
}

// undisown takes b back from the disowned batches: its client holds its
// acknowledgement after all.
func (in *instance) undisown(b *batch) {
	if !b.inDisowned {
		return
	}
	b.inDisowned = false
	in.disownedRecs -= len(b.recs)
	for i, x := range in.disowned {
		if x == b {
			copy(in.disowned[i:], in.disowned[i+1:])
			in.disowned[len(in.disowned)-1] = nil
			in.disowned = in.disowned[:len(in.disowned)-1]
			break
		}
	}
}

// abandon disowns every batch of conn whose answer is not yet written: its
// client resent one of them on another connection. Batches conn sends
// later are its own again.
func (conn *Conn) abandon(in *instance) {
	for _, b := range conn.fifo {
		if !b.delivered && b.conn == conn {
			in.disown(b)
		}
	}
}

// dropUndelivered removes b from the undelivered lists.
func (in *instance) dropUndelivered(b *batch) {
	k := partKey{b.topic, b.part}
	l := in.undelivered[k]
	for i, x := range l {
		if x == b {
			l = append(l[:i], l[i+1:]...)
			in.liveRecs -= len(b.recs)
			in.liveDirty = true
			break
		}
	}
	in.undelivered[k] = l // kept when empty: the partition's next batch reuses it
}

// sweep forgets the disowned batches whose window has ended, once one
// may have (lookups skip them meanwhile: sweeping only frees memory). A
// batch settled after it was disowned is swept at most a window late.
func (in *instance) sweep(now int64, window int64) {
	if now < in.sweepAt {
		return
	}
	next := now + window
	kept := in.disowned[:0]
	for _, b := range in.disowned {
		if b.phase == appended && b.until <= now {
			b.inDisowned = false
			in.disownedRecs -= len(b.recs)
			in.forget(b)
			continue
		}
		if b.phase == appended {
			next = min(next, b.until)
		}
		kept = append(kept, b)
	}
	clear(in.disowned[len(kept):])
	in.disowned = kept
	in.sweepAt = next
}

// reindex rebuilds the index of disowned records.
func (in *instance) reindex() {
	in.index.reset(in.disownedRecs)
	for _, b := range in.disowned {
		for i, r := range b.recs {
			if r.hash != 0 {
				in.index.add(idxKey(r.hash, uint32(b.topic), -1), recRef{b: b, gen: b.gen, i: int32(i)})
			}
		}
	}
	in.dirty, in.index.rebuild = false, false
}

// candidate is a record a record of a new batch may repeat.
type candidate struct {
	b *batch
	i int32
}

// lookup returns the first disowned record of topic with hash h that is
// not used up, or false.
func (in *instance) lookup(topic seqstate.TopicID, h uint64, now int64, undo *[]undo) (candidate, bool) {
	if len(in.disowned) == 0 {
		return candidate{}, false
	}
	if in.dirty || in.index.rebuild || len(in.index.slots) == 0 {
		in.reindex()
	}
	r, ok := in.index.find(idxKey(h, uint32(topic), -1), func(r *recRef) verdict {
		b := r.b
		if b.gen != r.gen || !b.inDisowned || b.recs[r.i].hash != h || b.phase == appended && b.until <= now {
			return skipForGood
		}
		return take
	}, undo)
	if !ok {
		return candidate{}, false
	}
	return candidate{r.b, r.i}, true
}

// sameParts returns a record with hash h in a batch to (topic, part) not
// yet answered to another connection than conn: the client gave up on it
// and this is its retry.
func (in *instance) sameParts(conn *Conn, topic seqstate.TopicID, part int32, h uint64, now int64, undo *[]undo) (candidate, bool) {
	if in.conns < 2 || conn.reqs >= youngRequests {
		return candidate{}, false
	}
	if in.liveRecs == 0 {
		return candidate{}, false
	}
	if in.liveDirty || in.live.rebuild || len(in.live.slots) == 0 {
		in.rebuildLive()
	}
	r, ok := in.live.find(idxKey(h, uint32(topic), part), func(r *recRef) verdict {
		b := r.b
		switch {
		case b.gen != r.gen || b.delivered || b.conn == nil || (b.phase == appended && b.until <= now) || b.recs[r.i].hash != h:
			return skipForGood
		case b.conn == conn:
			return skipNow
		}
		return take
	}, undo)
	if !ok {
		return candidate{}, false
	}
	return candidate{r.b, r.i}, true
}

// anyOtherUndelivered reports whether a batch to (topic, part) from another
// connection than conn is not yet answered.
func (in *instance) anyOtherUndelivered(conn *Conn, topic seqstate.TopicID, part int32) bool {
	if in.conns < 2 || conn.reqs >= youngRequests {
		return false // no other connection, or not a young one (see youngRequests)
	}
	for _, b := range in.undelivered[partKey{topic, part}] {
		if b.conn != conn && b.conn != nil {
			return true
		}
	}
	return false
}
