package sim

import (
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/dedupproxy/dedupproxy/decide"
)

// Client models. Each stands for a real client (docs/clients.md) and
// models only what decides how the proxy sees its retries: what it tells
// the proxy about itself (client id, host, principal, the software name of
// its ApiVersions v3+ request), how it writes a batch without a producer
// id, and how it sends records again after a failure.

// resendStyle is how a client sends records again.
type resendStyle uint8

const (
	// sameBatch: the failed batch is sent again as it was, ahead of newer
	// batches of its partition (franz-go, the Java client, kafka-python;
	// every idempotent producer).
	sameBatch resendStyle = iota
	// restampBatch: the failed batch again, its records stamped anew,
	// their deltas kept (kafka-go: Message.Time unset is stamped at encode).
	restampBatch
	// resplit: failed records go back to the head of their partition's
	// queue and are batched anew with what follows them, at other
	// boundaries (librdkafka: msgq re-insert, then the next MessageSet).
	resplit
	// requeueRestamp: failed records go back behind newer ones, each stamped
	// anew when a batch takes it (sarama: retryMessages, then
	// produceSet.add stamps time.Now() for a message without Timestamp).
	requeueRestamp
	// jsSend: the application's whole send() again, its keyless records
	// partitioned afresh and stamped with Date.now(), to every broker that
	// has not answered it yet (kafkajs: producer/sendMessages.js).
	jsSend
)

// library is a real client's behaviour.
type library struct {
	name     string
	software string // ApiVersions v3+ client software name; "" when it sends none
	w        writer
	style    resendStyle
	// keepConn: a request timeout keeps the connection, and the retry goes
	// down it behind the original (kafkajs).
	keepConn    bool
	maxInFlight int
	maxBatch    int
	linger      time.Duration
	retries     int // -1: until the delivery timeout
	idempotent  bool
}

var (
	libFranzGo = library{name: "franz-go", software: "kgo", w: writer{leaderEpoch: -1, legacyEpoch: -1},
		style: sameBatch, maxInFlight: 5, maxBatch: 8, linger: 5 * time.Millisecond, retries: -1}
	libJava = library{name: "java", software: "apache-kafka-java", w: writer{leaderEpoch: -1, legacyEpoch: -1},
		style: sameBatch, maxInFlight: 5, maxBatch: 8, linger: 5 * time.Millisecond, retries: -1}
	libKafkaPython = library{name: "kafka-python", w: writer{legacyEpoch: -1},
		style: sameBatch, maxInFlight: 5, maxBatch: 8, linger: 5 * time.Millisecond, retries: 3}
	libSarama = library{name: "sarama", software: "sarama", w: writer{legacyEpoch: -1},
		style: requeueRestamp, maxInFlight: 5, maxBatch: 8, linger: 5 * time.Millisecond, retries: 10}
	libRdkafka = library{name: "librdkafka", software: "librdkafka", w: writer{legacyEpoch: -1},
		style: resplit, maxInFlight: 5, maxBatch: 6, linger: 5 * time.Millisecond, retries: -1}
	libKafkaGo = library{name: "kafka-go", w: writer{leaderEpoch: -1, legacyEpoch: -1},
		style: restampBatch, maxInFlight: 1, maxBatch: 8, linger: 5 * time.Millisecond, retries: 10}
	libKafkaJS = library{name: "kafkajs", w: writer{legacyEpoch: 0},
		style: jsSend, keepConn: true, maxInFlight: 5, maxBatch: 8, retries: 5}
	// Idempotent producers: the same batch, the same sequence numbers.
	libFranzGoIdem = library{name: "franz-go-idempotent", software: "kgo", w: writer{leaderEpoch: -1},
		style: sameBatch, maxInFlight: 5, maxBatch: 8, linger: 5 * time.Millisecond, retries: -1, idempotent: true}
	libRdkafkaIdem = library{name: "librdkafka-idempotent", software: "librdkafka",
		style: sameBatch, maxInFlight: 5, maxBatch: 6, linger: 5 * time.Millisecond, retries: -1, idempotent: true}
)

