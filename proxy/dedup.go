package proxy

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// produceDecision is the proxy's decision for one partition of a Produce
// request.
type produceDecision struct {
	ti, pi    int  // topic and partition index in the client's request
	tracked   bool // an idempotent batch the table decided
	forwarded bool // goes upstream
	key       seqstate.Key
	batch     seqstate.Batch
	maxTS     int64 // the batch's maxTimestamp, kept as the original's log_append_time
	result    seqstate.Result
	local     protocol.LocalPartitionResult // the answer when not forwarded
}

// producePlan is what a Produce request needs between its decision in
// readLoop and its response: the decisions to commit or release, and, when
// the proxy answers some partitions itself, the client's request to merge
// the answer into. Plans are pooled; steady-state requests allocate nothing.
type producePlan struct {
	version   int16
	corrID    int32
	decisions []produceDecision
	anyLocal  bool   // some partition is answered by the proxy
	anyUp     bool   // some partition goes upstream
	body      []byte // copy of the request body, only when anyLocal
	// outstanding counts what must still happen before the response can be
	// built: the upstream response (if anyUp) and each in-flight wait.
	outstanding atomic.Int32
	upstream    *[]byte // upstream response frame, when anyUp and anyLocal
	upBodyOff   int
	failed      bool // the upstream part failed: the connection closes
}

var planPool = sync.Pool{New: func() any { return &producePlan{} }}

func getPlan() *producePlan {
	pl := planPool.Get().(*producePlan)
	pl.decisions = pl.decisions[:0]
	pl.anyLocal, pl.anyUp = false, false
	pl.body = pl.body[:0]
	pl.upstream = nil
	pl.failed = false
	return pl
}

func putPlan(pl *producePlan) {
	if cap(pl.body) > maxPooledFrame {
		pl.body = nil
	}
	planPool.Put(pl)
}

// dedupState is the server-wide part of deduplication: the table, the
// batches other requests wait on, and the log start offsets seen.
type dedupState struct {
	mode  string
	table *seqstate.Table

	waitMu   sync.Mutex
	waiters  map[waitKey][]*waiter
	nWaiting atomic.Int64 // len of all waiters lists: resolve skips the lock at 0

	lsoMu    sync.Mutex
	logStart map[seqstate.Key]int64 // ProducerID 0: per partition
}

// waitKey identifies an in-flight batch.
type waitKey struct {
	key      seqstate.Key
	epoch    int16
	firstSeq int32
	count    int32
}

// waiter is a retry waiting for the original batch's outcome (decision
// InFlight): it gets the same answer, and the batch is never forwarded twice.
type waiter struct {
	sess *session
	p    *pending
	d    *produceDecision
}

func newDedupState(cfg *Config) (*dedupState, error) {
	d := &dedupState{mode: cfg.Dedup.Mode, waiters: map[waitKey][]*waiter{}, logStart: map[seqstate.Key]int64{}}
	if d.mode == DedupOff {
		return d, nil
	}
	t, err := seqstate.New(seqstate.Config{
		MaxEntries:           cfg.Dedup.MaxEntries,
		RetainedBatches:      cfg.Dedup.RetainedBatches,
		ProducerIDExpiration: cfg.Dedup.ProducerIDExpiration,
	})
	if err != nil {
		return nil, err
	}
	d.table = t
	return d, nil
}

func (d *dedupState) logStartOffset(k seqstate.Key) int64 {
	k.ProducerID = 0
	d.lsoMu.Lock()
	defer d.lsoMu.Unlock()
	if v, ok := d.logStart[k]; ok {
		return v
	}
	return -1
}

func (d *dedupState) setLogStartOffset(k seqstate.Key, v int64) {
	if v < 0 {
		return
	}
	k.ProducerID = 0
	d.lsoMu.Lock()
	d.logStart[k] = v
	d.lsoMu.Unlock()
}

