// Package decide is the proxy's decision core for Produce requests: for
// each batch, forward it, forward it without the records it repeats, answer
// it here, or wait for an outcome it needs — for idempotent producers by
// Kafka's rules (docs/kafka-rules.md §12, through seqstate), for legacy
// producers by one record-level rule scoped to the client instance
// (docs/legacy.md).
//
// It has one entry point, Core.Step (docs/produce-path.md, "Events in,
// effects out"): sessions tell it facts (an Event: a connection
// authenticated or ended, a request scanned, the broker's answer or its
// loss, an answer about to be written, a log read, a node handed over) and
// carry out what it returns (Effects, and for a request the Plan, whose
// Status says to carry it out, wait for a wake, read partitions' logs, or
// read record bytes held in pipes). Every event that may unblock a waiting
// request names the connections to wake. The same events in the same order
// at the same times give the same effects.
//
// # Contract
//
//   - Pure: no I/O, no logging, no metrics, no goroutines, no channels, no
//     clock — time is an argument (now), never time.Now; no sleeping or
//     timers. Imports only the standard library, protocol, seqstate, its
//     store of legacy records (package sent, under the same contract) and
//     franz-go's error codes (TestContract enforces all of this).
//   - Its locks are its own, one at a time: each step takes the locks it
//     needs one after the other (a client instance's, a partition shard's,
//     a table shard's), never two at once, and holds none when it returns,
//     so no lock is shared with I/O (docs/architecture.md, "Locks"; a
//     lockcheck build checks it). What a request waits for is registered
//     under the lock of the state that settles it. A client instance's
//     lock is its alone, and record identities are computed before any
//     lock is taken: the work a request causes is paid by its own client
//     instance.
//   - Settled before woken: an event updates every state a waiter looks at
//     before it names the waiter to wake (TestWaitersNeverMissAnOutcome).
//   - Bounded: the legacy records remembered (Config.MaxRecords, shared
//     fairly between principals and client instances: package sent), client
//     instances (64 Ki), partitions (256 Ki), log records per partition and
//     unknown outcomes per partition are capped; past a cap the core forgets,
//     which costs a missed retry, never a wrong answer. Identical records
//     cost O(1) each in every index (sent's record index, a partition's log
//     chains).
//   - No allocation on the steady legacy path (TestLegacyNoAllocs).
//
// Its tests are datadriven scripts in testdata/, one per rule and per
// client retry shape, each citing docs/legacy.md.
package decide
