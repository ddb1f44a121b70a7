package decide

import (
	"fmt"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/decide/internal/lockcheck"
	"github.com/dedupproxy/dedupproxy/decide/sent"
	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// steady is one client instance producing legacy batches to 4 partitions
// on one connection, each answered and delivered: the path every legacy
// batch takes when nothing goes wrong.
type steady struct {
	c     *Core
	conn  *Conn
	topic seqstate.TopicID
	reqs  []Request
	resps [][]byte
	pl    Plan
	fx    Effects
	sc    protocol.ProduceResponseScanner
	now   time.Time
}

func newSteady(tb testing.TB, n, records int) *steady {
	tab, err := seqstate.New(seqstate.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	tab.InternTopics([]seqstate.TopicRef{{Name: scriptTopic, Partitions: 4}})
	return steadyOn(tb, New(Config{Table: tab}, &Settings{}), 1, n, records)
}

// steadyOn is newSteady for connection id of c, its records its own.
func steadyOn(tb testing.TB, c *Core, id ConnID, n, records int) *steady {
	topic, _ := c.table.LookupTopic([]byte(scriptTopic))
	s := &steady{c: c, topic: topic, now: ddBase}
	s.conn = s.c.connect(id, Client{ID: "bench", Host: netip.MustParseAddr("127.0.0.1")}, s.now)
	ts := make([]int64, records)
	for i := range n {
		req := Request{Conn: s.conn, Version: 9, Acks: -1, Timeout: 5 * time.Second}
		resp := kmsg.NewPtrProduceResponse()
		resp.SetVersion(9)
		rt := kmsg.NewProduceResponseTopic()
		rt.Topic = scriptTopic
		for p := range int32(4) {
			names := make([]string, records)
			for j := range names {
				names[j] = fmt.Sprintf("record %d of request %d to partition %d on connection %d, about a hundred bytes long.........", j, i, p, id)
				ts[j] = ddBase.UnixMilli()
			}
			raw := scriptBatch(names, ts, -1, 0, 0, false)
			var h protocol.BatchHeader
			if _, err := protocol.ReadBatch(raw, &h); err != nil {
				tb.Fatal(err)
			}
			req.Parts = append(req.Parts, Part{TI: 0, PI: int(p), Topic: topic, Partition: p, Header: h, Records: raw})
			rp := kmsg.NewProduceResponseTopicPartition()
			rp.Partition, rp.BaseOffset, rp.LogAppendTime = p, int64(i*records), -1
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
		s.reqs = append(s.reqs, req)
		s.resps = append(s.resps, resp.AppendTo(nil))
	}
	return s
}

// one decides request i, applies its answer and delivers it, 100 ms
// after the previous one (so that answered batches pass their hold).
func (s *steady) one(tb testing.TB, i int) {
	s.now = s.now.Add(100 * time.Millisecond)
	s.c.decide(&s.reqs[i], &s.pl, s.now, &s.fx)
	if s.pl.Status != Ready || s.pl.AnyLocal {
		tb.Fatalf("request %d: status %d, local %v", i, s.pl.Status, s.pl.AnyLocal)
	}
	if _, err := s.c.outcome(&s.pl, &s.sc, s.resps[i], s.now, nil); err != nil {
		tb.Fatal(err)
	}
	s.c.delivered(&s.pl, true, s.now)
}

// TestLegacyNoAllocs pins zero allocations per request on the core's
// steady-state legacy path, once a connection keeps the batches of its
// last requests (keepRequests): each new batch reuses one let go.
func TestLegacyNoAllocs(t *testing.T) {
	if lockcheck.On {
		t.Skip("a lockcheck build allocates at each lock it checks")
	}
	s := newSteady(t, 1300, 10)
	i := 0
	for ; i < sent.KeepRequests+10; i++ {
		s.one(t, i)
	}
	if n := testing.AllocsPerRun(1000, func() { s.one(t, i); i++ }); n != 0 {
		t.Fatalf("%v allocations per request of 4 legacy batches", n)
	}
}

// BenchmarkDecideLegacy measures the core's work for one request of 4
// legacy batches of 10 records of about 100 bytes: the records hashed and
// kept, the answer applied, the answer delivered.
func BenchmarkDecideLegacy(b *testing.B) {
	const n = 4096
	s := newSteady(b, n, 10)
	b.ReportAllocs()
	b.SetBytes(int64(4 * len(s.reqs[0].Parts[0].Records)))
	i := 0
	for b.Loop() {
		if i == n {
			b.StopTimer()
			s = newSteady(b, n, 10)
			i = 0
			b.StartTimer()
		}
		s.one(b, i)
		i++
	}
	b.ReportMetric(4, "batches/op")
}

// BenchmarkLegacyMemory reports the heap per legacy record remembered, for
// batches of 100 records (each batch's own share and the index a lookup
// builds included): connections that closed, so their batches stay for the
// window.
func BenchmarkLegacyMemory(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		const conns, perConn = 16, sent.KeepRequests
		first := newSteady(b, 1, 1)
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		var all []*steady
		for c := range conns {
			all = append(all, steadyOn(b, first.c, ConnID(c+2), perConn, 100))
		}
		b.StartTimer()
		for _, s := range all {
			for i := range s.reqs {
				s.one(b, i)
			}
			s.c.disconnect(s.conn, Broken, s.now)
		}
		// A request of the same instance looks its records up, which
		// builds the index of the disowned ones: counted too.
		probe := steadyOn(b, first.c, ConnID(conns+2), 1, 100)
		probe.c.decide(&probe.reqs[0], &probe.pl, probe.now, &probe.fx)
		b.StopTimer()
		probe.reqs, probe.resps = nil, nil
		for _, s := range all {
			s.reqs, s.resps = nil, nil // the requests' bytes are not the core's
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		held, _ := first.c.LegacyRecords()
		b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/float64(held), "B/record")
		runtime.KeepAlive(all)
		b.StartTimer()
	}
}

// BenchmarkInstanceMemory reports the heap per client instance with one
// open connection and nothing remembered yet: what a client costs before
// it sends a legacy batch.
func BenchmarkInstanceMemory(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		const n = 20000
		first := newSteady(b, 1, 1)
		ids := make([]string, n)
		for i := range ids {
			ids[i] = fmt.Sprintf("client-%06d", i)
		}
		conns := make([]*Conn, 0, n)
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		b.StartTimer()
		for i, id := range ids {
			conns = append(conns, first.c.connect(ConnID(i+10), Client{ID: id, Host: netip.MustParseAddr("10.0.0.1")}, first.now))
		}
		b.StopTimer()
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapInuse-before.HeapInuse-uint64(cap(conns))*8)/n, "B/instance")
		runtime.KeepAlive(conns)
		runtime.KeepAlive(ids)
		b.StartTimer()
	}
}

// BenchmarkDecideLegacyAfterReconnect is BenchmarkDecideLegacy for a client
// instance that reconnected: the batches of its closed connection (64
// requests of 4 batches of 100 records) are disowned for the window, so
// each new record is looked up among them (and found in none).
func BenchmarkDecideLegacyAfterReconnect(b *testing.B) {
	const n = 4096
	old := newSteady(b, sent.KeepRequests, 100)
	for i := range old.reqs {
		old.one(b, i)
	}
	old.c.disconnect(old.conn, Broken, old.now)
	s := steadyOn(b, old.c, 2, n, 10)
	s.now = old.now
	b.ReportAllocs()
	b.SetBytes(int64(4 * len(s.reqs[0].Parts[0].Records)))
	i := 0
	for b.Loop() {
		if i == n {
			b.StopTimer()
			s = steadyOn(b, old.c, ConnID(3+i), n, 10)
			s.now = old.now
			i = 0
			b.StartTimer()
		}
		s.one(b, i)
		i++
	}
	b.ReportMetric(4, "batches/op")
	if held, _ := old.c.LegacyRecords(); held < sent.KeepRequests*4*100 {
		b.Fatalf("%d records remembered, want the closed connection's %d at least", held, sent.KeepRequests*4*100)
	}
}
