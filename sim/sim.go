package sim

// runSeed generates and runs the scenario of seed and checks it. With
// record, the run also writes its script.
func runSeed(seed uint64, record bool) (*result, *world) {
	w := newWorld(seed, record)
	ended := w.run()
	return w.check(ended), w
}
