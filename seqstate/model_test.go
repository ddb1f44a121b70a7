package seqstate

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// model is a naive reference implementation of the documented semantics:
// maps and slices, no rings, slabs or LRU library. The randomized test and
// the fuzz target drive it and a Table with the same operations and require
// identical results, counters and state.
type model struct {
	retained   int
	expiration int64
	maxEntries int // table-wide
	fencesCap  int
	shardOf    func(pid int64) int

	entries  map[Key]*mEntry
	recency  [][]Key // per shard, least recently used first
	fences   map[int64]mFence
	fenceRec [][]int64

	evictions, expirations uint64
	overshoots             int // inserts that left more than maxEntries entries
}

type mEntry struct {
	epoch    int16
	batches  []mBatch // oldest first
	lastSeen int64
}

type mBatch struct {
	first, last int32
	fp          uint32
	pending     bool
	off, ts     int64
}

type mFence struct {
	epoch int16
	seen  int64
}

func newModel(cfg Config, t *Table) *model {
	cfg.EnsureDefaults()
	return &model{
		retained:   cfg.RetainedBatches,
		expiration: int64(cfg.ProducerIDExpiration),
		maxEntries: cfg.MaxEntries,
		fencesCap:  (cfg.MaxFencedProducers + cfg.Shards - 1) / cfg.Shards,
		shardOf:    t.shardIndex,
		entries:    map[Key]*mEntry{},
		recency:    make([][]Key, cfg.Shards),
		fences:     map[int64]mFence{},
		fenceRec:   make([][]int64, cfg.Shards),
	}
}

func (m *model) touch(k Key) {
	s := m.shardOf(k.ProducerID)
	i := slices.Index(m.recency[s], k)
	m.recency[s] = append(slices.Delete(m.recency[s], i, i+1), k)
}

func (m *model) drop(k Key) {
	s := m.shardOf(k.ProducerID)
	i := slices.Index(m.recency[s], k)
	m.recency[s] = slices.Delete(m.recency[s], i, i+1)
	delete(m.entries, k)
}

// get is a lookup that marks use and expires lazily.
func (m *model) get(k Key, now int64) *mEntry {
	e, ok := m.entries[k]
	if !ok {
		return nil
	}
	m.touch(k)
	if now-e.lastSeen >= m.expiration {
		m.drop(k)
		m.expirations++
		return nil
	}
	return e
}

// add inserts k. At the table-wide cap it evicts the least recently used
// entry of k's shard, if the shard has one (see shard.insert).
func (m *model) add(k Key) *mEntry {
	s := m.shardOf(k.ProducerID)
	if len(m.entries) >= m.maxEntries && len(m.recency[s]) > 0 {
		delete(m.entries, m.recency[s][0])
		m.recency[s] = m.recency[s][1:]
		m.evictions++
	}
	e := &mEntry{}
	m.entries[k] = e
	m.recency[s] = append(m.recency[s], k)
	if len(m.entries) > m.maxEntries {
		m.overshoots++
	}
	return e
}

func lastOf(first, count int32) int32 {
	l := int64(first) + int64(count) - 1
	if l > math.MaxInt32 {
		l -= math.MaxInt32 + 1
	}
	return int32(l)
}

func (m *model) fenced(pid int64, epoch int16, now int64) bool {
	f, ok := m.fences[pid]
	if !ok {
		return false
	}
	if now-f.seen >= m.expiration {
		delete(m.fences, pid)
		s := m.shardOf(pid)
		i := slices.Index(m.fenceRec[s], pid)
		m.fenceRec[s] = slices.Delete(m.fenceRec[s], i, i+1)
		return false
	}
	return epoch < f.epoch
}

