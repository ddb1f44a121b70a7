package proxy

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// The planner's and the Produce shell's error and pass-through paths, each
// driven directly.

func frameOf(req kmsg.Request) []byte {
	return kmsg.NewRequestFormatter(kmsg.FormatterClientID("paths")).AppendRequest(nil, req, 3)
}

func planFrame(t *testing.T, c *session, req kmsg.Request) (*producePlan, error) {
	t.Helper()
	body := frameOf(req)[4:]
	h, err := protocol.ParseRequestHeader(body)
	if err != nil {
		t.Fatal(err)
	}
	return c.planProduce(h, body, time.Now())
}

// TestPlanPassThroughReasons: each kind of batch the planner does not
// decide is relayed untouched and counted under its reason.
func TestPlanPassThroughReasons(t *testing.T) {
	c := newDecisionSession(t)
	m := c.s.Metrics
	// Two batches in one records field, and garbage: invalid.
	two := append(recordBatch(t, 1, 0, 0, 1, "a"), recordBatch(t, 1, 0, 1, 1, "b")...)
	for _, recs := range [][]byte{two, []byte("not a batch")} {
		if pl, err := planFrame(t, c, produceParts("steady", -1, part{0, recs})); err != nil || pl != nil {
			t.Fatalf("invalid batch planned: %v %v", err, pl)
		}
	}
	// Magic 1 inside a v3+ request: old format.
	old := recordBatch(t, 1, 0, 0, 1, "a")
	old[16] = 1
	if pl, _ := planFrame(t, c, produceParts("steady", -1, part{0, old})); pl != nil {
		t.Fatal("magic 1 planned")
	}
	// Produce v2: message format v0/v1, counted per request.
	v2 := produceParts("steady", -1, part{0, recordBatch(t, 1, 0, 0, 1, "a")})
	v2.SetVersion(2)
	if pl, _ := planFrame(t, c, v2); pl != nil {
		t.Fatal("Produce v2 planned")
	}
	if a, b := testutil.ToFloat64(m.passthrough[passInvalid]), testutil.ToFloat64(m.passthrough[passOldFormat]); a != 2 || b != 2 {
		t.Fatalf("invalid %v, old_format %v; want 2, 2", a, b)
	}
	// Dedup off: nothing scanned, counted per request.
	off := newDecisionSession(t)
	off.s.Config.Dedup.Mode = DedupOff
	pn, err := newDedupPlanner(&off.s.Config, off.s.Metrics)
	if err != nil {
		t.Fatal(err)
	}
	off.s.planner = pn
	if pl, _ := planFrame(t, off, produceParts("steady", -1, part{0, recordBatch(t, 1, 0, 0, 1, "a")})); pl != nil {
		t.Fatal("planned with dedup off")
	}
	if n := testutil.ToFloat64(off.s.Metrics.passthrough[passDedupOff]); n != 1 {
		t.Fatalf("dedup_off %v", n)
	}
}

// TestPlanMalformedRequestReleases: a request that turns out malformed
// after a partition was decided releases what it registered and is an
// error (the session closes the connection).
func TestPlanMalformedRequestReleases(t *testing.T) {
	c := newDecisionSession(t)
	req := produceParts("steady", -1, part{0, recordBatch(t, 1, 0, 0, 1, "a")}, part{1, recordBatch(t, 1, 0, 0, 1, "b")})
	body := frameOf(req)[4:]
	h, err := protocol.ParseRequestHeader(body)
	if err != nil {
		t.Fatal(err)
	}
	cut := body[:len(body)-10] // the second partition is truncated
	if _, err := c.planProduce(h, cut, time.Now()); err == nil {
		t.Fatal("truncated request planned")
	}
	if _, err := c.planProduce(h, body[:h.BodyOffset+1], time.Now()); err == nil {
		t.Fatal("request without a body planned")
	}
	id, _ := c.s.planner.table.LookupTopic([]byte("steady"))
	if r := c.s.planner.table.Decide(seqstate.Key{ProducerID: 1, Topic: id, Partition: 0}, seqstate.Batch{FirstSeq: 0, Count: 1}, time.Now()); r.Decision != seqstate.Accept {
		t.Fatalf("the decided partition stayed registered: %v", r.Decision)
	}
}

// TestPlanCompleteIgnoresWhatItDidNotSend: a response naming a topic or
// partition the plan did not forward changes nothing.
func TestPlanCompleteIgnoresWhatItDidNotSend(t *testing.T) {
	h := newPlanHarness(t, DedupEnforce)
	pl := h.plan(produce(9, -1, 1000, recordBatch(t, 1, 0, 0, 1, "a")), true)
	resp := kmsg.NewPtrProduceResponse()
	resp.SetVersion(9)
	for _, name := range []string{"unknown-topic", planTopic} {
		rt := kmsg.NewProduceResponseTopic()
		rt.Topic = name
		rp := kmsg.NewProduceResponseTopicPartition()
		rp.Partition = 7 // not in the request
		rt.Partitions = append(rt.Partitions, rp)
		resp.Topics = append(resp.Topics, rt)
	}
	if err := h.pn.complete(pl, &h.rscan, resp.AppendTo(nil), h.now); err != nil {
		t.Fatal(err)
	}
	if r := h.decide(1, 0, 0, 0, 1); r.Decision != seqstate.Accept {
		t.Fatalf("an unanswered partition: %v, want released", r.Decision)
	}
}

