package sim

import (
	"github.com/dedupproxy/dedupproxy/decide"
	"github.com/dedupproxy/dedupproxy/sim/check"
)

// defaultConfig is the proxy's default configuration of the legacy rule:
// a 2-minute window, client instances, match auto.
var defaultConfig = coreConfig{window: decide.DefaultWindow, scope: decide.ScopeInstance, match: decide.MatchAuto}

// runSeed generates and runs the scenario of seed with cores configured
// with cfg, and checks it. With record, the run also writes its script.
func runSeed(seed uint64, cfg coreConfig, record bool) (*check.Result, *world) {
	w := newWorld(seed, cfg, record)
	ended := w.run()
	return check.Invariants(&check.Run{Seed: w.seed, Ended: ended, MaxSteps: w.maxSteps, Window: w.cfg.window, Faults: w.faults,
		Records: w.led.Records, Requests: w.led.Requests, Clients: w.clients, Broker: &w.broker,
		TailReads: w.tailReads, TailFails: w.tailFails, Restarts: w.restarts, Handovers: w.handovers, Rewarms: w.rewarms,
		Idem: &w.idem}), w
}
