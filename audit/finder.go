package audit

import (
	"encoding/binary"
	"math"
	"math/bits"
	"sort"
	"time"

	"github.com/zeebo/xxh3"
)

// Record is one record of the topic, as the finder needs it.
type Record struct {
	Partition  int32
	Offset     int64
	Timestamp  time.Time
	ProducerID int64 // -1: a producer without idempotence
	Key, Value []byte
	Headers    []Header
}

// Header is one record header.
type Header struct {
	Key   string
	Value []byte
}

// Defaults of Settings.
const (
	// DefaultWindow is the proxy's dedup.legacy.window: how long after the
	// original a client's retry arrives (delivery.timeout.ms, 2 minutes,
	// in the Java client and librdkafka).
	DefaultWindow = 2 * time.Minute
	// DefaultKeyWindow is the proxy's dedup.keys.ttl.
	DefaultKeyWindow = 24 * time.Hour
	// DefaultMaxTracked bounds each table: about 100 MiB at most for
	// content copies, as much again for keys.
	DefaultMaxTracked = 1 << 20
	// DefaultExamples is how many copies the report shows.
	DefaultExamples = 5
	// maxProducers bounds the producers counted one by one; the rest are
	// counted together.
	maxProducers = 1000
	// examplePrefix is how much of a key or value an example shows.
	examplePrefix = 64
)

// BytesPerTracked is what one remembered record costs: its ring slot
// (48 bytes) and its index entry (a 16-byte hash and a 4-byte slot number
// in a Go map, which keeps its load under 7/8 and doubles as it grows: 24
// to 48 bytes). TestMemoryBound measures it.
const BytesPerTracked = 100

// Settings tell the finder what counts as a copy. The zero value of each
// field means its default.
type Settings struct {
	// Window: a content copy is at most this long after the earlier
	// record (by record timestamp). Default DefaultWindow.
	Window time.Duration
	// KeyHeader names the idempotency key header. Empty: keys are not
	// checked.
	KeyHeader string
	// KeyWindow: a key repeat is at most this long after the earlier
	// record with the key. Default DefaultKeyWindow.
	KeyWindow time.Duration
	// MaxTracked bounds the records each table remembers. Default
	// DefaultMaxTracked.
	MaxTracked int
	// Examples is how many copies the report shows. Default
	// DefaultExamples; negative: none.
	Examples int
}

func (s *Settings) ensureDefaults() {
	if s.Window <= 0 {
		s.Window = DefaultWindow
	}
	if s.KeyWindow <= 0 {
		s.KeyWindow = DefaultKeyWindow
	}
	if s.MaxTracked <= 0 {
		s.MaxTracked = DefaultMaxTracked
	}
	if s.Examples == 0 {
		s.Examples = DefaultExamples
	}
	s.Examples = max(s.Examples, 0)
}

// Finder counts the copies among the records it is given, in the order a
// consumer reads them: each partition in offset order, partitions
// interleaved.
type Finder struct {
	s       Settings
	content *table
	keys    *table
	report  Report
	parts   map[int32]*PartitionCounts
	prods   map[int64]*ProducerCounts
	other   ProducerCounts // producers beyond maxProducers

	// gaps counts the time between copies: gaps[0] zero, gaps[i] in
	// [2^(i-1), 2^i) milliseconds.
	gaps           [48]int64
	minGap, maxGap time.Duration

	// reading holds the newest timestamp read from each partition still
	// being read (math.MinInt64 before its first record); low, the oldest
	// of them, recomputed every lowEvery records, is how far in time every
	// partition has been read.
	reading  map[int32]int64
	low      int64
	sinceLow int
	hasher   *xxh3.Hasher128
	scratch  [8]byte
}

// lowEvery is how many records may pass before low is recomputed: an
// older low only keeps records a little longer.
const lowEvery = 256

