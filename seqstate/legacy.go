package seqstate

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Legacy producers (producer id -1) carry no sequence numbers: Kafka appends
// every batch they send, retries included (docs/kafka-rules.md §3.1). The
// LegacyTable remembers recent legacy batches by identity — a hash of the
// topic, the record count, the records section's length and a 64-bit
// fingerprint of its bytes, computed by the caller — and the partition they
// went to, so that a retry can be told from new data (docs/legacy.md):
//
//   - an identical batch still in flight upstream to the same partition,
//     sent on another connection, is a retry: it waits for the original's
//     outcome;
//   - an identical batch acknowledged within the window is a retry unless
//     that acknowledgement went to the very connection the new batch arrives
//     on: a client that has the acknowledgement (responses leave a
//     connection in request order, so one that is still sending gets it)
//     and sends the same content again is sending new data — a heartbeat,
//     or the same record pipelined right behind itself;
//   - an identical batch acknowledged within the window to another
//     partition is a retry if the connection its acknowledgement went to
//     has closed since (Orphan): kafkajs assigns keyless records to
//     partitions round-robin on every attempt, so its retry moves whole
//     batches to other partitions. Its answer has offset -1: the records
//     are at the original's offset, in the original's partition;
//   - anything else is new.
//
// Like Table it is deterministic, reads no clock (time is an argument) and
// allocates nothing per batch once its shards are sized. Its shards start
// empty and grow toward their share of MaxIdentities as batches arrive
// (lazyRing), so a proxy whose producers are all idempotent never pays for
// it.

// LegacyDecision is what the LegacyTable concludes about a legacy batch.
//
// NOTE: add new decisions to legacyDecisionNames and the proxy's metrics.
type LegacyDecision uint8

const (
	// LegacyNew: forward the batch; it is registered as in flight and the
	// caller must Commit or Release it.
	LegacyNew LegacyDecision = iota + 1
	// LegacyInFlight: an identical batch from another connection is in
	// flight upstream. Do not forward it: wait for the original's outcome.
	LegacyInFlight
	// LegacyDuplicate: an identical batch was appended within the window
	// and its acknowledgement never reached this connection. Answer with
	// LegacyResult's offsets; nothing is registered.
	LegacyDuplicate
)

var legacyDecisionNames = [...]string{
	LegacyNew:       "legacy_new",
	LegacyInFlight:  "legacy_in_flight",
	LegacyDuplicate: "legacy_duplicate",
}

func (d LegacyDecision) String() string {
	if int(d) < len(legacyDecisionNames) && legacyDecisionNames[d] != "" {
		return legacyDecisionNames[d]
	}
	return fmt.Sprintf("LegacyDecision(%d)", d)
}

// LegacyResult is a decision plus, for a duplicate, the original's answer.
type LegacyResult struct {
	Decision LegacyDecision
	// BaseOffset and LogAppendTime are the original's, for a duplicate.
	// BaseOffset is -1 when the original was appended without an offset
	// in its response (REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS_AFTER_APPEND:
	// Kafka has appended it, the response does not say where), or went to
	// another partition.
	BaseOffset    int64
	LogAppendTime int64
	// Tracked is true when a LegacyNew batch was registered as in flight:
	// Commit or Release it.
	Tracked bool
	// From is, for LegacyInFlight, the connection the original is in
	// flight from: its client has given up on it, or is about to.
	From uint64
	// Moved marks a LegacyNew batch whose records were appended to another
	// partition within the window and acknowledged on a connection still
	// open: new data on its own, but a retry when it travels in one request
	// with a recognised retry (a client that re-partitions its retry and
	// resends only to the brokers that did not answer, docs/legacy.md).
	// LogAppendTime is then the original's; Commit it with offset -1 to
	// answer it as a retry.
	Moved bool
}

