// Package audit finds the duplicates a Kafka topic already holds, so a team
// can measure the problem before it deploys the proxy and check afterwards
// that it stopped (dedupproxy audit; docs/audit.md).
//
// Two kinds of copies are found:
//
//   - content copies: a record identical to an earlier one of the same
//     topic in key, value and headers (in order), whose timestamp is at most
//     Settings.Window after the earlier one's. That is what a producer's
//     retry writes (docs/legacy.md); a record written again later than the
//     window is not counted. The two may be in different partitions (a
//     client may send its retry to another one).
//   - key repeats: a record whose idempotency key header (Settings.KeyHeader)
//     carries a value an earlier record carried at most Settings.KeyWindow
//     before it, whatever the rest of the record holds.
//
// Only the log is read, so the audit cannot tell a retry from a record a
// producer meant to write twice (two identical heartbeats): its examples
// are there to be read. Nor does it know clients: records of different
// producers count as copies of each other when identical (the producer ids
// are reported, -1 for producers without idempotence).
//
// [Finder] is the decision, pure: records in, counts out, time taken from
// the records' own timestamps, no I/O, the same input giving the same
// report. [Scan] feeds it from a cluster with a franz-go consumer.
//
// Memory is bounded: each of the two tables remembers at most
// Settings.MaxTracked records (about 100 bytes each, see [BytesPerTracked]),
// the oldest forgotten first; a record forgotten before its window ended
// is counted in Report.Forgotten, and then the counts are a lower bound.
// Everything else is bounded by the partition count, Settings.Examples and
// maxProducers.
package audit