func (m *model) check(k Key, b Batch, now int64, register bool) Result {
	no := Result{BaseOffset: -1, MaxTimestamp: -1}
	if k.ProducerID < 0 {
		no.Decision = Accept
		return no
	}
	if b.FirstSeq < 0 || b.Count < 1 {
		no.Decision = Invalid
		return no
	}
	if m.fenced(k.ProducerID, b.Epoch, now) {
		no.Decision = Fenced
		return no
	}
	e := m.get(k, now)
	epoch, batches := int16(-1), []mBatch(nil)
	if e != nil {
		epoch, batches = e.epoch, e.batches
	}
	last := lastOf(b.FirstSeq, b.Count)
	if b.Epoch == epoch {
		for _, x := range batches {
			if x.first == b.FirstSeq && x.last == last {
				switch {
				case b.Fingerprint != 0 && x.fp != 0 && b.Fingerprint != x.fp:
					no.Decision = SequenceReuse
				case x.pending:
					no.Decision = InFlight
				default:
					return Result{Decision: Duplicate, BaseOffset: x.off, MaxTimestamp: x.ts}
				}
				return no
			}
		}
	}
	switch {
	case b.Epoch < epoch:
		no.Decision = Fenced
		return no
	case b.Epoch != epoch:
		if b.FirstSeq != 0 && epoch != -1 {
			no.Decision = OutOfOrder
			return no
		}
	default:
		tail := int64(-1)
		if len(batches) > 0 {
			tail = int64(batches[len(batches)-1].last)
		}
		next := int64(b.FirstSeq)
		if epoch != -1 && next != tail+1 && !(next == 0 && tail == math.MaxInt32) {
			no.Decision = OutOfOrder
			return no
		}
	}
	no.Decision = Accept
	if register {
		if e == nil {
			e = m.add(k)
			e.epoch = b.Epoch
		}
		m.appendBatch(e, b.Epoch, mBatch{first: b.FirstSeq, last: last, fp: b.Fingerprint, pending: true, off: -1, ts: -1}, now)
	}
	return no
}

func (m *model) appendBatch(e *mEntry, epoch int16, x mBatch, now int64) {
	if e.epoch != epoch {
		e.epoch, e.batches = epoch, nil
	}
	// The window stays contiguous (only epoch -1 can break it) and spans
	// fewer than 2^31 sequences (see entry.push).
	if n := len(e.batches); n > 0 && !inSequence(e.batches[n-1].last, x.first) {
		e.batches = nil
	}
	size := func(x mBatch) int64 { return (int64(x.last)-int64(x.first)+math.MaxInt32+1)%(math.MaxInt32+1) + 1 }
	for {
		span := size(x)
		for _, y := range e.batches {
			span += size(y)
		}
		if span <= math.MaxInt32 {
			break
		}
		e.batches = e.batches[1:]
	}
	e.batches = append(e.batches, x)
	if len(e.batches) > m.retained {
		e.batches = e.batches[1:]
	}
	e.lastSeen = now
}

func (m *model) commit(k Key, b Batch, off, ts, now int64) {
	if k.ProducerID < 0 || b.FirstSeq < 0 || b.Count < 1 {
		return
	}
	last := lastOf(b.FirstSeq, b.Count)
	x := mBatch{first: b.FirstSeq, last: last, fp: b.Fingerprint, off: off, ts: ts}
	e := m.get(k, now)
	if e == nil {
		e = m.add(k)
		e.epoch = b.Epoch
		m.appendBatch(e, b.Epoch, x, now)
		return
	}
	if b.Epoch == e.epoch {
		for i := range e.batches {
			if e.batches[i].first == b.FirstSeq && e.batches[i].last == last {
				if e.batches[i].pending {
					e.batches[i].pending = false
					e.batches[i].off, e.batches[i].ts = off, ts
					e.lastSeen = now
				}
				return
			}
		}
	}
	if b.Epoch < e.epoch {
		return
	}
	if b.Epoch == e.epoch && e.epoch != -1 && len(e.batches) > 0 {
		tail := int64(e.batches[len(e.batches)-1].last)
		next := int64(b.FirstSeq)
		if next != tail+1 && !(next == 0 && tail == math.MaxInt32) {
			m.drop(k)
			return
		}
	}
	m.appendBatch(e, b.Epoch, x, now)
}