// LegacyConfig configures a LegacyTable. The zero value means all defaults.
type LegacyConfig struct {
	// MaxIdentities caps the batches remembered; the oldest is forgotten
	// first. Zero means DefaultMaxIdentities.
	MaxIdentities int
	// Window is how long an acknowledged batch is remembered. Zero means
	// DefaultLegacyWindow, the default delivery.timeout.ms of the Java
	// client and librdkafka (2 minutes): a client gives up retrying after
	// it.
	Window time.Duration
	// Shards is a power of two; zero means as for Config.Shards.
	Shards int
}

const (
	// DefaultMaxIdentities bounds the LegacyTable when
	// LegacyConfig.MaxIdentities is zero: about 16 MiB at ~64 B each,
	// once that many batches have been seen (the table grows on demand).
	DefaultMaxIdentities = 1 << 18
	// DefaultLegacyWindow is LegacyConfig.Window's default.
	DefaultLegacyWindow = 2 * time.Minute
)

// ErrInvalidLegacyConfig is returned, wrapped, by NewLegacyTable.
var ErrInvalidLegacyConfig = errors.New("seqstate: invalid legacy config")

// LegacyTable is safe for concurrent use.
type LegacyTable struct {
	shards    []legacyShard
	layout    ringLayout
	window    int64
	evictions atomic.Uint64
}

// legacyEntry is one remembered batch: 40 bytes, no pointers; its
// identity is kept beside it (ringIndex).
type legacyEntry struct {
	offset    int64  // base offset once appended, -1 if unknown
	ts        int64  // log_append_time to answer a duplicate with
	conn      uint64 // the connection that sent it, or was last answered it: its acknowledgement goes there; 0 once that closed
	seen      int64  // when it was last registered, committed or answered (ns)
	partition int32
	inflight  uint16 // copies in flight upstream from conn
	state     uint8
	// unacked: appended, and its client got an error or nothing for it
	// (Disown): it may resend the records inside other batches. Cleared
	// once reported by Remember, or once a retry is answered (Adopt).
	unacked bool
}

const (
	legacyPending  uint8 = iota // in flight, never appended yet
	legacyAppended              // appended; offset may be -1
)

// legacyShard is one lock's worth of the table: a ring of entries in
// expiry order with an index (ring.go).
type legacyShard struct {
	mu sync.Mutex
	ringIndex[legacyEntry]
	_ [16]byte
}

// NewLegacyTable returns an empty table.
func NewLegacyTable(cfg LegacyConfig) (*LegacyTable, error) {
	if cfg.MaxIdentities == 0 {
		cfg.MaxIdentities = DefaultMaxIdentities
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultLegacyWindow
	}
	l, err := newRingLayout(cfg.MaxIdentities, cfg.Window, cfg.Shards, "MaxIdentities", "Window", ErrInvalidLegacyConfig)
	if err != nil {
		return nil, err
	}
	t := &LegacyTable{shards: make([]legacyShard, l.shards), layout: l, window: int64(cfg.Window)}
	for i := range t.shards {
		t.shards[i].initLazy()
	}
	return t, nil
}

func (t *LegacyTable) shard(id uint64) *legacyShard { return &t.shards[t.layout.shardOf(id)] }

// inFlightFrom returns id's entry if conn has a copy of it in flight.
func (s *legacyShard) inFlightFrom(id, conn uint64) *legacyEntry {
	slot, ok := s.get(id)
	if !ok {
		return nil
	}
	if e := &s.ring[slot]; e.conn == conn && e.inflight > 0 {
		return e
	}
	return nil
}

// lookup returns the live entry for id, dropping it if it expired.
func (s *legacyShard) lookup(id uint64, now, window int64) *legacyEntry {
	slot, ok := s.get(id)
	if !ok {
		return nil
	}
	e := &s.ring[slot]
	if now-e.seen >= window && e.inflight == 0 {
		s.forget(id)
		return nil
	}
	return e
}

// insert writes a new entry, forgetting the oldest one in its place (see
// ringIndex.push). An entry still in flight can be forgotten too: its
// Commit or Release then finds nothing, which only loses a possible dedup.
func (t *LegacyTable) insert(s *legacyShard, id uint64, e legacyEntry) {
	if old, ok := s.pushGrow(id, e, t.layout.per); ok && e.seen-old.seen < t.window {
		t.evictions.Add(1)
	}
}

