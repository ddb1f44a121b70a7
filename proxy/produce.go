package proxy

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/decide"
	"github.com/dedupproxy/dedupproxy/metrics"
	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/relay"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// The session's side of the Produce path (docs/produce-path.md): it scans a
// request, hands it to the decision core (package decide), carries out
// what the core decides — read partitions' tails, wait for an outcome,
// forward, forward rewritten, answer — and reports back what happens to
// it: the broker's answer, a lost broker connection, the answer written to
// the client or not, the connection closed. The core decides; the session
// reads, writes and waits.

// producePlan is a decided Produce request on its way through the session.
type producePlan struct {
	decide.Plan
	corrID  int32
	version int16
	acks    int16
	// skeleton is the request body without records (keepSkeleton), when
	// the proxy answers some part; skeletonHold holds its budget when it
	// is large.
	skeleton     []byte
	skeletonHold *relay.RequestBuffer
	upstream     *[]byte // the broker's response frame, when AnyUp and AnyLocal
	upOff        int     // its body offset after the size prefix
	pending      int     // batches counted in Server.pendingBatches
	// held: its decision waited (for an outcome or a log read), so its
	// client may have left meanwhile (see responseLoop).
	held bool
}

var planPool = sync.Pool{New: func() any { return &producePlan{} }}

func getPlan() *producePlan {
	pl := planPool.Get().(*producePlan)
	pl.skeleton, pl.upstream, pl.pending, pl.held = pl.skeleton[:0], nil, 0, false
	return pl
}

func putPlan(pl *producePlan) {
	relay.PutFrame(pl.upstream)
	pl.upstream = nil
	if h := pl.skeletonHold; h != nil {
		h.Unreserve()
		pl.skeletonHold = nil
	}
	if cap(pl.skeleton) > maxPooledFrame {
		pl.skeleton = nil
	}
	planPool.Put(pl)
}

// errClientGone ends readLoop: the client left while its request waited.
var errClientGone = errors.New("client connection closed")

// errHolesLost ends readLoop: the records of a request held in pipes could
// not be read back.
var errHolesLost = errors.New("cannot read back the records of a produce request held in pipes")