func (m *model) abort(k Key, b Batch) {
	if k.ProducerID < 0 || b.FirstSeq < 0 || b.Count < 1 {
		return
	}
	e, ok := m.entries[k]
	if !ok || e.epoch != b.Epoch {
		return
	}
	last := lastOf(b.FirstSeq, b.Count)
	for i, x := range e.batches {
		if x.first != b.FirstSeq || x.last != last {
			continue
		}
		if !x.pending {
			return
		}
		for _, y := range e.batches[i+1:] {
			if !y.pending {
				m.drop(k)
				return
			}
		}
		e.batches = e.batches[:i]
		if i == 0 {
			m.drop(k)
		}
		return
	}
}

func (m *model) initProducerID(pid int64, epoch int16, now int64) {
	if pid < 0 {
		return
	}
	s := m.shardOf(pid)
	if f, ok := m.fences[pid]; ok {
		if epoch < f.epoch && now-f.seen < m.expiration {
			epoch = f.epoch
		}
		i := slices.Index(m.fenceRec[s], pid)
		m.fenceRec[s] = slices.Delete(m.fenceRec[s], i, i+1)
	} else if len(m.fenceRec[s]) >= m.fencesCap {
		delete(m.fences, m.fenceRec[s][0])
		m.fenceRec[s] = m.fenceRec[s][1:]
	}
	m.fences[pid] = mFence{epoch: epoch, seen: now}
	m.fenceRec[s] = append(m.fenceRec[s], pid)
}

func (m *model) expire(now int64) int {
	n := 0
	for s := range m.recency {
		for len(m.recency[s]) > 0 {
			k := m.recency[s][0]
			if now-m.entries[k].lastSeen < m.expiration {
				break
			}
			m.drop(k)
			m.expirations++
			n++
		}
		for len(m.fenceRec[s]) > 0 {
			pid := m.fenceRec[s][0]
			if now-m.fences[pid].seen < m.expiration {
				break
			}
			delete(m.fences, pid)
			m.fenceRec[s] = m.fenceRec[s][1:]
		}
	}
	return n
}

// dump renders the model's entries in LRU order per shard, in the format of
// Table.dumpAll.
func (m *model) dump() string {
	var sb strings.Builder
	for s, keys := range m.recency {
		fmt.Fprintf(&sb, "shard %d:", s)
		for _, k := range keys {
			e := m.entries[k]
			fmt.Fprintf(&sb, " {%v e=%d seen=%d", k, e.epoch, e.lastSeen)
			for _, x := range e.batches {
				fmt.Fprintf(&sb, " %d-%d/%d/%v/%d/%d", x.first, x.last, x.fp, x.pending, x.off, x.ts)
			}
			sb.WriteString("}")
		}
		sb.WriteString(" fences:")
		for _, pid := range m.fenceRec[s] {
			fmt.Fprintf(&sb, " %d=%d@%d", pid, m.fences[pid].epoch, m.fences[pid].seen)
		}
		sb.WriteString("\n")
	}
	return sb.String()
}

// dumpAll renders the table like model.dump. It also checks the shards'
// bookkeeping: counts, the slab free list and the LRU agree, and the table
// holds at most MaxEntries+Shards-1 entries. The table must be quiescent.
func (t *Table) dumpAll(tb testing.TB) string {
	var sb strings.Builder
	total := 0
	for i := range t.shards {
		s := &t.shards[i].shard
		func() {
			// A Fatalf below must not leave the lock held: run's deferred
			// compareState calls dumpAll again.
			s.mu.Lock()
			defer s.mu.Unlock()
			keys, idxs := s.walk(tb, i)
			total += len(keys)
			if int(s.used) != len(keys)+len(s.free) {
				tb.Fatalf("shard %d: used %d != live %d + free %d", i, s.used, len(keys), len(s.free))
			}
			if len(keys) > s.capacity {
				tb.Fatalf("shard %d: %d entries over capacity %d", i, len(keys), s.capacity)
			}
			s.checkSlab(tb, i)
			fmt.Fprintf(&sb, "shard %d:", i)
			seen := map[int32]bool{}
			for j, k := range keys {
				idx := idxs[j]
				if seen[idx] || slices.Contains(s.free, uint32(idx)) {
					tb.Fatalf("shard %d: slab index %d used twice", i, idx)
				}
				seen[idx] = true
				e := s.entry(idx)
				if e.h.n == 0 || int(e.h.n) > e.len() {
					tb.Fatalf("shard %d: key %v holds %d batches", i, k, e.h.n)
				}
				fmt.Fprintf(&sb, " {%v e=%d seen=%d", k, e.h.epoch, e.h.lastSeen)
				for j := 0; j < int(e.h.n); j++ {
					x := e.at(j)
					off, ts := e.offsets(e.pos(j))
					fmt.Fprintf(&sb, " %d-%d/%d/%v/%d/%d", e.firstOf(j), x.lastSeq(), x.fingerprint, x.pending(), off, ts)
				}
				sb.WriteString("}")
			}
			sb.WriteString(" fences:")
			for _, pid := range s.fences.Keys() {
				f, _ := s.fences.Peek(pid)
				fmt.Fprintf(&sb, " %d=%d@%d", pid, f.epoch, f.seen)
			}
			sb.WriteString("\n")
		}()
	}
	if total != t.Len() || total > int(t.shards[0].maxEntries)+len(t.shards)-1 {
		tb.Fatalf("%d entries in the shards, Len %d, MaxEntries %d, %d shards", total, t.Len(), t.shards[0].maxEntries, len(t.shards))
	}
	return sb.String()
}

