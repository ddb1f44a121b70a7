// Package owner is a replica's ownership of broker nodes (docs/replicas.md)
// as a pure state machine: which node this replica decides, which it hands
// over, which it takes, and when it is ready. The replicas' HTTP, the
// drain of Produce requests in flight, the legacy state exchange and the
// logs and metrics live in the proxy, which feeds the machine events and
// carries out the effects it returns (raft's shape):
//
//	m := owner.New(owner.Config{Self: 1, Count: 3, ...}, now)
//	effects := m.Step(owner.PeerStatus{Peer: 0, Status: st}, now)
//	for _, e := range effects { ... }          // SetState, Drain, Take, WakePeers, ...
//	m.Step(owner.Drained{Node: 4}, now)        // what a Drain effect asked for
//	if at, ok := m.Deadline(); ok { ... }     // Step(owner.Tick{}, at) then
//
// Events are facts: a node first seen, a peer's status read, a peer that did
// not answer, a node's drain finished, a node's take finished, the handover
// asked for (SIGTERM), a redirect answered, time passed. Effects are commands
// and notes: a node's new state, drain a node, take a node from a peer, a
// node moved (counted), wake the peers, advertise nodes elsewhere, a phase
// changed, a peer changed, the handover began and ended.
//
// # Vocabulary
//
// A handover is one node moving from the replica that decides it to another:
// the giver releases it (drains what it forwarded, then publishes it as
// released), the receiver takes it (marks its partitions to warm from the
// log and takes its legacy state from the giver), then serves it. A take by
// a replica that does not own the node is a cover; a take by its owner, back
// from the peer that covered it, is a take-back (the metric label is
// "reclaimed"). The proxy's decision core calls its two halves of a
// handover's legacy state decide.Core.HandOff (the giver's) and TakeOver
// (the receiver's).
//
// # Contract
//
//   - Pure and deterministic: no I/O, no logging, no metrics, no goroutine,
//     no channel, no clock (time is an argument), no lock; the same events
//     at the same times give the same effects (TestContract, the scripts).
//   - Not safe for concurrent use: the caller serialises Step and every
//     query.
//   - Every wait has a bound: Deadline says when the machine next needs a
//     Tick (a release's drain, a take-back that peers do not let go, the
//     handover's end).
//
// Its tests are datadriven scripts in testdata/, one per transition and per
// handover ordering.
package owner
