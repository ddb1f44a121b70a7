package proxy

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/decide"
	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// newDecisionSession is a session with just what decideProduce needs: an
// authenticated connection and the topic "steady" known from Metadata
// (its partitions read from the log already: warm-up off).
func newDecisionSession(t testing.TB) *session {
	s := &Server{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: NewMetrics(nil)}
	off := false
	s.Config.Dedup.Warm.Enabled = &off
	s.Config.EnsureDefaults()
	var err error
	if s.core, s.table, s.keys, err = newCore(&s.Config); err != nil {
		t.Fatal(err)
	}
	s.table.InternTopics([]seqstate.TopicRef{{Name: "steady", Partitions: 4}})
	s.openUpstream.Store(true)
	client, _ := net.Pipe()
	return &session{s: s, log: s.Logger, id: 1, client: client, wake: make(chan struct{}, 1), closed: make(chan struct{})}
}

// decideSettle runs one request through the Produce path as readLoop and
// responseLoop do: decided, answered by the broker, the answer written.
func (c *session) decideSettle(t testing.TB, body, response []byte) *producePlan {
	h, err := protocol.ParseRequestHeader(body)
	if err != nil {
		t.Fatal(err)
	}
	pl, err := c.decideProduce(h, body)
	if err != nil || pl == nil || pl.AnyLocal || len(pl.Parts) != 4 {
		t.Fatalf("decide: %v %+v", err, pl)
	}
	if response != nil {
		if err := c.settleResponse(pl, response); err != nil {
			t.Fatal(err)
		}
		// Each answer is delivered 100 ms after the previous one, as at
		// ten requests a second: answered batches pass their hold (the
		// request's timeout plus a margin) and are let go in steady state.
		c.s.step(&decide.Event{Kind: decide.EvWritten, Plan: &pl.Plan, OK: true}, time.Now().Add(time.Duration(deliverTick.Add(1))*100*time.Millisecond), nil)
	}
	return pl
}

var deliverTick atomic.Int64

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
	i := 0
	run := func() {
		pl := c.decideSettle(t, frames[i], responses[i])
		i++
		sinkPlan = pl
		putPlan(pl)
	}
	run() // first sight of each partition allocates its entry
	allocs := testing.AllocsPerRun(1000, run)
	if allocs != 0 && !raceEnabled { // the race detector makes sync.Pool drop items
		t.Fatalf("%v allocations per request (4 batches) on the steady-state path", allocs)
	}
}

// BenchmarkDecideSettleProduce measures the per-request cost of the dedup
// path for a 4-partition request of an idempotent producer: scan, decide,
// the broker's answer applied, the answer written.
func BenchmarkDecideSettleProduce(b *testing.B) {
	benchDecideSettle(b, func(i int) []byte { return recordBatch(b, 99, 0, int32(i*10), 10, "steady-state record value") })
}

// BenchmarkDecideSettleLegacy is BenchmarkDecideSettleProduce for a
// legacy producer (producer id -1): every record is hashed and kept.
func BenchmarkDecideSettleLegacy(b *testing.B) {
	benchDecideSettle(b, func(i int) []byte {
		return recordBatch(b, -1, -1, -1, 10, fmt.Sprintf("steady-state record value %d", i))
	})
}

func benchDecideSettle(b *testing.B, batch func(i int) []byte) {
	const n = 1 << 12
	c := newDecisionSession(b)
	frames := make([][]byte, n)
	for i := range frames {
		var parts []part
		for p := int32(0); p < 4; p++ {
			parts = append(parts, part{p, batch(i)})
		}
		frames[i] = kmsg.NewRequestFormatter().AppendRequest(nil, produceParts("steady", -1, parts...), int32(i))[4:]
	}
	responses := steadyResponses(n)
	b.ReportAllocs()
	b.SetBytes(int64(len(frames[0])))
	i := 0
	for b.Loop() {
		if i == n {
			b.StopTimer()
			c = newDecisionSession(b)
			i = 0
			b.StartTimer()
		}
		putPlan(c.decideSettle(b, frames[i], responses[i]))
		i++
	}
	b.ReportMetric(4, "batches/op")
}

// TestLegacySteadyStateNoAllocs pins zero allocations per request for
// legacy batches (producer id -1) on the steady-state path: scan, record
// identities, decision, the broker's answer and the delivered answer.
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
	i := 0
	run := func() {
		pl := c.decideSettle(t, frames[i], responses[i])
		if !pl.Parts[0].Verdict.Legacy {
			t.Fatal("not decided as legacy")
		}
		i++
		sinkPlan = pl
		putPlan(pl)
	}
	// A connection keeps the batches of its last requests (a retry may
	// still need them): past those, each new batch reuses one let go.
	for range 100 {
		run()
	}
	allocs := testing.AllocsPerRun(1000, run)
	if allocs != 0 && !raceEnabled {
		t.Fatalf("%v allocations per request (4 legacy batches) on the steady-state path", allocs)
	}
}