// checkSlab checks the slab pages: only the first page may be short, room
// counts what the pages hold and covers the indexes handed out, and the view
// of mru is current. That every wide value is keyed by a marked slot of a
// live entry (none left at an address a page move abandoned) is walk's
// check.
func (s *shard) checkSlab(tb testing.TB, i int) {
	room := 0
	for p, pg := range s.pages {
		if p > 0 && len(pg.h) != 1<<s.pageShift || len(pg.h) > 1<<s.pageShift ||
			len(pg.s) != len(pg.h)*s.retained+MaxRetainedBatches-s.retained {
			tb.Fatalf("shard %d: page %d of %d holds %d headers, %d slots", i, p, len(s.pages), len(pg.h), len(pg.s))
		}
		room += len(pg.h)
	}
	if int(s.room) != room || s.used > s.room {
		tb.Fatalf("shard %d: room %d, pages hold %d, used %d", i, s.room, room, s.used)
	}
	want := entry{}
	if s.mru != nilIndex {
		want = s.entry(s.mru)
	}
	if s.mruEntry != want {
		tb.Fatalf("shard %d: stale view of mru %d", i, s.mru)
	}
}

// walk lists the shard's keys and slab indexes from least to most recently
// used, checking the LRU links and that the index finds every key at its
// slab index and holds nothing else.
func (s *shard) walk(tb testing.TB, i int) (keys []Key, idxs []int32) {
	prev := int32(nilIndex)
	for idx := s.lru; idx != nilIndex; idx = s.hdr(idx).prev {
		h := s.hdr(idx)
		if h.next != prev {
			tb.Fatalf("shard %d: entry %d links back to %d, want %d", i, idx, h.next, prev)
		}
		if got, ok := s.peek(h.key); !ok || got != idx {
			tb.Fatalf("shard %d: index finds %v at %d, %v; want %d", i, h.key, got, ok, idx)
		}
		keys, idxs = append(keys, h.key), append(idxs, idx)
		prev = idx
		if len(keys) > s.capacity {
			tb.Fatalf("shard %d: LRU list longer than capacity %d (cycle?)", i, s.capacity)
		}
	}
	if prev != s.mru || s.live != len(keys) {
		tb.Fatalf("shard %d: LRU ends at %d, mru %d; live %d, listed %d", i, prev, s.mru, s.live, len(keys))
	}
	marks := 0
	for _, idx := range idxs {
		e := s.entry(idx)
		for j := range e.len() {
			if e.s[j].offDelta == wideDelta {
				if _, ok := s.wide[&e.s[j]]; !ok {
					tb.Fatalf("shard %d: entry %d slot %d marked wide without a value", i, idx, j)
				}
				marks++
			}
		}
	}
	if marks != len(s.wide) {
		tb.Fatalf("shard %d: %d wide marks, %d wide values", i, marks, len(s.wide))
	}
	words := 0
	for _, w := range s.index {
		if w != 0 {
			words++
		}
	}
	if words != len(keys) || (words+0)*4 > len(s.index)*3 {
		tb.Fatalf("shard %d: index holds %d words of %d for %d keys", i, words, len(s.index), len(keys))
	}
	return keys, idxs
}

