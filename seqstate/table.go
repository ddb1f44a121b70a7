package seqstate

import (
	"math/bits"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// Table is the concurrent, bounded state table. It is safe for concurrent use.
//
// Entries are sharded by producer id, so all of a producer's partitions and
// its InitProducerId epoch floor sit behind one shard lock. Each shard is an
// intrusive LRU over slabs of pointer-free entry memory (see shard). The
// entry cap, Config.MaxEntries, is table-wide (see shard.insert).
type Table struct {
	shards     []paddedShard
	shardShift uint // 64 - log2(len(shards))
	retained   int
	expiration int64 // nanoseconds
	topics     interner
	// count is the number of entries in all shards. Inserts and removals
	// update it under their shard's lock, so it is exact at every moment;
	// the padding keeps its cache line away from the read-mostly fields
	// above, which every call reads.
	_     [64]byte
	count atomic.Int64
	_     [56]byte
}

// New returns an empty table. Zero fields of cfg take their defaults.
func New(cfg Config) (*Table, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	t := &Table{
		shards:     make([]paddedShard, cfg.Shards),
		shardShift: uint(64 - bits.TrailingZeros(uint(cfg.Shards))),
		retained:   cfg.RetainedBatches,
		expiration: int64(cfg.ProducerIDExpiration),
	}
	fencesPerShard := (cfg.MaxFencedProducers + cfg.Shards - 1) / cfg.Shards
	seed0, seed1 := rand.Uint64(), rand.Uint64()
	for i := range t.shards {
		s := &t.shards[i].shard
		s.init(cfg.MaxEntries, cfg.Shards, fencesPerShard, cfg.RetainedBatches, t.expiration, seed0, seed1, &t.count)
	}
	t.topics.init(cfg.MaxTopics)
	return t, nil
}

// shardIndex spreads producer ids over the shards with a Fibonacci hash:
// producer ids come in blocks of 1000 consecutive values
// (ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE), so the low bits alone would do,
// but the multiply also spreads ids that share low bits.
func (t *Table) shardIndex(pid int64) int {
	if t.shardShift == 64 {
		return 0
	}
	return int((uint64(pid) * 0x9e3779b97f4a7c15) >> t.shardShift)
}

func (t *Table) shard(pid int64) *shard { return &t.shards[t.shardIndex(pid)].shard }

// Check decides batch b for key k (see Decision) and, when it accepts it,
// registers it as pending: the next batch may follow it, and an identical
// batch gets InFlight until the caller calls Commit or Abort for it.
//
// A producer id below 0 is not idempotent: Kafka runs none of these checks
// (AbstractRecordBatch.hasProducerId), so Check accepts it and keeps no state.
// A batch with FirstSeq < 0 or Count < 1 is Invalid. An unknown, evicted or
// expired key accepts any sequence (Kafka ≥ 2.5). A key found expired at
// lookup is removed first.
//
// It does not allocate for a known key; a new key allocates only when its
// shard grows (a slab page or the index, amortized).
func (t *Table) Check(k Key, b Batch, now time.Time) Result {
	return t.check(k, b, now.UnixNano(), true /* register */)
}

// Decide is Check without registering an accepted batch: the table is only
// consulted (expired entries are still removed). The proxy's observe-only mode
// can use Decide and then Commit what the broker appended.
func (t *Table) Decide(k Key, b Batch, now time.Time) Result {
	return t.check(k, b, now.UnixNano(), false /* register */)
}

func (t *Table) check(k Key, b Batch, now int64, register bool) Result {
	if k.ProducerID < 0 {
		return result(Accept)
	}
	if !b.valid() {
		return result(Invalid)
	}
	s := t.shard(k.ProducerID)
	s.mu.Lock()
	r := s.check(k, b, now, register)
	s.mu.Unlock()
	return r
}

// check is Table.check under the shard lock, for a valid batch of a
// producer id of this shard.
func (s *shard) check(k Key, b Batch, now int64, register bool) Result {
	if s.anyFences && s.fenced(k.ProducerID, b.Epoch, now) {
		return result(Fenced)
	}
	last := b.LastSeq()
	e, ok := s.mruEntry, s.mruHit(k, now)
	if !ok {
		e, ok = s.lookupMiss(k, now)
	}
	if !ok {
		r := absent().decideLast(b, last)
		if register && r.Decision == Accept {
			s.insert(k).register(b, last, now)
		}
		return r
	}
	if register && e.appendNext(b, last, now) {
		return result(Accept)
	}
	r := e.decideLast(b, last)
	if register && r.Decision == Accept {
		e.register(b, last, now)
	}
	return r
}

// Commit records that the broker appended b (as accepted by Check) at
// baseOffset, with maxTimestamp as BatchMetadata.timestamp: the batch's
// maxTimestamp after validation, which is the broker's log_append_time_ms on
// LogAppendTime topics and the batch header's maxTimestamp on CreateTime
// topics. A later retry of b is then a Duplicate answered with these.
//
// The caller decides what counts as appended. Kafka updates producer state as
// soon as the leader has appended (docs/kafka-rules.md §2), so
// REQUEST_TIMED_OUT (7) and NOT_ENOUGH_REPLICAS_AFTER_APPEND (20) count as
// appended, even though their responses carry base_offset -1: commit with
// -1, and a Duplicate then carries -1 too (see Result.BaseOffset).
//
// Commit of a batch the table does not hold as pending is applied as the
// broker applied it; see the package documentation ("Commit and Abort").
func (t *Table) Commit(k Key, b Batch, baseOffset, maxTimestamp int64, now time.Time) {
	if k.ProducerID < 0 || !b.valid() {
		return
	}
	ns := now.UnixNano()
	s := t.shard(k.ProducerID)
	s.mu.Lock()
	s.commit(k, b, baseOffset, maxTimestamp, ns, nil)
	s.mu.Unlock()
}

// commit is Commit under the shard lock, for a valid batch of a producer id
// of this shard. An entry it forgets appends its pending batches to
// dropped (see entry.pendingInto).
func (s *shard) commit(k Key, b Batch, baseOffset, maxTimestamp, now int64, dropped *[]Op) {
	e, ok := s.mruEntry, s.mruHit(k, now)
	if !ok {
		e, ok = s.lookupMiss(k, now)
	}
	if ok {
		if !e.commitNewest(b, baseOffset, maxTimestamp, now) && e.commit(b, baseOffset, maxTimestamp, now) == forget {
			e.pendingInto(k, -1, dropped)
			s.remove(s.mru) // the lookup made it the most recently used
		}
		return
	}
	e = s.insert(k)
	e.setEpoch(b.Epoch)
	e.pushCommitted(b, b.LastSeq(), baseOffset, maxTimestamp)
	e.h.lastSeen = now
}

// CommitLogged is Commit for a batch read back from the partition's log,
// which replays a producer's batches from the oldest the read reaches: a
// batch of the entry's epoch that ends before the oldest batch its window
// retains is one the window has moved past, and changes nothing (Commit
// would take it for a disagreement with the broker and forget the entry,
// with the batches it holds in flight); a batch the window holds committed
// without an offset (REQUEST_TIMED_OUT) takes the log's.
func (t *Table) CommitLogged(k Key, b Batch, baseOffset, maxTimestamp int64, now time.Time) {
	if k.ProducerID < 0 || !b.valid() {
		return
	}
	s := t.shard(k.ProducerID)
	s.mu.Lock()
	defer s.mu.Unlock()
	if idx, ok := s.peek(k); ok && baseOffset >= 0 {
		e := s.entry(idx)
		if b.Epoch == e.h.epoch && e.h.n > 0 && e.passed(b) {
			return
		}
		if i := e.find(b.FirstSeq, b.LastSeq()); b.Epoch == e.h.epoch && i >= 0 {
			// Committed without an offset (REQUEST_TIMED_OUT): the log
			// has it.
			if j := e.pos(i); !e.s[j].pending() {
				if off, _ := e.offsets(j); off < 0 {
					e.setOffsets(j, baseOffset, maxTimestamp)
				}
				return
			}
		}
	}
	s.commit(k, b, baseOffset, maxTimestamp, now.UnixNano(), nil)
}

// Abort records that the broker did not append b, a batch Check accepted:
// b and every batch registered after it are dropped, so the next expected
// sequence is the one after the batch before b. See the package documentation
// ("Commit and Abort").
func (t *Table) Abort(k Key, b Batch) {
	if k.ProducerID < 0 || !b.valid() {
		return
	}
	s := t.shard(k.ProducerID)
	s.mu.Lock()
	s.abort(k, b, nil)
	s.mu.Unlock()
}

// abort is Abort under the shard lock, for a valid batch of a producer
// id of this shard; see entry.abort for dropped.
func (s *shard) abort(k Key, b Batch, dropped *[]Op) {
	if idx, ok := s.peek(k); ok {
		if s.entry(idx).abort(k, b, dropped) == forget {
			s.remove(idx)
		}
	}
}

// ObserveInitProducerID records a successful InitProducerId response for a
// transactional producer: from now on a batch from pid with an epoch below
// epoch is Fenced on every partition, including partitions the table has no
// entry for.
//
// This is stricter than a partition leader, which only compares with the
// epoch stored for that partition (docs/kafka-rules.md §12). It is stricter
// only where Kafka's outcome is certain: the coordinator answers
// InitProducerId successfully only after aborting the old epoch's open
// transaction with markers at the new epoch
// (TransactionCoordinator.handleInitProducerId,
// prepareFenceProducerEpoch), and with transaction.partition.verification.enable
// (default true since 3.6, KIP-890) the first write of a stale epoch to any
// other partition fails verification with INVALID_PRODUCER_EPOCH. So call it
// only for responses with error 0 to requests with a transactional id, and
// not at all for brokers older than 3.6 or with verification turned off.
// Idempotent producers get a fresh producer id at epoch 0 and need nothing.
//
// The floor only rises. It expires after Config.ProducerIDExpiration without
// a newer InitProducerId, and at most Config.MaxFencedProducers floors are
// kept (least recently observed first out); forgetting one only makes the
// table less strict.
func (t *Table) ObserveInitProducerID(pid int64, epoch int16, now time.Time) {
	if pid < 0 {
		return
	}
	ns := now.UnixNano()
	s := t.shard(pid)
	s.mu.Lock()
	if f, ok := s.fences.Peek(pid); ok && epoch < f.epoch && !s.expired(f.seen, ns) {
		epoch = f.epoch
	}
	s.fences.Add(pid, fence{epoch: epoch, seen: ns})
	s.anyFences = true
	s.mu.Unlock()
}

// Expire removes entries and epoch floors whose last state change is at least
// Config.ProducerIDExpiration before now, as Kafka's periodic
// ProducerStateManager.removeExpiredProducers does (isProducerExpired:
// now - lastTimestamp >= producer.id.expiration.ms). Call it periodically;
// lookups also expire lazily. It returns the number of entries removed.
//
// Each shard is swept from its least recently used end and the sweep stops at
// the first live entry, so the cost is proportional to what is removed. An
// entry whose last lookup (a duplicate, say) came after its last state change
// sits ahead of its expiry order and is removed by a later sweep or lookup.
// The shard lock is released every expireBatch removals.
func (t *Table) Expire(now time.Time) int {
	ns := now.UnixNano()
	n := 0
	for i := range t.shards {
		n += t.shards[i].expire(ns)
	}
	return n
}

// Len returns the number of entries, including any that have expired but were
// not yet removed. It is at most Config.MaxEntries + Config.Shards - 1 (see
// Config.MaxEntries).
func (t *Table) Len() int { return int(t.count.Load()) }

// Evictions returns how many entries were evicted because the table was full.
func (t *Table) Evictions() uint64 {
	var n uint64
	for i := range t.shards {
		n += t.shards[i].evictions.Load()
	}
	return n
}

// Expirations returns how many entries were removed for expiry, by Expire or
// at lookup.
func (t *Table) Expirations() uint64 {
	var n uint64
	for i := range t.shards {
		n += t.shards[i].expirations.Load()
	}
	return n
}

// InternTopics interns the topics of one Metadata response: call it with the
// topics the broker answered with error 0. Only interned topics can be
// looked up, so only they are deduplicated; a Produce to any other topic is
// forwarded without a decision, which is always safe (an unknown producer is
// what the broker sees after a restart too).
//
// A topic's identity is its name and, where the cluster has them, its topic
// ID: each name gets one TopicID, and a non-zero ID maps to it, so Produce
// v13+, which names topics by ID, and earlier versions, which name them by
// string, share one Key per partition. A name seen again with a new ID after
// it had another (the topic was deleted and recreated) gets a new TopicID,
// which the name and the new ID map to from then on: nothing known of the
// old topic applies to the new one. The old ID keeps its mapping (nothing
// is ever removed, so lookups need no lock). A ref with an empty name is
// ignored. A ref's partition count, when given, is kept for
// TopicPartitions.
//
// At most Config.MaxTopics names and Config.MaxTopics IDs are interned.
// Beyond that nothing new is interned and TopicsRefused counts the refs
// refused. It returns how many refs added a name or an ID.
//
// It copies the names it keeps, so they may alias a reused buffer. Each new
// name costs amortized O(1); known names cost a lookup.
func (t *Table) InternTopics(topics []TopicRef) (added int) { return t.topics.intern(topics) }

// LookupTopic returns the TopicID of a name interned by InternTopics, for a
// Produce request's topic name still in the request buffer. It takes no lock
// and does not allocate; a name never interned is not found.
func (t *Table) LookupTopic(name []byte) (TopicID, bool) { return t.topics.lookupName(name) }

// LookupTopicID is LookupTopic for a Produce v13+ topic ID. The all-zero ID
// is never found.
func (t *Table) LookupTopicID(id [16]byte) (TopicID, bool) { return t.topics.lookupID(id) }

// TopicName returns the name interned as id.
func (t *Table) TopicName(id TopicID) (string, bool) { return t.topics.name(id) }

// TopicPartitions returns the partition count of topic id in the latest
// Metadata response that gave one, 0 when none did.
func (t *Table) TopicPartitions(id TopicID) int32 { return t.topics.partitions(id) }

// Topics returns the number of topics interned (a recreated topic counts
// again).
func (t *Table) Topics() int { return t.topics.count() }

// TopicsRefused returns how many refs InternTopics refused because
// Config.MaxTopics names or IDs were already interned. A topic refused in
// several Metadata responses counts once per response.
func (t *Table) TopicsRefused() uint64 { return t.topics.refused.Load() }

// expireBatch bounds how many entries Expire removes per lock hold, so a large
// sweep does not stall the hot path on that shard.
const expireBatch = 1024

// paddedShard keeps shards on separate cache lines, so that locking one does
// not slow down its neighbours (false sharing).
type paddedShard struct {
	shard
	_ [64]byte
}

// nilIndex is the null slab index in the LRU links.
const nilIndex = -1

// shard is one lock's worth of the table: an intrusive LRU over slabs.
//
// Entries live in pages of headers and pages of slots, indexed by an int32
// slab index. A header holds its key and its LRU links (slab indexes of its
// more and less recently used neighbours), so the slabs
// hold no pointers and the garbage collector never scans them. The key index
// is an open-addressing hash table of uint32 words with linear probing: a
// word is 0 (empty) or the slab index plus one in its low idxBits bits, with
// the high bits of the key's hash above them as a tag, so a probe touches a
// header only when the tag matches. Removal shifts the following words back
// (no tombstones), rehashing the keys it moves: the hash is a multiply, cheaper
// than the 4 bytes per entry that keeping it would cost.
type shard struct {
	mu          sync.Mutex
	index       []uint32 // len is a power of two, at most 3/4 full
	idxMask     uint32   // low bits of an index word: slab index + 1
	seed0       uint64
	seed1       uint64
	mru, lru    int32         // most and least recently used entries, or nilIndex
	mruEntry    entry         // the view of mru, kept so that lookup's common case skips the slab arithmetic
	live        int           // entries in the LRU
	total       *atomic.Int64 // Table.count: entries in all shards
	maxEntries  int64         // Config.MaxEntries, the table-wide cap
	fences      *simplelru.LRU[int64, fence]
	anyFences   bool    // fences.Len() > 0, without the pointer chase
	wide        wideMap // exact values of slots whose deltas do not fit (see slot)
	capacity    int     // most entries the shard can hold: maxEntries + shards - 1
	retained    int
	expiration  int64
	pageShift   uint
	pageMask    uint32   // 1<<pageShift - 1
	pages       []page   // page p holds entries p<<pageShift ...; the first may be shorter (see addRoom)
	room        uint32   // entries the pages hold
	used        uint32   // entries ever handed out (the slab's high-water mark)
	free        []uint32 // indexes handed back by removals
	evictions   atomic.Uint64
	expirations atomic.Uint64
}

// page is one slab page: 1<<pageShift headers (fewer in a first page still
// growing, see addRoom) and retained slots for each, plus
// MaxRetainedBatches-retained spare slots (see entry).
type page struct {
	h []header
	s []slot
}

// fence is the epoch floor from a transactional InitProducerId response.
type fence struct {
	seen  int64
	epoch int16
}

func (s *shard) init(maxEntries, shards, fences, retained int, expiration int64, seed0, seed1 uint64, total *atomic.Int64) {
	s.fences, _ = simplelru.NewLRU[int64, fence](fences, nil)
	// One shard may hold the whole table, and then some (see insert).
	capacity := maxEntries + shards - 1
	s.total, s.maxEntries = total, int64(maxEntries)
	s.capacity = capacity
	s.retained = retained
	s.expiration = expiration
	s.seed0, s.seed1 = seed0, seed1
	s.mru, s.lru = nilIndex, nilIndex
	s.idxMask = uint32(1)<<bits.Len32(uint32(capacity)) - 1 // holds capacity itself
	s.index = make([]uint32, 8)
	// Pages of up to 4096 entries: large enough that the page tables stay
	// short and that the slot page's spare slots (see entry), which push it
	// into one more 8 KiB runtime page, cost at most 2 bytes per entry for
	// any RetainedBatches. Smaller full pages would fall in Go's small size
	// classes, where the spare slots round some slot pages up by as much as
	// a quarter (256 entries: +1.2 B/entry measured with 5 retained
	// batches, ~+30 computed with 8). A full first page, ~557 KB with 5
	// retained batches, would be most of a small table's heap, so the first
	// page starts small and grows instead (see addRoom).
	s.pageShift = uint(min(12, bits.Len(uint(capacity-1))))
	s.pageMask = 1<<s.pageShift - 1
}

// hash is a seeded multiply-mix of the key (wyhash's mum), folded to 32
// bits. The seed is random per table, so clients choosing producer ids cannot
// aim for collisions; placement never affects a decision.
func (s *shard) hash(k Key) uint32 {
	hi, lo := bits.Mul64(uint64(k.ProducerID)^s.seed0^uint64(k.Principal)<<32, (uint64(k.Topic)<<32|uint64(uint32(k.Partition)))^s.seed1)
	h := hi ^ lo
	return uint32(h) ^ uint32(h>>32)
}

func (s *shard) hdr(idx int32) *header {
	// The shift count masked below 32 spares the compiler's check for
	// larger ones on this, the hottest address computation.
	return &s.pages[uint32(idx)>>(s.pageShift&31)].h[uint32(idx)&s.pageMask]
}

func (s *shard) entry(idx int32) entry {
	p, o := &s.pages[uint32(idx)>>(s.pageShift&31)], int(uint32(idx)&s.pageMask)
	return entry{h: &p.h[o], s: (*[MaxRetainedBatches]slot)(p.s[o*s.retained:]), sh: s}
}

func (s *shard) expired(seen, now int64) bool { return now-seen >= s.expiration }

// peek finds k without marking it used or expiring it. The most recently
// used entry is tried first: a Commit usually follows its Check with no other
// key of the shard in between, and a producer's batches to one partition
// come in runs.
func (s *shard) peek(k Key) (int32, bool) {
	if m := s.mru; m != nilIndex && s.hdr(m).key == k {
		return m, true
	}
	idx, _, ok := s.probe(k)
	return idx, ok
}

// probe finds k in the index, with the view of its entry.
func (s *shard) probe(k Key) (int32, entry, bool) {
	h := s.hash(k)
	mask := uint32(len(s.index) - 1)
	tag := h &^ s.idxMask
	for i := h & mask; ; i = (i + 1) & mask {
		w := s.index[i]
		if w == 0 {
			return 0, entry{}, false
		}
		if w&^s.idxMask == tag {
			idx := int32(w&s.idxMask) - 1
			if e := s.entry(idx); e.h.key == k {
				return idx, e, true
			}
		}
	}
}

// Finding an entry, marking it most recently used and expiring it lazily (an
// expired entry is removed and reported missing) takes two steps on the hot
// paths: mruHit, which inlines, tries the most recently used entry, as a
// producer's batches to one partition come in runs and a Commit usually
// follows its Check with no other key of the shard in between; lookupMiss
// does the rest. The most recently used entry's view is kept in
// shard.mruEntry, so the first step skips the slab arithmetic.

// mruHit reports whether k is the most recently used entry and live.
func (s *shard) mruHit(k Key, now int64) bool {
	h := s.mruEntry.h
	return h != nil && h.key == k && now-h.lastSeen < s.expiration
}

// lookupMiss finds k when mruHit did not.
// mruHit has already compared k with the most recently used entry's key,
// so the index is probed at once. A live entry found is then the most
// recently used, and the view the probe made is kept as its view.
func (s *shard) lookupMiss(k Key, now int64) (entry, bool) {
	idx, e, ok := s.probe(k)
	if !ok {
		return entry{}, false
	}
	s.touch(idx, e)
	if now-e.h.lastSeen >= s.expiration {
		s.remove(idx)
		s.expirations.Add(1)
		return entry{}, false
	}
	return e, true
}

// touch moves entry idx, whose view is e, to the most recently used end.
func (s *shard) touch(idx int32, e entry) {
	if s.mru == idx {
		return
	}
	s.unlink(e.h)
	s.pushFront(idx, e)
}

func (s *shard) unlink(h *header) {
	if h.prev != nilIndex {
		s.hdr(h.prev).next = h.next
	} else {
		s.setMRU(h.next)
	}
	if h.next != nilIndex {
		s.hdr(h.next).prev = h.prev
	} else {
		s.lru = h.prev
	}
}

// pushFront makes entry idx, whose view is e, the most recently used.
func (s *shard) pushFront(idx int32, e entry) {
	e.h.prev, e.h.next = nilIndex, s.mru
	if s.mru != nilIndex {
		s.mruEntry.h.prev = idx // mruEntry is the view of mru
	} else {
		s.lru = idx
	}
	s.mru, s.mruEntry = idx, e
}

func (s *shard) setMRU(idx int32) {
	s.mru = idx
	if idx == nilIndex {
		s.mruEntry = entry{}
	} else {
		s.mruEntry = s.entry(idx)
	}
}

// insert adds an empty entry for k, which must be absent. The caller fills it
// in.
//
// Config.MaxEntries caps the whole table, not the shard: a shard grows until
// the table holds MaxEntries entries, so one producer, whose partitions all
// share a shard, can use all of it. At the cap, an insert evicts its own
// shard's least recently used entry, since only its own lock is held; a
// shard with no entry inserts anyway.
//
// The overshoot that allows is bounded: Table.count never exceeds
// MaxEntries + Shards - 1, even with concurrent inserts. Take any moment T
// and the last moment T0 before it when count was below MaxEntries (count
// changes by one at a time, so it is at least MaxEntries throughout (T0, T]).
// An insert that read count after T0 read at least MaxEntries, so it evicted
// first, unless its shard was empty. An insert that read count at or before
// T0 held its shard's lock at T0, so there is at most one per shard. So at T
// no shard holds more than one entry above what it held at T0, and count is
// at most (MaxEntries-1) + Shards. Sequentially the bound is reached when one
// shard holds MaxEntries entries and each other shard then inserts one.
func (s *shard) insert(k Key) entry {
	if s.live > 0 && s.total.Load() >= s.maxEntries {
		s.remove(s.lru)
		s.evictions.Add(1)
	}
	var idx int32
	if n := len(s.free); n > 0 {
		idx = int32(s.free[n-1])
		s.free = s.free[:n-1]
	} else {
		idx = int32(s.used)
		s.used++
		if uint32(idx) == s.room {
			s.addRoom()
		}
	}
	if (s.live+1)*4 > len(s.index)*3 {
		s.grow()
	}
	hv := s.hash(k)
	mask := uint32(len(s.index) - 1)
	i := hv & mask
	for s.index[i] != 0 {
		i = (i + 1) & mask
	}
	s.index[i] = hv&^s.idxMask | uint32(idx+1)
	s.live++
	s.total.Add(1)
	e := s.entry(idx)
	*e.h = header{key: k}
	s.pushFront(idx, e)
	return e
}

// firstPageEntries is the size of a shard's first slab page when it is
// allocated: ~1.3 KB with 5 retained batches.
const firstPageEntries = 8

// addRoom makes room for one more entry, slab index s.room. The first page
// doubles until it is full size, so a shard's slab costs about what its
// entries need (at most twice, plus Go's size-class rounding) until it holds
// a page's worth; then full pages are added. Only insert calls it, before
// taking the view of the new entry.
func (s *shard) addRoom() {
	switch full := 1 << s.pageShift; {
	case len(s.pages) == 0:
		s.pages = append(s.pages, s.newPage(min(firstPageEntries, full)))
		s.room = uint32(len(s.pages[0].h))
	case int(s.room) < full: // the first page, still growing
		s.resizeFirst(2 * int(s.room))
	default:
		s.pages = append(s.pages, s.newPage(full))
		s.room += uint32(full)
	}
}

func (s *shard) newPage(n int) page {
	// MaxRetainedBatches-retained spare slots let the last entry's ring be
	// an array pointer (see entry).
	return page{h: make([]header, n), s: make([]slot, n*s.retained+MaxRetainedBatches-s.retained)}
}

// resizeFirst moves the shard's only page to a new one of n entries (more, or
// fewer than it holds but no fewer than s.used), copying the entries. Entry
// views are addresses in the page, so it re-keys the wide values (by slot
// address, see wideMap) and retakes the view of mru; the callers, insert and
// compact, hold no other view across it.
func (s *shard) resizeFirst(n int) {
	old, p := s.pages[0], s.newPage(n)
	copy(p.h, old.h)
	copy(p.s, old.s)
	if len(s.wide) > 0 {
		for j := range min(len(old.s), len(p.s)) {
			if old.s[j].offDelta != wideDelta {
				continue
			}
			// A slot past s.used may still be marked: move leaves its
			// source as it was.
			if v, ok := s.wide[&old.s[j]]; ok {
				s.wide[&p.s[j]] = v
				delete(s.wide, &old.s[j])
			}
		}
	}
	s.pages[0] = p
	s.room = uint32(n)
	s.setMRU(s.mru)
}

// grow doubles the index and reinserts every word at its home position.
func (s *shard) grow() {
	old := s.index
	s.index = make([]uint32, 2*len(old))
	mask := uint32(len(s.index) - 1)
	for _, w := range old {
		if w == 0 {
			continue
		}
		i := s.hash(s.hdr(int32(w&s.idxMask)-1).key) & mask
		for s.index[i] != 0 {
			i = (i + 1) & mask
		}
		s.index[i] = w
	}
}

// remove drops entry idx from the index and the LRU and frees its slab slot.
func (s *shard) remove(idx int32) {
	h := s.hdr(idx)
	hv := s.hash(h.key)
	mask := uint32(len(s.index) - 1)
	want := hv&^s.idxMask | uint32(idx+1)
	i := hv & mask
	for s.index[i] != want {
		i = (i + 1) & mask
	}
	// Backward-shift deletion: move each following word of the run whose
	// home is not in (i, j] into the hole.
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		w := s.index[j]
		if w == 0 {
			break
		}
		home := s.hash(s.hdr(int32(w&s.idxMask)-1).key) & mask
		if (j-home)&mask >= (j-i)&mask {
			s.index[i] = w
			i = j
		}
	}
	s.index[i] = 0
	if len(s.wide) > 0 {
		e := s.entry(idx)
		for j := range e.len() {
			e.clearWide(j)
		}
	}
	s.unlink(h)
	s.free = append(s.free, uint32(idx))
	s.live--
	s.total.Add(-1)
	if s.used >= compactMinUsed && uint32(s.live)*2 < s.used {
		s.compact()
	}
}