// deliveryTimeout is delivery.timeout.ms's default (Java, librdkafka):
// past it a record is given up.
const deliveryTimeout = 2 * time.Minute

// qrec is a record waiting in a client's queue.
type qrec struct {
	rec
	first    time.Duration // first sent (0: never)
	why      string        // why it is (re)sent: "new", or what became of its last send
	attempts int
	key      bool // keyed: its partition is fixed
}

// cbatch is a batch a client built, sent again as it is by the
// fixed-batch styles.
type cbatch struct {
	n     int // creation order
	part  int32
	recs  []qrec
	seq   int32
	epoch int16
}

// partQueue is one partition's accumulator.
type partQueue struct {
	recs    []qrec
	batches []*cbatch
	flight  int // batches in flight
}

// client is one client process.
type client struct {
	w        *world
	n        int
	name     string
	info     clientInfo
	lib      library
	acks     int16
	timeout  time.Duration
	skew     int64 // ms its clock is off
	workload string
	// conns: the connection per node in use.
	conns   []*conn
	parts   [maxPartitions]partQueue
	meta    [maxPartitions]int // the leader it believes in
	nparts  int
	rr      int // keyless round robin
	batchN  int
	flushOn bool
	backoff time.Duration
	retryAt time.Duration // no connection attempt before
	ended   bool          // the process exited: nothing more is sent
	// open: records not acked nor given up.
	open int
	// Idempotent state.
	pid     int64
	epoch   int16
	nextSeq [maxPartitions]int32
	// kafkajs: the send in progress and those queued behind it.
	js      *jsSendState
	jsQueue [][]qrec
	onIdle  func() // called once nothing is open
	// closeAfter: close a connection once nothing is in flight on it
	// (a clean close).
	closeAfter map[*conn]bool
	// bornAt, diedAt: when the process started and exited (0: it did not).
	bornAt, diedAt time.Duration
}

// wireReq is one Produce request a client sent.
type wireReq struct {
	id      int
	c       *client
	cn      *conn
	acks    int16
	timeout time.Duration
	parts   []*batchSpec
	raws    [][]byte
	whys    [][]string
	batches []*cbatch // fixed styles: the batch of each part
	sentAt  time.Duration
	// The proxy's side, for the checks.
	replica  int
	coreName string
	decided  time.Duration // when it was decided Ready (0: never)
	delivAt  time.Duration // when the core was told its answer was written (0: never)
	plan     *decide.Plan
	handled  time.Duration // when the broker handled it (0: never)
	written  []partResult  // the answer the proxy wrote
	answered []partResult  // what the client got, nil if nothing
	js       *jsSendState
	node     int
	timedOut bool          // the client gave up waiting for its answer
	lost     bool          // the proxy told the core its answer will never come
	lostAt   time.Duration // when it did
	settled  time.Duration // when the proxy stepped its broker answer (0: never)
	resp     []partResult  // the broker's answer, as the proxy stepped it
}

func (w *world) newClient(name string, info clientInfo, lib library, acks int16, workload string) *client {
	c := &client{w: w, n: len(w.clients), name: name, info: info, lib: lib, acks: acks, workload: workload,
		timeout: w.between(400*time.Millisecond, 2*time.Second), skew: int64(w.intn(5)) - 2, nparts: maxPartitions,
		conns: make([]*conn, w.nodes), closeAfter: map[*conn]bool{}, bornAt: w.now}
	c.meta = w.broker.leader
	c.backoff = w.between(50*time.Millisecond, 250*time.Millisecond)
	c.epoch = 0
	if lib.idempotent {
		c.pid = int64(1000 + c.n)
	} else {
		c.pid = -1
	}
	w.clients = append(w.clients, c)
	return c
}

// clock is the client's clock in ms since the epoch.
func (c *client) clock() int64 { return c.w.wall().UnixMilli() + c.skew }

