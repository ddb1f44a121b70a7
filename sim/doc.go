// Package sim judges the legacy rule (docs/legacy.md) by simulation
// (docs/simulation.md): a seeded, deterministic run drives decide.Core as
// the proxy's session does (docs/produce-path.md) — no sockets, no
// goroutines, a virtual clock — with client models of every retry shape
// seen in the wild, a broker model with a reference of Kafka's idempotence
// rules, one or two proxy replicas and a schedule of faults; then it checks
// invariants over the log and what each client was told.
//
// Package sim is the world a run happens in: the scenario a seed generates
// (scenario.go), the virtual clock and the seeded source (world.go), the
// proxy's replicas and their sessions stepping the core (proxy.go,
// replica.go, adapter.go) and the script a run writes (script.go). What it
// drives lives in packages below it, each importing only those listed
// under it (and decide, protocol, seqstate):
//
//	sim         the world: scenario, clock, replicas and sessions, the core adapter, the script
//	sim/check   the invariants and shapes, over a finished run
//	sim/client  client models, their connections through the network, the ledger
//	sim/kafka   batches as clients write them, the broker and Kafka's rules
//
// # Contract
//
//   - One seed is one scenario, and the same seed the same run, bit for bit
//     (TestSimulationDeterministic): one goroutine per run, a seeded source,
//     events ordered by time and then by the order they were scheduled.
//   - The core is called only from adapter.go, one method per event the
//     session hands it.
//   - A run can print its script in decide/testdata's format, which
//     replays its decisions against the core alone.
//
// Run it with go test ./sim -run TestSimulation -args -seeds=N -seed=S.
package sim