// decideProduce scans a Produce request and has the core decide it,
// reading tails and waiting as the core asks. nil means relay it
// untouched: nothing in it could be decided.
func (c *session) decideProduce(h protocol.RequestHeader, body []byte) (*producePlan, error) {
	core, m := c.s.core, c.s.Metrics
	switch {
	case core == nil:
		m.Passthrough[decide.PassDedupOff].Inc()
		return nil, nil
	case h.APIVersion < 3: // message formats v0/v1: no producer ids
		m.Passthrough[decide.PassOldFormat].Inc()
		return nil, nil
	}
	sc := &c.scan
	if err := sc.Reset(body[h.BodyOffset:], h.APIVersion); err != nil {
		return nil, err
	}
	req := &c.dreq
	clear(req.Parts)
	req.Parts = req.Parts[:0]
	// Before the broker has authenticated the client, nothing is decided
	// or looked up for it (docs/security.md).
	conn := c.coreConn()
	holes := c.req != nil && c.req.HasHoles()
	for sc.Next() {
		part := sc.Partition()
		if conn == nil {
			m.Passthrough[decide.PassUnauthenticated].Inc()
			continue
		}
		var bh protocol.BatchHeader
		n, err := protocol.ReadBatch(part.Records, &bh)
		switch {
		case err != nil || n != 1:
			m.Passthrough[decide.PassInvalid].Inc()
			continue
		case bh.Magic < 2:
			m.Passthrough[decide.PassOldFormat].Inc()
			continue
		}
		topic, known := c.s.lookupTopic(h.APIVersion, part.Topic, part.TopicID)
		if !known {
			m.Passthrough[decide.PassUnknownTopic].Inc()
			c.s.unknownTopics.Add(1)
			continue
		}
		req.Parts = append(req.Parts, decide.Part{TI: part.TopicIndex, PI: part.PartitionIndex, Topic: topic, Partition: part.Partition,
			Header: bh, Records: part.Records, Unread: holes && bh.ProducerID >= 0})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(req.Parts) == 0 {
		return nil, nil
	}
	req.Version, req.Acks, req.GiveUp = h.APIVersion, sc.Acks, false
	req.Rounds, req.Waited = 0, time.Time{}
	req.Timeout = time.Duration(max(sc.TimeoutMillis, 0)) * time.Millisecond
	req.Arrived = c.readAt
	req.Conn = conn
	pl := getPlan()
	pl.corrID, pl.version, pl.acks = h.CorrelationID, h.APIVersion, sc.Acks
	waited := false // waited for an outcome
	held := false   // waited for an outcome or a tail
	for round := 0; ; round++ {
		if held && (core.Gone(conn) || c.clientHungUp()) {
			// Its client gave up on this connection while the request
			// waited (its timeout shorter than the broker's slowness) and
			// resends elsewhere: an answer would reach no one, and a
			// decision would use up the records its resend repeats, which
			// would then be written again (docs/produce-path.md).
			putPlan(pl)
			return nil, errClientGone
		}
		// The core gives the request up past its wait's deadline or
		// decide.MaxRounds rounds; its effects may wake its own connection
		// (what it is to wait for came as it registered).
		req.Rounds = round
		var fx decide.Effects
		c.s.step(&decide.Event{Kind: decide.EvRequest, Req: req, Plan: &pl.Plan}, c.s.now(), &fx)
		c.s.wakeConns(fx.Wake)
		req.Waited = time.Time{}
		if pl.GaveUp == decide.GaveUpWait {
			c.s.Metrics.WaitTimeouts.Inc()
		}
		switch pl.Status {
		case decide.ReadTails:
			held = true
			c.readTails(pl.Tails)
			continue
		case decide.ReadRecords:
			if !c.fillRequest() {
				putPlan(pl)
				return nil, errHolesLost
			}
			for i := range req.Parts {
				req.Parts[i].Unread = false
			}
			continue
		case decide.Wait:
			if c.log.Enabled(context.Background(), slog.LevelDebug) {
				c.log.Debug("produce request waits for an outcome it needs", "correlation_id", h.CorrelationID, "at_most", pl.Until.Sub(c.s.now()).Round(time.Millisecond))
			}
			waited, held = true, true
			c.s.Metrics.Waiting.Inc()
			woken := c.awaitWake(pl.Until)
			c.s.Metrics.Waiting.Dec()
			if !woken {
				putPlan(pl)
				return nil, errClientGone
			}
			req.Waited = pl.Until
			if c.s.closing.Load() {
				// Stopping: a waiting request gives up at once
				// (REQUEST_TIMED_OUT; its client retries, at the next
				// proxy if this one is going away) instead of holding
				// the drain.
				req.GiveUp = true
			}
			continue
		}
		break
	}
	if pl.AnyUp && pl.acks != 0 && (core.Gone(conn) || held && c.clientHungUp()) {
		// Its client gave up on this connection (and resends elsewhere,
		// perhaps already did): the core heard the connection break
		// before this request was decided (read behind a full queue or a
		// wait), or its client closed it while it waited. What would go
		// upstream now is a copy no one will read the answer of: not
		// written (docs/produce-path.md); the connection ends, and
		// nothing may wait on its batches.
		// Not c.wakeBuf: responseLoop uses it meanwhile.
		c.s.stepWake(&decide.Event{Kind: decide.EvUnsent, Plan: &pl.Plan}, nil)
		putPlan(pl)
		return nil, errClientGone
	}
	pl.held = held
	c.countVerdicts(pl, waited)
	return pl, nil
}

// clientHungUp reports whether the client has closed or reset this
// connection, whatever of it is still buffered unread: no Kafka client
// closes only its sending side, so no answer written now reaches it.
func (c *session) clientHungUp() bool {
	return relay.PeerGone(c.client)
}

// coreConn returns the core's state of this connection once the broker has
// authenticated its client, nil before.
func (c *session) coreConn() *decide.Conn {
	who, ok := c.authenticated()
	if !ok {
		return nil
	}
	if c.dconn == nil || c.dconnPrincipal != who.ID {
		if c.dconn != nil {
			c.s.step(&decide.Event{Kind: decide.EvClose, Conn: c.dconn, How: decide.Broken}, c.s.now(), nil)
		}
		cl := decide.Client{Principal: who.ID, ID: c.clientID, Host: remoteIP(c.client), Software: c.software}
		var fx decide.Effects
		c.s.step(&decide.Event{Kind: decide.EvConnect, ID: decide.ConnID(c.id), Client: cl}, c.s.now(), &fx)
		c.dconn, c.dconnPrincipal = fx.Conn, who.ID
		c.sharedConn.Store(c.dconn)
		c.s.disconnectGoneSiblings(c.dconn)
	}
	return c.dconn
}

// disconnectGoneSiblings tells the core of every other connection of
// conn's client instance whose client has closed it, though its session
// has not read that yet (it may be waiting, or behind a full queue): a
// client that gives up on a connection resends on its next one at once,
// and the answers written on the old one must count as unread by then.
func (s *Server) disconnectGoneSiblings(conn *decide.Conn) {
	for _, id := range s.core.Siblings(conn, nil) {
		v, ok := s.byID.Load(uint64(id))
		if !ok {
			continue
		}
		if sib := v.(*session); sib.clientHungUp() {
			// Its end of stream is in the kernel (perhaps behind requests
			// its session has not read): it closed cleanly if its answers
			// are all acknowledged and it did not reset.
			s.step(&decide.Event{Kind: decide.EvSiblingClosed, Conn: conn, ID: id, How: sib.howClosed(io.EOF)}, s.now(), nil)
		}
	}
}

// awaitWake waits until the core wakes this connection (an outcome its
// request waits for), until, or shutdown; it reports false when the
// connection closed meanwhile.
func (c *session) awaitWake(until time.Time) bool {
	d := until.Sub(c.s.now())
	if d <= 0 {
		return true
	}
	t := c.s.clock().NewTimer(d)
	defer t.Stop()
	select {
	case <-c.wake:
	case <-t.C:
	case <-c.s.stop:
	case <-c.closed:
		return false
	}
	return true
}

// wakeConns wakes the sessions whose waiting requests the core named.
func (s *Server) wakeConns(ids []decide.ConnID) {
	for _, id := range ids {
		if v, ok := s.byID.Load(uint64(id)); ok {
			select {
			case v.(*session).wake <- struct{}{}:
			default:
			}
		}
	}
}

// readTails reads the tails the core asked for, each on a connection of
// the proxy's own (at most connWarmups at once for this connection and
// dedup.warm.max_concurrent for the proxy), and waits for them at most
// dedup.warm.timeout. A tail that gets no slot in time is decided without;
// one still being read when the wait ends is waited for by the next
// decision.
func (c *session) readTails(tails []decide.TailKey) {
	bound := c.s.Config.Dedup.Warm.Timeout
	timer := c.s.clock().NewTimer(bound)
	defer timer.Stop()
	done := make(chan struct{}, len(tails))
	started := 0
	for _, k := range tails {
		if !c.warmSlot(timer.C) {
			c.s.Metrics.Warmups[metrics.WarmTimedOut].Inc()
			c.s.stepWake(&decide.Event{Kind: decide.EvTailFailed, Tail: k}, nil)
			continue
		}
		name, _ := c.s.table.TopicName(k.Topic)
		read := func() {
			defer func() { c.releaseWarmSlot(); done <- struct{}{} }()
			c.s.warmPartition(name, k)
		}
		if !c.s.spawn(read) {
			// Draining: no new goroutine, so read it here (the drain
			// waits for this session): a request already read is
			// decided with its tail.
			read()
		}
		started++
	}
	for ; started > 0; started-- {
		select {
		case <-done:
		case <-timer.C:
			c.s.Metrics.Warmups[metrics.WarmTimedOut].Inc()
			return
		case <-c.closed:
			return
		}
	}
}

// connWarmups bounds the warm-ups one client connection runs at once.
const connWarmups = 8

// warmSlot takes a slot for one warm-up: the connection's, then the
// proxy's. It gives up when expired fires or the connection closes.
func (c *session) warmSlot(expired <-chan time.Time) bool {
	select {
	case c.warmSlots <- struct{}{}:
	case <-expired:
		return false
	case <-c.closed:
		return false
	}
	select {
	case c.s.warmSlots <- struct{}{}:
		return true
	case <-expired:
	case <-c.closed:
	}
	<-c.warmSlots
	return false
}

func (c *session) releaseWarmSlot() {
	<-c.s.warmSlots
	<-c.warmSlots
}

// lookupTopic returns the table's key for a topic named in a Produce
// request: by ID from v13 (KIP-516), by name before.
func (s *Server) lookupTopic(version int16, name []byte, id [16]byte) (seqstate.TopicID, bool) {
	if version >= 13 {
		return s.table.LookupTopicID(id)
	}
	return s.table.LookupTopic(name)
}

// sendDecided queues and forwards a decided Produce request. It reports
// false when the connection must close.
func (c *session) sendDecided(pl *producePlan, h protocol.RequestHeader, body, frame []byte, start time.Time, api *metrics.API) bool {
	// Until pl is queued or settled, a panic leaves it to readLoop's
	// cleanup (not a defer here: that would run first and hide it).
	c.unqueued = pl
	testHook("plan")
	// Parts answered or left out: the request's bytes are needed whole.
	if (pl.AnyLocal && !c.fillRequest()) || (c.req != nil && c.req.Broken()) {
		c.log.Error("closing connection: cannot read back the records of a produce request held in pipes")
		return false
	}
	if pl.acks == 0 {
		// Nothing comes back, so nothing was registered. Kafka closes the
		// connection when an acks=0 write fails (KafkaApis
		// handleProduceRequest); a duplicate is simply not written again.
		var rewritten []byte
		if pl.AnyLocal && pl.AnyUp && !pl.Reuse {
			rewritten = c.rewriteRequest(pl, h, body)
		}
		anyLocal, anyUp, reuse := pl.AnyLocal, pl.AnyUp, pl.Reuse
		c.unqueued = nil
		putPlan(pl)
		switch {
		case reuse:
			c.log.Warn("closing client connection: acks=0 produce reuses a sequence with different records (as Kafka closes on a failed acks=0 write)")
			return false
		case !anyLocal:
			return c.forward(frame)
		case anyUp:
			return rewritten != nil && c.forward(rewritten)
		}
		return true
	}
	p := c.newPending(h, start, api)
	p.plan = pl
	pl.pending = c.countPending(pl)
	if !pl.AnyLocal {
		// Everything goes upstream as it came; the plan rides along so the
		// response settles each batch.
		c.enqueue(p)
		c.unqueued = nil
		return c.forward(frame)
	}
	var rewritten []byte
	if !c.keepSkeleton(pl, h, body) || (pl.AnyUp && func() bool { rewritten = c.rewriteRequest(pl, h, body); return rewritten == nil }()) {
		c.unqueued = nil
		c.fail(p)
		c.release(p)
		return false
	}
	// Once queued, pl belongs to responseLoop, which may answer, release
	// and reuse it at once (nothing goes upstream): read nothing of it after.
	anyUp := pl.AnyUp
	c.enqueue(p)
	c.unqueued = nil
	if anyUp {
		return c.forward(rewritten)
	}
	c.kickResponseLoop() // no broker response will wake it
	return true
}

// countPending counts pl's batches that go upstream decided, in
// dedupproxy_produce_pending_batches until their answer is in.
func (c *session) countPending(pl *producePlan) int {
	n := 0
	for i := range pl.Parts {
		if pp := &pl.Parts[i]; pp.Act != decide.Answer && pp.Verdict.Pass < 0 {
			n++
		}
	}
	c.s.pendingBatches.Add(int64(n))
	return n
}

// settled takes pl's batches out of the pending count.
func (c *session) settled(pl *producePlan) {
	if pl.pending > 0 {
		c.s.pendingBatches.Add(-int64(pl.pending))
		pl.pending = 0
	}
}

// keepSkeleton keeps in pl what its answer is built from: the request's
// topics and partitions in order, without their records (a few bytes per
// partition), so that a request the proxy answers copies none of its
// records. A skeleton larger than relay.SmallRequest holds request_memory budget
// until the answer is written (docs/security.md, "Memory").
func (c *session) keepSkeleton(pl *producePlan, h protocol.RequestHeader, body []byte) bool {
	out, _, err := protocol.RewriteProduce(pl.skeleton[:0], body[h.BodyOffset:], h.APIVersion, withoutRecords)
	if err != nil {
		c.log.Error("cannot copy produce request; closing connection", "err", err)
		return false
	}
	pl.skeleton = out
	if len(out) > relay.SmallRequest {
		pl.skeletonHold = c.s.requestPool().Reserve(len(out), c.closed)
	}
	return true
}

// withoutRecords keeps every partition of a request with empty records.
func withoutRecords(int, int) (bool, []byte) { return true, noRecords }

var noRecords = []byte{}

// rewriteRequest builds, in c.reduceBuf, the frame of a Produce request
// holding only the parts that go upstream, rebuilt ones with their rebuilt
// batch.
func (c *session) rewriteRequest(pl *producePlan, h protocol.RequestHeader, body []byte) []byte {
	if cap(c.reduceBuf) > maxPooledFrame && len(body) < cap(c.reduceBuf)/4 {
		c.reduceBuf = nil // one outsized request does not pin memory for the connection's life
	}
	buf := append(c.reduceBuf[:0], 0, 0, 0, 0)
	buf = append(buf, body[:h.BodyOffset]...)
	cursor := 0
	out, _, err := protocol.RewriteProduce(buf, body[h.BodyOffset:], h.APIVersion, func(ti, pi int) (bool, []byte) {
		return pl.Upstream(&cursor, ti, pi)
	})
	if err != nil {
		c.log.Error("cannot rewrite produce request; closing connection", "err", err)
		return nil
	}
	size := uint32(len(out) - 4)
	out[0], out[1], out[2], out[3] = byte(size>>24), byte(size>>16), byte(size>>8), byte(size)
	c.reduceBuf = out
	return out
}

// step carries an event to the core (decide.Core.Step, the decisions'
// one entry point) at now; fx, when not nil, gets its effects.
func (s *Server) step(ev *decide.Event, now time.Time, fx *decide.Effects) {
	if fx == nil {
		var local decide.Effects
		fx = &local
	}
	s.core.Step(ev, now, fx)
}

// stepWake is step at the server's clock, then the wake-ups it asks for.
func (s *Server) stepWake(ev *decide.Event, fx *decide.Effects) {
	if fx == nil {
		var local decide.Effects
		fx = &local
	}
	s.core.Step(ev, s.now(), fx)
	s.wakeConns(fx.Wake)
}

// settleResponse hands the broker's answer (body after its header) to the
// core and wakes whoever waited on it.
func (c *session) settleResponse(pl *producePlan, body []byte) error {
	c.settled(pl)
	fx := decide.Effects{Wake: c.wakeBuf}
	c.s.stepWake(&decide.Event{Kind: decide.EvAnswered, Plan: &pl.Plan, Scanner: &c.respScan, Body: body}, &fx)
	c.wakeBuf = fx.Wake[:0]
	return fx.Err
}

// lose tells the core that pl's answer will never come.
func (c *session) lose(pl *producePlan) {
	c.settled(pl)
	fx := decide.Effects{Wake: c.wakeBuf}
	c.s.stepWake(&decide.Event{Kind: decide.EvLost, Plan: &pl.Plan}, &fx)
	c.wakeBuf = fx.Wake[:0]
}

// finishProduce builds the response of a Produce request the proxy answered
// at least partly itself, once its upstream part (if any) is in.
func (c *session) finishProduce(p *pending) {
	pl := p.plan
	testHook("merge")
	var upBody []byte
	if pl.upstream != nil {
		upBody = (*pl.upstream)[4+pl.upOff:]
	}
	bp := relay.GetFrame(len(pl.skeleton) + 64)
	dst := append((*bp)[:0], 0, 0, 0, 0)
	dst = protocol.AppendResponseHeader(dst, int16(kmsg.Produce), pl.version, pl.corrID)
	cursor := 0
	out, err := protocol.MergeProduceResponse(dst, pl.version, pl.skeleton, upBody, func(ti, pi int) (protocol.LocalPartitionResult, bool) {
		return pl.Local(&cursor, ti, pi)
	})
	if err != nil {
		c.log.Error("cannot build produce response; closing connection", "err", err)
		relay.PutFrame(bp)
		p.failed = true
		return
	}
	size := uint32(len(out) - 4)
	out[0], out[1], out[2], out[3] = byte(size>>24), byte(size>>16), byte(size>>8), byte(size)
	*bp = out
	p.resp = bp
}

// warmPartition reads the tail of one partition and hands it to the core.
func (s *Server) warmPartition(topic string, k decide.TailKey) {
	cfg := &s.Config.Dedup.Warm
	ctx, cancel := context.WithTimeout(s.warmCtx, cfg.Timeout)
	defer cancel()
	start := s.now()
	records, n, err := s.readTail(ctx, topic, k.Partition)
	if err != nil && s.warmCtx.Err() != nil {
		// Stopped past the drain's deadline: the connections are being
		// cut, and the requests waiting for this tail are not decided
		// without it (they would be forwarded: a resend written again).
		return
	}
	if err != nil {
		s.Metrics.Warmups[metrics.WarmFailed].Inc()
		if ok, suppressed := s.warmLog.Allow(s.now()); ok {
			s.Logger.Warn("cannot read partition tail; deciding its batches without it", "topic", topic, "partition", k.Partition, "err", err, "suppressed", suppressed)
		}
		s.stepWake(&decide.Event{Kind: decide.EvTailFailed, Tail: k}, nil)
		return
	}
	s.stepWake(&decide.Event{Kind: decide.EvTailRead, Tail: k, Records: records}, nil)
	s.Metrics.Warmups[metrics.WarmOK].Inc()
	s.Metrics.WarmBytes.Add(float64(len(records)))
	took := s.now().Sub(start)
	s.Metrics.WarmSeconds.Observe(took.Seconds())
	s.Logger.Debug("warmed partition from its tail", "topic", topic, "partition", k.Partition, "batches", n, "bytes", len(records), "took", took)
}