// driver turns a byte source into operations on a Table and the model, the
// way a client population would: mostly in-sequence batches and their
// retries, with epoch bumps, random sequences, commits and aborts in any
// order, InitProducerId, clock jumps and sweeps.
type driver struct {
	tb        testing.TB
	next      func() (byte, bool)
	t         *Table
	m         *model
	now       int64
	ops       int
	sent      map[Key]*client
	decisions map[Decision]int
	// wide draws committed offsets and timestamps from far-apart ranges, so
	// their 32-bit deltas often do not fit (see slot).
	wide    bool
	maxWide int // most wide values held at once
	// pids is how many producer ids the driver uses, -1 (not idempotent)
	// to pids-2; 0 means 5. More make the shards large enough to compact.
	pids int
	// compactions counts ops after which a shard's slab had shrunk (see
	// shard.compact).
	compactions int
	// op and out are check's and settle's one-batch requests.
	op  [1]Op
	out [1]Outcome
}

type client struct {
	epoch    int16
	nextSeq  int32
	history  []Batch // recently sent, for retries
	inFlight []Batch // accepted, not yet resolved
}

func newDriver(tb testing.TB, cfg Config, next func() (byte, bool)) *driver {
	t, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return &driver{tb: tb, next: next, t: t, m: newModel(cfg, t), now: time.Hour.Nanoseconds(), sent: map[Key]*client{}, decisions: map[Decision]int{}}
}

func (d *driver) byte() byte {
	b, ok := d.next()
	if !ok {
		panic(errDone)
	}
	return b
}

var errDone = fmt.Errorf("out of input")

func (d *driver) run() {
	defer func() {
		if r := recover(); r != nil && r != errDone {
			panic(r)
		}
		d.compareState()
	}()
	for {
		d.step()
	}
}

func (d *driver) compareState() {
	if got, want := d.t.dumpAll(d.tb), d.m.dump(); got != want {
		d.tb.Fatalf("after %d ops, state differs:\ntable:\n%s\nmodel:\n%s", d.ops, got, want)
	}
}