// produce is the application handing the client a new record.
func (c *client) produce(name string, partition int32, keyed bool) lid {
	w := c.w
	l := w.newLid(c, name)
	c.open++
	q := qrec{rec: rec{lid: l, name: name, ts: c.clock()}, why: "new", key: keyed}
	if c.lib.style == jsSend {
		c.jsQueue = append(c.jsQueue, []qrec{q})
		c.jsNext()
		return l
	}
	if !keyed {
		partition = int32(c.rr % c.nparts)
		c.rr++
	}
	c.parts[partition].recs = append(c.parts[partition].recs, q)
	c.kick()
	return l
}

// kick schedules a flush after the linger.
func (c *client) kick() {
	if c.flushOn || c.ended {
		return
	}
	c.flushOn = true
	c.w.after(c.lib.linger+time.Millisecond, func() {
		c.flushOn = false
		c.flush()
	})
}

// connFor returns the connection to node, opening one to the replica that
// serves it; nil while none can be opened.
func (c *client) connFor(node int) *conn {
	w := c.w
	if cn := c.conns[node]; cn != nil && cn.usable() {
		if w.owner[node] == cn.r.id || len(cn.inflight) > 0 {
			return cn
		}
		// The node moved to another replica: a new connection there; the
		// old one closes once nothing is in flight on it.
		cn.close()
	}
	c.conns[node] = nil
	if w.now < c.retryAt {
		return nil
	}
	r := w.replicas[w.owner[node]]
	if r.down {
		c.retryAt = w.now + c.backoff
		c.w.at(c.retryAt, c.flush)
		return nil
	}
	cn := &conn{w: w, id: decide.ConnID(len(w.conns)), c: c, node: node, r: r}
	w.conns = append(w.conns, cn)
	r.newSession(cn)
	c.conns[node] = cn
	return cn
}

// flush sends what is ready, within each connection's in-flight limit.
func (c *client) flush() {
	if c.ended {
		return
	}
	if c.lib.style == jsSend {
		return // kafkajs sends from send()
	}
	for node := 0; node < c.w.nodes; node++ {
		for {
			if !c.anyReady(node) {
				break
			}
			cn := c.connFor(node)
			if cn == nil || len(cn.inflight) >= c.lib.maxInFlight {
				break
			}
			req := c.buildRequest(cn, node)
			if req == nil {
				break
			}
			c.sendReq(cn, req)
		}
	}
}

func (c *client) anyReady(node int) bool {
	for p := int32(0); p < int32(c.nparts); p++ {
		q := &c.parts[p]
		if c.meta[p] == node && (len(q.recs) > 0 || len(q.batches) > 0) && q.flight < c.lib.maxInFlight {
			return true
		}
	}
	return false
}

// buildRequest takes one batch per partition led by node.
func (c *client) buildRequest(cn *conn, node int) *wireReq {
	w := c.w
	req := &wireReq{id: len(w.reqs) + 1, c: c, cn: cn, acks: c.acks, timeout: c.timeout, node: node}
	for p := int32(0); p < int32(c.nparts); p++ {
		q := &c.parts[p]
		if c.meta[p] != node || q.flight >= c.lib.maxInFlight {
			continue
		}
		var b *cbatch
		switch {
		case len(q.batches) > 0 && (c.lib.style == sameBatch || c.lib.style == restampBatch):
			b = q.batches[0]
			q.batches = q.batches[1:]
		case len(q.recs) > 0:
			n := min(len(q.recs), c.lib.maxBatch)
			c.batchN++
			b = &cbatch{n: c.batchN, part: p, recs: slices.Clone(q.recs[:n]), seq: -1, epoch: -1}
			q.recs = q.recs[n:]
		default:
			continue
		}
		if c.lib.idempotent && b.epoch != c.epoch {
			// Sequence numbers are given at the first send under the
			// producer's epoch: after a bump, failed batches are numbered
			// again from 0 in their order.
			b.epoch, b.seq = c.epoch, c.nextSeq[p]
			c.nextSeq[p] += int32(len(b.recs))
		}
		q.flight++
		c.addPart(req, b)
	}
	if len(req.parts) == 0 {
		return nil
	}
	return req
}