// compactMinUsed is the slab size below which a shard is never compacted:
// too small to be worth it.
const compactMinUsed = 64

// compact moves the shard's entries to the lowest slab indexes, drops the
// slab pages no entry then uses (and shrinks the first page if it is the
// only one left, to the size addRoom would have grown it to), and rebuilds
// the index at the size the entries need; the LRU order, the entries and
// their wide values are unchanged. remove calls it when fewer than half the
// entries the slab has handed out are live, so a shard's slab and index stay
// within about twice its live entries (plus a partly used page): a shard
// that once held many entries (any shard may grow to MaxEntries) gives the
// memory back when they go. Its cost, O(entries), is amortized over the
// removals that halved the shard.
func (s *shard) compact() {
	target := uint32(s.live)
	// Slab indexes below target are live or free, so there are as many
	// free ones there as live entries at or above target.
	holes := s.free[:0]
	for _, f := range s.free {
		if f < target {
			holes = append(holes, f)
		}
	}
	for idx := s.lru; idx != nilIndex; {
		prev := s.hdr(idx).prev
		if uint32(idx) >= target {
			s.move(idx, int32(holes[len(holes)-1]))
			holes = holes[:len(holes)-1]
		}
		idx = prev
	}
	size := 8
	for s.live*4 > size*3 {
		size *= 2
	}
	s.index = make([]uint32, size)
	mask := uint32(size - 1)
	for idx := s.lru; idx != nilIndex; idx = s.hdr(idx).prev {
		hv := s.hash(s.hdr(idx).key)
		i := hv & mask
		for s.index[i] != 0 {
			i = (i + 1) & mask
		}
		s.index[i] = hv&^s.idxMask | uint32(idx+1)
	}
	s.used = target
	s.free = nil
	keep := int((target + 1<<s.pageShift - 1) >> s.pageShift)
	clear(s.pages[keep:])
	s.pages = s.pages[:keep]
	s.room = uint32(keep) << s.pageShift
	s.setMRU(s.mru) // the view of the new slab index
	if keep == 1 {
		n := firstPageEntries
		for n < int(target) {
			n *= 2
		}
		if n < len(s.pages[0].h) {
			s.resizeFirst(n)
		} else {
			s.room = uint32(len(s.pages[0].h))
		}
	}
}