// NewFinder returns a finder for s.
func NewFinder(s Settings) *Finder {
	s.ensureDefaults()
	f := &Finder{
		s:       s,
		content: newTable(s.MaxTracked, s.Window.Milliseconds()),
		parts:   map[int32]*PartitionCounts{},
		prods:   map[int64]*ProducerCounts{},
		reading: map[int32]int64{},
		low:     math.MinInt64,
		hasher:  xxh3.New128(),
	}
	if s.KeyHeader != "" {
		f.keys = newTable(s.MaxTracked, s.KeyWindow.Milliseconds())
	}
	f.report.Window, f.report.KeyHeader, f.report.KeyWindow = s.Window, s.KeyHeader, s.KeyWindow
	f.report.MaxTracked = s.MaxTracked
	return f
}

// Expect says partition p will be read: until its first record, records
// of other partitions are remembered however old, since p's may be older.
func (f *Finder) Expect(p int32) {
	if _, ok := f.reading[p]; !ok {
		f.reading[p] = math.MinInt64
		f.low = math.MinInt64
	}
}

// Done says partition p has been read to its end: it no longer holds
// back the letting go of old records.
func (f *Finder) Done(p int32) {
	delete(f.reading, p)
	f.sinceLow = lowEvery
}

// Add counts r.
func (f *Finder) Add(r *Record) {
	ts := r.Timestamp.UnixMilli()
	pc := f.parts[r.Partition]
	if pc == nil {
		pc = &PartitionCounts{Partition: r.Partition, FirstOffset: r.Offset}
		f.parts[r.Partition] = pc
	}
	pc.Records++
	pc.LastOffset = r.Offset
	f.report.Records++
	f.report.Bytes += int64(len(r.Key) + len(r.Value))
	for _, h := range r.Headers {
		f.report.Bytes += int64(len(h.Key) + len(h.Value))
	}
	if f.report.Records == 1 || ts < f.report.First.UnixMilli() {
		f.report.First = time.UnixMilli(ts).UTC()
	}
	if f.report.Records == 1 || ts > f.report.Last.UnixMilli() {
		f.report.Last = time.UnixMilli(ts).UTC()
	}
	if t, ok := f.reading[r.Partition]; !ok || ts > t {
		if t == math.MinInt64 {
			f.sinceLow = lowEvery // its first record may raise low
		}
		f.reading[r.Partition] = ts
	}
	if f.sinceLow++; f.sinceLow >= lowEvery {
		f.sinceLow = 0
		f.low = math.MaxInt64
		for _, t := range f.reading {
			f.low = min(f.low, t)
		}
	}
	at := ref{partition: r.Partition, offset: r.Offset, ts: ts, pid: r.ProducerID}

	prev, copied := f.content.observe(f.contentHash(r), at, f.low)
	if copied {
		later, earlier := f.order(at, prev)
		f.report.Copies++
		f.parts[later.partition].Copies++
		f.producer(later.pid).Copies++
		if earlier.partition == later.partition {
			f.report.SamePartition++
		}
		if earlier.pid == later.pid {
			f.report.SameProducer++
		}
		f.gap(later.ts - earlier.ts)
		f.example(KindCopy, r, later, earlier)
	}
	if f.keys == nil {
		return
	}
	key, found := keyHeader(r, f.s.KeyHeader)
	if !found {
		f.report.WithoutKey++
		return
	}
	if prev, ok := f.keys.observe(xxh3.Hash128(key).Bytes(), at, f.low); ok {
		later, earlier := f.order(at, prev)
		f.report.KeyRepeats++
		f.parts[later.partition].KeyRepeats++
		f.producer(later.pid).KeyRepeats++
		if !copied { // a copy's example says it all
			f.example(KindKeyRepeat, r, later, earlier)
		}
	}
}

// order returns the later and the earlier of two matching records: the
// copy is the later one in time, whichever was read first.
func (f *Finder) order(a, b ref) (later, earlier ref) {
	if b.ts > a.ts {
		if f.parts[b.partition] == nil {
			f.parts[b.partition] = &PartitionCounts{Partition: b.partition, FirstOffset: b.offset, LastOffset: b.offset}
		}
		return b, a
	}
	return a, b
}