// addPart puts batch b into req, stamped as the client stamps it.
func (c *client) addPart(req *wireReq, b *cbatch) {
	now := c.clock()
	switch c.lib.style {
	case restampBatch:
		if b.recs[0].first > 0 {
			d := now - b.recs[0].ts
			for i := range b.recs {
				b.recs[i].ts += d
			}
		}
	case requeueRestamp:
		for i := range b.recs {
			b.recs[i].ts = now
		}
	}
	spec := &batchSpec{partition: b.part, pid: c.pid, epoch: b.epoch, seq: b.seq, w: c.lib.w}
	var whys []string
	for i := range b.recs {
		if b.recs[i].first == 0 {
			b.recs[i].first = c.w.now
		}
		b.recs[i].attempts++
		spec.recs = append(spec.recs, b.recs[i].rec)
		whys = append(whys, b.recs[i].why)
	}
	req.parts = append(req.parts, spec)
	req.raws = append(req.raws, spec.bytes())
	req.whys = append(req.whys, whys)
	req.batches = append(req.batches, b)
}

// sendReq writes req on cn and arms its timeout.
func (c *client) sendReq(cn *conn, req *wireReq) {
	w := c.w
	req.sentAt = w.now
	w.reqs = append(w.reqs, req)
	for _, s := range req.parts {
		for _, r := range s.recs {
			w.recs[r.lid].sends = append(w.recs[r.lid].sends, req.id)
		}
	}
	cn.send(req)
	if req.acks == 0 {
		// Nothing comes back: the client takes them as sent.
		for i, s := range req.parts {
			for _, r := range s.recs {
				c.acked(r.lid)
			}
			c.parts[s.partition].flight--
			_ = i
		}
		c.kick()
		return
	}
	cn.inflight = append(cn.inflight, req)
	w.after(req.timeout, func() {
		if slices.Contains(cn.inflight, req) {
			c.timedOut(cn, req)
		}
	})
}

func (c *client) acked(l lid) {
	ri := &c.w.recs[l]
	if !ri.acked && ri.gaveUp == "" {
		ri.acked = true
		c.open--
		c.idle()
	}
}

func (c *client) giveUp(l lid, why string) {
	ri := &c.w.recs[l]
	if !ri.acked && ri.gaveUp == "" {
		ri.gaveUp = why
		c.open--
		c.idle()
	}
}

func (c *client) idle() {
	if c.open == 0 && c.onIdle != nil {
		f := c.onIdle
		c.onIdle = nil
		f()
	}
}

// onAnswer: an answer reached the client.
func (c *client) onAnswer(cn *conn, req *wireReq, res []partResult) {
	i := slices.Index(cn.inflight, req)
	if i < 0 {
		return // timed out already (kafkajs), or its connection abandoned
	}
	cn.inflight = slices.Delete(cn.inflight, i, i+1)
	req.answered = res
	if req.js != nil {
		c.jsAnswer(req, res)
		c.maybeClose(cn)
		return
	}
	refresh := false
	for i, s := range req.parts {
		r := res[i]
		c.parts[s.partition].flight--
		switch {
		case r.code == 0:
			for _, x := range s.recs {
				c.acked(x.lid)
			}
		default:
			if r.code == kerr.NotLeaderForPartition.Code {
				refresh = true
			}
			if c.lib.idempotent && (r.code == kerr.OutOfOrderSequenceNumber.Code || r.code == kerr.InvalidProducerEpoch.Code) && s.epoch == c.epoch {
				// franz-go: the producer id is failed and its epoch bumped;
				// every partition's sequences start again at 0.
				c.epoch++
				c.nextSeq = [maxPartitions]int32{}
			}
			c.requeue(req, i, fmt.Sprintf("error %d", r.code))
		}
	}
	if refresh {
		c.refreshMeta()
	}
	c.maybeClose(cn)
	c.kick()
}

// maybeClose closes cn cleanly once nothing is in flight on it, if asked.
func (c *client) maybeClose(cn *conn) {
	if c.closeAfter[cn] && len(cn.inflight) == 0 {
		delete(c.closeAfter, cn)
		cn.close()
		if c.conns[cn.node] == cn {
			c.conns[cn.node] = nil
		}
	}
}