// TestFinishProduceMergeFailureCloses: a broker response that does not
// answer a partition sent to it cannot be merged; the connection closes
// rather than answer wrongly.
func TestFinishProduceMergeFailureCloses(t *testing.T) {
	c := newDecisionSession(t)
	pn := c.s.planner
	now := time.Now()
	b := recordBatch(t, 1, 0, 0, 1, "a")
	req := produceParts("steady", -1, part{0, b})
	pl, _ := planFrame(t, c, req)
	up := kmsg.NewPtrProduceResponse()
	up.SetVersion(9)
	rt := kmsg.NewProduceResponseTopic()
	rt.Topic = "steady"
	rp := kmsg.NewProduceResponseTopicPartition()
	rt.Partitions = append(rt.Partitions, rp)
	up.Topics = append(up.Topics, rt)
	if err := pn.complete(pl, &c.respScan, up.AppendTo(nil), now); err != nil {
		t.Fatal(err)
	}
	putPlan(pl)
	// A duplicate answered locally next to a new partition the broker's
	// (empty) answer leaves out.
	mixed := produceParts("steady", -1, part{0, b}, part{1, recordBatch(t, 2, 0, 0, 1, "b")})
	pl, err := planFrame(t, c, mixed)
	if err != nil || !pl.anyLocal || !pl.anyUp {
		t.Fatalf("plan: %v %+v", err, pl)
	}
	body := frameOf(mixed)[4:]
	h, _ := protocol.ParseRequestHeader(body)
	pl.skeleton = append(pl.skeleton[:0], body[h.BodyOffset:]...)
	empty := kmsg.NewPtrProduceResponse()
	empty.SetVersion(9)
	bp := getFrame(64)
	*bp = append(append((*bp)[:0], 0, 0, 0, 0, 0, 0, 0, 3, 0), empty.AppendTo(nil)...)
	pl.upstream, pl.upOff = bp, 5
	p := &pending{plan: pl}
	c.finishProduce(p)
	if !p.failed || p.resp != nil {
		t.Fatalf("merge failure: failed=%v resp=%v", p.failed, p.resp != nil)
	}
	pn.fail(pl)
	putPlan(pl)
}

// TestAcksZeroMixedRequest: acks=0 with a durable duplicate and a new
// batch: only the new one is forwarded, in a reduced request, and nothing
// is registered.
func TestAcksZeroMixedRequest(t *testing.T) {
	c := newDecisionSession(t)
	upstream, broker := net.Pipe()
	defer upstream.Close()
	c.upstream = upstream
	got := make(chan []byte, 1)
	go func() {
		b, _ := readFrame(broker)
		got <- b
		io.Copy(io.Discard, broker)
	}()
	b := recordBatch(t, 1, 0, 0, 1, "a")
	pl, _ := planFrame(t, c, produceParts("steady", -1, part{0, b}))
	resp := kmsg.NewPtrProduceResponse()
	resp.SetVersion(9)
	rt := kmsg.NewProduceResponseTopic()
	rt.Topic = "steady"
	rt.Partitions = append(rt.Partitions, kmsg.NewProduceResponseTopicPartition())
	resp.Topics = append(resp.Topics, rt)
	if err := c.s.planner.complete(pl, &c.respScan, resp.AppendTo(nil), time.Now()); err != nil {
		t.Fatal(err)
	}
	putPlan(pl)
	req := produceParts("steady", 0, part{0, b}, part{1, recordBatch(t, 5, 0, 0, 1, "new")})
	frame := frameOf(req)
	h, _ := protocol.ParseRequestHeader(frame[4:])
	pl, err := c.planProduce(h, frame[4:], time.Now())
	if err != nil || pl == nil || !pl.anyLocal || !pl.anyUp {
		t.Fatalf("plan: %v %+v", err, pl)
	}
	if !c.sendPlanned(pl, h, frame[4:], frame, time.Now(), c.s.Metrics.api(0)) {
		t.Fatal("connection closed")
	}
	sent := kmsg.NewPtrProduceRequest()
	sent.SetVersion(9)
	body := <-got
	sh, err := protocol.ParseRequestHeader(body)
	if err != nil {
		t.Fatal(err)
	}
	if err := sent.ReadFrom(body[sh.BodyOffset:]); err != nil {
		t.Fatal(err)
	}
	if len(sent.Topics) != 1 || len(sent.Topics[0].Partitions) != 1 || sent.Topics[0].Partitions[0].Partition != 1 {
		t.Fatalf("forwarded %+v, want only partition 1", sent.Topics)
	}
	if c.unqueued != nil {
		t.Fatal("plan left unqueued")
	}
}