// planProduce decides every idempotent batch of a Produce request. It
// returns nil when the request is relayed untouched (dedup off, or nothing
// idempotent in it).
func (c *session) planProduce(h protocol.RequestHeader, body []byte, now time.Time) (*producePlan, error) {
	ds := c.s.dedup
	if ds.table == nil || h.APIVersion < 3 {
		return nil, nil
	}
	sc := &c.scan
	if err := sc.Reset(body[h.BodyOffset:], h.APIVersion); err != nil {
		return nil, err
	}
	var pl *producePlan
	enforce := ds.mode == DedupEnforce
	register := sc.Acks != 0 // acks=0: no response to commit from, so nothing is registered
	for sc.Next() {
		part := sc.Partition()
		var bh protocol.BatchHeader
		n, err := protocol.ReadBatch(part.Records, &bh)
		if err != nil || n != 1 || bh.Magic < 2 || bh.ProducerID < 0 {
			// Legacy producers, and batches Kafka will reject on its own
			// (§2.1 rows 4, 11): relayed, the broker answers.
			c.s.Metrics.batchPassthrough.Inc()
			continue
		}
		if pl == nil {
			pl = getPlan()
			pl.version, pl.corrID = h.APIVersion, h.CorrelationID
		}
		d := produceDecision{ti: part.TopicIndex, pi: part.PartitionIndex, tracked: true, forwarded: true, maxTS: bh.MaxTimestamp}
		if h.APIVersion >= 13 {
			d.key.Topic = ds.table.TopicBytes(part.TopicID[:])
		} else {
			d.key.Topic = ds.table.TopicBytes(part.Topic)
		}
		d.key.ProducerID, d.key.Partition = bh.ProducerID, part.Partition
		d.batch = seqstate.Batch{Epoch: bh.ProducerEpoch, FirstSeq: bh.BaseSequence, Count: bh.LastOffsetDelta + 1,
			Fingerprint: protocol.RecordsFingerprint(part.Records, &bh)}
		if register {
			d.result = ds.table.Check(d.key, d.batch, now)
		} else {
			d.result = ds.table.Decide(d.key, d.batch, now)
		}
		c.s.Metrics.countDecision(d.result.Decision)
		switch d.result.Decision {
		case seqstate.Accept:
			d.tracked = register
		case seqstate.Invalid:
			d.tracked = false // the broker rejects it with INVALID_RECORD
		case seqstate.Duplicate:
			d.tracked = false
			// A duplicate of a batch committed without an offset (its
			// append ended in REQUEST_TIMED_OUT) goes to the broker, whose
			// own duplicate check answers with the real offset.
			if enforce && d.result.BaseOffset >= 0 && protocol.BatchValid(part.Records, &bh) == 0 {
				d.forwarded = false
				d.local = c.localAnswer(&d)
			}
		default:
			d.tracked = false
			if enforce && protocol.BatchValid(part.Records, &bh) == 0 {
				// Kafka validates a batch before its duplicate check
				// (§2.1 rows 4–12); an invalid one goes upstream for
				// Kafka's own error.
				d.forwarded = false
				d.local = c.localAnswer(&d)
			}
		}
		pl.decisions = append(pl.decisions, d)
		if d.forwarded {
			pl.anyUp = true
		} else {
			pl.anyLocal = true
		}
	}
	if err := sc.Err(); err != nil {
		if pl != nil {
			c.releaseAll(pl)
			putPlan(pl)
		}
		return nil, err
	}
	return pl, nil
}

// localAnswer is the Kafka broker's answer for a batch the proxy does not
// forward (kafka-idempotence.md §4).
func (c *session) localAnswer(d *produceDecision) protocol.LocalPartitionResult {
	lso := c.s.dedup.logStartOffset(d.key)
	switch d.result.Decision {
	case seqstate.Duplicate:
		return protocol.LocalPartitionResult{BaseOffset: d.result.BaseOffset, LogAppendTime: d.result.MaxTimestamp, LogStartOffset: lso}
	case seqstate.Fenced:
		return protocol.LocalPartitionResult{ErrorCode: kerr.InvalidProducerEpoch.Code, BaseOffset: -1, LogAppendTime: -1, LogStartOffset: lso}
	case seqstate.InFlight:
		return protocol.LocalPartitionResult{BaseOffset: -1, LogAppendTime: -1, LogStartOffset: -1} // filled in when the original resolves
	default: // OutOfOrder, SequenceReuse
		return protocol.LocalPartitionResult{ErrorCode: kerr.OutOfOrderSequenceNumber.Code, BaseOffset: -1, LogAppendTime: -1, LogStartOffset: lso}
	}
}