// requeue puts part i of a failed request back, as the client does.
func (c *client) requeue(req *wireReq, i int, why string) {
	b := req.batches[i]
	q := &c.parts[b.part]
	var keep []qrec
	for _, r := range b.recs {
		if c.w.recs[r.lid].acked || c.w.recs[r.lid].gaveUp != "" {
			continue
		}
		if c.lib.retries >= 0 && r.attempts > c.lib.retries {
			c.giveUp(r.lid, "retries exhausted")
			continue
		}
		if c.w.now-r.first >= deliveryTimeout {
			c.giveUp(r.lid, "delivery timeout")
			continue
		}
		r.why = why
		keep = append(keep, r)
	}
	if len(keep) == 0 {
		return
	}
	switch c.lib.style {
	case sameBatch, restampBatch:
		b.recs = keep
		if len(keep) < len(req.parts[i].recs) && c.lib.idempotent {
			// Never: an idempotent batch is acked or failed whole.
			panic("partial idempotent batch")
		}
		q.batches = append(q.batches, b)
		slices.SortFunc(q.batches, func(x, y *cbatch) int { return x.n - y.n })
	case resplit:
		q.recs = append(keep, q.recs...)
		slices.SortStableFunc(q.recs, func(x, y qrec) int { return int(x.lid - y.lid) })
	case requeueRestamp:
		q.recs = append(q.recs, keep...)
	}
}

// timedOut: no answer within the request timeout.
func (c *client) timedOut(cn *conn, req *wireReq) {
	req.timedOut = true
	if c.lib.keepConn {
		// kafkajs keeps the connection: the send is retried, down it.
		i := slices.Index(cn.inflight, req)
		cn.inflight = slices.Delete(cn.inflight, i, i+1)
		c.jsFailed(req, "timeout")
		return
	}
	// The connection is given up as a whole (librdkafka "N request(s)
	// timed out: disconnect"; franz-go, sarama, Java, kafka-python).
	c.abandon(cn, "timeout")
}

// connBroken: the client read the connection's end, or a reset.
func (c *client) connBroken(cn *conn) {
	if cn.broken || cn.clientClosed {
		return
	}
	cn.broken = true
	c.abandon(cn, "connection lost")
}

// abandon fails every request in flight on cn and closes it.
func (c *client) abandon(cn *conn, why string) {
	reqs := cn.inflight
	cn.inflight = nil
	if !cn.broken {
		cn.close()
	}
	if c.conns[cn.node] == cn {
		c.conns[cn.node] = nil
	}
	delete(c.closeAfter, cn)
	for _, req := range reqs {
		if req.js != nil {
			c.jsFailed(req, why)
			continue
		}
		for i, s := range req.parts {
			c.parts[s.partition].flight--
			c.requeue(req, i, why)
		}
	}
	c.retryAt = c.w.now + c.backoff
	c.w.at(c.retryAt, c.flush)
	c.refreshMeta()
}

// refreshMeta learns the partitions' leaders, after a round trip.
func (c *client) refreshMeta() {
	w := c.w
	w.after(w.between(10*time.Millisecond, 100*time.Millisecond), func() {
		c.meta = w.broker.leader
		c.kick()
		if c.lib.style == jsSend {
			c.jsNext()
		}
	})
}

// end makes the process exit once nothing is open: its connections close
// cleanly.
func (c *client) end() {
	c.onIdle = func() {
		c.ended, c.diedAt = true, c.w.now
		for _, cn := range c.conns {
			if cn != nil && cn.usable() {
				cn.close()
			}
		}
	}
	c.idle()
}

// closeConns closes the client's connections once what is in flight on
// them is answered, as a client that closes and reconnects does.
func (c *client) closeConns() {
	for node, cn := range c.conns {
		if cn == nil || !cn.usable() {
			continue
		}
		c.conns[node] = nil
		if len(cn.inflight) == 0 {
			cn.close()
		} else {
			c.closeAfter[cn] = true
		}
	}
}
