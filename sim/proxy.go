package sim

import (
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/dedupproxy/dedupproxy/decide"
	"github.com/dedupproxy/dedupproxy/sim/client"
	"github.com/dedupproxy/dedupproxy/sim/kafka"
)

// The proxy, as proxy/session.go and proxy/produce.go carry out the core's
// decisions (docs/produce-path.md), with no sockets and no goroutines:
// each session's readLoop and responseLoop are state machines stepped by
// the world's events.

// Timings the proxy's configuration sets (their defaults).
const (
	maxInflight  = 256              // max_inflight
	drainTimeout = 30 * time.Second // drain_timeout
	warmTimeout  = 5 * time.Second  // dedup.warm.timeout
)

// replica is one proxy process and its core.
type replica struct {
	w        *world
	id       int
	core     *core
	gen      int  // restarts so far
	down     bool // restarting: connections are refused
	stopping bool // draining before a restart
	sessions []*session
	// releasing: nodes being handed to the other replica; their requests
	// are held, then redirected (proxy/handover.go, replicaGate).
	releasing map[int]bool
	released  map[int]bool
}

// session is one client connection at the proxy.
type session struct {
	w     *world
	r     *replica
	k     *core
	cn    *client.Conn
	gone  bool // its process is gone (a crash): nothing of it runs again
	dconn *decide.Conn

	// readLoop
	inbox      []*client.Request
	finIn      bool // the client's end of stream is behind the inbox
	rstIn      bool // reset: reads fail
	cur        *deciding
	blocked    bool // the queue is full
	readEnded  bool
	clientLeft bool
	wakeSet    bool // a wake arrived while nothing waited (the proxy's buffered wake channel)
	inRead     bool
	inResp     bool

	// responseLoop
	queue          []*pending
	upFailed       bool
	dead           bool
	disconnected   bool
	closed         bool // closeAll
	respEnded      bool
	writesAfterFin int

	// The upstream connection: the broker handles its requests in order.
	upFree    time.Duration
	upResp    time.Duration
	upCutAt   time.Duration // the broker connection broke; 0: never
	drainTick int
}

// deciding is a request in decideProduce's loop.
type deciding struct {
	req        *client.Request
	dreq       decide.Request
	pl         *decide.Plan
	round      int
	waited     bool
	held       bool
	waiting    bool // for a wake or until
	tails      int  // reads still under way
	tailsUntil time.Duration
	gate       bool // held by a node's release
	token      int  // invalidates stale timers
}

// pending is a request queued for its answer.
type pending struct {
	req     *client.Request
	pl      *decide.Plan       // nil for an answer the replica gate gave
	local   []kafka.PartResult // the gate's answer
	up      bool               // something went upstream
	sent    []sentPart         // what went upstream
	resp    []kafka.PartResult
	arrived bool
	failed  bool
	held    bool // its decision waited (producePlan.held)
}

// sentPart is one batch as it went upstream.
type sentPart struct {
	spec *kafka.Batch
	raw  []byte
	recs []kafka.Rec // the records it carries (lids), as far as the bytes tell
}

func (r *replica) newSession(cn *client.Conn) *session {
	s := &session{w: r.w, r: r, k: r.core, cn: cn}
	cn.Proxy = s
	r.sessions = append(r.sessions, s)
	return s
}

// Arrive: a request reached the proxy.
func (s *session) Arrive(req *client.Request) bool {
	if s.gone || s.rstIn || s.readEnded {
		return false
	}
	s.inbox = append(s.inbox, req)
	s.pumpRead()
	return true
}

// Fin: the client's end of stream reached the proxy.
func (s *session) Fin() {
	if s.gone {
		return
	}
	s.finIn = true
	if s.cn.FinAt == 0 {
		s.cn.FinAt = s.w.now
	}
	s.pumpRead()
}