// releaseAll releases every batch of pl registered as pending and not yet
// resolved, telling anyone waiting on them.
func (c *session) releaseAll(pl *producePlan) {
	for i := range pl.decisions {
		d := &pl.decisions[i]
		if d.tracked {
			c.s.dedup.table.Release(d.key, d.batch)
			d.tracked = false
			c.s.dedup.resolve(d, protocol.LocalPartitionResult{ErrorCode: kerr.RequestTimedOut.Code, BaseOffset: -1, LogAppendTime: -1, LogStartOffset: -1})
		}
	}
}

// resolve hands the outcome of batch d to every request waiting on it.
func (ds *dedupState) resolve(d *produceDecision, r protocol.LocalPartitionResult) {
	// A waiter registering after this check re-reads the table, which
	// the caller updated first, so it cannot be missed (see wait).
	if ds.nWaiting.Load() == 0 {
		return
	}
	wk := waitKey{d.key, d.batch.Epoch, d.batch.FirstSeq, d.batch.Count}
	ds.waitMu.Lock()
	ws := ds.waiters[wk]
	delete(ds.waiters, wk)
	ds.nWaiting.Add(-int64(len(ws)))
	ds.waitMu.Unlock()
	for _, w := range ws {
		w.d.local = r
		w.sess.partDone(w.p)
	}
}

// wait registers a waiter for the in-flight original of d. If the original
// resolved between the decision and the registration, the table now knows
// its outcome: answer from it instead.
func (c *session) wait(p *pending, d *produceDecision, now time.Time) {
	ds := c.s.dedup
	wk := waitKey{d.key, d.batch.Epoch, d.batch.FirstSeq, d.batch.Count}
	w := &waiter{sess: c, p: p, d: d}
	ds.waitMu.Lock()
	ds.waiters[wk] = append(ds.waiters[wk], w)
	ds.nWaiting.Add(1)
	ds.waitMu.Unlock()
	r := ds.table.Decide(d.key, d.batch, now)
	if r.Decision == seqstate.InFlight {
		return // the original's resolve answers us
	}
	// Claim our waiter back, unless resolve already took it.
	ds.waitMu.Lock()
	ws := ds.waiters[wk]
	mine := false
	for i, x := range ws {
		if x == w {
			ws = append(ws[:i], ws[i+1:]...)
			mine = true
			ds.nWaiting.Add(-1)
			break
		}
	}
	if len(ws) == 0 {
		delete(ds.waiters, wk)
	} else {
		ds.waiters[wk] = ws
	}
	ds.waitMu.Unlock()
	if !mine {
		return
	}
	if r.Decision == seqstate.Duplicate {
		d.result = r
		d.local = c.localAnswer(d)
	} else {
		// Released: its fate upstream is unknown. A retriable error makes
		// the client retry, and the retry is then decided afresh.
		d.local = protocol.LocalPartitionResult{ErrorCode: kerr.RequestTimedOut.Code, BaseOffset: -1, LogAppendTime: -1, LogStartOffset: -1}
	}
	c.partDone(p)
}

// partDone counts one resolved part of p's plan and finishes p when it was
// the last one.
func (c *session) partDone(p *pending) {
	if p.plan.outstanding.Add(-1) == 0 {
		c.finishProduce(p)
	}
}

