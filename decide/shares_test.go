package decide

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// harness drives a core the way a session does, for tests that need more
// records than a script reads well.
type harness struct {
	t     *testing.T
	c     *Core
	topic seqstate.TopicID
	now   time.Time
	offs  map[int32]int64 // the broker's next offset, per partition
}

func newHarness(t *testing.T, maxRecords int) *harness {
	tab, err := seqstate.New(seqstate.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tab.InternTopics([]seqstate.TopicRef{{Name: scriptTopic, Partitions: 4}})
	topic, _ := tab.LookupTopic([]byte(scriptTopic))
	c := New(Config{Table: tab, Window: time.Minute, MaxRecords: maxRecords}, &Settings{})
	return &harness{t: t, c: c, topic: topic, now: ddBase, offs: map[int32]int64{}}
}

func (h *harness) connect(id ConnID, client string, principal uint32) *Conn {
	return h.c.connect(id, Client{Principal: principal, ID: client, Host: netip.MustParseAddr("127.0.0.1")}, h.now)
}

// send decides one batch of values to partition p on conn.
func (h *harness) send(conn *Conn, p int32, values []string) *Plan {
	h.t.Helper()
	ts := make([]int64, len(values))
	for i := range ts {
		ts[i] = h.now.UnixMilli()
	}
	raw := scriptBatch(values, ts, -1, -1, -1, false)
	var bh protocol.BatchHeader
	if _, err := protocol.ReadBatch(raw, &bh); err != nil {
		h.t.Fatal(err)
	}
	req := &Request{Conn: conn, Version: 9, Acks: -1, Timeout: 5 * time.Second,
		Parts: []Part{{Topic: h.topic, Partition: p, Header: bh, Records: raw}}}
	pl := &Plan{}
	h.c.decide(req, pl, h.now, new(Effects))
	if pl.Status != Ready {
		h.t.Fatalf("status %d, want ready", pl.Status)
	}
	return pl
}

// answer has the broker append what pl forwarded, and the answer written
// to the client when delivered.
func (h *harness) answer(pl *Plan, delivered bool) {
	h.t.Helper()
	if pl.AnyUp {
		resp := kmsg.NewPtrProduceResponse()
		resp.SetVersion(9)
		rt := kmsg.NewProduceResponseTopic()
		rt.Topic = scriptTopic
		for i := range pl.Parts {
			if pl.Parts[i].Act == Answer {
				continue
			}
			p := pl.st[i].key.Partition
			rp := kmsg.NewProduceResponseTopicPartition()
			rp.Partition, rp.BaseOffset, rp.LogAppendTime = p, h.offs[p], -1
			h.offs[p] += int64(pl.Parts[i].Verdict.Records)
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
		var sc protocol.ProduceResponseScanner
		if _, err := h.c.outcome(pl, &sc, resp.AppendTo(nil), h.now, nil); err != nil {
			h.t.Fatal(err)
		}
	}
	h.c.delivered(pl, delivered, h.now)
}

func values(prefix string, n int) []string {
	v := make([]string, n)
	for i := range v {
		v[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return v
}

// fill has instance client of principal send n distinct records in
// batches of 256, all pipelined before the first answer, have them
// acknowledged, then close its connection: its records stay, matchable,
// for the window (docs/legacy.md rule 1).
func (h *harness) fill(id ConnID, client string, principal uint32, n int) {
	conn := h.connect(id, client, principal)
	var pls []*Plan
	for i := 0; i < n; i += 256 {
		pls = append(pls, h.send(conn, 1, values(fmt.Sprintf("%s-%d", client, i), min(256, n-i))))
	}
	for _, pl := range pls {
		h.answer(pl, true)
	}
	h.c.disconnect(conn, Broken, h.now)
}

// lostAndRetried sends a batch whose answer never reaches its client on one
// connection and its retry on the next: the retry's act.
func (h *harness) lostAndRetried(client string, principal uint32, id ConnID) Act {
	h.t.Helper()
	conn := h.connect(id, client, principal)
	vs := values(client+"-order", 10)
	h.answer(h.send(conn, 0, vs), false)
	h.c.disconnect(conn, Broken, h.now)
	retry := h.connect(id+1, client, principal)
	pl := h.send(retry, 0, vs)
	h.answer(pl, true)
	return pl.Parts[0].Act
}

// TestFairShareFillerCannotSwitchOthersOff: a client that fills the store
// with records and closes cannot make another client's lost-acknowledgement
// retry be written twice (docs/security.md, "Fair shares"): the other is
// within its share, and the room comes from the largest holder. Both
// within one principal (instances) and across principals.
func TestFairShareFillerCannotSwitchOthersOff(t *testing.T) {
	for _, principal := range []uint32{0, 7} {
		t.Run(fmt.Sprintf("victim-principal-%d", principal), func(t *testing.T) {
			h := newHarness(t, 4096)
			h.fill(1, "filler", 0, 8192)
			if held, _ := h.c.LegacyRecords(); held < 4096-256 {
				t.Fatalf("the filler holds %d records; want the store about full", held)
			}
			if act := h.lostAndRetried("victim", principal, 10); act != Answer {
				t.Fatalf("the victim's retry: act %d, want answered as a retry (not written twice)", act)
			}
			use := h.c.LegacyUse(nil)
			var evicted uint64
			for _, u := range use {
				if u.Principal == 0 {
					evicted = u.Evicted
				}
			}
			if evicted == 0 {
				t.Fatalf("use %+v: want the filler's principal to have records evicted", use)
			}
		})
	}
}

// TestFairShareOverShareEvictsOnlyItself: a client holding more than its
// share cannot take room from one within its share; its own oldest
// records go instead.
func TestFairShareOverShareEvictsOnlyItself(t *testing.T) {
	h := newHarness(t, 4096)
	// The victim's batch is held (its answer lost), the filler then fills.
	conn := h.connect(10, "victim", 0)
	vs := values("victim-order", 10)
	h.answer(h.send(conn, 0, vs), false)
	h.c.disconnect(conn, Broken, h.now)
	h.fill(1, "filler", 0, 16384)
	retry := h.connect(11, "victim", 0)
	pl := h.send(retry, 0, vs)
	if pl.Parts[0].Act != Answer {
		t.Fatalf("the victim's retry after the filler: act %d, want answered as a retry", pl.Parts[0].Act)
	}
	if held, _ := h.c.LegacyRecords(); held > 4096+256 {
		t.Fatalf("held %d records, want at most the bound (4096) and one batch", held)
	}
}

// TestIdenticalRecordsBoundedWork: identical records cost O(1) each in the
// index of records whose acknowledgement may not be held, whatever their
// number (docs/security.md, "Bounded work"): 64 requests of 16,384
// identical empty records from one instance, a close, then the same
// record sent again and more of them. Linear probing on one hash made
// this quadratic: the next request never got its answer.
func TestIdenticalRecordsBoundedWork(t *testing.T) {
	const reqs, per = 64, 16384
	h := newHarness(t, 2*reqs*per)
	conn := h.connect(1, "a", 0)
	same := make([]string, per)
	for i := range same {
		same[i] = "" // an empty value: the smallest record
	}
	for range reqs {
		h.answer(h.send(conn, 0, same), true)
	}
	h.c.disconnect(conn, Broken, h.now)
	in := conn.Inst
	base := in.IndexSteps()
	retry := h.connect(2, "a", 0)
	pl := h.send(retry, 0, []string{""})
	if pl.Parts[0].Act != Answer {
		t.Fatalf("one record resent: act %d, want answered as a retry", pl.Parts[0].Act)
	}
	// Then a whole request of them: each matches the next original.
	pl = h.send(retry, 0, same)
	if pl.Parts[0].Act != Answer || pl.Parts[0].Local.BaseOffset != 1 {
		t.Fatalf("a request of identical records resent: act %d answer %+v, want answered from offset 1", pl.Parts[0].Act, pl.Parts[0].Local)
	}
	added := uint64(reqs * per)
	if steps := in.IndexSteps(); steps > 4*added {
		t.Fatalf("%d index steps for %d records indexed and %d looked up: want O(1) each", steps, added, per+1)
	}
	if steps := in.IndexSteps() - base; steps > 8*(per+1) {
		t.Fatalf("%d index steps to look up %d identical records: want O(1) each", steps, per+1)
	}
}