// Check decides a legacy batch with identity id (never 0) for partition
// arriving on connection conn (a caller-chosen id, never 0) at now, and
// registers it as in flight when it is new and can be tracked. Decision
// LegacyNew with Tracked false means forward it without Commit or Release:
// an identical batch to another partition is in flight, and one entry per
// identity is kept.
func (t *LegacyTable) Check(id uint64, partition int32, conn uint64, now time.Time) LegacyResult {
	ns := now.UnixNano()
	s := t.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.lookup(id, ns, t.window)
	fresh := legacyEntry{offset: -1, ts: -1, conn: conn, seen: ns, partition: partition, inflight: 1, state: legacyPending}
	newResult := LegacyResult{Decision: LegacyNew, BaseOffset: -1, LogAppendTime: -1, Tracked: true}
	switch {
	case e == nil:
		t.insert(s, id, fresh)
		return newResult
	case e.conn == conn && e.partition == partition:
		// Sent again on the connection its acknowledgement goes to: new
		// data. A client retries only on a new connection (every client
		// measured in docs/clients.md §3 does). Until this copy's
		// outcome is known, a retry of it must not be answered with an
		// earlier copy's offset.
		e.inflight++
		e.seen, e.state, e.offset, e.ts = ns, legacyPending, -1, -1
		return newResult
	case e.inflight > 0 && e.partition == partition:
		return LegacyResult{Decision: LegacyInFlight, BaseOffset: -1, LogAppendTime: -1, From: e.conn}
	case e.inflight > 0 || e.conn == conn:
		// The same records to another partition while they are in
		// flight, or from the connection that has their
		// acknowledgement: new, and the entry stays with the original.
		newResult.Tracked = false
		return newResult
	case e.partition == partition:
		// Appended, acknowledged elsewhere: a retry. This connection now
		// gets the acknowledgement, so the same content sent here again
		// is new.
		e.conn, e.seen = conn, ns
		return LegacyResult{Decision: LegacyDuplicate, BaseOffset: e.offset, LogAppendTime: e.ts}
	case e.conn == 0:
		// Appended to another partition, and the connection its
		// acknowledgement went to has closed: a retry that moved.
		e.conn, e.seen = conn, ns
		return LegacyResult{Decision: LegacyDuplicate, BaseOffset: -1, LogAppendTime: e.ts}
	}
	// The same records to another partition from a live producer
	// elsewhere (a record broadcast to every partition): new, unless the
	// caller finds a retry beside it (Moved). The entry follows the newest.
	if e.state == legacyAppended {
		newResult.Moved, newResult.LogAppendTime = true, e.ts
	}
	*e = fresh
	return newResult
}

// Commit records that the broker appended a batch Check registered from
// conn, at baseOffset (-1 if the response carried none) with logAppendTime
// as the answer to a later duplicate.
func (t *LegacyTable) Commit(id, conn uint64, baseOffset, logAppendTime int64, now time.Time) {
	s := t.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.inFlightFrom(id, conn)
	if e == nil {
		return
	}
	e.inflight--
	e.offset, e.ts, e.seen, e.state = baseOffset, logAppendTime, now.UnixNano(), legacyAppended
}

// MatchRetry reports whether a batch on connection conn that begins with
// the records of batch id, in partition, is a retry of it: id was appended
// there within the window and its acknowledgement did not go to conn. It
// registers and changes nothing; call Adopt once the retry is answered.
func (t *LegacyTable) MatchRetry(id uint64, partition int32, conn uint64, now time.Time) (LegacyResult, bool) {
	s := t.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.lookup(id, now.UnixNano(), t.window)
	if e == nil || e.state != legacyAppended || e.inflight > 0 || e.partition != partition || e.conn == conn {
		return LegacyResult{}, false
	}
	return LegacyResult{Decision: LegacyDuplicate, BaseOffset: e.offset, LogAppendTime: e.ts}, true
}