// finishProduce builds the response of a Produce request the proxy
// answered at least partly itself, and hands it to responseLoop.
func (c *session) finishProduce(p *pending) {
	pl := p.plan
	if pl.failed {
		if pl.upstream != nil {
			putFrame(pl.upstream)
			pl.upstream = nil
		}
		p.failed = true
		p.ready <- struct{}{}
		return
	}
	var upBody []byte
	if pl.upstream != nil {
		upBody = (*pl.upstream)[4+pl.upBodyOff:]
	}
	bp := getFrame(len(pl.body) + 64)
	buf := append((*bp)[:0], 0, 0, 0, 0)
	buf = protocol.AppendResponseHeader(buf, int16(kmsg.Produce), pl.version, pl.corrID)
	di := 0
	out, err := protocol.MergeProduceResponse(buf, pl.version, pl.body, upBody, func(ti, pi int) (protocol.LocalPartitionResult, bool) {
		// decisions are in request order, so a cursor finds each one.
		for ; di < len(pl.decisions); di++ {
			d := &pl.decisions[di]
			if d.ti > ti || (d.ti == ti && d.pi > pi) {
				break
			}
			if d.ti == ti && d.pi == pi {
				return d.local, !d.forwarded
			}
		}
		return protocol.LocalPartitionResult{}, false
	})
	if pl.upstream != nil {
		putFrame(pl.upstream)
		pl.upstream = nil
	}
	if err != nil {
		c.log.Error("cannot build produce response; closing connection", "err", err)
		putFrame(bp)
		p.failed = true
		p.ready <- struct{}{}
		return
	}
	size := uint32(len(out) - 4)
	out[0], out[1], out[2], out[3] = byte(size>>24), byte(size>>16), byte(size>>8), byte(size)
	*bp = out
	p.resp = bp
	p.ready <- struct{}{}
}

// commitProduce applies the upstream response of a forwarded Produce to the
// table: appended batches are committed with their offsets, the others
// released; requests waiting on them get the same outcome.
func (c *session) commitProduce(p *pending, body []byte) error {
	pl := p.plan
	ds := c.s.dedup
	sc := &c.respScan
	if err := sc.Reset(body, pl.version); err != nil {
		return err
	}
	now := time.Now()
	cursor := 0
	for sc.Next() {
		pr := sc.Partition()
		var topic seqstate.TopicID
		if pl.version >= 13 {
			topic = ds.table.TopicBytes(pr.TopicID[:])
		} else {
			topic = ds.table.TopicBytes(pr.Topic)
		}
		// Brokers answer in request order in practice, so the decision at
		// the cursor is nearly always the one; Kafka does not promise it.
		d := pl.find(topic, pr.Partition, &cursor)
		if d == nil {
			continue
		}
		ds.setLogStartOffset(d.key, pr.LogStartOffset)
		outcome := protocol.LocalPartitionResult{ErrorCode: pr.ErrorCode, BaseOffset: pr.BaseOffset, LogAppendTime: pr.LogAppendTime, LogStartOffset: pr.LogStartOffset}
		switch pr.ErrorCode {
		case 0, kerr.RequestTimedOut.Code, kerr.NotEnoughReplicasAfterAppend.Code:
			// Kafka counts these as appended (kafka-idempotence.md §2,
			// row 16): its producer state moved, so ours does too.
			ts := pr.LogAppendTime
			if ts < 0 {
				ts = d.maxTS
			}
			off := pr.BaseOffset
			if pr.ErrorCode != 0 {
				off = -1
			}
			ds.table.Commit(d.key, d.batch, off, ts, now)
			if pr.ErrorCode == 0 {
				outcome.LogAppendTime = ts // what a retry of it is answered with
			}
		default:
			ds.table.Release(d.key, d.batch)
		}
		d.tracked = false
		ds.resolve(d, outcome)
	}
	if err := sc.Err(); err != nil {
		return err
	}
	c.releaseAll(pl) // anything the response did not mention
	return nil
}

// find returns the forwarded, still pending decision for topic/partition,
// searching from *cursor and leaving it after the match.
func (pl *producePlan) find(topic seqstate.TopicID, partition int32, cursor *int) *produceDecision {
	n := len(pl.decisions)
	for i := 0; i < n; i++ {
		j := (*cursor + i) % n
		d := &pl.decisions[j]
		if d.forwarded && d.tracked && d.key.Topic == topic && d.key.Partition == partition {
			*cursor = j + 1
			return d
		}
	}
	return nil
}