// Reset: the connection was reset. Unread requests are lost; the next
// read, and every write from now on, fails.
func (s *session) Reset() {
	if s.gone {
		return
	}
	s.rstIn = true
	if s.cn.FinAt == 0 {
		s.cn.FinAt = s.w.now
	}
	for _, req := range s.inbox {
		s.w.led.LostAcks0(req, "lost with its connection")
	}
	s.inbox = nil
	s.pumpRead()
}

// pumpRead runs readLoop as far as it can go now. Called again while it
// runs (an effect of its own step), it leaves the work to the outer call.
func (s *session) pumpRead() {
	if s.inRead {
		return
	}
	s.inRead = true
	defer func() { s.inRead = false }()
	for !s.gone && !s.readEnded && s.cur == nil && !s.blocked {
		if s.closed || s.r.stopping {
			s.endRead()
			return
		}
		if len(s.inbox) == 0 {
			if s.finIn || s.rstIn {
				s.endRead()
			}
			return
		}
		req := s.inbox[0]
		s.inbox = s.inbox[1:]
		s.handle(req)
	}
}

// handle is readLoop's work on one Produce request.
func (s *session) handle(req *client.Request) {
	d := &deciding{req: req}
	s.cur = d
	if req.Acks != 0 && (s.r.releasing[s.cn.Node] || s.r.released[s.cn.Node]) {
		// replicaGate: held while the node moves, then redirected.
		d.gate = true
		if s.r.released[s.cn.Node] {
			s.redirect(d)
		}
		return
	}
	s.decideProduce(d)
}

// redirect answers a request of a released node NOT_LEADER_OR_FOLLOWER
// for every partition (proxy/handover.go, redirect).
func (s *session) redirect(d *deciding) {
	p := &pending{req: d.req}
	for _, b := range d.req.Parts {
		p.local = append(p.local, kafka.PartResult{Partition: b.Partition, Code: kerr.NotLeaderForPartition.Code, Offset: -1, AppendTime: -1})
	}
	s.w.script.comment("replica %d redirects req=%d: node %d moved", s.r.id, d.req.ID, s.cn.Node)
	s.cur = nil
	s.enqueue(p)
	s.pumpResp()
	s.pumpRead()
}

// coreConn is the connection's state in the core, made at its first
// decided Produce, after which the instance's other connections whose
// client already closed them are disconnected (proxy/produce.go).
func (s *session) coreConn() *decide.Conn {
	if s.dconn != nil {
		return s.dconn
	}
	w, cn := s.w, s.cn
	info := cn.Client.Info
	s.dconn = s.k.connect(decide.ConnID(cn.ID), info, w.Wall())
	w.script.connect(s)
	for _, id := range s.k.siblings(s.dconn) {
		sib := sessionOf(w.conns[id])
		if sib != nil && (sib.finIn || sib.rstIn) && !sib.disconnected && !sib.readEnded {
			w.script.comment("conn %d's first produce finds sibling conn %d closed by its client", cn.ID, id)
			clean := sib.clean()
			w.script.close(sib, "sibling", clean)
			if sib.cn.ToldAt == 0 {
				sib.cn.ToldAt = w.now
			}
			s.k.disconnectSibling(s.dconn, id, clean, w.Wall())
		}
	}
	return s.dconn
}

func (s *session) decideProduce(d *deciding) {
	req := d.req
	d.dreq = decide.Request{Conn: s.coreConn(), Version: requestVersion, Acks: req.Acks, Timeout: req.Timeout}
	for i, b := range req.Parts {
		var h = kafka.HeaderOf(req.Raws[i])
		d.dreq.Parts = append(d.dreq.Parts, decide.Part{TI: 0, PI: i, Topic: s.k.topic, Partition: b.Partition, Header: h, Records: req.Raws[i]})
	}
	d.pl = &decide.Plan{}
	s.step(d)
}

// requestVersion is the Produce version of every request: v9, as in the
// decide scripts.
const requestVersion = 9

