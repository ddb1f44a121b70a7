package client

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/dedupproxy/dedupproxy/sim/kafka"
)

// Info is what a connection's client tells the proxy about itself.
type Info struct {
	Principal uint32
	ID        string
	Host      netip.Addr
	Software  string // ApiVersions v3+ client software name, "" for none
}

// SameInstance: the core takes a and b for one client instance
// (docs/legacy.md, "Scope: the client instance"): the same principal,
// client id and host. The software a client names is not part of it: two
// processes of different libraries behind one address, sharing a client
// id, are one instance.
func (a Info) SameInstance(b Info) bool {
	return a.Principal == b.Principal && a.ID == b.ID && a.Host == b.Host
}

// Env is the run a client lives in: its virtual clock and seeded source,
// the cluster's metadata, and the proxy's listeners.
type Env interface {
	// Now is the virtual clock; Wall the same instant as the core and the
	// clients' clocks read it.
	Now() time.Duration
	Wall() time.Time
	// At schedules fn at t (not before Now), After d from Now. Events of
	// one instant run in the order they were scheduled.
	At(t time.Duration, fn func())
	After(d time.Duration, fn func())
	// Between and Intn draw from the run's seeded source; Latency is one
	// hop on the network.
	Between(lo, hi time.Duration) time.Duration
	Intn(n int) int
	Latency() time.Duration
	// Nodes is the number of broker nodes, Leaders which node leads each
	// partition (what a metadata request tells).
	Nodes() int
	Leaders() [kafka.MaxPartitions]int
	// Serving is the replica serving node; Dial opens a connection of c
	// to node at that replica, nil while it is down.
	Serving(node int) int
	Dial(c *Client, node int) *Conn
}

// Style is how a client sends records again.
type Style uint8

const (
	// SameBatch: the failed batch is sent again as it was, ahead of newer
	// batches of its partition (franz-go, the Java client, kafka-python;
	// every idempotent producer).
	SameBatch Style = iota
	// RestampBatch: the failed batch again, its records stamped anew,
	// their deltas kept (kafka-go: Message.Time unset is stamped at encode).
	RestampBatch
	// Resplit: failed records go back to the head of their partition's
	// queue and are batched anew with what follows them, at other
	// boundaries (librdkafka: msgq re-insert, then the next MessageSet).
	Resplit
	// RequeueRestamp: failed records go back behind newer ones, each stamped
	// anew when a batch takes it (sarama: retryMessages, then
	// produceSet.add stamps time.Now() for a message without Timestamp).
	RequeueRestamp
	// JSSend: the application's whole send() again, its keyless records
	// partitioned afresh and stamped with Date.now(), to every broker that
	// has not answered it yet (kafkajs: producer/sendMessages.js).
	JSSend
)

// Library is a real client's behaviour.
type Library struct {
	Name     string
	Software string // ApiVersions v3+ client software name; "" when it sends none
	W        kafka.Writer
	Style    Style
	// KeepConn: a request timeout keeps the connection, and the retry goes
	// down it behind the original (kafkajs).
	KeepConn    bool
	maxInFlight int
	maxBatch    int
	linger      time.Duration
	retries     int // -1: until the delivery timeout
	Idempotent  bool
}