// sendPlanned queues and forwards a Produce request the table decided. It
// reports false when the connection must close.
func (c *session) sendPlanned(pl *producePlan, h protocol.RequestHeader, body, frame []byte, respond bool, start time.Time, api *apiMetrics) bool {
	ds := c.s.dedup
	if !respond {
		// acks=0: nothing comes back, so nothing was registered. Kafka
		// closes the connection when an acks=0 write fails (KafkaApis
		// handleProduceRequest); a duplicate is simply not written again.
		rejected := false
		for i := range pl.decisions {
			switch pl.decisions[i].result.Decision {
			case seqstate.OutOfOrder, seqstate.Fenced, seqstate.SequenceReuse:
				rejected = rejected || !pl.decisions[i].forwarded
			}
		}
		anyLocal, anyUp := pl.anyLocal, pl.anyUp
		var reduced []byte
		if anyLocal && anyUp && !rejected {
			reduced = c.reduce(pl, h, body)
		}
		putPlan(pl)
		switch {
		case rejected:
			c.log.Warn("closing client connection: acks=0 produce rejected (as Kafka does)")
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
	if ds.mode != DedupEnforce || !pl.anyLocal {
		// Everything goes upstream as it came; the plan rides along so the
		// response commits or releases each batch.
		c.queue <- p
		return c.forward(frame)
	}
	// The proxy answers some partitions itself. Keep the client's request
	// to merge the answer into, then count what must resolve first: the
	// upstream response and every in-flight wait, plus a guard held until
	// all of it is registered.
	pl.body = append(pl.body[:0], body[h.BodyOffset:]...)
	waits := 0
	for i := range pl.decisions {
		if pl.decisions[i].result.Decision == seqstate.InFlight && !pl.decisions[i].forwarded {
			waits++
		}
	}
	up := 0
	if pl.anyUp {
		up = 1
	}
	pl.outstanding.Store(int32(1 + up + waits))
	var reduced []byte
	if pl.anyUp {
		if reduced = c.reduce(pl, h, body); reduced == nil {
			c.releaseAll(pl)
			putPlan(pl)
			p.plan = nil
			c.release(p)
			return false
		}
	}
	p.async = true
	c.queue <- p
	now := time.Now()
	for i := range pl.decisions {
		d := &pl.decisions[i]
		if d.result.Decision == seqstate.InFlight && !d.forwarded {
			c.wait(p, d, now)
		}
	}
	c.partDone(p) // the guard
	if pl.anyUp {
		return c.forward(reduced)
	}
	return true
}

// reduce builds the frame of a Produce request holding only the forwarded
// partitions, in c.reduceBuf.
func (c *session) reduce(pl *producePlan, h protocol.RequestHeader, body []byte) []byte {
	buf := append(c.reduceBuf[:0], 0, 0, 0, 0)
	buf = append(buf, body[:h.BodyOffset]...)
	di := 0
	out, _, err := protocol.ReduceProduce(buf, body[h.BodyOffset:], h.APIVersion, func(ti, pi int) bool {
		for ; di < len(pl.decisions); di++ {
			d := &pl.decisions[di]
			if d.ti > ti || (d.ti == ti && d.pi > pi) {
				break
			}
			if d.ti == ti && d.pi == pi {
				return d.forwarded
			}
		}
		return true // partitions the table did not decide (legacy) are forwarded
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

// isTransactionalInit reports whether an InitProducerId request names a
// transactional id: its response then fences the producer's older epochs
// (seqstate.Table.ObserveInitProducerID). Rare, so kmsg decoding is fine.
func isTransactionalInit(body []byte, version int16) bool {
	req := kmsg.NewPtrInitProducerIDRequest()
	req.SetVersion(version)
	return req.ReadFrom(body) == nil && req.TransactionalID != nil
}

// observeInit feeds a transactional InitProducerId response to the table.
func (c *session) observeInit(p *pending, body []byte) {
	resp := kmsg.NewPtrInitProducerIDResponse()
	resp.SetVersion(p.version)
	if resp.ReadFrom(body) == nil && resp.ErrorCode == 0 {
		c.s.dedup.table.ObserveInitProducerID(resp.ProducerID, resp.ProducerEpoch, time.Now())
	}
}

// dedupKey is the table key of a (producer, topic name, partition), for
// tests and diagnostics.
func (s *Server) dedupKey(topic string, pid int64, partition int32) seqstate.Key {
	return seqstate.Key{ProducerID: pid, Topic: s.dedup.table.Topic(topic), Partition: partition}
}
