package decide

import (
	"sync"

	"github.com/dedupproxy/dedupproxy/decide/internal/lockcheck"
	"github.com/dedupproxy/dedupproxy/decide/sent"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// partition is what the core knows of one partition beyond its producers:
// whether its tail was read since the proxy started, who waits on it, the
// log start offset its answers carry, the legacy records read back from its
// log, and the legacy batches whose outcome only its log can tell.
type partition struct {
	warm     warmState
	warmed   bool         // its first read since start is done (or failed)
	waiters  sent.Waiters // requests waiting on an event here
	logStart int64        // -1 unknown
	seen     int64        // the highest base offset answered for it, -1 none
	// log holds the legacy records read back from the tail, in log order,
	// for a restart (docs/legacy.md, "After a restart"); logIdx indexes
	// them by hash.
	log      []logRec
	logIdx   map[uint64]int32 // hash of (record, timestamp) -> first index+1 in log, chained by next
	logUntil int64            // ns: the last until in log; past it, log is let go
	// unknown lists batches whose outcome is unknown (the broker connection
	// broke) or appended without an offset: the next read of the tail
	// settles them.
	unknown []sent.Ref
	// flying lists idempotent batches on their way to the broker that the
	// table no longer holds as pending (flying.go).
	flying []flyingBatch
}

type warmState uint8

const (
	cold    warmState = iota // not read since start
	reading                  // a session reads it now
	warm                     // read (or the read failed: decided without)
)

// logRec is one legacy record read back from the log.
type logRec struct {
	hash  uint64 // the record's hash mixed with its timestamp
	off   int64
	until int64 // ns: its timestamp plus the window
	next  int32 // next index+1 with the same hash in logIdx's chain, 0 for none
	taken bool  // matched by a resend already: each answers one
}

type partitions struct {
	shards [partShards]partShard
}

const partShards = 64

type partShard struct {
	mu sync.Mutex
	m  map[seqstate.Key]*partition // key: TopicID and Partition only
	_  [48]byte
}

func (sh *partShard) lock()   { lockcheck.Take("partition shard"); sh.mu.Lock() }
func (sh *partShard) unlock() { sh.mu.Unlock(); lockcheck.Drop() }

func (ps *partitions) init() {
	for i := range ps.shards {
		ps.shards[i].m = map[seqstate.Key]*partition{}
	}
}

func partKeyOf(topic seqstate.TopicID, p int32) seqstate.Key {
	return seqstate.Key{Topic: topic, Partition: p}
}

func (ps *partitions) shard(k seqstate.Key) *partShard {
	h := (uint64(k.Topic)<<32 | uint64(uint32(k.Partition))) * 0x9e3779b97f4a7c15
	return &ps.shards[h>>(64-6)]
}

// get returns k's partition with its shard locked; the caller unlocks.
// maxParts bounds the map: past it a shard is cleared, which costs a warm-up
// and the log records kept, never a wrong decision.
func (ps *partitions) get(k seqstate.Key) (*partition, *partShard) {
	sh := ps.shard(k)
	sh.lock()
	p, ok := sh.m[k]
	if !ok {
		if len(sh.m) >= maxPartsPerShard {
			for victim, vp := range sh.m {
				if len(vp.waiters) == 0 && len(vp.unknown) == 0 && len(vp.flying) == 0 && vp.warm != reading {
					delete(sh.m, victim)
					break
				}
			}
		}
		p = &partition{logStart: -1, seen: -1}
		sh.m[k] = p
	}
	return p, sh
}

// maxPartsPerShard bounds the partitions remembered (256 Ki in all).
const maxPartsPerShard = 4096

// await registers conn as waiting on p; call with p's shard locked.
func (p *partition) await(conn ConnID) { p.waiters.Add(conn) }

// event appends p's waiters to wake; call with p's shard locked.
func (p *partition) event(wake []ConnID) []ConnID { return p.waiters.Take(wake) }

// wakePartition signals an event on partition k.
func (c *Core) wakePartition(k seqstate.Key, wake []ConnID) []ConnID {
	p, sh := c.parts.get(k)
	wake = p.event(wake)
	sh.unlock()
	return wake
}

// unwait removes conn from the waiters of the partitions it may wait on.
func (c *Core) unwait(conn ConnID, keys []seqstate.Key) {
	for _, k := range keys {
		p, sh := c.parts.get(k)
		for i, w := range p.waiters {
			if w == conn {
				p.waiters = append(p.waiters[:i], p.waiters[i+1:]...)
				break
			}
		}
		sh.unlock()
	}
}

// LogStart returns the last log start offset seen for a partition, -1 when
// unknown.
func (c *Core) LogStart(topic seqstate.TopicID, partition int32) int64 {
	p, sh := c.parts.get(partKeyOf(topic, partition))
	defer sh.unlock()
	return p.logStart
}

// SetLogStart records a partition's log start offset, for the answers the
// proxy gives (Kafka's carry the current one).
func (c *Core) setLogStart(topic seqstate.TopicID, partition int32, v int64) {
	if v < 0 {
		return
	}
	p, sh := c.parts.get(partKeyOf(topic, partition))
	p.logStart = v
	sh.unlock()
}

// Rewarm makes a partition read its tail again before its next decision,
// as on its first since start: its leadership moved to a broker another
// proxy decides for, and batches written meanwhile are known only to the
// log. A read under way is left to finish.
func (c *Core) rewarm(topic seqstate.TopicID, partition int32) {
	p, sh := c.parts.get(partKeyOf(topic, partition))
	if p.warm == warm {
		p.warm, p.warmed = cold, false
	}
	sh.unlock()
}

// Warm reports whether a partition's tail has been read since start (or
// its read failed, and it is decided without).
func (c *Core) Warm(topic seqstate.TopicID, partition int32) bool {
	p, sh := c.parts.get(partKeyOf(topic, partition))
	defer sh.unlock()
	return p.warm == warm
}
