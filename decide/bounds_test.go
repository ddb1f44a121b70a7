package decide

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// testCore returns a core with a one-minute window over a table that knows
// scriptTopic (4 partitions), and the topic's key.
func testCore(t *testing.T) (*Core, seqstate.TopicID) {
	tab, err := seqstate.New(seqstate.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tab.InternTopics([]seqstate.TopicRef{{Name: scriptTopic, Partitions: 4}})
	topic, _ := tab.LookupTopic([]byte(scriptTopic))
	return New(Config{Table: tab, Window: time.Minute}, &Settings{}), topic
}

// TestUnknownOutcomesBounded: a partition lists at most maxUnknown legacy
// batches whose outcome its log must tell (the broker connection broke
// before their answers). A batch past the bound is settled at once as not
// written: its retry goes upstream (at worst a duplicate, as without the
// proxy) instead of waiting on a read that would never settle it. Those
// within the bound are settled by the read.
func TestUnknownOutcomesBounded(t *testing.T) {
	c, topic := testCore(t)
	now := ddBase
	cl := Client{ID: "a", Host: netip.MustParseAddr("127.0.0.1")}
	part := func(i int) Part {
		raw := scriptBatch([]string{fmt.Sprintf("record %d", i)}, []int64{now.UnixMilli()}, -1, 0, 0, false)
		var h protocol.BatchHeader
		if _, err := protocol.ReadBatch(raw, &h); err != nil {
			t.Fatal(err)
		}
		return Part{Topic: topic, Partition: 0, Header: h, Records: raw}
	}
	conn := c.connect(1, cl, now)
	var pl Plan
	for i := range maxUnknown + 1 {
		req := &Request{Conn: conn, Version: 9, Acks: -1, Timeout: time.Second, Parts: []Part{part(i)}}
		c.decide(req, &pl, now, new(Effects))
		if pl.Status != Ready || pl.Parts[0].Act != Forward {
			t.Fatalf("batch %d: status %d act %d", i, pl.Status, pl.Parts[0].Act)
		}
		c.lost(&pl, now, nil)
		c.delivered(&pl, false, now)
	}
	c.disconnect(conn, Broken, now)
	retry := c.connect(2, cl, now)
	decide := func(i int) *Plan {
		var rp Plan
		c.decide(&Request{Conn: retry, Version: 9, Acks: -1, Timeout: time.Second, Parts: []Part{part(i)}}, &rp, now, new(Effects))
		return &rp
	}
	if rp := decide(maxUnknown); rp.Status != Ready || rp.Parts[0].Act != Forward {
		t.Fatalf("the retry of the batch past the bound: status %d act %d, want forwarded", rp.Status, rp.Parts[0].Act)
	}
	rp := decide(0)
	if rp.Status != ReadTails {
		t.Fatalf("the retry of the first batch: status %d, want a read of its tail", rp.Status)
	}
	c.tailRead(rp.Tails[0], scriptBatch([]string{"record 0"}, []int64{now.UnixMilli()}, -1, 0, 0, false), now, nil)
	if rp = decide(0); rp.Status != Ready || rp.Parts[0].Act != Answer || rp.Parts[0].Local.BaseOffset != 0 {
		t.Fatalf("the retry of the first batch after the read: status %d act %d answer %+v, want answered offset 0", rp.Status, rp.Parts[0].Act, rp.Parts[0].Local)
	}
}