// step decides d once and follows what the plan says.
func (s *session) step(d *deciding) {
	w := s.w
	for {
		if s.gone {
			return
		}
		d.dreq.Rounds = d.round // the core gives up past its wait or decide.MaxRounds
		w.wake(s.k.decide(&d.dreq, d.pl, w.Wall()), s.k)
		d.dreq.Waited = time.Time{}
		w.script.decide(s, d)
		w.script.expect(d)
		d.round++
		switch d.pl.Status {
		case decide.ReadTails:
			d.held = true
			s.readTails(d)
			return
		case decide.ReadRecords:
			continue // never: the simulation holds every record
		case decide.Wait:
			d.waited, d.held = true, true
			if s.wakeSet {
				// The wake channel held one: awaitWake returns at once.
				s.wakeSet = false
				d.dreq.Waited = d.pl.Until
				continue
			}
			d.waiting = true
			d.token++
			tok := d.token
			w.At(d.until(), func() {
				if s.cur == d && d.waiting && d.token == tok {
					d.waiting = false
					d.dreq.Waited = d.pl.Until
					s.step(d)
				}
			})
			return
		}
		break
	}
	pl := d.pl
	if pl.AnyUp && d.req.Acks != 0 && (s.k.gone(s.dconn) || d.held && s.clientClosedBehind()) {
		// Its client gave up on this connection: not forwarded
		// (docs/produce-path.md, "Deliver").
		w.script.unsent(s, d.req)
		s.w.wake(s.k.unsent(pl, w.Wall()), s.k)
		s.cur = nil
		s.endRead()
		return
	}
	s.cur = nil
	d.req.Decided, d.req.CoreName, d.req.Replica = w.now, s.k.name, s.r.id
	w.idem.Decided(d.req, d.pl, &w.broker)
	s.sendDecided(d)
	s.pumpRead()
}

// told records when the core first heard that the connection ended.
func (s *session) told() {
	if s.cn.ToldAt == 0 {
		s.cn.ToldAt = s.w.now
	}
}

func (d *deciding) until() time.Duration { return d.pl.Until.Sub(base) }

// clientClosedBehind: nothing more of the client is buffered and its end
// of stream is in the kernel.
func (s *session) clientClosedBehind() bool {
	return len(s.inbox) == 0 && (s.finIn || s.rstIn)
}

// woken: the core named this connection in a wake.
func (s *session) woken() {
	if s.gone {
		return
	}
	d := s.cur
	if d == nil || !d.waiting {
		s.wakeSet = true
		return
	}
	d.waiting = false
	d.dreq.Waited = d.pl.Until
	s.step(d)
}

// readTails reads the tails the core asked for, each on its own, and waits
// for them at most warmTimeout (proxy/produce.go, readTails).
func (s *session) readTails(d *deciding) {
	w := s.w
	d.tails = len(d.pl.Tails)
	d.tailsUntil = w.now + warmTimeout
	d.token++
	tok := d.token
	for _, t := range d.pl.Tails {
		p := t.Partition
		k := s.k
		w.After(w.Between(time.Millisecond, 20*time.Millisecond), func() {
			if s.gone {
				return // the process is gone, the read with it
			}
			w.readTail(k, p)
			if s.cur == d && d.token == tok {
				d.tails--
				if d.tails == 0 {
					s.step(d)
				}
			}
		})
	}
	w.At(d.tailsUntil, func() {
		if s.cur == d && d.token == tok && d.tails > 0 {
			d.token++
			s.step(d)
		}
	})
}

// sendDecided queues and forwards a decided request.
func (s *session) sendDecided(d *deciding) {
	w, pl, req := s.w, d.pl, d.req
	p := &pending{req: req, pl: pl, up: pl.AnyUp, held: d.held}
	if pl.AnyUp {
		for i, b := range req.Parts {
			pp := &pl.Parts[i]
			switch pp.Act {
			case decide.Forward:
				p.sent = append(p.sent, sentPart{spec: b, raw: req.Raws[i], recs: b.Recs})
			case decide.Rebuild:
				raw := pl.Rebuilt[pp.At:pp.End]
				p.sent = append(p.sent, sentPart{spec: b, raw: append([]byte(nil), raw...), recs: kafka.KeptRecords(b.Recs, raw, w.everWritten)})
			}
		}
	}
	for _, sp := range p.sent {
		for _, r := range sp.recs {
			w.led.Records[r.Lid].Upstream = true
		}
	}
	if req.Acks == 0 {
		if p.up {
			s.forward(p)
		}
		return
	}
	s.enqueue(p)
	if p.up {
		s.forward(p)
	}
	s.pumpResp()
}

