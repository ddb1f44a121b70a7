package seqstate

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"runtime"
	"time"
)

// ErrInvalidConfig is returned, wrapped with the reason, by Config.Validate and
// New.
var ErrInvalidConfig = errors.New("seqstate: invalid config")

const (
	// DefaultMaxEntries bounds the table when Config.MaxEntries is zero.
	// Full, at the bytes per entry BenchmarkTableMemory measures with 5
	// retained batches (bench/results/micro.md), it takes about 40 MB.
	DefaultMaxEntries = 1 << 18
	// DefaultRetainedBatches is Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN.
	DefaultRetainedBatches = 5
	// MaxRetainedBatches bounds Config.RetainedBatches: the window lives in
	// a fixed-stride slab of 16-byte slots, is viewed as an array of this
	// length, and its indexes are bytes.
	MaxRetainedBatches = 16
	// DefaultProducerIDExpiration is Kafka's producer.id.expiration.ms
	// default, 86400000 (KIP-854).
	DefaultProducerIDExpiration = 24 * time.Hour
	// DefaultMaxFencedProducers bounds the per-producer epoch floors kept by
	// Table.ObserveInitProducerID when Config.MaxFencedProducers is zero.
	DefaultMaxFencedProducers = 1 << 14
	// DefaultMaxTopics bounds the interned topic names, and separately the
	// interned topic IDs, when Config.MaxTopics is zero. A topic with one ID
	// keeps about 120 bytes plus its name's allocation (BenchmarkInternTopics:
	// 117–135 B per topic with 16-byte name allocations, varying as the
	// tables double), so the default is about 20 MB when full of 32-byte
	// names. It is allocated only as Metadata responses name new topics.
	DefaultMaxTopics = 1 << 17
)

// Config configures a Table. The zero value means all defaults.
type Config struct {
	// MaxEntries caps the number of (producer, topic, partition) entries in
	// the whole table; zero means DefaultMaxEntries. Any shard may hold up
	// to all of them, so a producer with many partitions (all in one shard)
	// does not evict its own entries below the cap. At the cap, an insert
	// evicts the least recently used entry of its own shard, or, if that
	// shard holds none, is allowed: the table then holds at most
	// MaxEntries + Shards - 1 entries (see Table.Len). An evicted producer
	// is unknown, which Kafka accepts with any sequence.
	//
	// Eviction never crosses shards, so the cap is shared first come, first
	// served: while one shard holds most entries, a new producer in another
	// shard evicts that shard's own entries, until the first shard's entries
	// expire or are forgotten. Hashing producer ids over shards keeps this
	// rare unless a few producers hold most entries.
	//
	// A shard's slab and index grow with its entries, and a shard left with
	// fewer than half the entries its slab has handed out compacts, so
	// whichever shards the entries are in (a large producer's move when it
	// restarts with a new producer id), the slabs hold at most about twice
	// the table's entries, plus a partly used page per shard.
	MaxEntries int
	// Shards is the number of independently locked shards, a power of two.
	// Zero means 4*GOMAXPROCS rounded up to a power of two: pebble's rule of
	// thumb, enough shards that two busy goroutines rarely pick the same lock,
	// and a power of two so picking one is a multiply and a shift.
	Shards int
	// RetainedBatches is the number of batches kept per entry, the dedup
	// window, 1..MaxRetainedBatches. Zero means DefaultRetainedBatches (5, as
	// Kafka); more detects older retries than Kafka does.
	RetainedBatches int
	// ProducerIDExpiration is how long an entry with no state change lives,
	// like producer.id.expiration.ms. Zero means DefaultProducerIDExpiration.
	ProducerIDExpiration time.Duration
	// MaxFencedProducers caps the producers whose InitProducerId epoch is
	// remembered (Table.ObserveInitProducerID). Zero means
	// DefaultMaxFencedProducers.
	MaxFencedProducers int
	// MaxTopics caps the topic names, and separately the topic IDs, that
	// Table.InternTopics interns; beyond it nothing new is interned (see
	// Table.TopicsRefused). Zero means DefaultMaxTopics.
	MaxTopics int
}

// EnsureDefaults replaces zero fields with their defaults.
func (c *Config) EnsureDefaults() {
	if c.MaxEntries == 0 {
		c.MaxEntries = DefaultMaxEntries
	}
	if c.Shards == 0 {
		c.Shards = 1 << bits.Len(uint(4*runtime.GOMAXPROCS(0)-1))
		for c.Shards > 1 && c.Shards > c.MaxEntries {
			c.Shards /= 2
		}
	}
	if c.RetainedBatches == 0 {
		c.RetainedBatches = DefaultRetainedBatches
	}
	if c.ProducerIDExpiration == 0 {
		c.ProducerIDExpiration = DefaultProducerIDExpiration
	}
	if c.MaxFencedProducers == 0 {
		c.MaxFencedProducers = DefaultMaxFencedProducers
	}
	if c.MaxTopics == 0 {
		c.MaxTopics = DefaultMaxTopics
	}
}

// Validate reports the first invalid field, wrapping ErrInvalidConfig. Call it
// after EnsureDefaults.
func (c *Config) Validate() error {
	switch {
	case c.MaxEntries < 1 || c.MaxEntries > math.MaxInt32:
		return fmt.Errorf("%w: MaxEntries %d not in [1, 2^31-1]", ErrInvalidConfig, c.MaxEntries)
	case c.Shards < 1 || c.Shards&(c.Shards-1) != 0:
		return fmt.Errorf("%w: Shards %d is not a positive power of two", ErrInvalidConfig, c.Shards)
	case c.Shards > c.MaxEntries:
		return fmt.Errorf("%w: Shards %d > MaxEntries %d", ErrInvalidConfig, c.Shards, c.MaxEntries)
	case c.MaxEntries > math.MaxInt32-c.Shards+1:
		// one shard may hold MaxEntries+Shards-1 entries, indexed by int32
		return fmt.Errorf("%w: MaxEntries %d + Shards %d - 1 > 2^31-1", ErrInvalidConfig, c.MaxEntries, c.Shards)
	case c.RetainedBatches < 1 || c.RetainedBatches > MaxRetainedBatches:
		return fmt.Errorf("%w: RetainedBatches %d not in [1, %d]", ErrInvalidConfig, c.RetainedBatches, MaxRetainedBatches)
	case c.ProducerIDExpiration <= 0:
		return fmt.Errorf("%w: ProducerIDExpiration %v <= 0", ErrInvalidConfig, c.ProducerIDExpiration)
	case c.MaxFencedProducers < 1:
		return fmt.Errorf("%w: MaxFencedProducers %d < 1", ErrInvalidConfig, c.MaxFencedProducers)
	case c.MaxTopics < 1 || c.MaxTopics > math.MaxInt32:
		return fmt.Errorf("%w: MaxTopics %d not in [1, 2^31-1]", ErrInvalidConfig, c.MaxTopics)
	}
	return nil
}