// Report returns the counts so far.
func (f *Finder) Report() Report {
	rep := f.report
	rep.Forgotten = f.content.forgotten
	rep.Tracked = f.content.n
	if f.keys != nil {
		rep.Forgotten += f.keys.forgotten
		rep.Tracked += f.keys.n
	}
	rep.Partitions = make([]PartitionCounts, 0, len(f.parts))
	for _, pc := range f.parts {
		rep.Partitions = append(rep.Partitions, *pc)
	}
	sort.Slice(rep.Partitions, func(i, j int) bool { return rep.Partitions[i].Partition < rep.Partitions[j].Partition })
	rep.Producers = nil
	for _, p := range f.prods {
		if p.Copies+p.KeyRepeats > 0 {
			rep.Producers = append(rep.Producers, *p)
		}
	}
	sort.Slice(rep.Producers, func(i, j int) bool {
		a, b := rep.Producers[i], rep.Producers[j]
		if a.Copies+a.KeyRepeats != b.Copies+b.KeyRepeats {
			return a.Copies+a.KeyRepeats > b.Copies+b.KeyRepeats
		}
		return a.ProducerID < b.ProducerID
	})
	if f.other.Copies+f.other.KeyRepeats > 0 {
		o := f.other
		o.Others = true
		rep.Producers = append(rep.Producers, o)
	}
	rep.Gaps = f.gapStats()
	rep.Examples = append([]Example(nil), f.report.Examples...)
	return rep
}

// contentHash identifies key, value and headers. Every field is
// length-prefixed, and a null key or value differs from an empty one.
func (f *Finder) contentHash(r *Record) [16]byte {
	f.hasher.Reset()
	f.writeBytes(r.Key, r.Key == nil)
	f.writeBytes(r.Value, r.Value == nil)
	binary.BigEndian.PutUint64(f.scratch[:], uint64(len(r.Headers)))
	f.hasher.Write(f.scratch[:])
	for _, hd := range r.Headers {
		f.writeBytes([]byte(hd.Key), false)
		f.writeBytes(hd.Value, hd.Value == nil)
	}
	return f.hasher.Sum128().Bytes()
}

func (f *Finder) writeBytes(b []byte, null bool) {
	n := uint64(len(b))
	if null {
		n = math.MaxUint64
	}
	binary.BigEndian.PutUint64(f.scratch[:], n)
	f.hasher.Write(f.scratch[:])
	f.hasher.Write(b)
}

func keyHeader(r *Record, name string) ([]byte, bool) {
	for _, h := range r.Headers {
		if h.Key == name {
			return h.Value, true
		}
	}
	return nil, false
}

func (f *Finder) producer(pid int64) *ProducerCounts {
	if p := f.prods[pid]; p != nil {
		return p
	}
	if len(f.prods) >= maxProducers {
		return &f.other
	}
	p := &ProducerCounts{ProducerID: pid}
	f.prods[pid] = p
	return p
}

// example keeps a copy (later) and the record it repeats (earlier); r is
// the record just read, one of the two.
func (f *Finder) example(kind string, r *Record, later, earlier ref) {
	if len(f.report.Examples) >= f.s.Examples {
		return
	}
	ex := Example{
		Kind:      kind,
		Partition: later.partition, Offset: later.offset, ProducerID: later.pid,
		Timestamp:         time.UnixMilli(later.ts).UTC(),
		EarlierPartition:  earlier.partition,
		EarlierOffset:     earlier.offset,
		EarlierProducerID: earlier.pid,
		Apart:             time.Duration(later.ts-earlier.ts) * time.Millisecond,
		Key:               prefix(r.Key),
		Value:             prefix(r.Value),
	}
	if f.s.KeyHeader != "" {
		v, _ := keyHeader(r, f.s.KeyHeader)
		ex.KeyHeader = prefix(v)
	}
	f.report.Examples = append(f.report.Examples, ex)
}

func prefix(b []byte) string {
	if len(b) > examplePrefix {
		return string(b[:examplePrefix]) + "…"
	}
	return string(b)
}

func absMillis(d int64) int64 {
	if d < 0 {
		return -d
	}
	return d
}

func (f *Finder) gap(ms int64) {
	i := bits.Len64(uint64(ms))
	f.gaps[min(i, len(f.gaps)-1)]++
	d := time.Duration(ms) * time.Millisecond
	if f.report.Copies == 1 || d < f.minGap {
		f.minGap = d
	}
	f.maxGap = max(f.maxGap, d)
}

