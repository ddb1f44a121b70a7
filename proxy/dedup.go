package proxy

import (
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// This file is the session's side of the Produce path: it feeds the
// planner (planner.go) and carries out what it decides. See
// docs/produce-path.md for the whole life of a Produce.

func newDedupPlanner(cfg *Config, m *Metrics) (*planner, error) {
	dc := &cfg.Dedup
	if dc.Mode == DedupOff {
		return newPlanner(dc, nil, nil, nil, m), nil
	}
	t, err := seqstate.New(seqstate.Config{
		MaxEntries:           dc.MaxEntries,
		RetainedBatches:      dc.RetainedBatches,
		ProducerIDExpiration: dc.ProducerIDExpiration,
	})
	if err != nil {
		return nil, err
	}
	// The legacy table exists whatever the settings, so that a reload can
	// turn legacy dedup on. The key table (tens of MB at its default cap)
	// only when some topic uses idempotency keys at start.
	legacy, err := seqstate.NewLegacyTable(seqstate.LegacyConfig{MaxIdentities: dc.Legacy.MaxIdentities, Window: dc.Legacy.Window})
	if err != nil {
		return nil, err
	}
	var keys *seqstate.KeyTable
	for _, tc := range dc.Topics {
		if tc.IdempotencyKey != nil {
			if keys, err = seqstate.NewKeyTable(seqstate.KeyConfig{MaxKeys: dc.Keys.MaxKeys, TTL: dc.Keys.TTL}); err != nil {
				return nil, err
			}
			break
		}
	}
	return newPlanner(dc, t, legacy, keys, m), nil
}

// responseMapper is what session.rewrite hands the protocol package: the
// node registry maps broker addresses, and the topics of every Metadata
// response are interned so that Produce requests can be keyed (only topics
// the cluster knows are interned, never a name a client made up).
type responseMapper struct {
	*nodeRegistry
	table *seqstate.Table
}

func (m responseMapper) ObserveTopics(topics []protocol.TopicInfo) {
	if m.table == nil {
		return
	}
	refs := make([]seqstate.TopicRef, len(topics))
	for i, t := range topics {
		refs[i] = seqstate.TopicRef{Name: t.Name, ID: t.ID, Partitions: t.Partitions}
	}
	m.table.InternTopics(refs)
}

// noteResponse learns from a broker response what authenticated needs:
// the end of a SASL exchange, or that the cluster answers clients that
// never authenticated (so it requires no authentication).
func (c *session) noteResponse(p *pending, body []byte) {
	switch kmsg.Key(p.key) {
	case kmsg.ApiVersions, kmsg.SASLHandshake:
	case kmsg.SASLAuthenticate:
		if off, err := protocol.ResponseBodyOffset(body, p.key, p.version); err == nil {
			c.noteAuthAnswer(p, body[off:])
		}
	default:
		if !c.auth.started.Load() && !c.s.openUpstream.Load() {
			c.s.openUpstream.Store(true)
		}
	}
}

// planProduce decides a Produce request; nil means relay it untouched.
func (c *session) planProduce(h protocol.RequestHeader, body []byte, now time.Time) (*producePlan, error) {
	pn := c.s.planner
	switch {
	case pn.table == nil || pn.settings.Load().mode == DedupOff:
		pn.metrics.passthrough[passDedupOff].Inc()
		return nil, nil
	case h.APIVersion < 3: // message formats v0/v1: no producer ids
		pn.metrics.passthrough[passOldFormat].Inc()
		return nil, nil
	}
	sc := &c.scan
	if err := sc.Reset(body[h.BodyOffset:], h.APIVersion); err != nil {
		return nil, err
	}
	who, trusted := c.authenticated()
	pl := pn.plan(h, sc, c.id, who.id, trusted, c.fill, now)
	if err := sc.Err(); err != nil {
		if pl != nil {
			pn.fail(pl)
			putPlan(pl)
		}
		return nil, err
	}
	if pl != nil {
		for i := range pl.decisions {
			d := &pl.decisions[i]
			if d.legacy && (d.pending || d.lresult.Decision == seqstate.LegacyDuplicate) {
				c.legacyIDs.add(legacyRef{id: d.ident, topic: d.key.Topic, partition: d.key.Partition, count: d.batch.Count, size: d.size, first: d.first})
			}
			if d.legacy && d.lresult.Decision == seqstate.LegacyInFlight && d.lresult.From != 0 && d.lresult.From != c.id {
				c.s.suspectGone(d.lresult.From)
			}
		}
	}
	return pl, nil
}

// sendPlanned queues and forwards a Produce request the planner decided. It
// reports false when the connection must close.
func (c *session) sendPlanned(pl *producePlan, h protocol.RequestHeader, body, frame []byte, start time.Time, api *apiMetrics) bool {
	pn := c.s.planner
	// Until pl is queued or returned, a panic leaves it to readLoop's
	// cleanup, which releases its batches (not a defer here: that would
	// run first and hide it).
	c.unqueued = pl
	testHook("plan")
	// Answers merged in, or partitions left out: the request's bytes are
	// needed whole.
	if (pl.anyLocal && !c.fillRequest()) || (c.req != nil && c.req.broken) {
		c.log.Error("closing connection: cannot read back the records of a produce request held in pipes")
		return false
	}
	if pl.acks == 0 {
		// Nothing comes back, so nothing was registered. Kafka closes the
		// connection when an acks=0 write fails (KafkaApis
		// handleProduceRequest); a duplicate is simply not written again.
		var reduced []byte
		if pl.anyLocal && pl.anyUp && !pl.reuse {
			reduced = c.reduce(pl, h, body)
		}
		anyLocal, anyUp, reuse := pl.anyLocal, pl.anyUp, pl.reuse
		c.unqueued = nil
		putPlan(pl)
		switch {
		case reuse:
			c.log.Warn("closing client connection: acks=0 produce reuses a sequence with different records (as Kafka closes on a failed acks=0 write)")
			return false
		case !anyLocal:
			return c.forward(frame)
		case anyUp:
			return reduced != nil && c.forward(reduced)
		}
		return true
	}
	p := c.newPending(h, start, api)
	p.plan = pl
	if !pl.anyLocal {
		// Everything goes upstream as it came; the plan rides along so the
		// response commits or releases each batch.
		c.queue <- p
		c.unqueued = nil
		return c.forward(frame)
	}
	// The proxy answers some partitions itself: keep the request's
	// skeleton to merge the answers into.
	if !c.keepSkeleton(pl, h, body) {
		pn.fail(pl)
		p.plan = nil
		c.unqueued = nil
		putPlan(pl)
		c.release(p)
		return false
	}
	var reduced []byte
	if pl.anyUp {
		if reduced = c.reduce(pl, h, body); reduced == nil {
			pn.fail(pl)
			p.plan = nil
			c.unqueued = nil
			putPlan(pl)
			c.release(p)
			return false
		}
	}
	// Once queued, pl belongs to responseLoop, which may answer, release
	// and reuse it at once (nothing goes upstream): read nothing of it after.
	anyUp := pl.anyUp
	c.queue <- p
	c.unqueued = nil
	if anyUp {
		return c.forward(reduced)
	}
	c.kickResponseLoop() // no broker response will wake it
	return true
}

// keepSkeleton keeps in pl what its answer is built from: the request's
// topics and partitions in order, without their records (a few bytes per
// partition), so that a request the proxy answers copies none of its
// records. A skeleton larger than smallRequest holds request_memory budget
// until the answer is written (docs/security.md, "Memory").
func (c *session) keepSkeleton(pl *producePlan, h protocol.RequestHeader, body []byte) bool {
	out, _, err := protocol.RewriteProduce(pl.skeleton[:0], body[h.BodyOffset:], h.APIVersion, withoutRecords)
	if err != nil {
		c.log.Error("cannot copy produce request; closing connection", "err", err)
		return false
	}
	pl.skeleton = out
	if len(out) > smallRequest {
		hold := &requestBuffer{pool: c.s.requestPool()}
		hold.pool.reserve(hold, len(out), c.closed)
		pl.skeletonHold = hold
	}
	return true
}

// withoutRecords keeps every partition of a request with empty records.
func withoutRecords(int, int) (bool, []byte) { return true, noRecords }

var noRecords = []byte{}

// reduce builds the frame of a Produce request holding only the forwarded
// partitions, in c.reduceBuf.
func (c *session) reduce(pl *producePlan, h protocol.RequestHeader, body []byte) []byte {
	if cap(c.reduceBuf) > maxPooledFrame && len(body) < cap(c.reduceBuf)/4 {
		c.reduceBuf = nil // one outsized request does not pin memory for the connection's life
	}
	buf := append(c.reduceBuf[:0], 0, 0, 0, 0)
	buf = append(buf, body[:h.BodyOffset]...)
	cursor := 0
	out, _, err := protocol.RewriteProduce(buf, body[h.BodyOffset:], h.APIVersion, func(ti, pi int) (bool, []byte) {
		return pl.keepUpstream(&cursor, ti, pi)
	})
	if err != nil {
		c.log.Error("cannot reduce produce request; closing connection", "err", err)
		return nil
	}
	size := uint32(len(out) - 4)
	out[0], out[1], out[2], out[3] = byte(size>>24), byte(size>>16), byte(size>>8), byte(size)
	c.reduceBuf = out
	return out
}

// awaitWaits blocks until every wait of pl is resolved, its deadline
// passes, or the connection is closed; the unresolved ones are then
// answered REQUEST_TIMED_OUT.
func (c *session) awaitWaits(pl *producePlan) {
	pn := c.s.planner
	if pn.waitsDone(pl) {
		return
	}
	timer := time.NewTimer(time.Until(pl.deadline))
	defer timer.Stop()
	for i := 0; !pn.waitsDone(pl); i++ {
		select {
		case <-pl.ready:
		case <-timer.C:
			c.s.Metrics.waitTimeouts.Inc()
			pn.abandonWaits(pl)
			return
		case <-c.closed:
			pn.abandonWaits(pl)
			return
		}
	}
}

// finishProduce builds the response of a Produce request the proxy answered
// at least partly itself, once its upstream part (if any) is in.
func (c *session) finishProduce(p *pending) {
	pl := p.plan
	c.awaitWaits(pl)
	testHook("merge")
	var upBody []byte
	if pl.upstream != nil {
		upBody = (*pl.upstream)[4+pl.upOff:]
	}
	bp := getFrame(len(pl.skeleton) + 64)
	out, err := c.s.planner.answer((*bp)[:0], pl, upBody)
	if err != nil {
		c.log.Error("cannot build produce response; closing connection", "err", err)
		putFrame(bp)
		p.failed = true
		return
	}
	*bp = out
	p.resp = bp
	c.logAnswers(pl)
}

// logAnswers writes one line per batch the proxy answered itself — a
// prevented duplicate or a refused sequence reuse — rate-limited across the
// server, because an operator of a payment system wants to see each one.
func (c *session) logAnswers(pl *producePlan) {
	for i := range pl.decisions {
		d := &pl.decisions[i]
		if d.act == actForward {
			continue
		}
		ok, suppressed := c.s.answerLog.allow(time.Now())
		if !ok {
			continue
		}
		topic, _ := c.s.planner.table.TopicName(d.key.Topic)
		attrs := []any{"topic", topic, "partition", d.key.Partition, "client_id", c.clientID,
			"error_code", d.local.ErrorCode, "offset", d.local.BaseOffset}
		if d.legacy {
			attrs = append(attrs, "producer_id", -1)
		} else {
			attrs = append(attrs, "producer_id", d.key.ProducerID, "epoch", d.batch.Epoch, "first_seq", d.batch.FirstSeq, "last_seq", d.batch.LastSeq())
		}
		if suppressed > 0 {
			attrs = append(attrs, "suppressed", suppressed)
		}
		switch {
		case d.local.ErrorCode == 0:
			c.log.Info("duplicate prevented: answered with the original's offset", attrs...)
		case d.act == actAnswer:
			c.log.Warn("batch refused: it reuses a sequence for different records (Kafka would drop them silently)", attrs...)
		default:
			c.log.Info("retry answered with its original's outcome", attrs...)
		}
	}
}

// logLimiter lets at most perSecond lines through each second and counts
// the rest, which the next line that passes reports.
type logLimiter struct {
	mu         sync.Mutex
	second     int64
	n          int
	suppressed int
}

const answerLogPerSecond = 20

func (l *logLimiter) allow(now time.Time) (ok bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := now.Unix(); s != l.second {
		l.second, l.n = s, 0
	}
	if l.n >= answerLogPerSecond {
		l.suppressed++
		return false, 0
	}
	l.n++
	suppressed, l.suppressed = l.suppressed, 0
	return true, suppressed
}

// isTransactionalInit reports whether an InitProducerId request names a
// transactional id: its response then fences the producer's older epochs
// (seqstate.Table.ObserveInitProducerID). Rare, so kmsg decoding is fine.
func isTransactionalInit(body []byte, version int16) bool {
	req := kmsg.NewPtrInitProducerIDRequest()
	req.SetVersion(version)
	return req.ReadFrom(body) == nil && req.TransactionalID != nil
}

// observeInit feeds a transactional InitProducerId response to the table.
// The table then counts a later batch of an older epoch as fenced; the
// batch still goes to the broker, which decides (the floor is only as good
// as the broker's transaction verification, KIP-890).
func (c *session) observeInit(p *pending, body []byte) {
	resp := kmsg.NewPtrInitProducerIDResponse()
	resp.SetVersion(p.version)
	if resp.ReadFrom(body) == nil && resp.ErrorCode == 0 {
		c.s.planner.table.ObserveInitProducerID(resp.ProducerID, resp.ProducerEpoch, time.Now())
	}
}

// testHookFn, when a test sets it, runs at named points of the Produce path
// so that the test can inject a panic there. It is nil in production.
var testHookFn atomic.Pointer[func(where string)]

func testHook(where string) {
	if f := testHookFn.Load(); f != nil {
		(*f)(where)
	}
}

// dedupKey is the table key of a (producer, topic name, partition), for
// tests and diagnostics; ok is false for a topic never seen in Metadata.
func (s *Server) dedupKey(topic string, pid int64, partition int32) seqstate.Key {
	id, _ := s.planner.table.LookupTopic([]byte(topic))
	return seqstate.Key{ProducerID: pid, Topic: id, Partition: partition}
}

// SetDedup applies the dedup settings a running proxy can change (mode,
// legacy match, per-topic settings), as SIGHUP does; sizes and windows
// need a restart. Mode off at start has no tables: leaving it needs a
// restart too. It returns the keys it applied.
func (s *Server) SetDedup(cfg DedupConfig) ([]string, error) {
	pn := s.planner
	if pn == nil {
		return nil, errors.New("proxy: not started")
	}
	if pn.table == nil && cfg.Mode != DedupOff {
		return nil, fmt.Errorf("%w: dedup.mode %s: the proxy started with dedup off, which keeps no tables; restart it", ErrInvalidConfig, cfg.Mode)
	}
	test := s.Config
	test.Dedup.Mode, test.Dedup.Legacy.Match, test.Dedup.Topics = cfg.Mode, cfg.Legacy.Match, cfg.Topics
	test.EnsureDefaults()
	if err := test.Validate(); err != nil {
		return nil, err
	}
	next := newDedupSettings(&test.Dedup)
	if len(next.keyHeader) > 0 && pn.keys == nil {
		return nil, fmt.Errorf("%w: dedup.topics: idempotency keys were off for every topic at start, so there is no key table; restart to turn them on", ErrInvalidConfig)
	}
	old := pn.settings.Swap(next)
	var applied []string
	if old.mode != next.mode {
		applied = append(applied, "dedup.mode")
	}
	if old.legacyMatch != next.legacyMatch {
		applied = append(applied, "dedup.legacy.match")
	}
	if !maps.Equal(old.topicMatch, next.topicMatch) || !maps.Equal(old.keyHeader, next.keyHeader) {
		applied = append(applied, "dedup.topics")
	}
	return applied, nil
}
