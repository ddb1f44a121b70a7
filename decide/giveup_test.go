package decide

import (
	"net/netip"
	"testing"
	"time"

	"github.com/dedupproxy/dedupproxy/protocol"
)

// TestGiveUp: the core gives a waiting request up itself, answering it
// REQUEST_TIMED_OUT, once the wait it comes back from is over (a wake
// before its deadline decides it as usual), or once it was decided
// MaxRounds times, or when its caller asks.
func TestGiveUp(t *testing.T) {
	c, topic := testCore(t)
	now := ddBase
	cl := Client{ID: "give-up", Host: netip.MustParseAddr("127.0.0.1")}
	orig, retry := c.connect(1, cl, now), c.connect(2, cl, now)
	raw := scriptBatch([]string{"held"}, []int64{now.UnixMilli()}, -1, 0, 0, false)
	var h protocol.BatchHeader
	if _, err := protocol.ReadBatch(raw, &h); err != nil {
		t.Fatal(err)
	}
	part := Part{Topic: topic, Partition: 0, Header: h, Records: raw}
	var opl Plan
	c.decide(&Request{Conn: orig, Version: 9, Acks: -1, Timeout: time.Second, Parts: []Part{part}}, &opl, now, new(Effects))
	if opl.Status != Ready || opl.Parts[0].Act != Forward {
		t.Fatalf("the original: status %d, act %d", opl.Status, opl.Parts[0].Act)
	}
	c.disconnect(orig, Broken, now) // its client resends on the other connection
	for _, tc := range []struct {
		name   string
		req    func(until time.Time) Request
		at     func(until time.Time) time.Time
		want   GaveUp
		status Status
	}{
		{"woken before the deadline", func(u time.Time) Request { return Request{Waited: u} }, func(u time.Time) time.Time { return u.Add(-time.Millisecond) }, NotGivenUp, Wait},
		{"the wait is over", func(u time.Time) Request { return Request{Waited: u} }, func(u time.Time) time.Time { return u }, GaveUpWait, Ready},
		{"decided MaxRounds times", func(time.Time) Request { return Request{Rounds: MaxRounds} }, func(u time.Time) time.Time { return now }, GaveUpRounds, Ready},
		{"asked", func(time.Time) Request { return Request{GiveUp: true} }, func(u time.Time) time.Time { return now }, GaveUpAsked, Ready},
	} {
		req := Request{Conn: retry, Version: 9, Acks: -1, Timeout: time.Second, Parts: []Part{part}}
		var pl Plan
		c.decide(&req, &pl, now, new(Effects))
		if pl.Status != Wait {
			t.Fatalf("%s: the retry of a batch in flight: status %d, want a wait", tc.name, pl.Status)
		}
		next := tc.req(pl.Until)
		req.Rounds, req.Waited, req.GiveUp = next.Rounds, next.Waited, next.GiveUp
		c.decide(&req, &pl, tc.at(pl.Until), new(Effects))
		if pl.GaveUp != tc.want || pl.Status != tc.status {
			t.Fatalf("%s: gave up %d, status %d; want %d, %d", tc.name, pl.GaveUp, pl.Status, tc.want, tc.status)
		}
		if tc.want != NotGivenUp && (pl.Parts[0].Act != Answer || pl.Parts[0].Local != timedOut) {
			t.Fatalf("%s: act %d answer %+v, want REQUEST_TIMED_OUT", tc.name, pl.Parts[0].Act, pl.Parts[0].Local)
		}
	}
}
