package seqstate

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// KeyTable remembers idempotency keys: a record header that names the
// logical operation a record carries (an event id), opted into per topic
// (docs/legacy.md, "Idempotency keys"). A legacy record whose key was
// written to its topic within the TTL is not written again. This catches
// what no retry rule can: an application that restarts and sends again, an
// outbox relay that republishes.
//
// Keys are kept as 128-bit hashes, computed by the caller with the topic
// mixed in; two different keys collide with probability about 2^-128. Like
// the other tables it reads no clock and allocates nothing per key once
// sized; it starts empty and grows toward MaxKeys on demand (lazyRing).
type KeyTable struct {
	shards    []keyShard
	layout    ringLayout
	ttl       int64
	evictions atomic.Uint64
}

// KeyConfig configures a KeyTable. The zero value means all defaults.
type KeyConfig struct {
	// MaxKeys caps the keys remembered (40 bytes each); the oldest goes
	// first. Zero means DefaultMaxKeys.
	MaxKeys int
	// TTL is how long a written key is remembered. Zero means
	// DefaultKeyTTL.
	TTL time.Duration
	// Shards is a power of two; zero means as for Config.Shards.
	Shards int
}

const (
	// DefaultMaxKeys is KeyConfig.MaxKeys's default: about 40 MiB full,
	// allocated as keys arrive.
	DefaultMaxKeys = 1 << 20
	// DefaultKeyTTL is KeyConfig.TTL's default.
	DefaultKeyTTL = 24 * time.Hour
)

// ErrInvalidKeyConfig is returned, wrapped, by NewKeyTable.
var ErrInvalidKeyConfig = errors.New("seqstate: invalid key config")

type keyEntry struct {
	hi     uint64 // the key hash's other half (lo is the ring id)
	offset int64  // where the record with this key was written, -1 if unknown
	seen   int64  // when it was written (ns)
}

type keyShard struct {
	mu sync.Mutex
	ringIndex[keyEntry]
	_ [16]byte
}

// NewKeyTable returns an empty table.
func NewKeyTable(cfg KeyConfig) (*KeyTable, error) {
	if cfg.MaxKeys == 0 {
		cfg.MaxKeys = DefaultMaxKeys
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultKeyTTL
	}
	l, err := newRingLayout(cfg.MaxKeys, cfg.TTL, cfg.Shards, "MaxKeys", "TTL", ErrInvalidKeyConfig)
	if err != nil {
		return nil, err
	}
	t := &KeyTable{shards: make([]keyShard, l.shards), layout: l, ttl: int64(cfg.TTL)}
	for i := range t.shards {
		t.shards[i].initLazy()
	}
	return t, nil
}

func (t *KeyTable) shard(id uint64) *keyShard { return &t.shards[t.layout.shardOf(id)] }

// keyID maps the low half to a ring id, never 0.
func keyID(lo uint64) uint64 {
	if lo == 0 {
		return 1
	}
	return lo
}

// Lookup reports whether key (lo, hi) was written within the TTL, and at
// which offset (-1 if unknown).
func (t *KeyTable) Lookup(lo, hi uint64, now time.Time) (int64, bool) {
	return t.find(lo, hi, now, false)
}

// Take is Lookup, except that a key found is forgotten: it answers for one
// record only (the proxy's stamps of records resent after an error answer,
// each matched once).
func (t *KeyTable) Take(lo, hi uint64, now time.Time) (int64, bool) {
	return t.find(lo, hi, now, true)
}

// find looks key (lo, hi) up, forgetting it when expired, or when found
// and take.
func (t *KeyTable) find(lo, hi uint64, now time.Time, take bool) (int64, bool) {
	id := keyID(lo)
	s := t.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	slot, ok := s.get(id)
	if !ok {
		return -1, false
	}
	e := s.ring[slot]
	if now.UnixNano()-e.seen >= t.ttl {
		s.forget(id)
		return -1, false
	}
	if e.hi != hi {
		return -1, false
	}
	if take {
		s.forget(id)
	}
	return e.offset, true
}

// Commit records that a record with key (lo, hi) was written at offset. A
// key already remembered keeps its first offset.
func (t *KeyTable) Commit(lo, hi uint64, offset int64, now time.Time) {
	id := keyID(lo)
	ns := now.UnixNano()
	s := t.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if slot, ok := s.get(id); ok {
		if e := &s.ring[slot]; ns-e.seen < t.ttl {
			return
		}
		s.forget(id)
	}
	if old, ok := s.pushGrow(id, keyEntry{hi: hi, offset: offset, seen: ns}, t.layout.per); ok && ns-old.seen < t.ttl {
		t.evictions.Add(1)
	}
}

// Len returns the keys remembered, expired ones included until overwritten
// or looked up.
func (t *KeyTable) Len() int {
	n := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		n += s.n
		s.mu.Unlock()
	}
	return n
}

// Evictions returns how many keys were forgotten before their TTL because
// the table was full.
func (t *KeyTable) Evictions() uint64 { return t.evictions.Load() }
