// Package tail reads partitions' tails from the log (docs/warm.md): the
// last records of a partition, read at its leader before the proxy decides
// its first batch since start, and when only the log can tell what became
// of a batch. A [Reader] finds the leader with a Metadata request to a
// bootstrap broker, asks for the log's bounds and the first offset within
// the legacy window (ListOffsets), and fetches whole record batches from
// there to the end, bounded in bytes ([Limits]) and by its context.
//
// It reads on connections of the proxy's own ([Conns]): dialled as the
// proxy dials its brokers (TLS with upstream_tls) and authenticated with
// upstream_sasl. The proxy's other requests of its own use them too: the
// readiness probe, which learns the cluster's brokers and topics
// ([Conns.Metadata]), and the partitions a replica takes
// ([Conns.PartitionsLedBy]).
//
// Deciding is not its business: it returns records, and tells the log
// start offset it learns to the function it is given.
package tail
