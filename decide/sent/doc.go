// Package sent is the decision core's memory of legacy records: per client
// instance, the batches its connections sent that a retry may still need
// (docs/legacy.md, "The rule"), each with its records' identities and
// offsets, found by record in O(1) (index.go), and bounded in all, per
// principal and per instance (shares.go; docs/security.md, "Fair
// shares"). Package decide applies the rule; sent only keeps what the rule
// looks at.
//
// A Store holds one Instance per client instance (the principal, client
// id and, with decide.ScopeInstance, host of a connection's client); an
// Instance holds its connections (Conn), each with the batches it sent
// (Batch) oldest first, the batches not yet answered, by partition, and
// the batches whose acknowledgement its client may not hold (disowned),
// each until its window ends. A batch's state is its Phase (in flight,
// appended, appended with offsets the log may tell, unknown), its Answer
// (not written, written, written late) and its Conn (nil once disowned).
//
// # Contract
//
//   - Pure, as decide is: no I/O, logging, metrics, goroutines, channels
//     or clock; time (ns) is an argument (decide's TestContract checks
//     this package too).
//   - An instance's lock is its own (Instance.Lock); methods that take it
//     themselves say so, the others are called with it held. The store's
//     shards lock only their maps, before an instance's, never after.
//   - Bounded: records (Store.MaxRecords, shared fairly), instances (64 Ki),
//     a connection's answered requests (1,024); past a bound a batch is
//     forgotten, which costs a missed retry, never a wrong answer.
package sent
