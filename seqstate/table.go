package seqstate

import (
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// Table is the concurrent, bounded state table. It is safe for concurrent use.
//
// Entries are sharded by producer id, so all of a producer's partitions and
// its InitProducerId epoch floor sit behind one shard lock. Each shard is a
// simplelru from key to an index into the shard's slab of pointer-free entry
// memory.
type Table struct {
	shards     []paddedShard
	shardShift uint // 64 - log2(len(shards))
	retained   int
	expiration int64 // nanoseconds
	topics     interner
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
	perShard := (cfg.MaxEntries + cfg.Shards - 1) / cfg.Shards
	fencesPerShard := (cfg.MaxFencedProducers + cfg.Shards - 1) / cfg.Shards
	for i := range t.shards {
		s := &t.shards[i].shard
		s.init(perShard, fencesPerShard, cfg.RetainedBatches, t.expiration)
	}
	t.topics.init()
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
// batch gets InFlight until the caller calls Commit or Release for it.
//
// A producer id below 0 is not idempotent: Kafka runs none of these checks
// (AbstractRecordBatch.hasProducerId), so Check accepts it and keeps no state.
// A batch with FirstSeq < 0 or Count < 1 is Invalid. An unknown, evicted or
// expired key accepts any sequence (Kafka ≥ 2.5). A key found expired at
// lookup is removed first.
//
// It does not allocate for a known key; the first batch of a new key
// allocates the LRU element (one allocation).
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
	if s.fenced(k.ProducerID, b.Epoch, now) {
		s.mu.Unlock()
		return result(Fenced)
	}
	var r Result
	last := b.LastSeq()
	if idx, ok := s.lookup(k, now); ok {
		e := s.entry(idx)
		r = e.decideLast(b, last)
		if register && r.Decision == Accept {
			e.register(b, last, now)
		}
	} else {
		r = absent().decideLast(b, last)
		if register && r.Decision == Accept {
			s.insert(k).register(b, last, now)
		}
	}
	s.mu.Unlock()
	return r
}

// Commit records that the broker appended b (as accepted by Check) at
// baseOffset, with maxTimestamp as BatchMetadata.timestamp: the batch's
// maxTimestamp after validation, which is the broker's log_append_time_ms on
// LogAppendTime topics and the batch header's maxTimestamp on CreateTime
// topics. A later retry of b is then a Duplicate answered with these.
//
// The caller decides what counts as appended. Kafka updates producer state as
// soon as the leader has appended (§2), so REQUEST_TIMED_OUT (7) and
// NOT_ENOUGH_REPLICAS_AFTER_APPEND (20) count as appended, even though their
// responses carry base_offset -1: commit with -1, and a Duplicate then
// carries -1 too (see Result.BaseOffset).
//
// Commit of a batch the table does not hold as pending is applied as the
// broker applied it; see the package documentation ("Commit and Release").
func (t *Table) Commit(k Key, b Batch, baseOffset, maxTimestamp int64, now time.Time) {
	if k.ProducerID < 0 || !b.valid() {
		return
	}
	ns := now.UnixNano()
	s := t.shard(k.ProducerID)
	s.mu.Lock()
	if idx, ok := s.lookup(k, ns); ok {
		if s.entry(idx).commit(b, baseOffset, maxTimestamp, ns) == forget {
			s.remove(k, idx)
		}
	} else {
		e := s.insert(k)
		e.setEpoch(b.Epoch)
		e.push(committedSlot(b, baseOffset, maxTimestamp))
		e.h.lastSeen = ns
	}
	s.mu.Unlock()
}

// Release records that the broker did not append b, a batch Check accepted:
// b and every batch registered after it are dropped, so the next expected
// sequence is the one after the batch before b. See the package documentation
// ("Commit and Release").
func (t *Table) Release(k Key, b Batch) {
	if k.ProducerID < 0 || !b.valid() {
		return
	}
	s := t.shard(k.ProducerID)
	s.mu.Lock()
	if idx, ok := s.lru.Peek(k); ok {
		if s.entry(idx).release(b) == forget {
			s.remove(k, idx)
		}
	}
	s.mu.Unlock()
}

// ObserveInitProducerID records a successful InitProducerId response for a
// transactional producer: from now on a batch from pid with an epoch below
// epoch is Fenced on every partition, including partitions the table has no
// entry for.
//
// This is stricter than a partition leader, which only compares with the
// epoch stored for that partition (§12). It is stricter only where Kafka's
// outcome is certain: the coordinator answers InitProducerId successfully only
// after aborting the old epoch's open transaction with markers at the new
// epoch (TransactionCoordinator.handleInitProducerId,
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
// not yet removed.
func (t *Table) Len() int {
	var n int64
	for i := range t.shards {
		n += t.shards[i].count.Load()
	}
	return int(n)
}

// Evictions returns how many entries were evicted because their shard was full.
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

// Topic interns a topic name, or a Produce v13+ topic id as a 16-byte string,
// into a TopicID. Interning a known name does not allocate or lock. Names are
// never forgotten, so intern only topics the cluster knows (for example from
// Metadata responses), not arbitrary client input.
func (t *Table) Topic(name string) TopicID { return t.topics.intern(name) }

// TopicBytes is Topic for a name still in a request buffer; a known name does
// not allocate.
func (t *Table) TopicBytes(name []byte) TopicID {
	if id, ok := t.topics.lookupBytes(name); ok {
		return id
	}
	return t.topics.intern(string(name))
}

// TopicName returns the name interned as id.
func (t *Table) TopicName(id TopicID) (string, bool) { return t.topics.name(id) }

// expireBatch bounds how many entries Expire removes per lock hold, so a large
// sweep does not stall the hot path on that shard.
const expireBatch = 1024

// paddedShard keeps shards on separate cache lines, so that locking one does
// not slow down its neighbours (false sharing).
type paddedShard struct {
	shard
	_ [64]byte
}

// shard is one lock's worth of the table. Entries live in slabs: pages of
// headers and pages of slots, indexed by the uint32 the LRU stores, so the
// LRU element stays in its 80-byte size class and the slab pages, holding no
// pointers, are never scanned by the garbage collector.
type shard struct {
	mu          sync.Mutex
	lru         *simplelru.LRU[Key, uint32]
	fences      *simplelru.LRU[int64, fence]
	capacity    int
	retained    int
	expiration  int64
	pageShift   uint
	headers     [][]header // page p holds entries p<<pageShift ...
	slots       [][]slot   // page p holds retained slots per entry
	used        uint32     // entries ever handed out (the slab's high-water mark)
	free        []uint32   // indexes handed back by removals
	count       atomic.Int64
	evictions   atomic.Uint64
	expirations atomic.Uint64
}

// fence is the epoch floor from a transactional InitProducerId response.
type fence struct {
	seen  int64
	epoch int16
}

func (s *shard) init(capacity, fences, retained int, expiration int64) {
	s.lru, _ = simplelru.NewLRU[Key, uint32](capacity, nil)
	s.fences, _ = simplelru.NewLRU[int64, fence](fences, nil)
	s.capacity = capacity
	s.retained = retained
	s.expiration = expiration
	// Pages of up to 256 entries: small enough that a shard wastes at most
	// one partly used page, large enough that the page tables stay short.
	s.pageShift = uint(min(8, bits.Len(uint(capacity-1))))
}

func (s *shard) entry(idx uint32) entry {
	p, o := idx>>s.pageShift, int(idx&(1<<s.pageShift-1))
	r := s.retained
	return entry{h: &s.headers[p][o], s: s.slots[p][o*r : o*r+r : o*r+r]}
}

func (s *shard) expired(seen, now int64) bool { return now-seen >= s.expiration }

// lookup finds k, marking it most recently used. An expired entry is removed
// and reported missing (lazy expiry).
func (s *shard) lookup(k Key, now int64) (uint32, bool) {
	idx, ok := s.lru.Get(k)
	if !ok {
		return 0, false
	}
	if now-s.headers[idx>>s.pageShift][idx&(1<<s.pageShift-1)].lastSeen >= s.expiration {
		s.remove(k, idx)
		s.expirations.Add(1)
		return 0, false
	}
	return idx, true
}

// insert adds an empty entry for k, evicting the least recently used entry if
// the shard is full. The caller fills it in.
func (s *shard) insert(k Key) entry {
	if s.lru.Len() >= s.capacity {
		if _, old, ok := s.lru.RemoveOldest(); ok {
			s.free = append(s.free, old)
			s.count.Add(-1)
			s.evictions.Add(1)
		}
	}
	var idx uint32
	if n := len(s.free); n > 0 {
		idx = s.free[n-1]
		s.free = s.free[:n-1]
	} else {
		idx = s.used
		s.used++
		if p := int(idx >> s.pageShift); p == len(s.headers) {
			size := 1 << s.pageShift
			s.headers = append(s.headers, make([]header, size))
			s.slots = append(s.slots, make([]slot, size*s.retained))
		}
	}
	s.lru.Add(k, idx)
	s.count.Add(1)
	e := s.entry(idx)
	*e.h = header{}
	return e
}

func (s *shard) remove(k Key, idx uint32) {
	s.lru.Remove(k)
	s.free = append(s.free, idx)
	s.count.Add(-1)
}

// fenced reports whether epoch is below the producer's InitProducerId floor,
// expiring the floor lazily. A floor lookup does not count as use.
func (s *shard) fenced(pid int64, epoch int16, now int64) bool {
	if s.fences.Len() == 0 {
		return false
	}
	f, ok := s.fences.Peek(pid)
	if !ok {
		return false
	}
	if s.expired(f.seen, now) {
		s.fences.Remove(pid)
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
			k, idx, ok := s.lru.GetOldest()
			if !ok || !s.expired(s.entry(idx).h.lastSeen, now) {
				break
			}
			s.remove(k, idx)
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
		}
		s.mu.Unlock()
		if done {
			return n
		}
	}
}
