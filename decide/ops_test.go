package decide

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/protocol"
)

// TestRandomLegacyOps drives one client instance's connections through
// random sequences of connects, requests (new records and resends), broker
// answers, lost answers, deliveries and closes, and checks after each step
// that nothing panics and the instance's counts of undelivered and
// disowned records are what its lists hold.
func TestRandomLegacyOps(t *testing.T) {
	for seed := range uint64(200) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { randomOps(t, seed) })
	}
}

func randomOps(t *testing.T, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed))
	c, topic := testCore(t)
	now := ddBase
	cl := Client{ID: "a", Host: netip.MustParseAddr("127.0.0.1")}
	type open struct {
		conn *Conn
		pend []*Plan
	}
	var conns []*open
	nextID := ConnID(1)
	values := []string{"a", "b", "c", "d", "e"}
	var sc protocol.ProduceResponseScanner
	off := int64(0)
	for step := range 300 {
		now = now.Add(time.Duration(r.IntN(500)) * time.Millisecond)
		switch op := r.IntN(6); {
		case op == 0 || len(conns) == 0:
			conns = append(conns, &open{conn: c.connect(nextID, cl, now)})
			nextID++
		case op == 1:
			i := r.IntN(len(conns))
			o := conns[i]
			c.disconnect(o.conn, Broken, now)
			for _, pl := range o.pend {
				c.lost(pl, now, nil)
				c.delivered(pl, false, now)
			}
			conns = append(conns[:i], conns[i+1:]...)
		case op == 2 || op == 3:
			o := conns[r.IntN(len(conns))]
			n := 1 + r.IntN(4)
			recs := make([]string, n)
			ts := make([]int64, n)
			for j := range recs {
				recs[j] = values[r.IntN(len(values))]
				ts[j] = now.UnixMilli()
			}
			raw := scriptBatch(recs, ts, -1, 0, 0, false)
			var h protocol.BatchHeader
			if _, err := protocol.ReadBatch(raw, &h); err != nil {
				t.Fatal(err)
			}
			part := int32(r.IntN(2))
			pl := &Plan{}
			req := &Request{Conn: o.conn, Version: 9, Acks: -1, Timeout: time.Second, Parts: []Part{{Topic: topic, Partition: part, Header: h, Records: raw}}}
			c.decide(req, pl, now, new(Effects))
			if pl.Status == Ready {
				o.pend = append(o.pend, pl)
			}
		default:
			o := conns[r.IntN(len(conns))]
			if len(o.pend) == 0 {
				continue
			}
			pl := o.pend[0]
			o.pend = o.pend[1:]
			if pl.Parts[0].Act != Answer {
				resp := kmsg.NewPtrProduceResponse()
				resp.SetVersion(9)
				rt := kmsg.NewProduceResponseTopic()
				rt.Topic = scriptTopic
				rp := kmsg.NewProduceResponseTopicPartition()
				rp.Partition, rp.BaseOffset, rp.LogAppendTime = pl.st[0].key.Partition, off, -1
				off += 10
				if r.IntN(5) == 0 {
					rp.ErrorCode = 7 // REQUEST_TIMED_OUT: appended, no offset
				}
				rt.Partitions = append(rt.Partitions, rp)
				resp.Topics = append(resp.Topics, rt)
				if r.IntN(8) == 0 {
					c.lost(pl, now, nil)
				} else if _, err := c.outcome(pl, &sc, resp.AppendTo(nil), now, nil); err != nil {
					t.Fatal(err)
				}
			}
			c.delivered(pl, r.IntN(6) != 0, now)
		}
		for _, o := range conns {
			in := o.conn.Inst
			in.Lock()
			err := in.Check()
			in.Unlock()
			if err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			break
		}
	}
}
