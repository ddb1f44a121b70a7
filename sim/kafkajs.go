package sim

import (
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
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
	responded map[int]*wireReq // node → the request it answered
	pending   int
	failed    bool
	why       string
	attempt   int
}

// jsNext starts the next send if none is under way.
func (c *client) jsNext() {
	if c.js != nil || len(c.jsQueue) == 0 || c.ended {
		return
	}
	n := 0
	var msgs []qrec
	for n < len(c.jsQueue) && len(msgs) < c.lib.maxBatch {
		msgs = append(msgs, c.jsQueue[n]...)
		n++
	}
	c.jsQueue = c.jsQueue[n:]
	c.js = &jsSendState{msgs: msgs, responded: map[int]*wireReq{}}
	c.jsAttempt()
}

// jsAttempt is one attempt of the send in progress.
func (c *client) jsAttempt() {
	w, js := c.w, c.js
	js.failed, js.why = false, ""
	js.attempt++
	now := c.clock()
	byNode := map[int]map[int32][]int{} // node → partition → message indexes
	for i := range js.msgs {
		m := &js.msgs[i]
		if w.recs[m.lid].acked || w.recs[m.lid].gaveUp != "" {
			continue
		}
		p := int32(c.rr % c.nparts)
		c.rr++
		node := c.meta[p]
		if r, ok := js.responded[node]; ok {
			// responsePerBroker: this broker answered the send already, so
			// nothing more goes to it; a message partitioned onto it now
			// that it did not carry is never sent (a loss of kafkajs's own).
			if !slices.ContainsFunc(r.parts, func(s *batchSpec) bool {
				return slices.ContainsFunc(s.recs, func(x rec) bool { return x.lid == m.lid })
			}) {
				c.giveUp(m.lid, "kafkajs: partitioned onto a broker that had answered the send")
			}
			continue
		}
		if byNode[node] == nil {
			byNode[node] = map[int32][]int{}
		}
		byNode[node][p] = append(byNode[node][p], i)
	}
	for node := 0; node < w.nodes; node++ {
		parts := byNode[node]
		if parts == nil {
			continue
		}
		cn := c.connFor(node)
		if cn == nil {
			js.failed, js.why = true, "connect"
			continue
		}
		req := &wireReq{id: len(w.reqs) + 1, c: c, cn: cn, acks: c.acks, timeout: c.timeout, js: js, node: node}
		for p := int32(0); p < int32(c.nparts); p++ {
			idx := parts[p]
			if len(idx) == 0 {
				continue
			}
			b := &cbatch{part: p, seq: -1}
			for _, i := range idx {
				m := &js.msgs[i]
				m.ts = now
				if m.first == 0 {
					m.first = w.now
				}
				m.attempts++
				b.recs = append(b.recs, *m)
			}
			spec := &batchSpec{partition: p, pid: -1, seq: -1, w: c.lib.w}
			var whys []string
			for _, m := range b.recs {
				spec.recs = append(spec.recs, m.rec)
				whys = append(whys, m.why)
			}
			req.parts = append(req.parts, spec)
			req.raws = append(req.raws, spec.bytes())
			req.whys = append(req.whys, whys)
			req.batches = append(req.batches, b)
		}
		js.pending++
		c.sendReq(cn, req)
		if req.acks == 0 {
			js.pending--
		}
	}
	c.jsSettle()
}

// jsAnswer: a broker answered one request of the send.
func (c *client) jsAnswer(req *wireReq, res []partResult) {
	js := req.js
	js.pending--
	ok := true
	for _, r := range res {
		if r.code != 0 {
			ok = false
			js.failed, js.why = true, "error "+itoa(int(r.code))
			if r.code == kerr.NotLeaderForPartition.Code {
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
func (c *client) jsFailed(req *wireReq, why string) {
	js := req.js
	js.pending--
	js.failed, js.why = true, why
	c.jsSettle()
}

// jsSettle ends the attempt once every request of it is settled.
func (c *client) jsSettle() {
	js := c.js
	if js == nil || js.pending > 0 {
		return
	}
	w := c.w
	if !js.failed {
		for _, m := range js.msgs {
			c.acked(m.lid)
		}
		c.js = nil
		c.jsNext()
		return
	}
	for i := range js.msgs {
		js.msgs[i].why = js.why
	}
	if js.attempt > c.lib.retries {
		for _, m := range js.msgs {
			c.giveUp(m.lid, "retries exhausted")
		}
		c.js = nil
		c.jsNext()
		return
	}
	// kafkajs's retrier: 300 ms, doubling, with jitter.
	d := time.Duration(300<<min(js.attempt-1, 4)) * time.Millisecond
	w.after(w.between(d*8/10, d*12/10), func() {
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
