package proxy

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// The planner's unit tests drive it with encoded requests and responses and
// no sockets: each numbered case of the planner's rules, and every path by
// which a plan ends (answered, completed, failed, abandoned).

const planTopic = "orders"

var planTopicID = [16]byte{0xde, 0xd0, 1}

type planHarness struct {
	t     *testing.T
	pn    *planner
	now   time.Time
	scan  protocol.ProduceScanner
	rscan protocol.ProduceResponseScanner
	conn  uint64 // the session the next plan comes from
}

func newPlanHarness(t *testing.T, mode string) *planHarness {
	t.Helper()
	cfg := Config{}
	cfg.EnsureDefaults()
	cfg.Dedup.Mode = mode
	pn, err := newDedupPlanner(&cfg, NewMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	pn.table.InternTopics([]seqstate.TopicRef{{Name: planTopic, ID: planTopicID}})
	return &planHarness{t: t, pn: pn, now: time.Unix(1700000000, 0), conn: 1}
}

// produce encodes a Produce request of version v for planTopic (by ID from
// v13), one batch per partition in order.
func produce(v int16, acks int16, timeoutMs int32, batches ...[]byte) *kmsg.ProduceRequest {
	req := kmsg.NewPtrProduceRequest()
	req.SetVersion(v)
	req.Acks, req.TimeoutMillis = acks, timeoutMs
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic, rt.TopicID = planTopic, planTopicID
	for i, b := range batches {
		rp := kmsg.NewProduceRequestTopicPartition()
		rp.Partition, rp.Records = int32(i), b
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	return req
}

// plan runs the planner on req as a session would.
func (h *planHarness) plan(req *kmsg.ProduceRequest, trusted bool) *producePlan {
	h.t.Helper()
	body := kmsg.NewRequestFormatter().AppendRequest(nil, req, 7)[4:]
	hdr, err := protocol.ParseRequestHeader(body)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := h.scan.Reset(body[hdr.BodyOffset:], hdr.APIVersion); err != nil {
		h.t.Fatal(err)
	}
	pl := h.pn.plan(hdr, &h.scan, h.conn, 0 /* ANONYMOUS */, trusted, nil, h.now)
	if err := h.scan.Err(); err != nil {
		h.t.Fatal(err)
	}
	if pl != nil {
		pl.skeleton = append(pl.skeleton[:0], body[hdr.BodyOffset:]...)
	}
	return pl
}

// brokerResult is the broker's answer for one partition.
type brokerResult struct {
	err    int16
	offset int64
}

// response encodes the broker's response body to the forwarded part of pl.
func (h *planHarness) response(pl *producePlan, results map[int32]brokerResult) []byte {
	resp := kmsg.NewPtrProduceResponse()
	resp.SetVersion(pl.version)
	rt := kmsg.NewProduceResponseTopic()
	rt.Topic, rt.TopicID = planTopic, planTopicID
	for i := range pl.decisions {
		d := &pl.decisions[i]
		if d.act != actForward && d.act != actRebatch {
			continue
		}
		r := results[d.key.Partition]
		rp := kmsg.NewProduceResponseTopicPartition()
		rp.Partition, rp.ErrorCode, rp.BaseOffset, rp.LogAppendTime, rp.LogStartOffset = d.key.Partition, r.err, r.offset, -1, 0
		if r.err != 0 {
			rp.BaseOffset = -1
		}
		rt.Partitions = append(rt.Partitions, rp)
	}
	resp.Topics = append(resp.Topics, rt)
	return resp.AppendTo(nil)
}

// complete hands pl the broker's response.
func (h *planHarness) complete(pl *producePlan, results map[int32]brokerResult) []byte {
	h.t.Helper()
	body := h.response(pl, results)
	if err := h.pn.complete(pl, &h.rscan, body, h.now); err != nil {
		h.t.Fatal(err)
	}
	return body
}

// answer builds the client's response to pl and decodes it.
func (h *planHarness) answer(pl *producePlan, upBody []byte) []kmsg.ProduceResponseTopicPartition {
	h.t.Helper()
	if !pl.anyUp {
		upBody = nil
	}
	frame, err := h.pn.answer(nil, pl, upBody)
	if err != nil {
		h.t.Fatal(err)
	}
	resp := kmsg.NewPtrProduceResponse()
	resp.SetVersion(pl.version)
	off, err := protocol.ResponseBodyOffset(frame[4:], int16(kmsg.Produce), pl.version)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := resp.ReadFrom(frame[4+off:]); err != nil {
		h.t.Fatal(err)
	}
	return resp.Topics[0].Partitions
}

func (h *planHarness) decide(pid int64, partition int32, epoch int16, seq, n int32) seqstate.Result {
	id, _ := h.pn.table.LookupTopic([]byte(planTopic))
	return h.pn.table.Decide(seqstate.Key{ProducerID: pid, Topic: id, Partition: partition}, seqstate.Batch{Epoch: epoch, FirstSeq: seq, Count: n}, h.now)
}

func acts(pl *producePlan) []action {
	var a []action
	for i := range pl.decisions {
		a = append(a, pl.decisions[i].act)
	}
	return a
}

// TestPlanOneKeyAcrossProduceVersions: Produce v13 names topics by ID and
// v3–12 by name; both map to one table key (rule 1), so a rolling upgrade
// that alternates versions on one partition keeps its sequence. Before, v12
// seq 0, v13 seq 2, v12 seq 4 answered 45 from a stale entry.
func TestPlanOneKeyAcrossProduceVersions(t *testing.T) {
	h := newPlanHarness(t, DedupEnforce)
	for i, v := range []int16{12, 13, 12, 13} {
		seq := int32(2 * i)
		pl := h.plan(produce(v, -1, 1000, recordBatch(t, 1, 0, seq, 2, "v")), true)
		if pl == nil || pl.decisions[0].result.Decision != seqstate.Accept || pl.anyLocal {
			t.Fatalf("v%d seq %d: %+v", v, seq, pl)
		}
		h.complete(pl, map[int32]brokerResult{0: {offset: int64(seq)}})
		putPlan(pl)
	}
	// A retry of the v12 batch sent as v13 is the same batch.
	pl := h.plan(produce(13, -1, 1000, recordBatch(t, 1, 0, 4, 2, "v")), true)
	if got := pl.decisions[0].result; got.Decision != seqstate.Duplicate || got.BaseOffset != 4 {
		t.Fatalf("v13 retry of a v12 batch: %+v", got)
	}
	if r := h.answer(pl, nil)[0]; r.ErrorCode != 0 || r.BaseOffset != 4 {
		t.Fatalf("answer: %+v", r)
	}
}

// TestPlanUnknownTopicAndUntrustedPassThrough: a topic never seen in a
// Metadata response is not keyed (and not interned), and nothing is decided
// on a connection that has not authenticated (rule 7).
func TestPlanUnknownTopicAndUntrustedPassThrough(t *testing.T) {
	h := newPlanHarness(t, DedupEnforce)
	req := produce(9, -1, 1000, recordBatch(t, 1, 0, 0, 1, "v"))
	req.Topics[0].Topic = "never-seen"
	if pl := h.plan(req, true); pl != nil {
		t.Fatalf("unknown topic planned: %+v", pl.decisions)
	}
	if _, ok := h.pn.table.LookupTopic([]byte("never-seen")); ok {
		t.Fatal("a client-supplied topic name was interned")
	}
	if pl := h.plan(produce(9, -1, 1000, recordBatch(t, 1, 0, 0, 1, "v")), false); pl != nil {
		t.Fatalf("untrusted connection planned: %+v", pl.decisions)
	}
	if h.pn.table.Len() != 0 {
		t.Fatalf("untrusted batch touched the table: %d entries", h.pn.table.Len())
	}
	m := h.pn.metrics
	if a, b := testutil.ToFloat64(m.passthrough[passUnknownTopic]), testutil.ToFloat64(m.passthrough[passUnauthenticated]); a != 1 || b != 1 {
		t.Fatalf("passthrough unknown_topic=%v unauthenticated=%v", a, b)
	}
	if pl := h.plan(produce(9, 0, 1000, recordBatch(t, -1, -1, -1, 1, "legacy")), true); pl != nil {
		t.Fatal("legacy acks=0 batch planned")
	}
	if n := testutil.ToFloat64(m.passthrough[passLegacy]); n != 1 {
		t.Fatalf("legacy counted %v", n)
	}
}

// TestPlanForwardsWhatTheBrokerDecides: a gap, a new epoch not at 0 and a
// stale epoch are counted and forwarded (rule 2): with a second proxy or a
// bypassing producer the table lags the broker. When the broker accepts
// such a batch, the table follows it.
func TestPlanForwardsWhatTheBrokerDecides(t *testing.T) {
	h := newPlanHarness(t, DedupEnforce)
	pl := h.plan(produce(9, -1, 1000, recordBatch(t, 1, 3, 0, 2, "a")), true)
	h.complete(pl, map[int32]brokerResult{0: {offset: 0}})
	putPlan(pl)
	cases := []struct {
		name  string
		batch []byte
		want  seqstate.Decision
	}{
		{"gap", recordBatch(t, 1, 3, 5, 1, "gap"), seqstate.OutOfOrder},
		{"rewind", recordBatch(t, 1, 3, 1, 1, "rewind"), seqstate.OutOfOrder},
		{"new epoch not at 0", recordBatch(t, 1, 4, 3, 1, "e4"), seqstate.OutOfOrder},
		{"stale epoch", recordBatch(t, 1, 2, 0, 1, "e2"), seqstate.Fenced},
	}
	for _, tc := range cases {
		pl := h.plan(produce(9, -1, 1000, tc.batch), true)
		if d := pl.decisions[0]; d.result.Decision != tc.want || d.act != actForward || pl.anyLocal {
			t.Fatalf("%s: decision %v act %v", tc.name, d.result.Decision, d.act)
		}
		h.complete(pl, map[int32]brokerResult{0: {err: kerr.OutOfOrderSequenceNumber.Code}})
		putPlan(pl)
	}
	// The other proxy wrote seq 2..4; this one sees 5 next: a gap to the
	// table, accepted by the broker, and the table forgets what it had
	// (it cannot know the batches in between).
	pl = h.plan(produce(9, -1, 1000, recordBatch(t, 1, 3, 5, 1, "after-other-proxy")), true)
	h.complete(pl, map[int32]brokerResult{0: {offset: 5}})
	putPlan(pl)
	if r := h.decide(1, 0, 3, 6, 1); r.Decision != seqstate.Accept {
		t.Fatalf("after the broker accepted a gap, the next batch is %v", r.Decision)
	}
}

// TestPlanAcksOneDuplicateForwarded: an acks=1 append may be lost by an
// unclean leader election, so a retry of it goes to the broker (rule 3).
// acks=all appends are answered locally.
func TestPlanAcksOneDuplicateForwarded(t *testing.T) {
	h := newPlanHarness(t, DedupEnforce)
	b := recordBatch(t, 1, 0, 0, 2, "a")
	pl := h.plan(produce(9, 1, 1000, b), true)
	h.complete(pl, map[int32]brokerResult{0: {offset: 10}})
	putPlan(pl)
	for _, acks := range []int16{1, -1} {
		pl = h.plan(produce(9, acks, 1000, b), true)
		if d := pl.decisions[0]; d.result.Decision != seqstate.Duplicate || d.result.BaseOffset != -1 || d.act != actForward {
			t.Fatalf("acks=%d retry of an acks=1 append: %v offset %d act %v", acks, d.result.Decision, d.result.BaseOffset, d.act)
		}
		putPlan(pl)
	}
	b2 := recordBatch(t, 1, 0, 2, 1, "b")
	pl = h.plan(produce(9, -1, 1000, b2), true)
	h.complete(pl, map[int32]brokerResult{0: {offset: 12}})
	putPlan(pl)
	pl = h.plan(produce(9, -1, 1000, b2), true)
	if d := pl.decisions[0]; d.act != actAnswer || d.local.BaseOffset != 12 {
		t.Fatalf("acks=all retry of an acks=all append: act %v %+v", d.act, d.local)
	}
	putPlan(pl)
	// An acks=1 retry of a batch in flight is forwarded, not parked.
	b3 := recordBatch(t, 1, 0, 3, 1, "c")
	orig := h.plan(produce(9, -1, 1000, b3), true)
	pl = h.plan(produce(9, 1, 1000, b3), true)
	if d := pl.decisions[0]; d.result.Decision != seqstate.InFlight || d.act != actForward {
		t.Fatalf("acks=1 retry of an in-flight batch: %v act %v", d.result.Decision, d.act)
	}
	h.pn.fail(orig)
	h.pn.fail(pl)
}

// TestPlanInFlightRetryGetsOriginalOutcome: a retry of a batch still in
// flight waits, is never forwarded, and is answered with the original's
// outcome when that is a success; an error outcome, or an unknown one, is
// not inherited: the retry gets REQUEST_TIMED_OUT, so that the client
// sends it again and the broker decides it (docs/security.md), never
// success with offset -1 (rule 4).
func TestPlanInFlightRetryGetsOriginalOutcome(t *testing.T) {
	for _, tc := range []struct {
		name   string
		settle func(h *planHarness, orig *producePlan)
		want   brokerResult
	}{
		{"appended", func(h *planHarness, orig *producePlan) {
			h.complete(orig, map[int32]brokerResult{0: {offset: 40}})
		}, brokerResult{offset: 40}},
		{"rejected", func(h *planHarness, orig *producePlan) {
			h.complete(orig, map[int32]brokerResult{0: {err: kerr.NotLeaderForPartition.Code}})
		}, brokerResult{err: kerr.RequestTimedOut.Code, offset: -1}},
		{"timed out after append", func(h *planHarness, orig *producePlan) {
			h.complete(orig, map[int32]brokerResult{0: {err: kerr.RequestTimedOut.Code}})
		}, brokerResult{err: kerr.RequestTimedOut.Code, offset: -1}},
		{"upstream lost", func(h *planHarness, orig *producePlan) { h.pn.fail(orig) },
			brokerResult{err: kerr.RequestTimedOut.Code, offset: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newPlanHarness(t, DedupEnforce)
			b := recordBatch(t, 1, 0, 0, 2, "a")
			orig := h.plan(produce(9, -1, 1000, b), true)
			retry := h.plan(produce(9, -1, 1000, b, recordBatch(t, 2, 0, 0, 1, "new")), true)
			if got := acts(retry); got[0] != actWait || got[1] != actForward || retry.nWaits != 1 {
				t.Fatalf("retry acts %v waits %d", got, retry.nWaits)
			}
			tc.settle(h, orig)
			if !h.pn.waitsDone(retry) {
				t.Fatal("the original's outcome did not reach the waiting retry")
			}
			select {
			case <-retry.ready:
			default:
				t.Fatal("the waiting retry was not signalled")
			}
			up := h.complete(retry, map[int32]brokerResult{1: {offset: 60}})
			rs := h.answer(retry, up)
			if r := rs[0]; r.ErrorCode != tc.want.err || r.BaseOffset != tc.want.offset {
				t.Fatalf("retry answered %+v, want %+v", r, tc.want)
			}
			if r := rs[1]; r.ErrorCode != 0 || r.BaseOffset != 60 {
				t.Fatalf("forwarded partition answered %+v", r)
			}
		})
	}
}

// TestPlanInFlightRaceWithTimedOutCommit: the original commits without an
// offset (REQUEST_TIMED_OUT) between the retry's first check (InFlight) and
// its registration as a waiter. The second check, under the waiters lock,
// sees the commit, and the retry is forwarded so the broker answers with the
// real offset: never success with -1 (rule 4).
func TestPlanInFlightRaceWithTimedOutCommit(t *testing.T) {
	h := newPlanHarness(t, DedupEnforce)
	b := recordBatch(t, 1, 0, 0, 2, "a")
	orig := h.plan(produce(9, -1, 1000, b), true)
	hook := func(where string) {
		if where == "inflight" {
			h.complete(orig, map[int32]brokerResult{0: {err: kerr.RequestTimedOut.Code}})
		}
	}
	testHookFn.Store(&hook)
	retry := h.plan(produce(9, -1, 1000, b), true)
	testHookFn.Store(nil)
	d := retry.decisions[0]
	if d.result.Decision != seqstate.Duplicate || d.result.BaseOffset != -1 || d.act != actForward || retry.nWaits != 0 {
		t.Fatalf("retry after a racing timed-out commit: %v offset %d act %v waits %d", d.result.Decision, d.result.BaseOffset, d.act, retry.nWaits)
	}
}

// TestPlanWaitDeadline: a wait whose original never resolves is answered
// REQUEST_TIMED_OUT when abandoned (the session does so at the deadline,
// timeout_ms + waitMargin), and the original resolving later finds no
// waiter.
func TestPlanWaitDeadline(t *testing.T) {
	h := newPlanHarness(t, DedupEnforce)
	b := recordBatch(t, 1, 0, 0, 2, "a")
	orig := h.plan(produce(9, -1, 1000, b), true)
	retry := h.plan(produce(9, -1, 250, b), true)
	if want := h.now.Add(250*time.Millisecond + waitMargin); !retry.deadline.Equal(want) {
		t.Fatalf("deadline %v, want %v", retry.deadline, want)
	}
	h.pn.abandonWaits(retry)
	if r := h.answer(retry, nil)[0]; r.ErrorCode != kerr.RequestTimedOut.Code {
		t.Fatalf("abandoned wait answered %+v", r)
	}
	if n := h.pn.nWaiting.Load(); n != 0 || len(h.pn.waiters) != 0 {
		t.Fatalf("waiters left: %d %v", n, h.pn.waiters)
	}
	h.complete(orig, map[int32]brokerResult{0: {offset: 3}})
	if r := h.decide(1, 0, 0, 0, 2); r.Decision != seqstate.Duplicate || r.BaseOffset != 3 {
		t.Fatalf("original after the abandoned wait: %+v", r)
	}
	// A huge timeout_ms is capped.
	pl := h.plan(produce(9, -1, 1<<30, recordBatch(t, 2, 0, 0, 1, "x")), true)
	if want := h.now.Add(maxWaitTimeout + waitMargin); !pl.deadline.Equal(want) {
		t.Fatalf("deadline %v, want the cap %v", pl.deadline, want)
	}
}

// TestPlanSequenceReuseAnsweredLocally: same sequences, different records:
// Kafka would answer success and drop the records; the proxy answers 45.
func TestPlanSequenceReuseAnsweredLocally(t *testing.T) {
	h := newPlanHarness(t, DedupEnforce)
	pl := h.plan(produce(9, -1, 1000, recordBatch(t, 1, 0, 0, 2, "a")), true)
	h.complete(pl, map[int32]brokerResult{0: {offset: 0}})
	pl = h.plan(produce(9, -1, 1000, recordBatch(t, 1, 0, 0, 2, "other")), true)
	if r := h.answer(pl, nil)[0]; r.ErrorCode != kerr.OutOfOrderSequenceNumber.Code || !pl.reuse {
		t.Fatalf("sequence reuse answered %+v", r)
	}
}

// TestPlanObserveForwardsEverything: observe decides and counts but never
// answers or waits.
func TestPlanObserveForwardsEverything(t *testing.T) {
	h := newPlanHarness(t, DedupObserve)
	b := recordBatch(t, 1, 0, 0, 2, "a")
	orig := h.plan(produce(9, -1, 1000, b), true)
	retry := h.plan(produce(9, -1, 1000, b), true)
	h.complete(orig, map[int32]brokerResult{0: {offset: 0}})
	dup := h.plan(produce(9, -1, 1000, b), true)
	for _, pl := range []*producePlan{retry, dup} {
		if pl.anyLocal || pl.decisions[0].act != actForward {
			t.Fatalf("observe mode answered locally: %v", pl.decisions[0].result.Decision)
		}
	}
}

// TestPlanFailReleases: a plan whose response never comes releases its
// pending batches, so the client's retry is decided afresh and forwarded.
func TestPlanFailReleases(t *testing.T) {
	h := newPlanHarness(t, DedupEnforce)
	b := recordBatch(t, 1, 0, 0, 2, "a")
	pl := h.plan(produce(9, -1, 1000, b), true)
	h.pn.fail(pl)
	h.pn.fail(pl) // idempotent
	retry := h.plan(produce(9, -1, 1000, b), true)
	if d := retry.decisions[0]; d.result.Decision != seqstate.Accept || d.act != actForward {
		t.Fatalf("retry after a failed plan: %v", d.result.Decision)
	}
	// A response that leaves a partition out releases it too.
	h.pn.fail(retry)
	pl = h.plan(produce(9, -1, 1000, b, recordBatch(t, 1, 0, 0, 1, "p1")), true)
	resp := h.response(pl, map[int32]brokerResult{0: {offset: 0}, 1: {offset: 0}})
	short := kmsg.NewPtrProduceResponse()
	short.SetVersion(9)
	if err := short.ReadFrom(resp); err != nil {
		t.Fatal(err)
	}
	short.Topics[0].Partitions = short.Topics[0].Partitions[:1]
	if err := h.pn.complete(pl, &h.rscan, short.AppendTo(nil), h.now); err != nil {
		t.Fatal(err)
	}
	if r := h.decide(1, 1, 0, 0, 1); r.Decision != seqstate.Accept {
		t.Fatalf("partition missing from the response: %v, want released", r.Decision)
	}
	// A malformed response releases everything.
	pl = h.plan(produce(9, -1, 1000, recordBatch(t, 3, 0, 0, 1, "m")), true)
	if err := h.pn.complete(pl, &h.rscan, []byte{0x7f} /* 126 topics in no bytes */, h.now); err == nil {
		t.Fatal("malformed response accepted")
	}
	if r := h.decide(3, 0, 0, 0, 1); r.Decision != seqstate.Accept {
		t.Fatalf("after a malformed response: %v, want released", r.Decision)
	}
}

// TestPlanAcksZero: acks=0 registers nothing; a durable duplicate is not
// written again, sequence reuse marks the plan for closing the connection.
func TestPlanAcksZero(t *testing.T) {
	h := newPlanHarness(t, DedupEnforce)
	b := recordBatch(t, 1, 0, 0, 2, "a")
	pl := h.plan(produce(9, 0, 1000, b), true)
	if d := pl.decisions[0]; d.pending || d.commit || h.pn.table.Len() != 0 {
		t.Fatalf("acks=0 registered: %+v", d)
	}
	pl = h.plan(produce(9, -1, 1000, b), true)
	h.complete(pl, map[int32]brokerResult{0: {offset: 0}})
	pl = h.plan(produce(9, 0, 1000, b), true)
	if got := acts(pl); got[0] != actAnswer || pl.reuse || pl.anyUp {
		t.Fatalf("acks=0 duplicate: %v reuse=%v", got, pl.reuse)
	}
	pl = h.plan(produce(9, 0, 1000, recordBatch(t, 1, 0, 0, 2, "other")), true)
	if got := acts(pl); got[0] != actAnswer || !pl.reuse {
		t.Fatalf("acks=0 sequence reuse: %v reuse=%v", got, pl.reuse)
	}
}

// TestLogStartOffsetsBounded: the per-partition log start offsets stay
// within their bound and answer -1 for what they forgot.
func TestLogStartOffsetsBounded(t *testing.T) {
	var l logStartOffsets
	l.init()
	for p := int32(0); p < 2*logStartShards*logStartPerShard; p++ {
		l.set(seqstate.Key{Topic: 1, Partition: p}, int64(p))
	}
	n := 0
	for i := range l.shards {
		if len(l.shards[i].m) > logStartPerShard {
			t.Fatalf("shard %d holds %d", i, len(l.shards[i].m))
		}
		n += len(l.shards[i].m)
	}
	if n == 0 {
		t.Fatal("nothing kept")
	}
	if got := l.get(seqstate.Key{ProducerID: 9, Topic: 2, Partition: 0}); got != -1 {
		t.Fatalf("unknown partition: %d", got)
	}
	l.set(seqstate.Key{Topic: 2}, 5)
	if got := l.get(seqstate.Key{ProducerID: 7, Topic: 2}); got != 5 {
		t.Fatalf("get %d, want 5 whatever the producer", got)
	}
}

// TestPlanPendingGauge: the pending-batches count rises with each batch
// sent upstream and falls when it is committed, released or failed.
func TestPlanPendingGauge(t *testing.T) {
	h := newPlanHarness(t, DedupEnforce)
	a := h.plan(produce(9, -1, 1000, recordBatch(t, 1, 0, 0, 1, "a"), recordBatch(t, 1, 0, 0, 1, "b")), true)
	l := h.plan(produce(7, -1, 1000, recordBatch(t, -1, -1, -1, 1, "legacy")), true)
	if n := h.pn.pending.Load(); n != 3 {
		t.Fatalf("pending %d, want 3", n)
	}
	h.complete(a, map[int32]brokerResult{0: {offset: 0}, 1: {err: kerr.NotLeaderForPartition.Code}})
	h.pn.fail(l)
	if n := h.pn.pending.Load(); n != 0 {
		t.Fatalf("pending %d after commit, release and failure, want 0", n)
	}
	dup := h.plan(produce(9, -1, 1000, recordBatch(t, 1, 0, 0, 1, "a")), true)
	if dup.decisions[0].act != actAnswer || testutil.ToFloat64(h.pn.metrics.dupAnswered[dupByProxy]) != 1 {
		t.Fatal("duplicate answered by the proxy not counted")
	}
}