func (d *driver) step() {
	op := d.byte()
	pids := d.pids
	if pids == 0 {
		pids = 5
	}
	pid := int64(int(d.byte())%pids) - 1 // -1 is not idempotent
	used := d.slabUsed()
	k := Key{ProducerID: pid, Topic: TopicID(d.byte() % 2), Partition: int32(d.byte() % 2)}
	c := d.sent[k]
	if c == nil {
		c = &client{}
		if d.byte()%4 == 0 {
			c.nextSeq = math.MaxInt32 - int32(d.byte()%4) // start near the wrap
		}
		d.sent[k] = c
	}
	now := time.Unix(0, d.now)
	fp := func(b Batch) uint32 {
		switch d.byte() % 8 {
		case 0:
			return 0
		case 1:
			return uint32(d.byte()) + 1 // a different (or equal) fingerprint
		}
		return uint32(b.FirstSeq)<<8 ^ uint32(b.Count) ^ uint32(uint16(b.Epoch))<<24 | 1
	}
	var what string
	var got, want Result
	switch op % 16 {
	case 0, 1, 2: // the next batch in sequence
		b := Batch{Epoch: c.epoch, FirstSeq: c.nextSeq, Count: int32(d.byte()%3) + 1}
		if d.byte()%32 == 0 { // a huge batch, so windows reach 2^31 sequences (see entry.push)
			b.Count = math.MaxInt32/2 + int32(d.byte())
		}
		b.Fingerprint = fp(b)
		c.nextSeq = incrementSequence(b.FirstSeq, b.Count)
		c.history = append(c.history, b)
		if len(c.history) > 8 {
			c.history = c.history[1:]
		}
		what, got, want = "check", d.check(k, b, now, true), d.m.check(k, b, d.now, true)
		if got.Decision == Accept {
			c.inFlight = append(c.inFlight, b)
		}
	case 3, 4, 5: // a retry of a recent batch
		if len(c.history) == 0 {
			return
		}
		b := c.history[int(d.byte())%len(c.history)]
		if d.byte()%4 == 0 {
			b.Fingerprint = fp(b)
		}
		what, got, want = "retry", d.check(k, b, now, true), d.m.check(k, b, d.now, true)
		if got.Decision == Accept {
			c.inFlight = append(c.inFlight, b)
		}
	case 6: // anything
		b := Batch{Epoch: int16(d.byte()%4) - 1, FirstSeq: int32(d.byte()%8) - 1, Count: int32(d.byte() % 4)}
		b.Fingerprint = fp(b)
		if d.byte()%2 == 0 {
			what, got, want = "decide", d.check(k, b, now, false), d.m.check(k, b, d.now, false)
		} else {
			what, got, want = "random", d.check(k, b, now, true), d.m.check(k, b, d.now, true)
			if got.Decision == Accept {
				c.inFlight = append(c.inFlight, b)
			}
		}
	case 7, 8, 9, 10: // the upstream appended an in-flight batch, in any order
		if len(c.inFlight) == 0 {
			return
		}
		i := 0 // usually the oldest: responses on one connection come in order
		if d.byte()%4 == 0 {
			i = int(d.byte()) % len(c.inFlight)
		}
		b := c.inFlight[i]
		c.inFlight = slices.Delete(c.inFlight, i, i+1)
		off, ts := int64(d.byte())*10, int64(d.byte())
		if d.wide {
			off, ts = d.wideValue(off), d.wideValue(ts)
		}
		d.settle(Outcome{Key: k, Batch: b, Appended: true, BaseOffset: off, MaxTimestamp: ts}, now)
		d.m.commit(k, b, off, ts, d.now)
		if d.wide {
			n := 0
			for j := range d.t.shards {
				n += len(d.t.shards[j].wide)
			}
			d.maxWide = max(d.maxWide, n)
		}
	case 11: // the upstream did not append it
		if len(c.inFlight) == 0 {
			return
		}
		i := int(d.byte()) % len(c.inFlight)
		b := c.inFlight[i]
		c.inFlight = slices.Delete(c.inFlight, i, i+1)
		d.settle(Outcome{Key: k, Batch: b}, now)
		d.m.abort(k, b)
	case 12: // the client bumps its epoch (or a transactional InitProducerId)
		if d.byte()%4 != 0 {
			return
		}
		c.epoch++
		c.nextSeq = 0
		if d.byte()%2 == 0 {
			d.t.ObserveInitProducerID(pid, c.epoch, now)
			d.m.initProducerID(pid, c.epoch, d.now)
		}
	case 13: // a stale InitProducerId epoch
		e := int16(d.byte() % 4)
		d.t.ObserveInitProducerID(pid, e, now)
		d.m.initProducerID(pid, e, d.now)
	case 14: // time passes
		switch d.byte() % 16 {
		case 0:
			d.now += int64(time.Hour)
		case 1:
			d.now += int64(d.byte()) * int64(time.Minute) / 4
		default:
			d.now += int64(d.byte()) * int64(time.Second)
		}
	case 15:
		got, want := d.t.Expire(now), d.m.expire(d.now)
		if got != want {
			d.tb.Fatalf("op %d: Expire = %d, model %d", d.ops, got, want)
		}
	}
	d.ops++
	if d.slabUsed() < used {
		d.compactions++
	}
	if what != "" {
		d.decisions[got.Decision]++
	}
	if got != want {
		d.tb.Fatalf("op %d %s %v: table %+v, model %+v\nmodel state:\n%s", d.ops, what, k, got, want, d.m.dump())
	}
	if d.t.Len() != len(d.m.entries) || d.t.Evictions() != d.m.evictions || d.t.Expirations() != d.m.expirations {
		d.tb.Fatalf("op %d: table len=%d ev=%d exp=%d, model len=%d ev=%d exp=%d", d.ops,
			d.t.Len(), d.t.Evictions(), d.t.Expirations(), len(d.m.entries), d.m.evictions, d.m.expirations)
	}
	if d.ops%512 == 0 {
		d.compareState()
	}
}