// move moves entry from to the free slab index to, with its LRU links and
// wide values; compact fixes the index and the view of mru.
func (s *shard) move(from, to int32) {
	src, dst := s.entry(from), s.entry(to)
	*dst.h = *src.h
	for j := range s.retained {
		dst.s[j] = src.s[j]
		if src.s[j].offDelta == wideDelta {
			s.wide[&dst.s[j]] = s.wide[&src.s[j]]
			delete(s.wide, &src.s[j])
		}
	}
	h := dst.h
	if h.prev != nilIndex {
		s.hdr(h.prev).next = to
	} else {
		s.mru = to
	}
	if h.next != nilIndex {
		s.hdr(h.next).prev = to
	} else {
		s.lru = to
	}
}

// fenced reports whether epoch is below the producer's InitProducerId floor,
// expiring the floor lazily. A floor lookup does not count as use.
func (s *shard) fenced(pid int64, epoch int16, now int64) bool {
	if !s.anyFences {
		return false
	}
	f, ok := s.fences.Peek(pid)
	if !ok {
		return false
	}
	if s.expired(f.seen, now) {
		s.fences.Remove(pid)
		s.anyFences = s.fences.Len() > 0
		return false
	}
	return epoch < f.epoch
}

func (s *shard) expire(now int64) int {
	n := 0
	for {
		s.mu.Lock()
		done := true
		for i := 0; i < expireBatch; i++ {
			idx := s.lru
			if idx == nilIndex || !s.expired(s.hdr(idx).lastSeen, now) {
				break
			}
			s.remove(idx)
			s.expirations.Add(1)
			n++
			if i == expireBatch-1 {
				done = false
			}
		}
		if done {
			for {
				pid, f, ok := s.fences.GetOldest()
				if !ok || !s.expired(f.seen, now) {
					break
				}
				s.fences.Remove(pid)
			}
			s.anyFences = s.fences.Len() > 0
		}
		s.mu.Unlock()
		if done {
			return n
		}
	}
}
