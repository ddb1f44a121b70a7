package proxy

import (
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// newDecisionSession is a session with just what planProduce needs: a
// trusted connection and the topic "steady" known from Metadata.
func newDecisionSession(t testing.TB) *session {
	s := &Server{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: NewMetrics(nil)}
	s.Config.EnsureDefaults()
	pn, err := newDedupPlanner(&s.Config, s.Metrics)
	if err != nil {
		t.Fatal(err)
	}
	pn.table.InternTopics([]seqstate.TopicRef{{Name: "steady"}})
	s.planner = pn
	s.openUpstream.Store(true)
	return &session{s: s, log: s.Logger}
}

// steadyProduceFrames returns n Produce v9 requests (4 partitions each) of
// one idempotent producer continuing its sequences, as a producer in steady
// state sends them.
func steadyProduceFrames(t testing.TB, n int) [][]byte {
	frames := make([][]byte, n)
	for i := range frames {
		var parts []part
		for p := int32(0); p < 4; p++ {
			parts = append(parts, part{p, recordBatch(t, 99, 0, int32(i*10), 10, "steady-state record value")})
		}
		frames[i] = kmsg.NewRequestFormatter().AppendRequest(nil, produceParts("steady", -1, parts...), int32(i))[4:]
	}
	return frames
}

// steadyResponses returns the broker's answers to n 4-partition requests
// of topic "steady": request i appended at offset 10*i on each partition.
func steadyResponses(n int) [][]byte {
	responses := make([][]byte, n)
	for i := range responses {
		resp := kmsg.NewPtrProduceResponse()
		resp.SetVersion(9)
		rt := kmsg.NewProduceResponseTopic()
		rt.Topic = "steady"
		for p := int32(0); p < 4; p++ {
			rp := kmsg.NewProduceResponseTopicPartition()
			rp.Partition, rp.BaseOffset = p, int64(i*10)
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
		responses[i] = resp.AppendTo(nil)
	}
	return responses
}

var sinkPlan *producePlan

// TestSteadyStateDecisionNoAllocs pins zero allocations per batch on the
// steady-state path: scanning a Produce request, deciding each batch, and
// committing each from the broker's response — for known producers.
func TestSteadyStateDecisionNoAllocs(t *testing.T) {
	c := newDecisionSession(t)
	frames := steadyProduceFrames(t, 1200)
	responses := steadyResponses(len(frames))
	now := time.Now()
	i := 0
	run := func() {
		body := frames[i]
		i++
		h, err := protocol.ParseRequestHeader(body)
		if err != nil {
			t.Fatal(err)
		}
		pl, err := c.planProduce(h, body, now)
		if err != nil || pl == nil || pl.anyLocal || len(pl.decisions) != 4 {
			t.Fatalf("plan: %v %+v", err, pl)
		}
		// The broker's answer commits each batch, as in responseLoop.
		if err := c.s.planner.complete(pl, &c.respScan, responses[i-1], now); err != nil {
			t.Fatal(err)
		}
		sinkPlan = pl
		putPlan(pl)
	}
	run() // first sight of each partition allocates its entry
	allocs := testing.AllocsPerRun(1000, run)
	if allocs != 0 && !raceEnabled { // the race detector makes sync.Pool drop items
		t.Fatalf("%v allocations per request (4 batches) on the steady-state path", allocs)
	}
}

// BenchmarkDecideProduce measures the per-request cost of the dedup path
// (scan, decide, commit) for a 4-partition request.
func BenchmarkDecideProduce(b *testing.B) {
	c := newDecisionSession(b)
	frames := steadyProduceFrames(b, 1<<14)
	now := time.Now()
	b.ReportAllocs()
	b.SetBytes(int64(len(frames[0])))
	i := 0
	for b.Loop() {
		if i == len(frames) {
			b.StopTimer()
			c = newDecisionSession(b)
			i = 0
			b.StartTimer()
		}
		body := frames[i]
		i++
		h, _ := protocol.ParseRequestHeader(body)
		pl, _ := c.planProduce(h, body, now)
		for j := range pl.decisions {
			d := &pl.decisions[j]
			c.s.planner.table.Commit(d.key, d.batch, int64(i*10), 0, now)
		}
		putPlan(pl)
	}
	b.ReportMetric(4, "batches/op")
}

// BenchmarkDecideSettleProduce is BenchmarkDecideProduce with the
// broker's response applied as the proxy applies it (planner.complete), so
// that both table visits of a request are the proxy's own.
func BenchmarkDecideSettleProduce(b *testing.B) {
	const n = 1 << 14
	c := newDecisionSession(b)
	frames := steadyProduceFrames(b, n)
	responses := steadyResponses(n)
	now := time.Now()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if i == n {
			b.StopTimer()
			c = newDecisionSession(b)
			i = 0
			b.StartTimer()
		}
		h, _ := protocol.ParseRequestHeader(frames[i])
		pl, _ := c.planProduce(h, frames[i], now)
		if err := c.s.planner.complete(pl, &c.respScan, responses[i], now); err != nil {
			b.Fatal(err)
		}
		i++
		putPlan(pl)
	}
	b.ReportMetric(4, "batches/op")
}

func TestFrameClasses(t *testing.T) {
	for _, n := range []int{1, 16 << 10, 16<<10 + 1, 64 << 10, 64<<10 + 1, 1 << 20, 64 << 20} {
		bp := getFrame(n)
		if cap(*bp) < n || len(*bp) != 0 {
			t.Fatalf("getFrame(%d): len %d cap %d", n, len(*bp), cap(*bp))
		}
		putFrame(bp)
	}
	if frameClass(64<<20+1) != -1 {
		t.Fatal("a frame above the largest class must not be pooled")
	}
}

// TestLegacySteadyStateNoAllocs pins zero allocations per request for
// legacy batches (producer id -1) on the steady-state path: scan, identity,
// decision, and commit from the broker's response.
func TestLegacySteadyStateNoAllocs(t *testing.T) {
	c := newDecisionSession(t)
	c.id = 1
	frames := make([][]byte, 1200)
	for i := range frames {
		var parts []part
		for p := int32(0); p < 4; p++ {
			parts = append(parts, part{p, recordBatch(t, -1, -1, -1, 10, fmt.Sprintf("legacy record %d/%d", i, p))})
		}
		frames[i] = kmsg.NewRequestFormatter().AppendRequest(nil, produceParts("steady", -1, parts...), int32(i))[4:]
	}
	responses := steadyResponses(len(frames))
	now := time.Now()
	i := 0
	run := func() {
		body := frames[i]
		h, err := protocol.ParseRequestHeader(body)
		if err != nil {
			t.Fatal(err)
		}
		pl, err := c.planProduce(h, body, now)
		if err != nil || pl == nil || pl.anyLocal || len(pl.decisions) != 4 || !pl.decisions[0].legacy {
			t.Fatalf("plan: %v %+v", err, pl)
		}
		if err := c.s.planner.complete(pl, &c.respScan, responses[i], now); err != nil {
			t.Fatal(err)
		}
		i++
		sinkPlan = pl
		putPlan(pl)
	}
	run()
	allocs := testing.AllocsPerRun(1000, run)
	if allocs != 0 && !raceEnabled {
		t.Fatalf("%v allocations per request (4 legacy batches) on the steady-state path", allocs)
	}
}
