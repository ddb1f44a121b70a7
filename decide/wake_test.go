package decide

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// TestWaitersNeverMissAnOutcome races a retry's decision against its
// original's outcome, as two sessions do: the original's answer settles
// while the retry registers as a waiter. Whatever the interleaving, the
// retry is woken (by the outcome, or by itself when the outcome came as
// it registered) and answered with the
// original's offset: it never sits out its wait for an outcome that came.
// Idempotent and legacy retries (the legacy original's connection closed,
// so that its retry is one in every order), many rounds; run it with -race.
func TestWaitersNeverMissAnOutcome(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		t.Run(fmt.Sprintf("legacy=%v", legacy), func(t *testing.T) {
			c, topic := testCore(t)
			host := netip.MustParseAddr("127.0.0.1")
			for round := range 400 {
				raceOnce(t, c, topic, host, legacy, round)
				if t.Failed() {
					return
				}
			}
		})
	}
}

func raceOnce(t *testing.T, c *Core, topic seqstate.TopicID, host netip.Addr, legacy bool, round int) {
	now := ddBase.Add(time.Duration(round) * time.Second)
	id := ConnID(2*round + 1)
	cl := Client{ID: fmt.Sprintf("client %d", round), Host: host}
	orig, retry := c.connect(id, cl, now), c.connect(id+1, cl, now)
	defer c.disconnect(orig, Broken, now)
	defer c.disconnect(retry, Broken, now)
	pid := int64(1000 + round)
	if legacy {
		pid = -1
	}
	raw := scriptBatch([]string{fmt.Sprintf("record of round %d", round)}, []int64{now.UnixMilli()}, pid, 0, 0, false)
	var h protocol.BatchHeader
	if _, err := protocol.ReadBatch(raw, &h); err != nil {
		t.Fatal(err)
	}
	part := Part{Topic: topic, Partition: int32(round % 4), Header: h, Records: raw}
	req := func(conn *Conn) *Request {
		return &Request{Conn: conn, Version: 9, Acks: -1, Timeout: 100 * time.Millisecond, Parts: []Part{part}}
	}
	var pl Plan
	c.decide(req(orig), &pl, now, new(Effects))
	if pl.Status != Ready || pl.Parts[0].Act != Forward {
		t.Fatalf("round %d: the original: status %d, act %d", round, pl.Status, pl.Parts[0].Act)
	}
	if legacy {
		// Its client gave up on the connection: whenever the retry comes,
		// before the outcome or after, it is one.
		c.disconnect(orig, Broken, now)
	}
	resp := kmsg.NewPtrProduceResponse()
	resp.SetVersion(9)
	rt := kmsg.NewProduceResponseTopic()
	rt.Topic = scriptTopic
	rp := kmsg.NewProduceResponseTopicPartition()
	rp.Partition, rp.BaseOffset, rp.LogAppendTime = part.Partition, int64(round), -1
	rt.Partitions = append(rt.Partitions, rp)
	resp.Topics = append(resp.Topics, rt)
	body := resp.AppendTo(nil)

	wake := make(chan struct{}, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var sc protocol.ProduceResponseScanner
		woken, err := c.outcome(&pl, &sc, body, now, nil)
		if err != nil {
			t.Error(err)
		}
		for _, w := range woken {
			if w == retry.ID() {
				select {
				case wake <- struct{}{}:
				default:
				}
			}
		}
		c.delivered(&pl, true, now)
	}()
	defer wg.Wait()
	var rpl Plan
	var fx Effects
	r := req(retry)
	for step := 0; ; step++ {
		if step == 16 {
			t.Fatalf("round %d: the retry was decided %d times", round, step)
		}
		fx.reset()
		c.decide(r, &rpl, now, &fx)
		switch rpl.Status {
		case Wait:
			if slices.Contains(fx.Wake, retry.ID()) {
				// What it waits for came as it registered: it woke
				// itself.
				continue
			}
			select {
			case <-wake:
				continue
			case <-time.After(10 * time.Second):
				t.Fatalf("round %d: the retry waited 10 s for an outcome that came", round)
			}
		case Ready:
		default:
			t.Fatalf("round %d: status %d", round, rpl.Status)
		}
		break
	}
	pp := rpl.Parts[0]
	if pp.Act != Answer || pp.Local.ErrorCode != 0 || pp.Local.BaseOffset != int64(round) {
		t.Fatalf("round %d: the retry: act %d, answer %+v, want the original's offset %d", round, pp.Act, pp.Local, round)
	}
	c.delivered(&rpl, true, now)
}