// check is Check or Decide, through CheckBatches or DecideBatches on odd
// ops, so that the model checks both paths without the fuzz input choosing
// (multi-batch requests are TestBatchesMatchSingle's).
func (d *driver) check(k Key, b Batch, now time.Time, register bool) Result {
	switch {
	case d.ops%2 == 0 && register:
		return d.t.Check(k, b, now)
	case d.ops%2 == 0:
		return d.t.Decide(k, b, now)
	}
	ops := d.op[:]
	ops[0] = Op{Key: k, Batch: b}
	if register {
		d.t.CheckBatches(ops, now)
	} else {
		d.t.DecideBatches(ops, now)
	}
	return ops[0].Result
}

// settle is Commit or Abort, through SettleBatches on odd ops.
func (d *driver) settle(o Outcome, now time.Time) {
	switch {
	case d.ops%2 == 1:
		d.out[0] = o
		d.t.SettleBatches(d.out[:], now)
	case o.Appended:
		d.t.Commit(o.Key, o.Batch, o.BaseOffset, o.MaxTimestamp, now)
	default:
		d.t.Abort(o.Key, o.Batch)
	}
}

// slabUsed is the slab entries the shards have handed out.
func (d *driver) slabUsed() int {
	n := 0
	for i := range d.t.shards {
		n += int(d.t.shards[i].used)
	}
	return n
}

// wideValue spreads x over ranges more than 2^31 apart, including the int64
// extremes and -1.
func (d *driver) wideValue(x int64) int64 {
	switch d.byte() % 8 {
	case 0:
		return -1
	case 1:
		return x + 1<<31
	case 2:
		return x + 1<<40
	case 3:
		return math.MaxInt64 - x
	case 4:
		return math.MinInt64 + x
	case 5:
		return -x - 1<<33
	}
	return x
}

// TestTableVsModelWideValues is TestTableVsModel with committed offsets and
// timestamps whose deltas often do not fit in 32 bits, exercising rebasing
// and the wide map; dumpAll checks the wide map's bookkeeping.
func TestTableVsModelWideValues(t *testing.T) {
	configs := []Config{
		{MaxEntries: 6, Shards: 2, RetainedBatches: 5, ProducerIDExpiration: time.Hour, MaxFencedProducers: 2},
		{MaxEntries: 3, Shards: 1, RetainedBatches: 16, ProducerIDExpiration: 2 * time.Hour, MaxFencedProducers: 1},
		{MaxEntries: 1000, Shards: 8, RetainedBatches: 3, ProducerIDExpiration: time.Hour},
	}
	const ops = 200_000
	for i, cfg := range configs {
		t.Run(fmt.Sprintf("config=%d", i), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(uint64(i), 43))
			var d *driver
			d = newDriver(t, cfg, func() (byte, bool) {
				if d.ops >= ops {
					return 0, false
				}
				return byte(rng.Uint32()), true
			})
			d.wide = true
			d.run()
			t.Logf("%d ops, decisions %v, at most %d wide values", d.ops, d.decisions, d.maxWide)
			if d.maxWide == 0 || d.decisions[Duplicate] == 0 {
				t.Errorf("wide values not exercised")
			}
		})
	}
}

// TestTableVsModelCompaction is TestTableVsModel with a thousand keys, so
// that mass expiry shrinks shards and compacts them (shard.compact): the
// LRU order, entries and wide values must come through unchanged.
func TestTableVsModelCompaction(t *testing.T) {
	configs := []Config{
		{MaxEntries: 4000, Shards: 2, RetainedBatches: 3, ProducerIDExpiration: time.Hour},
		{MaxEntries: 300, Shards: 4, RetainedBatches: 5, ProducerIDExpiration: time.Hour, MaxFencedProducers: 8},
	}
	const ops = 200_000
	for i, cfg := range configs {
		for _, wide := range []bool{false, true} {
			t.Run(fmt.Sprintf("config=%d/wide=%v", i, wide), func(t *testing.T) {
				t.Parallel()
				rng := rand.New(rand.NewPCG(uint64(i), 44))
				var d *driver
				d = newDriver(t, cfg, func() (byte, bool) {
					if d.ops >= ops {
						return 0, false
					}
					return byte(rng.Uint32()), true
				})
				d.pids, d.wide = 250, wide
				d.run()
				t.Logf("%d ops, decisions %v, evictions %d, expirations %d, compactions %d, wide %d",
					d.ops, d.decisions, d.m.evictions, d.m.expirations, d.compactions, d.maxWide)
				if d.compactions == 0 || d.decisions[Duplicate] == 0 || (wide && d.maxWide == 0) {
					t.Errorf("compaction not exercised")
				}
			})
		}
	}
}

