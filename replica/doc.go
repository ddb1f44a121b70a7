// Package replica is a replica's side of the replica protocol
// (docs/replicas.md). R copies of the proxy each own a share of the broker
// nodes; a node's Produce requests are decided by one replica at a time,
// the one that serves it. Ownership is fixed by configuration
// (config.Layout); serving moves only by a handover between two replicas,
// which each publishes in its status (GET /replica on its admin listener)
// and reads in its peers'. No replica takes a node on suspicion: one that
// cannot be reached is taken to decide nothing, and its nodes wait for it.
//
// Who decides which node is the pure machine of package owner; [Set] is
// its shell: it reads the peers' statuses over HTTP and feeds them to the
// machine, with the drains, takes and ticks it asks for, and carries out
// its effects (the node states the Produce path reads, advertised
// addresses, wake-ups, logs and metrics). It owns two decisions of the
// Produce path: whether a request for a node in motion is forwarded, held
// or redirected ([Set.Hold]), and when a node's drain has ended
// ([Node.CheckDrained]). The legacy state that moves with a node travels
// over POST /replica/legacy (legacy.go); what it does to the decision core
// goes through [Core].
package replica
