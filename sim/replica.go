package sim

import "time"

// restart stops replica r and starts it again with a new core: memory
// lost, the log kept. A crash loses every answer not yet written; a
// graceful stop drains them first (proxy Shutdown), then closes its
// connections.
func (w *world) restart(r *replica, crash bool) {
	if r.down {
		return
	}
	r.down = true
	downtime := w.Between(50*time.Millisecond, time.Second)
	if crash {
		w.crash(r)
		w.After(downtime, func() { w.restarted(r) })
		return
	}
	r.stopping = true
	for _, s := range r.sessions {
		s.stopReading()
	}
	deadline := w.now + drainTimeout
	var poll func()
	poll = func() {
		busy := false
		for _, s := range r.sessions {
			busy = busy || !s.gone && !s.respEnded
		}
		if busy && w.now < deadline {
			w.After(5*time.Millisecond, poll)
			return
		}
		w.crash(r) // what is left is cut
		w.After(downtime, func() { w.restarted(r) })
	}
	poll()
}

// crash ends every session of r at once: its clients see a reset, and the
// broker's answers to what it forwarded reach no one.
func (w *world) crash(r *replica) {
	for _, s := range r.sessions {
		if s.gone {
			continue
		}
		s.gone = true
		for _, req := range s.inbox {
			w.led.LostAcks0(req, "never read: the proxy crashed")
		}
		s.cn.ProxyCrashed()
	}
	r.sessions = nil
}

func (w *world) restarted(r *replica) {
	r.gen++
	w.restarts = append(w.restarts, w.now)
	r.core = newCore(r.coreName(), w.cfg)
	r.stopping, r.down = false, false
	w.script.restart(r)
}

// stopReading: readLoop ends at its next read; a request waiting for an
// outcome gives up at once (REQUEST_TIMED_OUT).
func (s *session) stopReading() {
	if s.gone {
		return
	}
	if d := s.cur; d != nil && d.waiting {
		d.waiting = false
		d.dreq.GiveUp = true
		s.step(d)
		return
	}
	s.pumpRead()
}

// handOver hands node from the replica serving it to the other: its
// requests are held, and once none of them is in flight upstream the
// legacy state of its partitions moves (HandOff/TakeOver) and the held
// requests are redirected (docs/replicas.md).
func (w *world) handOver(node int) {
	from := w.replicas[w.owner[node]]
	to := w.replicas[1-from.id]
	if from.releasing[node] || from.down || to.down {
		return
	}
	from.releasing[node] = true
	deadline := w.now + drainTimeout
	var poll func()
	poll = func() {
		if from.nodeBusy(node) && w.now < deadline {
			w.After(5*time.Millisecond, poll)
			return
		}
		var parts []int32
		for p, n := range w.broker.Leader {
			if n == node {
				parts = append(parts, int32(p))
			}
		}
		for _, p := range parts {
			w.script.rewarm(to.core, p)
			to.core.rewarm(p)
		}
		w.handovers = append(w.handovers, w.now)
		w.script.handoff(from.core, to.core, parts)
		from.core.handOff(to.core, parts, w.Wall())
		w.owner[node] = to.id
		from.releasing[node], from.released[node] = false, true
		to.released[node] = false
		for _, s := range from.sessions {
			if d := s.cur; d != nil && d.gate && !s.gone && s.cn.Node == node {
				s.redirect(d)
			}
		}
	}
	poll()
}

// nodeBusy: some request of node is being decided or is upstream at r.
func (r *replica) nodeBusy(node int) bool {
	for _, s := range r.sessions {
		if s.gone || s.cn.Node != node {
			continue
		}
		if d := s.cur; d != nil && !d.gate {
			return true
		}
		for _, p := range s.queue {
			if p.up && !p.arrived && !p.failed && !s.upFailed {
				return true
			}
		}
	}
	return false
}