// TestTableVsModel runs long seeded random operation sequences against the
// table and the naive model under several configurations: identical
// decisions, offsets, counters and state throughout.
func TestTableVsModel(t *testing.T) {
	configs := []Config{
		{MaxEntries: 6, Shards: 2, RetainedBatches: 5, ProducerIDExpiration: time.Hour, MaxFencedProducers: 2},
		{MaxEntries: 64, Shards: 4, RetainedBatches: 1, ProducerIDExpiration: 30 * time.Minute, MaxFencedProducers: 4},
		{MaxEntries: 3, Shards: 1, RetainedBatches: 16, ProducerIDExpiration: 2 * time.Hour, MaxFencedProducers: 1},
		{MaxEntries: 1000, Shards: 8, RetainedBatches: 3, ProducerIDExpiration: time.Hour},
		{MaxEntries: 2, Shards: 2, RetainedBatches: 2, ProducerIDExpiration: time.Hour, MaxFencedProducers: 2},
	}
	const ops = 200_000
	for i, cfg := range configs {
		t.Run(fmt.Sprintf("config=%d", i), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(uint64(i), 42))
			var d *driver
			d = newDriver(t, cfg, func() (byte, bool) {
				if d.ops >= ops {
					return 0, false
				}
				return byte(rng.Uint32()), true
			})
			d.run()
			t.Logf("%d ops, decisions %v, evictions %d, expirations %d, overshoots %d", d.ops, d.decisions, d.m.evictions, d.m.expirations, d.m.overshoots)
			for dec := Accept; dec <= Invalid; dec++ {
				if d.decisions[dec] == 0 {
					t.Errorf("decision %v never exercised", dec)
				}
			}
			if d.m.evictions == 0 && cfg.MaxEntries < 16 {
				t.Errorf("no evictions exercised")
			}
			if d.m.overshoots == 0 && cfg.MaxEntries < 16 && cfg.Shards > 1 {
				t.Errorf("no insert into an empty shard at the cap exercised")
			}
			if d.m.expirations == 0 {
				t.Errorf("no expirations exercised")
			}
		})
	}
}

// FuzzTableVsModel drives the table and the model with fuzz bytes; they must
// agree on every decision, counter and the final state, and never panic.
func FuzzTableVsModel(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 1, 0, 0, 1, 2, 2, 0, 1, 0, 0, 1, 2, 8, 1, 0, 0, 0, 5, 5})
	f.Add([]byte("\x00\x01\x00\x00\x00\x01\x03\x00\x01\x00\x00\x02\x00\x0b\x01\x00\x00\x00\x05\x01\x00\x00\x00\x00"))
	f.Add([]byte("\x0c\x02\x01\x01\x00\x00\x00\x02\x01\x01\x00\x00\x07\x02\x01\x01\x05\x05\x05\x01\x01\x0e\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg := Config{MaxEntries: 4, Shards: 2, RetainedBatches: 3, ProducerIDExpiration: time.Hour, MaxFencedProducers: 2}
		wide := false
		if len(data) > 0 {
			cfg.RetainedBatches = int(data[0]%MaxRetainedBatches) + 1
			wide = data[0]&0x80 != 0 // far-apart offsets and timestamps
			data = data[1:]
		}
		i := 0
		d := newDriver(t, cfg, func() (byte, bool) {
			if i >= len(data) {
				return 0, false
			}
			i++
			return data[i-1], true
		})
		d.wide = wide
		d.run()
	})
}
