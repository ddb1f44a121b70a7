// Package kafka is the simulation's Kafka cluster (docs/simulation.md,
// "The cluster"): records and batches as clients write them, built byte
// for byte as decide's scripts build them (decide/script_test.go), and the
// broker: each partition's log and leader, and a reference model of
// Kafka's idempotence rules (docs/kafka-rules.md §3) that appends a batch,
// refuses it or answers it as a duplicate, and says what the broker would
// answer a batch the proxy answered itself.
//
// # Contract
//
//   - Pure: no clock, no random source, no goroutines. The world decides
//     when a batch reaches the broker and applies the broker's faults (a
//     node slower than the clients, REQUEST_TIMED_OUT after an append)
//     around Broker.Produce.
//   - A record's lid (Lid) is the simulation's hidden truth: the record a
//     client means to write once. The log keeps it beside the bytes for
//     the checks; the bytes, all the core ever reads, do not carry it.
//   - It imports no other package of the simulation.
package kafka