// gapStats summarises the time between copies: the exact minimum and
// maximum, and the median and 99th percentile to within a factor of two
// (the top of their power-of-two bucket, at most the maximum).
func (f *Finder) gapStats() GapStats {
	var n int64
	for _, c := range f.gaps {
		n += c
	}
	if n == 0 {
		return GapStats{}
	}
	at := func(q float64) time.Duration {
		want := int64(math.Ceil(q * float64(n)))
		var seen int64
		for i, c := range f.gaps {
			if seen += c; seen >= want {
				top := time.Duration(0)
				if i > 0 {
					top = time.Duration(int64(1)<<i-1) * time.Millisecond
				}
				return max(min(top, f.maxGap), f.minGap)
			}
		}
		return f.maxGap
	}
	return GapStats{Min: f.minGap, Median: at(0.5), P99: at(0.99), Max: f.maxGap}
}

// ref is where a remembered record is.
type ref struct {
	partition int32
	offset    int64
	ts        int64 // Unix milliseconds
	pid       int64
}

// table remembers records by hash: a ring of at most max slots in the
// order the records were read (grown by doubling as needed), and an index
// from a hash to its newest slot.
type table struct {
	max       int
	window    int64 // milliseconds
	ring      []slot
	head, n   int
	index     map[[16]byte]int32
	forgotten int64 // remembered records let go inside their window
	now       int64 // the timestamp of the record being observed
}

type slot struct {
	hash [16]byte
	ref
}

func newTable(max int, window int64) *table {
	return &table{max: max, window: window, index: map[[16]byte]int32{}}
}

// observe reports whether a record with hash h was read before within the
// window of r (and where), and remembers r as the newest record with h.
// low is how far in time every partition has been read: a record older
// than low − window can match nothing still to come, so it is let go.
func (t *table) observe(h [16]byte, r ref, low int64) (ref, bool) {
	t.expire(low)
	t.now = r.ts
	i, ok := t.index[h]
	if !ok {
		t.push(h, r)
		return ref{}, false
	}
	prev := t.ring[i].ref
	if absMillis(r.ts-prev.ts) > t.window {
		t.push(h, r)
		return prev, false
	}
	if prev.ts > r.ts {
		// Read out of time order (another partition is ahead): the newer
		// record stays the one later records are compared with.
		return prev, true
	}
	t.push(h, r)
	return prev, true
}

// push remembers r in a new slot, forgetting the oldest slot when the ring
// is at its bound.
func (t *table) push(h [16]byte, r ref) {
	if t.n == len(t.ring) {
		if len(t.ring) < t.max {
			t.grow()
		} else {
			t.drop(t.ring[t.head].ts >= t.now-t.window)
		}
	}
	i := (t.head + t.n) % len(t.ring)
	t.ring[i] = slot{hash: h, ref: r}
	t.index[h] = int32(i)
	t.n++
}

// drop lets go of the oldest slot; early says it could still match the
// record being observed (its window had not ended).
func (t *table) drop(early bool) {
	s := &t.ring[t.head]
	if i, ok := t.index[s.hash]; ok && int(i) == t.head {
		delete(t.index, s.hash)
		if early {
			t.forgotten++
		}
	}
	t.head = (t.head + 1) % len(t.ring)
	t.n--
}

// grow doubles the ring, up to max, keeping the slots in order.
func (t *table) grow() {
	next := make([]slot, min(max(2*len(t.ring), 1024), t.max))
	for k := 0; k < t.n; k++ {
		j := (t.head + k) % len(t.ring)
		next[k] = t.ring[j]
		if i, ok := t.index[next[k].hash]; ok && int(i) == j {
			t.index[next[k].hash] = int32(k)
		}
	}
	t.ring, t.head = next, 0
}

// expire lets go of the oldest slots older than low − window.
func (t *table) expire(low int64) {
	if low == math.MinInt64 {
		return // a partition not read yet may hold older records
	}
	for t.n > 0 && t.ring[t.head].ts < low-t.window {
		t.drop(false)
	}
}