func (s *session) enqueue(p *pending) {
	s.queue = append(s.queue, p)
	if len(s.queue) >= maxInflight {
		s.blocked = true
	}
}

// forward sends p's batches upstream: the broker handles the connection's
// requests in order, each after the one before.
func (s *session) forward(p *pending) {
	w := s.w
	arrive := w.now + w.Latency()
	if s.upCutAt > 0 {
		// Written to a broken connection: the write fails and readLoop
		// returns (proxy session.forward).
		w.led.LostAcks0(p.req, "its broker connection broke")
		s.endRead()
		return
	}
	start := max(arrive, s.upFree) + w.Between(200*time.Microsecond, 3*time.Millisecond)
	hold := w.brokerHold(s.cn.Node)
	start += hold
	s.upFree = start
	w.At(start, func() {
		if s.upCutAt > 0 && s.upCutAt <= arrive {
			w.led.LostAcks0(p.req, "its broker connection broke")
			return
		}
		res, lag := w.handleProduce(s.cn.Node, p)
		if p.req.Acks == 0 {
			return
		}
		at := max(w.now+lag+w.Latency(), s.upResp)
		s.upResp = at
		w.At(at, func() {
			if s.gone || (s.upCutAt > 0 && s.upCutAt <= at) {
				return
			}
			p.resp, p.arrived = res, true
			s.pumpResp()
		})
	})
}

// cutUpstream breaks the broker connection: what was not answered is lost
// (the broker may have appended it: the log will tell).
func (s *session) cutUpstream() {
	if s.upCutAt > 0 || s.gone {
		return
	}
	s.upCutAt = s.w.now
	s.upFailed = true
	s.pumpResp()
}

// pumpResp runs responseLoop as far as it can go now; like pumpRead, it
// does not run inside itself.
func (s *session) pumpResp() {
	if s.inResp {
		return
	}
	s.inResp = true
	defer func() { s.inResp = false }()
	w := s.w
	for !s.gone && len(s.queue) > 0 {
		p := s.queue[0]
		switch {
		case !p.up || p.pl == nil:
		case s.upFailed:
			s.fail(p)
		case !p.arrived:
			return
		default:
			w.script.answer(s, p)
			p.req.Settled, p.req.Resp = w.now, p.resp
			w.wake(s.k.outcome(p.pl, requestVersion, p.resp, w.Wall()), s.k)
		}
		if p.failed && !s.dead {
			s.dead = true
			s.closeAll()
		}
		if p.pl != nil && p.held && !s.dead && !p.failed && (s.finIn || s.rstIn) {
			// responseLoop: its decision waited and the client's end of
			// stream is in the kernel now: the answer will not be read.
			s.dead = true
			s.closeAll()
		}
		told := false
		if pl := p.pl; pl != nil && !s.dead && !p.failed && !s.clientLeft {
			told = true
			p.req.DelivAt = w.now
			w.script.deliver(s, p.req, true)
			s.k.delivered(pl, true, w.Wall())
		}
		if !s.dead {
			s.dead = !s.write(p)
		}
		if s.dead && !s.disconnected {
			s.disconnected = true
			if s.dconn != nil {
				clean := s.clean()
				w.script.close(s, "write failed", clean)
				s.told()
				s.k.disconnect(s.dconn, clean, w.Wall())
			}
		}
		if pl := p.pl; pl != nil && !told {
			ok := !s.dead && !p.failed && !s.clientLeft
			w.script.deliver(s, p.req, ok)
			s.k.delivered(pl, ok, w.Wall())
		}
		s.queue = s.queue[1:]
		if s.blocked && len(s.queue) < maxInflight {
			s.blocked = false
			w.After(0, s.pumpRead)
		}
	}
	if len(s.queue) == 0 && s.readEnded && !s.respEnded {
		s.respEnded = true
		s.closeAll()
	}
}