// Adopt records that batch id's acknowledgement went to connection conn.
func (t *LegacyTable) Adopt(id, conn uint64, now time.Time) {
	s := t.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.lookup(id, now.UnixNano(), t.window); e != nil && e.inflight == 0 {
		e.conn, e.seen, e.unacked = conn, now.UnixNano(), false
	}
}

// Remember records a legacy batch found appended in the log (a warm-up
// from the partition's tail): at baseOffset in partition, maxTimestamp its
// max timestamp (ms). Its acknowledgement belongs to no connection, so an
// identical batch from any connection within the window of that timestamp
// is a retry. A batch the table already holds keeps its state, but learns
// its offset if its response had none. unacked reports, once, a batch its
// client holds no acknowledgement for (Disown): it may resend those records
// in other batches.
func (t *LegacyTable) Remember(id uint64, partition int32, baseOffset, maxTimestamp int64, now time.Time) (unacked bool) {
	ns := now.UnixNano()
	seen := min(ns, maxTimestamp*int64(time.Millisecond))
	if ns-seen >= t.window {
		return false
	}
	s := t.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.lookup(id, ns, t.window); e != nil {
		// An append whose response carried no offset (REQUEST_TIMED_OUT)
		// learns it from the log.
		if e.state == legacyAppended && e.partition == partition {
			if e.offset < 0 {
				e.offset = baseOffset
			}
			unacked, e.unacked = e.unacked, false
		}
		return unacked
	}
	t.insert(s, id, legacyEntry{offset: baseOffset, ts: maxTimestamp, seen: seen, partition: partition, state: legacyAppended})
	return false
}

// Disown records that batch id, appended, was answered to conn with an
// error (REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS_AFTER_APPEND), or that its
// answer could not be delivered (conn's client had gone): the client holds
// no acknowledgement for it, and will retry — so an identical batch from
// any connection is its retry.
func (t *LegacyTable) Disown(id, conn uint64) {
	s := t.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if slot, ok := s.get(id); ok {
		if e := &s.ring[slot]; e.conn == conn && e.inflight == 0 && e.state == legacyAppended {
			e.conn, e.unacked = 0, true
		}
	}
}

// InFlightFrom reports whether batch id is in flight upstream from conn.
func (t *LegacyTable) InFlightFrom(id, conn uint64) bool {
	s := t.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inFlightFrom(id, conn) != nil
}

// Orphan records that connection conn has closed: batches whose
// acknowledgement went there may now be retried to another partition (see
// Check). ids are the identities conn registered recently; an entry that has
// moved on to another connection is left alone, and so is one still in
// flight from conn (its Commit or Release needs conn; call Orphan again once
// conn's responses have drained). The ids still in flight from conn are
// appended to inflight, which is returned.
func (t *LegacyTable) Orphan(conn uint64, ids []uint64, inflight []uint64) []uint64 {
	for _, id := range ids {
		s := t.shard(id)
		s.mu.Lock()
		if slot, ok := s.get(id); ok {
			switch e := &s.ring[slot]; {
			case e.conn == conn && e.inflight == 0:
				e.conn = 0
			case e.conn == conn:
				inflight = append(inflight, id)
			}
		}
		s.mu.Unlock()
	}
	return inflight
}

// Release records that a batch Check registered from conn was not appended,
// or that its fate is unknown (the upstream connection failed): a later
// identical batch is new.
func (t *LegacyTable) Release(id, conn uint64) {
	s := t.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.inFlightFrom(id, conn)
	if e == nil {
		return
	}
	if e.inflight--; e.inflight == 0 && e.state == legacyPending {
		s.forget(id)
	}
}

// Len returns the number of remembered batches, expired ones included until
// they are overwritten or looked up.
func (t *LegacyTable) Len() int {
	n := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		n += s.n
		s.mu.Unlock()
	}
	return n
}

// Evictions returns how many batches were forgotten before their window
// ended because the table was full.
func (t *LegacyTable) Evictions() uint64 { return t.evictions.Load() }
