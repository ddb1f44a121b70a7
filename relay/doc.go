// Package relay moves a session's bytes between a client and its broker
// (docs/produce-path.md, docs/performance.md): what the proxy's
// connections do whatever the decisions.
//
//   - [ConnReader]: each leg's buffered reader, whose buffer is taken from a
//     shared pool only while bytes wait, so an idle connection holds none.
//   - [RequestBuffer] and [RequestPool]: requests read whole, small ones
//     into size-class frames ([GetFrame]), large ones within the
//     request_memory budget; a large Produce may leave its records in pipes
//     (holes, Linux), spliced socket to socket when forwarded
//     ([RequestBuffer.WriteAround]) and read back only when the decision
//     core needs them ([RequestBuffer.FillHoles]).
//   - [Fetch]: large Fetch responses spliced from the broker's socket to
//     the client's; v16+ walked as it passes, its broker addresses
//     rewritten.
//   - [Tracker]: the client connection as the drain and the replicas see
//     it: which requests await a response, which Produce requests a node's
//     drain waits for.
//   - [Queue]: a session's requests awaiting their responses, in request
//     order, bounded by max_inflight (the backpressure).
//   - [PeerGone], [PeerReset], [Unacked]: a connection's TCP state as the
//     kernel holds it (Linux), which a read or a peek cannot see past
//     unread bytes.
//
// It decides nothing: what a request means is the caller's (package
// proxy). Socket deadlines and the budget's waits use the real clock: they
// bound I/O, not decisions.
package relay