var (
	FranzGo = Library{Name: "franz-go", Software: "kgo", W: kafka.Writer{LeaderEpoch: -1, LegacyEpoch: -1},
		Style: SameBatch, maxInFlight: 5, maxBatch: 8, linger: 5 * time.Millisecond, retries: -1}
	Java = Library{Name: "java", Software: "apache-kafka-java", W: kafka.Writer{LeaderEpoch: -1, LegacyEpoch: -1},
		Style: SameBatch, maxInFlight: 5, maxBatch: 8, linger: 5 * time.Millisecond, retries: -1}
	KafkaPython = Library{Name: "kafka-python", W: kafka.Writer{LegacyEpoch: -1},
		Style: SameBatch, maxInFlight: 5, maxBatch: 8, linger: 5 * time.Millisecond, retries: 3}
	Sarama = Library{Name: "sarama", Software: "sarama", W: kafka.Writer{LegacyEpoch: -1},
		Style: RequeueRestamp, maxInFlight: 5, maxBatch: 8, linger: 5 * time.Millisecond, retries: 10}
	Rdkafka = Library{Name: "librdkafka", Software: "librdkafka", W: kafka.Writer{LegacyEpoch: -1},
		Style: Resplit, maxInFlight: 5, maxBatch: 6, linger: 5 * time.Millisecond, retries: -1}
	KafkaGo = Library{Name: "kafka-go", W: kafka.Writer{LeaderEpoch: -1, LegacyEpoch: -1},
		Style: RestampBatch, maxInFlight: 1, maxBatch: 8, linger: 5 * time.Millisecond, retries: 10}
	KafkaJS = Library{Name: "kafkajs", W: kafka.Writer{LegacyEpoch: 0},
		Style: JSSend, KeepConn: true, maxInFlight: 5, maxBatch: 8, retries: 5}
	// Idempotent producers: the same batch, the same sequence numbers.
	FranzGoIdempotent = Library{Name: "franz-go-idempotent", Software: "kgo", W: kafka.Writer{LeaderEpoch: -1},
		Style: SameBatch, maxInFlight: 5, maxBatch: 8, linger: 5 * time.Millisecond, retries: -1, Idempotent: true}
	RdkafkaIdempotent = Library{Name: "librdkafka-idempotent", Software: "librdkafka",
		Style: SameBatch, maxInFlight: 5, maxBatch: 6, linger: 5 * time.Millisecond, retries: -1, Idempotent: true}
)

// deliveryTimeout is delivery.timeout.ms's default (Java, librdkafka):
// past it a record is given up.
const deliveryTimeout = 2 * time.Minute