// fail: p gets no answer from the broker; its outcome is unknown.
func (s *session) fail(p *pending) {
	if p.pl != nil && !p.failed {
		p.req.Lost, p.req.LostAt = true, s.w.now
		s.w.script.lost(s, p.req)
		s.w.wake(s.k.lost(p.pl, s.w.Wall()), s.k)
	}
	p.failed = true
}

// write writes p's answer to the client and reports whether the
// connection can still be written to.
func (s *session) write(p *pending) bool {
	cn := s.cn
	switch {
	case s.rstIn && !cn.Silent:
		return false
	case s.finIn:
		// A closed client's kernel takes the first write and answers it
		// with a reset; the next write fails.
		s.writesAfterFin++
		if s.writesAfterFin > 1 {
			return false
		}
	}
	res := p.local
	if p.pl != nil {
		res = s.answerOf(p)
	}
	p.req.Written = res
	cn.Answer(p.req, res)
	return true
}

// answerOf is the answer the client gets (proxy finishProduce): each part
// from the broker, or from the proxy (Answer, Rebuild).
func (s *session) answerOf(p *pending) []kafka.PartResult {
	var out []kafka.PartResult
	for i, b := range p.req.Parts {
		pp := &p.pl.Parts[i]
		switch pp.Act {
		case decide.Answer, decide.Rebuild:
			out = append(out, kafka.PartResult{Partition: b.Partition, Code: pp.Local.ErrorCode, Offset: pp.Local.BaseOffset, AppendTime: pp.Local.LogAppendTime})
		default:
			r := kafka.PartResult{Partition: b.Partition, Code: kerr.RequestTimedOut.Code, Offset: -1, AppendTime: -1}
			for _, x := range p.resp {
				if x.Partition == b.Partition {
					r = x
				}
			}
			out = append(out, r)
		}
	}
	return out
}

// clean: its client closed the connection (its own end of stream, no
// reset) with nothing outstanding — every request the session took in
// answered — and its TCP stack had received every answer written on it,
// as the proxy reads it from the socket (proxy howClosed). A client that
// closes with answers unread, or receives one after its close, resets.
func (s *session) clean() bool {
	return s.finIn && !s.rstIn && len(s.queue) == 0 && s.cn.Received == s.cn.Written
}

// endRead: readLoop returned. The core hears the connection end at once;
// responseLoop drains what was forwarded, at most drainTimeout.
func (s *session) endRead() {
	if s.readEnded || s.gone {
		return
	}
	w := s.w
	s.readEnded, s.clientLeft = true, true
	s.cur = nil
	for _, req := range s.inbox {
		w.led.LostAcks0(req, "never read: its connection ended")
	}
	s.inbox = nil
	if s.dconn != nil && !s.disconnected {
		s.disconnected = true
		clean := s.clean()
		w.script.close(s, "read ended", clean)
		s.told()
		s.k.disconnect(s.dconn, clean, w.Wall())
	}
	s.drainTick++
	tick := s.drainTick
	w.After(drainTimeout, func() {
		if s.drainTick == tick && !s.respEnded && !s.gone {
			s.upFailed = true
			s.pumpResp()
		}
	})
	s.pumpResp()
}

// closeAll closes both connections: the client reads the end, a waiting
// request gives up.
func (s *session) closeAll() {
	if s.closed {
		return
	}
	s.closed = true
	s.cn.ProxyClosed()
	if d := s.cur; d != nil && !d.gate {
		if d.waiting {
			// awaitWake returns false: errClientGone, nothing forwarded.
			s.cur = nil
			s.endRead()
			return
		}
		if d.tails > 0 {
			// readTails returns on close; the next decision finds the
			// reads under way and waits, which returns at once.
			d.token++
			d.tails = 0
			s.cur = nil
			s.endRead()
			return
		}
	}
	s.pumpRead()
}
