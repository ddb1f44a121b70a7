// Package check judges a simulation run (docs/simulation.md, "The
// invariants"): the invariants over what a finished run recorded (Run: the
// clients' Ledger, the broker's logs, when restarts, handovers and tail
// reads happened), each record written twice, dropped or answered with
// another's offset put under a Shape — one the rule covers fails the run,
// a documented miss is counted — and a Table of the counts over runs. Idem
// follows the idempotent batches as each request is decided (invariants 4
// and 6), against the broker as it is at that moment.
//
// # Contract
//
//   - It reads a run and changes nothing of it, and never steps the core:
//     the same run gives the same Result.
//   - A new shape needs its row in docs/simulation.md and a bound in
//     sim/sim_test.go.
package check