// qrec is a record waiting in a client's queue.
type qrec struct {
	kafka.Rec
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

// Client is one client process.
type Client struct {
	env      Env
	led      *Ledger
	n        int
	Name     string
	Info     Info
	Lib      Library
	acks     int16
	timeout  time.Duration
	skew     int64 // ms its clock is off
	Workload string
	// conns: the connection per node in use.
	conns   []*Conn
	parts   [kafka.MaxPartitions]partQueue
	meta    [kafka.MaxPartitions]int // the leader it believes in
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
	nextSeq [kafka.MaxPartitions]int32
	// kafkajs: the send in progress and those queued behind it.
	js      *jsSendState
	jsQueue [][]qrec
	onIdle  func() // called once nothing is open
	// closeAfter: close a connection once nothing is in flight on it
	// (a clean close).
	closeAfter map[*Conn]bool
	// BornAt, DiedAt: when the process started and exited (0: it did not).
	BornAt, DiedAt time.Duration
}

// Request is one Produce request a client sent.
type Request struct {
	ID       int
	Client   *Client
	Conn     *Conn
	Acks     int16
	Timeout  time.Duration
	Parts    []*kafka.Batch
	Raws     [][]byte
	Whys     [][]string // why each record of each part is sent: "new", or what became of its last send
	batches  []*cbatch  // fixed styles: the batch of each part
	js       *jsSendState
	node     int
	SentAt   time.Duration
	Answered []kafka.PartResult // what the client got, nil if nothing
	TimedOut bool               // the client gave up waiting for its answer

	// The proxy's and the broker's side, written by the world for the
	// checks.
	Replica  int                // the replica that decided it
	CoreName string             // the core that decided it
	Decided  time.Duration      // when it was decided Ready (0: never)
	DelivAt  time.Duration      // when the core was told its answer was written (0: never)
	Handled  time.Duration      // when the broker handled it (0: never)
	Written  []kafka.PartResult // the answer the proxy wrote
	Lost     bool               // the proxy told the core its answer will never come
	LostAt   time.Duration      // when it did
	Settled  time.Duration      // when the proxy stepped its broker answer (0: never)
	Resp     []kafka.PartResult // the broker's answer, as the proxy stepped it
}

func New(env Env, led *Ledger, n int, name string, info Info, lib Library, acks int16, workload string) *Client {
	c := &Client{env: env, led: led, n: n, Name: name, Info: info, Lib: lib, acks: acks, Workload: workload,
		timeout: env.Between(400*time.Millisecond, 2*time.Second), skew: int64(env.Intn(5)) - 2, nparts: kafka.MaxPartitions,
		conns: make([]*Conn, env.Nodes()), closeAfter: map[*Conn]bool{}, BornAt: env.Now()}
	c.meta = env.Leaders()
	c.backoff = env.Between(50*time.Millisecond, 250*time.Millisecond)
	c.epoch = 0
	if lib.Idempotent {
		c.pid = int64(1000 + c.n)
	} else {
		c.pid = -1
	}
	return c
}

// clock is the client's clock in ms since the epoch.
func (c *Client) clock() int64 { return c.env.Wall().UnixMilli() + c.skew }

// Produce is the application handing the client a new record.
func (c *Client) Produce(name string, partition int32, keyed bool) kafka.Lid {
	env := c.env
	l := c.led.newLid(c, name, env.Now())
	c.open++
	q := qrec{Rec: kafka.Rec{Lid: l, Name: name, TS: c.clock()}, why: "new", key: keyed}
	if c.Lib.Style == JSSend {
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
func (c *Client) kick() {
	if c.flushOn || c.ended {
		return
	}
	c.flushOn = true
	c.env.After(c.Lib.linger+time.Millisecond, func() {
		c.flushOn = false
		c.flush()
	})
}

// connFor returns the connection to node, opening one to the replica that
// serves it; nil while none can be opened.
func (c *Client) connFor(node int) *Conn {
	env := c.env
	if cn := c.conns[node]; cn != nil && cn.usable() {
		if env.Serving(node) == cn.Replica || len(cn.inflight) > 0 {
			return cn
		}
		// The node moved to another replica: a new connection there; the
		// old one closes once nothing is in flight on it.
		cn.close()
	}
	c.conns[node] = nil
	if env.Now() < c.retryAt {
		return nil
	}
	cn := env.Dial(c, node)
	if cn == nil {
		// The replica serving node is down.
		c.retryAt = env.Now() + c.backoff
		c.env.At(c.retryAt, c.flush)
		return nil
	}
	c.conns[node] = cn
	return cn
}

// flush sends what is ready, within each connection's in-flight limit.
func (c *Client) flush() {
	if c.ended {
		return
	}
	if c.Lib.Style == JSSend {
		return // kafkajs sends from send()
	}
	for node := 0; node < c.env.Nodes(); node++ {
		for {
			if !c.anyReady(node) {
				break
			}
			cn := c.connFor(node)
			if cn == nil || len(cn.inflight) >= c.Lib.maxInFlight {
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

func (c *Client) anyReady(node int) bool {
	for p := int32(0); p < int32(c.nparts); p++ {
		q := &c.parts[p]
		if c.meta[p] == node && (len(q.recs) > 0 || len(q.batches) > 0) && q.flight < c.Lib.maxInFlight {
			return true
		}
	}
	return false
}

// buildRequest takes one batch per partition led by node.
func (c *Client) buildRequest(cn *Conn, node int) *Request {
	req := &Request{ID: len(c.led.Requests) + 1, Client: c, Conn: cn, Acks: c.acks, Timeout: c.timeout, node: node}
	for p := int32(0); p < int32(c.nparts); p++ {
		q := &c.parts[p]
		if c.meta[p] != node || q.flight >= c.Lib.maxInFlight {
			continue
		}
		var b *cbatch
		switch {
		case len(q.batches) > 0 && (c.Lib.Style == SameBatch || c.Lib.Style == RestampBatch):
			b = q.batches[0]
			q.batches = q.batches[1:]
		case len(q.recs) > 0:
			n := min(len(q.recs), c.Lib.maxBatch)
			c.batchN++
			b = &cbatch{n: c.batchN, part: p, recs: slices.Clone(q.recs[:n]), seq: -1, epoch: -1}
			q.recs = q.recs[n:]
		default:
			continue
		}
		if c.Lib.Idempotent && b.epoch != c.epoch {
			// Sequence numbers are given at the first send under the
			// producer's epoch: after a bump, failed batches are numbered
			// again from 0 in their order.
			b.epoch, b.seq = c.epoch, c.nextSeq[p]
			c.nextSeq[p] += int32(len(b.recs))
		}
		q.flight++
		c.addPart(req, b)
	}
	if len(req.Parts) == 0 {
		return nil
	}
	return req
}

// addPart puts batch b into req, stamped as the client stamps it.
func (c *Client) addPart(req *Request, b *cbatch) {
	now := c.clock()
	switch c.Lib.Style {
	case RestampBatch:
		if b.recs[0].first > 0 {
			d := now - b.recs[0].TS
			for i := range b.recs {
				b.recs[i].TS += d
			}
		}
	case RequeueRestamp:
		for i := range b.recs {
			b.recs[i].TS = now
		}
	}
	spec := &kafka.Batch{Partition: b.part, PID: c.pid, Epoch: b.epoch, Seq: b.seq, W: c.Lib.W}
	var whys []string
	for i := range b.recs {
		if b.recs[i].first == 0 {
			b.recs[i].first = c.env.Now()
		}
		b.recs[i].attempts++
		spec.Recs = append(spec.Recs, b.recs[i].Rec)
		whys = append(whys, b.recs[i].why)
	}
	req.Parts = append(req.Parts, spec)
	req.Raws = append(req.Raws, spec.Bytes())
	req.Whys = append(req.Whys, whys)
	req.batches = append(req.batches, b)
}

// sendReq writes req on cn and arms its timeout.
func (c *Client) sendReq(cn *Conn, req *Request) {
	env := c.env
	req.SentAt = env.Now()
	c.led.Requests = append(c.led.Requests, req)
	for _, s := range req.Parts {
		for _, r := range s.Recs {
			c.led.Records[r.Lid].Sends = append(c.led.Records[r.Lid].Sends, req.ID)
		}
	}
	cn.send(req)
	if req.Acks == 0 {
		// Nothing comes back: the client takes them as sent.
		for i, s := range req.Parts {
			for _, r := range s.Recs {
				c.acked(r.Lid)
			}
			c.parts[s.Partition].flight--
			_ = i
		}
		c.kick()
		return
	}
	cn.inflight = append(cn.inflight, req)
	env.After(req.Timeout, func() {
		if slices.Contains(cn.inflight, req) {
			c.timedOut(cn, req)
		}
	})
}

func (c *Client) acked(l kafka.Lid) {
	ri := &c.led.Records[l]
	if !ri.Acked && ri.GaveUp == "" {
		ri.Acked = true
		c.open--
		c.idle()
	}
}

func (c *Client) giveUp(l kafka.Lid, why string) {
	ri := &c.led.Records[l]
	if !ri.Acked && ri.GaveUp == "" {
		ri.GaveUp = why
		c.open--
		c.idle()
	}
}

func (c *Client) idle() {
	if c.open == 0 && c.onIdle != nil {
		f := c.onIdle
		c.onIdle = nil
		f()
	}
}

// onAnswer: an answer reached the client.
func (c *Client) onAnswer(cn *Conn, req *Request, res []kafka.PartResult) {
	i := slices.Index(cn.inflight, req)
	if i < 0 {
		return // timed out already (kafkajs), or its connection abandoned
	}
	cn.inflight = slices.Delete(cn.inflight, i, i+1)
	req.Answered = res
	if req.js != nil {
		c.jsAnswer(req, res)
		c.maybeClose(cn)
		return
	}
	refresh := false
	for i, s := range req.Parts {
		r := res[i]
		c.parts[s.Partition].flight--
		switch {
		case r.Code == 0:
			for _, x := range s.Recs {
				c.acked(x.Lid)
			}
		default:
			if r.Code == kerr.NotLeaderForPartition.Code {
				refresh = true
			}
			if c.Lib.Idempotent && (r.Code == kerr.OutOfOrderSequenceNumber.Code || r.Code == kerr.InvalidProducerEpoch.Code) && s.Epoch == c.epoch {
				// franz-go: the producer id is failed and its epoch bumped;
				// every partition's sequences start again at 0.
				c.epoch++
				c.nextSeq = [kafka.MaxPartitions]int32{}
			}
			c.requeue(req, i, fmt.Sprintf("error %d", r.Code))
		}
	}
	if refresh {
		c.refreshMeta()
	}
	c.maybeClose(cn)
	c.kick()
}

// maybeClose closes cn cleanly once nothing is in flight on it, if asked.
func (c *Client) maybeClose(cn *Conn) {
	if c.closeAfter[cn] && len(cn.inflight) == 0 {
		delete(c.closeAfter, cn)
		cn.close()
		if c.conns[cn.Node] == cn {
			c.conns[cn.Node] = nil
		}
	}
}

// requeue puts part i of a failed request back, as the client does.
func (c *Client) requeue(req *Request, i int, why string) {
	b := req.batches[i]
	q := &c.parts[b.part]
	var keep []qrec
	for _, r := range b.recs {
		if c.led.Records[r.Lid].Acked || c.led.Records[r.Lid].GaveUp != "" {
			continue
		}
		if c.Lib.retries >= 0 && r.attempts > c.Lib.retries {
			c.giveUp(r.Lid, "retries exhausted")
			continue
		}
		if c.env.Now()-r.first >= deliveryTimeout {
			c.giveUp(r.Lid, "delivery timeout")
			continue
		}
		r.why = why
		keep = append(keep, r)
	}
	if len(keep) == 0 {
		return
	}
	switch c.Lib.Style {
	case SameBatch, RestampBatch:
		b.recs = keep
		if len(keep) < len(req.Parts[i].Recs) && c.Lib.Idempotent {
			// Never: an idempotent batch is acked or failed whole.
			panic("partial idempotent batch")
		}
		q.batches = append(q.batches, b)
		slices.SortFunc(q.batches, func(x, y *cbatch) int { return x.n - y.n })
	case Resplit:
		q.recs = append(keep, q.recs...)
		slices.SortStableFunc(q.recs, func(x, y qrec) int { return int(x.Lid - y.Lid) })
	case RequeueRestamp:
		q.recs = append(q.recs, keep...)
	}
}

// timedOut: no answer within the request timeout.
func (c *Client) timedOut(cn *Conn, req *Request) {
	req.TimedOut = true
	if c.Lib.KeepConn {
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
func (c *Client) connBroken(cn *Conn) {
	if cn.broken || cn.clientClosed {
		return
	}
	cn.broken = true
	c.abandon(cn, "connection lost")
}

// abandon fails every request in flight on cn and closes it.
func (c *Client) abandon(cn *Conn, why string) {
	reqs := cn.inflight
	cn.inflight = nil
	if !cn.broken {
		cn.close()
	}
	if c.conns[cn.Node] == cn {
		c.conns[cn.Node] = nil
	}
	delete(c.closeAfter, cn)
	for _, req := range reqs {
		if req.js != nil {
			c.jsFailed(req, why)
			continue
		}
		for i, s := range req.Parts {
			c.parts[s.Partition].flight--
			c.requeue(req, i, why)
		}
	}
	c.retryAt = c.env.Now() + c.backoff
	c.env.At(c.retryAt, c.flush)
	c.refreshMeta()
}

// refreshMeta learns the partitions' leaders, after a round trip.
func (c *Client) refreshMeta() {
	env := c.env
	env.After(env.Between(10*time.Millisecond, 100*time.Millisecond), func() {
		c.meta = env.Leaders()
		c.kick()
		if c.Lib.Style == JSSend {
			c.jsNext()
		}
	})
}

// End makes the process exit once nothing is open: its connections close
// cleanly.
func (c *Client) End() {
	c.onIdle = func() {
		c.ended, c.DiedAt = true, c.env.Now()
		for _, cn := range c.conns {
			if cn != nil && cn.usable() {
				cn.close()
			}
		}
	}
	c.idle()
}

// CloseConns closes the client's connections once what is in flight on
// them is answered, as a client that closes and reconnects does.
func (c *Client) CloseConns() {
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

// ContentOnly: the core leaves the timestamp out of this client's record
// identities (decide/rule.go, restamps): sarama names itself and restamps
// its retries; kafkajs writes producer epoch 0 into a legacy batch;
// kafka-go names no software and writes partition leader epoch -1.
func (c *Client) ContentOnly() bool {
	return c.Info.Software == "sarama" || c.Lib.W.LegacyEpoch == 0 || c.Info.Software == "" && c.Lib.W.LeaderEpoch == -1
}
