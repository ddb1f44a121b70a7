// Package seqstate decides, for each idempotent Produce batch, what a Kafka
// partition leader would decide: accept it, answer it as a duplicate with the
// original offsets, or reject it as out of order or fenced. The rules, and the
// Kafka source each comes from, are in docs/kafka-rules.md (§1–§4 and §6);
// comments cite the Kafka function beside each rule.
//
// # Contract
//
//   - Deterministic: the same calls in the same order give the same results.
//   - No I/O and no clock: time is an argument (now), never time.Now.
//   - Imports only the standard library and golang-lru/v2's simplelru (for
//     the small, rarely used InitProducerId epoch floors); no prometheus, slog
//     or net (TestImports enforces this). Counters are plain getters for the
//     proxy to wrap in GaugeFunc/CounterFunc.
//   - No allocation for a known key: Check, Decide, Commit and Abort of a
//     producer-partition the table holds allocate nothing, nor do their
//     per-request forms (CheckBatches, DecideBatches, SettleBatches, on
//     caller-owned slices), LookupTopic and LookupTopicID. A new key allocates only when its
//     shard's slab needs a new or larger page or its index doubles, and a removal only
//     when it leaves the shard's slab less than half used, which compacts
//     the shard into a smaller index (amortized, never per key). The one
//     exception is rare: a Commit whose offset or timestamp lies more than
//     2^31 from the others in its window may insert into the shard's wide
//     map (see Layout).
//
// # Layout
//
// The decision core (entry.go) works on one entry's memory: no locks, no
// clock, no allocation. An entry is the epoch plus a ring of the last
// RetainedBatches batches (5, Kafka's NUM_BATCHES_TO_RETAIN), each with its
// sequence range, original base offset and max timestamp, records
// fingerprint, and a pending flag. Table (table.go) shards entries by producer
// id; each shard, under its own mutex, is an intrusive LRU: entries live in
// pointer-free slabs, linked by int32 slab indexes, and an open-addressing
// index of uint32 words maps a Key to its slab index. It bounds the entry
// count, expires idle entries and counts both.
//
// The bound, Config.MaxEntries, is table-wide: any shard may grow until the
// table holds MaxEntries entries, so one producer, whose partitions all share
// its shard, can use the whole table. At the cap, an insert evicts the least
// recently used entry of its own shard (the only lock it holds); an insert
// into a shard with no entry is allowed, so the table holds at most
// MaxEntries + Shards - 1 entries, even under concurrent inserts (the proof
// is at shard.insert). Eviction never crosses shards: while one shard holds
// most of the table, producers in the others evict among themselves until
// its entries expire. Since any shard may grow that large, a shard whose
// entries drop below half of what its slab has handed out compacts (moves
// its entries down, drops the unused pages, rebuilds a smaller index), so
// the memory follows the entries from shard to shard instead of keeping
// every shard's high-water mark.
//
// golang-lru's simplelru under the shard lock was the first version. It was
// replaced because it missed the table's speed and memory targets and cost
// most of both budgets: its list element (80 B) and map slot
// (~40 B) were 120 of the 312 B per entry (5 retained batches,
// BenchmarkTableMemory), and its Get (~23 ns, a map lookup plus list
// splicing through pointers) was paid by both Check and Commit. The intrusive
// LRU keeps the same exact least-recently-used order (the model test checks
// it entry by entry) in 8 bytes of links plus ~8 bytes of index per entry;
// see BenchmarkCheckCommit and BenchmarkTableMemory for the figures.
//
// A retained batch takes 16 bytes, half its plain form (first and last
// sequence, base offset, max timestamp, fingerprint):
//
//   - Only its last sequence is kept. A window is contiguous, each batch
//     starting one after its predecessor's last sequence, so the header keeps
//     the oldest batch's first sequence and the rest follow. Check and Commit
//     only ever append a batch that follows the tail, except at epoch -1,
//     which accepts any sequence; there a batch that jumps replaces the window
//     (see entry.push).
//   - The fingerprint is 32 bits (see Batch.Fingerprint).
//   - The base offset and max timestamp are 32-bit deltas from two per-entry
//     bases, since a producer's last few batches to one partition lie close
//     together in both. Exactness is never traded for it: -1 has its own
//     code; a value that does not fit moves the bases to it and re-encodes
//     the window; a slot that still does not fit keeps its exact values in a
//     per-shard wide map (marked in the slot, removed with it), which stays
//     empty in normal operation. TestTableVsModelWideValues drives the table
//     with offsets and timestamps spread across the int64 range.
//
// A window also spans at most 2^31-1 sequences, so that no two of its
// batches share a range and a producer's next batch (first sequence right
// after the tail) can be accepted without scanning the window. Only batches
// of hundreds of millions of records reach that; the oldest batches are then
// dropped. Both rules only ever drop batches Kafka would still retain: the
// table then knows less than the broker, never something else, and a retry
// of a dropped batch is forwarded for the broker to answer.
//
// Memory per entry, 5 retained batches, 1M entries (BenchmarkTableMemory):
// 312 B with simplelru and 32-byte slots, 189 B with the intrusive LRU and
// 24-byte slots, now what bench/results/micro.md gives for
// TableMemory/entries=1M/retained=5: a 56-byte header (key 16, last-seen time 8,
// the two bases 16, LRU links 8, the window's first sequence 4, epoch and
// ring position 4), 5×16 bytes of slots, ~8.4 bytes of index (uint32 words,
// at most 3/4 full, power-of-two sized) and partly used slab pages.
// Full pages hold 4096 entries (~557 KB with 5 retained batches); a shard's
// first page starts at 8 entries and doubles, so a shard holding a few
// entries costs about 1.3 KB, not a full page (BenchmarkTableFresh: a default
// table with 64 producers' entries over its 8 shards takes 17.5 KB of heap,
// 4.5 MB with full first pages).
// The index does not keep each key's hash: it is recomputed (a multiply)
// when words move. With RetainedBatches 1 an entry is 83.6 B.
//
// A later target, 100 B with 5 retained batches, is not met:
// without giving up exactness it would take bit-packing nearly every field
// with escapes, which the hot path pays for on every batch. A slot must tell a
// duplicate's answer and the checks: a 32-bit fingerprint, the last
// sequence, the offset, the timestamp and the pending flag, 9 to 13 bytes
// even bit-packed around escapes for values that do not fit. The header
// must keep the key, the links of the exact LRU order, the last-seen time
// in nanoseconds, the window's first sequence and epoch, and the two bases.
// Even 12-byte slots (16-bit deltas, which send the windows of busy
// partitions and idle producers to the wide map at 30-50 bytes a slot) give
// ~128 B; 100 B would also take 28 of the header's 56 bytes.
// docs/performance.md (the decision table) lists each idea with its figure.
//
// # Speed
//
// A Produce request's batches all carry its producer id, so they all live
// in one shard. CheckBatches decides them in one acquisition of its lock and
// SettleBatches applies the broker's outcomes in another, where Check and
// Commit took it once per batch each; the decision core (decide) uses them. Neither
// holds the lock beyond its call: the caller forwards and waits with no lock
// held. BenchmarkRequest, a known producer's request of 1 or 8 batches
// (one per partition) decided then settled, takes a median of 48 and 50 ns
// per batch (15 alternated runs on the shared 2-core VM; minimums 46 ns),
// against a target of 50 ns. BenchmarkCheckCommit, the per-batch methods
// (two lock pairs), took 52 ns on the code before the per-request API and
// 47 ns after in the same runs (61–65 ns in earlier, noisier ones).
//
// Where the time goes (-cpuprofile): with 1 batch, the lock pair
// (BenchmarkShardLockFloor, ~25 ns, each lock operation an atomic
// read-modify-write) is half of it and the decision (appendNext, then
// commitNewest: the common case without the general path's scan) most of
// the rest. With 8 batches the lock costs ~3 ns a batch, but each batch
// misses the most-recently-used shortcut (the request names 8 keys in turn),
// so its check and its commit each hash the key, probe the index and move
// the entry to the front of the LRU: about a third of the time is the probe
// with the slab address arithmetic, an eighth the LRU relinking. The probe
// hands its view of the entry to the LRU update, so the slab addresses are
// computed once per lookup. Hashing is a multiply (~2%), and time is
// converted once per call.
//
// # Topics
//
// A Key names its topic by a TopicID, a dense uint32. The proxy interns the
// topics of every Metadata response the broker answered with error 0
// (Table.InternTopics) and looks up each Produce partition's topic, by name
// (LookupTopic, Produce v3–v12) or by 16-byte topic ID (LookupTopicID, v13+).
// Both map to the same TopicID: a topic ID interned with a name maps to that
// name's TopicID. A new ID for a name that had another (the topic was
// deleted and recreated) starts a new TopicID, so no state of the old topic
// applies to the new one. A topic never interned is
// not found, and its batches get no decision (forward them): the hot path
// never interns, so clients cannot grow the table by naming topics.
//
// Lookups take no lock and allocate nothing: names and IDs are in two
// append-only hash tables whose slots are atomic pointers to immutable
// entries, each grown by doubling under the writers' mutex, so a new name
// costs amortized O(1), not a copy of every name interned so far (see
// BenchmarkInternTopics). At most Config.MaxTopics names and as many IDs are
// interned, at about 120 bytes per topic plus its name; refusals are counted
// (Table.TopicsRefused). Nothing is ever removed.
//
// # State
//
// The state is per (producer id, topic, partition), as in Kafka
// (ProducerStateManager is per partition). A key with no entry — never seen,
// evicted, expired or forgotten — is unknown, and Kafka ≥ 2.5 accepts an
// unknown producer with any sequence, so bounding memory can never make the
// proxy reject what the broker would accept. It only costs dedup.
//
// Accepted batches are pending until the upstream confirms them: they are the
// tail the next batch must follow (clients pipeline up to 5), and an identical
// batch meanwhile is InFlight, never forwarded twice. Duplicates are found
// among committed batches only, as Kafka checks its committed state.
//
// # Commit and Abort
//
// Commit marks a pending batch committed with its offsets. A batch the table
// does not hold as pending is applied as the broker applied it (the broker
// appended it, so its state changed): a lower epoch than the entry's is
// ignored, a higher epoch restarts the window, the same epoch is appended if
// it follows the tail, an unknown key gets a new entry; otherwise the entry is
// forgotten.
//
// Abort drops a pending batch the broker did not append and every batch
// registered after it; the next expected sequence falls back to the batch
// before it. The later pending batches will be rejected by the broker as out
// of order (their predecessor is missing), so dropping them keeps the table
// where the broker is; their own Abort is a no-op. If that leaves no batch,
// or if a committed batch followed the aborted one, the entry is forgotten:
// the table no longer knows the broker's state, and unknown is always safe.
// SettleBatchesDropped names the pending batches an abort, or a forgotten
// entry, took with it: they may still be on their way to the broker, and the
// caller may wait for their answer before deciding a retry of one.
//
// CommitLogged is Commit for a batch read back from the log, which replays a
// producer's batches from the oldest: one that ends before the window's first
// sequence changes nothing (Commit would forget the entry), and one the
// window holds committed without an offset takes the log's.
//
// # Fingerprints
//
// Kafka matches duplicates on (epoch, first sequence, last sequence) only.
// kafkajs reuses sequences for different records after a failed send, so the
// table also compares a caller-supplied records fingerprint: a match with a
// different fingerprint is SequenceReuse, which the proxy answers with
// OUT_OF_ORDER_SEQUENCE_NUMBER rather than a success that would lose records.
// Fingerprint 0 means unknown and is never compared.
//
// # Where the table differs from a broker
//
//   - Expiry uses the proxy's clock at the last state change (now passed to
//     Check or Commit), not the batch's maxTimestamp, which on CreateTime
//     topics is client-supplied (docs/kafka-rules.md §6.1). A caller that
//     wants Kafka's rule can pass the batch's maxTimestamp as now to Commit.
//   - Pending batches occupy window slots, so while k batches are in flight
//     only the last RetainedBatches-k committed ones are duplicates. Every
//     batch a client may retry is unacknowledged, and clients keep at most 5
//     of those per partition, so RetainedBatches ≥ 5 loses none of them.
//   - A window is contiguous and spans fewer than 2^31 sequences (see
//     Layout), so at epoch -1 a batch that jumps, or a batch of hundreds of
//     millions of records, drops older batches Kafka would still retain.
//   - SequenceReuse and ObserveInitProducerID are deliberate, documented
//     differences (see Decision and Table.ObserveInitProducerID).
//   - The table knows only what passed through it: after a proxy restart a
//     producer is unknown, where the broker still has its last batch.
//
// # Usage
//
//	t, err := seqstate.New(seqstate.Config{}) // defaults: 5 batches, 24h expiry
//	if err != nil { ... }
//	// on every Metadata response, its topics with error 0:
//	t.InternTopics([]seqstate.TopicRef{{Name: name, ID: topicID}, ...})
//	// on every Produce partition:
//	topic, ok := t.LookupTopic(name) // or t.LookupTopicID(id) for v13+
//	if !ok { ... } // unknown topic: forward, no decision
//	k := seqstate.Key{ProducerID: pid, Topic: topic, Partition: p}
//	b := seqstate.Batch{Epoch: epoch, FirstSeq: baseSeq, Count: lastOffsetDelta + 1, Fingerprint: fp}
//	switch r := t.Check(k, b, now); r.Decision {
//	case seqstate.Accept:
//		// forward; on the response:
//		//   appended (error 0, 7 or 20): t.Commit(k, b, baseOffset, maxTimestamp, now)
//		//   otherwise:                   t.Abort(k, b)
//	case seqstate.Duplicate:
//		// answer error 0, base_offset r.BaseOffset, log_append_time_ms r.MaxTimestamp
//	case seqstate.InFlight:
//		// wait for the pending original's outcome and answer with it
//	case seqstate.OutOfOrder, seqstate.SequenceReuse:
//		// answer OUT_OF_ORDER_SEQUENCE_NUMBER (45)
//	case seqstate.Fenced:
//		// answer INVALID_PRODUCER_EPOCH (47)
//	case seqstate.Invalid:
//		// answer INVALID_RECORD (87)
//	}
//	// or per Produce request, whose batches share a producer id: one
//	// shard lock to decide them all, one to apply their outcomes
//	ops = append(ops[:0], seqstate.Op{Key: k, Batch: b}, ...) // caller-owned, reused
//	t.CheckBatches(ops, now) // ops[i].Result as from Check
//	// on the response, for each forwarded batch:
//	outs = append(outs[:0], seqstate.Outcome{Key: k, Batch: b, Appended: true, BaseOffset: off, MaxTimestamp: ts}, ...)
//	t.SettleBatches(outs, now) // Commit if Appended, else Abort
//	// periodically, e.g. every producer.id.expiration.check.interval.ms (10 min):
//	t.Expire(now)
package seqstate
