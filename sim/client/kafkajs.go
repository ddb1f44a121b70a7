package client

import (
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/dedupproxy/dedupproxy/sim/kafka"
)

// kafkajs's producer.send (producer/sendMessages.js), as far as it decides
// what reaches the proxy: the application awaits one send at a time; each
// attempt partitions the send's keyless messages afresh (round robin),
// stamps them with Date.now() when it encodes the request, and sends to
// every broker that has not answered this send yet (responsePerBroker);
// any retriable error, a request timeout included, retries the whole send
// after a backoff, on the same connections (a timeout does not close one).

type jsSendState struct {
	msgs      []qrec
	responded map[int]*Request // node → the request it answered
	pending   int
	failed    bool
	why       string
	attempt   int
}

// jsNext starts the next send if none is under way.
func (c *Client) jsNext() {
	if c.js != nil || len(c.jsQueue) == 0 || c.ended {
		return
	}
	n := 0
	var msgs []qrec
	for n < len(c.jsQueue) && len(msgs) < c.Lib.maxBatch {
		msgs = append(msgs, c.jsQueue[n]...)
		n++
	}
	c.jsQueue = c.jsQueue[n:]
	c.js = &jsSendState{msgs: msgs, responded: map[int]*Request{}}
	c.jsAttempt()
}

// jsAttempt is one attempt of the send in progress.
func (c *Client) jsAttempt() {
	env, js := c.env, c.js
	js.failed, js.why = false, ""
	js.attempt++
	now := c.clock()
	byNode := map[int]map[int32][]int{} // node → partition → message indexes
	for i := range js.msgs {
		m := &js.msgs[i]
		if c.led.Records[m.Lid].Acked || c.led.Records[m.Lid].GaveUp != "" {
			continue
		}
		p := int32(c.rr % c.nparts)
		c.rr++
		node := c.meta[p]
		if r, ok := js.responded[node]; ok {
			// responsePerBroker: this broker answered the send already, so
			// nothing more goes to it; a message partitioned onto it now
			// that it did not carry is never sent (a loss of kafkajs's own).
			if !slices.ContainsFunc(r.Parts, func(s *kafka.Batch) bool {
				return slices.ContainsFunc(s.Recs, func(x kafka.Rec) bool { return x.Lid == m.Lid })
			}) {
				c.giveUp(m.Lid, "kafkajs: partitioned onto a broker that had answered the send")
			}
			continue
		}
		if byNode[node] == nil {
			byNode[node] = map[int32][]int{}
		}
		byNode[node][p] = append(byNode[node][p], i)
	}
	for node := 0; node < env.Nodes(); node++ {
		parts := byNode[node]
		if parts == nil {
			continue
		}
		cn := c.connFor(node)
		if cn == nil {
			js.failed, js.why = true, "connect"
			continue
		}
		req := &Request{ID: len(c.led.Requests) + 1, Client: c, Conn: cn, Acks: c.acks, Timeout: c.timeout, js: js, node: node}
		for p := int32(0); p < int32(c.nparts); p++ {
			idx := parts[p]
			if len(idx) == 0 {
				continue
			}
			b := &cbatch{part: p, seq: -1}
			for _, i := range idx {
				m := &js.msgs[i]
				m.TS = now
				if m.first == 0 {
					m.first = env.Now()
				}
				m.attempts++
				b.recs = append(b.recs, *m)
			}
			spec := &kafka.Batch{Partition: p, PID: -1, Seq: -1, W: c.Lib.W}
			var whys []string
			for _, m := range b.recs {
				spec.Recs = append(spec.Recs, m.Rec)
				whys = append(whys, m.why)
			}
			req.Parts = append(req.Parts, spec)
			req.Raws = append(req.Raws, spec.Bytes())
			req.Whys = append(req.Whys, whys)
			req.batches = append(req.batches, b)
		}
		js.pending++
		c.sendReq(cn, req)
		if req.Acks == 0 {
			js.pending--
		}
	}
	c.jsSettle()
}

// jsAnswer: a broker answered one request of the send.
func (c *Client) jsAnswer(req *Request, res []kafka.PartResult) {
	js := req.js
	js.pending--
	ok := true
	for _, r := range res {
		if r.Code != 0 {
			ok = false
			js.failed, js.why = true, "error "+itoa(int(r.Code))
			if r.Code == kerr.NotLeaderForPartition.Code {
				c.refreshMeta()
			}
		}
	}
	if ok {
		js.responded[req.node] = req
	}
	c.jsSettle()
}

// jsFailed: a request of the send timed out, or its connection broke.
func (c *Client) jsFailed(req *Request, why string) {
	js := req.js
	js.pending--
	js.failed, js.why = true, why
	c.jsSettle()
}

// jsSettle ends the attempt once every request of it is settled.
func (c *Client) jsSettle() {
	js := c.js
	if js == nil || js.pending > 0 {
		return
	}
	env := c.env
	if !js.failed {
		for _, m := range js.msgs {
			c.acked(m.Lid)
		}
		c.js = nil
		c.jsNext()
		return
	}
	for i := range js.msgs {
		js.msgs[i].why = js.why
	}
	if js.attempt > c.Lib.retries {
		for _, m := range js.msgs {
			c.giveUp(m.Lid, "retries exhausted")
		}
		c.js = nil
		c.jsNext()
		return
	}
	// kafkajs's retrier: 300 ms, doubling, with jitter.
	d := time.Duration(300<<min(js.attempt-1, 4)) * time.Millisecond
	env.After(env.Between(d*8/10, d*12/10), func() {
		if c.js == js {
			c.jsAttempt()
		}
	})
}

func itoa(n int) string {
	if n < 0 {
		return "-" + itoa(-n)
	}
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}
