package sim

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/dedupproxy/dedupproxy/decide"
	"github.com/dedupproxy/dedupproxy/sim/check"
	"github.com/dedupproxy/dedupproxy/sim/client"
	"github.com/dedupproxy/dedupproxy/sim/kafka"
)

// A scenario is what one seed generates: a cluster of a few broker nodes
// and partitions, one or two proxy replicas, a few client processes with
// their workloads, and a schedule of faults, all before endAt; then the
// run drains until every client is done.

// brokerFault is a window of broker trouble on one node.
type brokerFault struct {
	node     int
	from, to time.Duration
	hold     time.Duration // before appending
	late     time.Duration // after appending, before answering
	timeout  float64       // chance a part is answered REQUEST_TIMED_OUT after its append
}

// newWorld generates the scenario of seed, its cores configured with cfg.
func newWorld(seed uint64, cfg coreConfig, rec bool) *world {
	w := &world{seed: seed, rng: rand.New(rand.NewPCG(seed, seed^0x5eed)), maxSteps: 2_000_000}
	if rec {
		w.script = &recorder{w: w}
	}
	w.cfg = cfg
	w.nodes = 1 + w.Intn(3)
	for p := range w.broker.Leader {
		w.broker.Leader[p] = p % w.nodes
	}
	nrep := 1
	if w.nodes > 1 && w.chance(0.2) {
		nrep = 2
	}
	for i := 0; i < nrep; i++ {
		r := &replica{w: w, id: i, releasing: map[int]bool{}, released: map[int]bool{}}
		r.core = newCore(r.coreName(), w.cfg)
		w.replicas = append(w.replicas, r)
	}
	w.owner = make([]int, w.nodes)
	for n := range w.owner {
		w.owner[n] = n % nrep
	}
	w.endAt = w.Between(1500*time.Millisecond, 5*time.Second)
	w.script.header()
	w.addClients()
	w.addFaults(nrep)
	return w
}

func (r *replica) coreName() string { return fmt.Sprintf("r%d.%d", r.id, r.gen) }

// nat is the one address several client machines share.
var nat = netip.MustParseAddr("192.0.2.1")

func hostN(n int) netip.Addr { return netip.AddrFrom4([4]byte{10, 0, 1, byte(n)}) }

// streamLibs are the clients whose retries the rule is for.
var streamLibs = []client.Library{client.FranzGo, client.Java, client.KafkaPython, client.Sarama, client.Rdkafka, client.KafkaGo, client.KafkaJS}

func (w *world) pickLib(libs []client.Library) client.Library { return libs[w.Intn(len(libs))] }

// addClients adds two to four workloads.
func (w *world) addClients() {
	n := 2 + w.Intn(3)
	for i := 0; i < n; i++ {
		switch k := w.Intn(100); {
		case k < 40:
			w.streamClient(i, -1)
		case k < 55:
			w.heartbeatClient(i)
		case k < 63:
			w.oneShotJobs(i)
		case k < 71:
			w.twins(i)
		case k < 77:
			w.sharedIdentity(i)
		case k < 85:
			if w.chance(0.5) {
				w.streamClient(i, 1)
			} else {
				w.streamClient(i, 0)
			}
		default:
			w.idempotentClient(i)
		}
	}
}

func (w *world) info(id string, host netip.Addr, lib client.Library) client.Info {
	return client.Info{ID: id, Host: host, Software: lib.Software}
}

// streamClient sends unique records at a steady pace.
func (w *world) streamClient(i int, acks int16) {
	lib := w.pickLib(streamLibs)
	name := fmt.Sprintf("c%d", i)
	c := w.newClient(name, w.info(name, hostN(i), lib), lib, acks, fmt.Sprintf("stream %s acks=%d", lib.Name, acks))
	every := w.Between(10*time.Millisecond, 80*time.Millisecond)
	keyed := lib.Style != client.JSSend && w.chance(0.5)
	n := 0
	var tick func()
	tick = func() {
		if w.now >= w.endAt {
			c.End()
			return
		}
		p := int32(w.Intn(kafka.MaxPartitions))
		c.Produce(fmt.Sprintf("%sr%d", name, n), p, keyed)
		n++
		w.After(w.Between(every/2, every*3/2), tick)
	}
	w.After(w.Between(0, 50*time.Millisecond), tick)
}

// heartbeatClient sends the same record on a timer, and closes its
// connections now and then (a client close) after reading every answer.
func (w *world) heartbeatClient(i int) {
	lib := w.pickLib(streamLibs)
	name := fmt.Sprintf("hb%d", i)
	c := w.newClient(name, w.info(name, hostN(i), lib), lib, -1, "heartbeat "+lib.Name)
	period := w.Between(10*time.Millisecond, 300*time.Millisecond)
	reconnect := 2 + w.Intn(8)
	p := int32(w.Intn(kafka.MaxPartitions))
	beats := 0
	var tick func()
	tick = func() {
		if w.now >= w.endAt {
			c.End()
			return
		}
		c.Produce("hb", p, true)
		beats++
		if beats%reconnect == 0 {
			c.CloseConns()
		}
		w.After(w.Between(period*9/10, period*11/10), tick)
	}
	w.After(w.Between(0, 50*time.Millisecond), tick)
}

// oneShotJobs runs a job again and again as the same client instance:
// each run a new process connects, sends the same record, reads its
// answer and exits.
func (w *world) oneShotJobs(i int) {
	lib := w.pickLib(streamLibs)
	name := fmt.Sprintf("job%d", i)
	info := w.info(name, hostN(i), lib)
	period := w.Between(20*time.Millisecond, time.Second)
	p := int32(w.Intn(kafka.MaxPartitions))
	run := 0
	var start func()
	start = func() {
		if w.now >= w.endAt {
			return
		}
		c := w.newClient(fmt.Sprintf("%s.%d", name, run), info, lib, -1, "one-shot "+lib.Name)
		run++
		c.Produce("job", p, true)
		c.End()
		w.After(w.Between(period*9/10, period*11/10), start)
	}
	w.After(w.Between(0, 50*time.Millisecond), start)
}

// twins are several instances sending the same records at the same pace:
// other client ids, or one client id from other hosts.
func (w *world) twins(i int) {
	lib := w.pickLib(streamLibs)
	sameID := w.chance(0.5)
	period := w.Between(10*time.Millisecond, 150*time.Millisecond)
	p := int32(w.Intn(kafka.MaxPartitions))
	for j := 0; j < 2+w.Intn(2); j++ {
		name := fmt.Sprintf("tw%d.%d", i, j)
		id := name
		if sameID {
			id = fmt.Sprintf("tw%d", i)
		}
		c := w.newClient(name, w.info(id, hostN(10*i+j), lib), lib, -1, "twins "+lib.Name)
		n := 0
		var tick func()
		tick = func() {
			if w.now >= w.endAt {
				c.End()
				return
			}
			c.Produce(fmt.Sprintf("reading%d", n%3), p, true)
			n++
			w.After(period, tick)
		}
		w.At(w.now+period/2, tick)
	}
}

// sharedIdentity: processes on hosts behind one NAT address that share a
// client id (a library default), each sending heartbeats: one client
// instance to the proxy (docs/legacy.md, "What is left").
func (w *world) sharedIdentity(i int) {
	lib := w.pickLib(streamLibs)
	id := "rdkafka"
	period := w.Between(10*time.Millisecond, 300*time.Millisecond)
	p := int32(w.Intn(kafka.MaxPartitions))
	for j := 0; j < 2; j++ {
		name := fmt.Sprintf("nat%d.%d", i, j)
		c := w.newClient(name, w.info(id, nat, lib), lib, -1, "shared identity "+lib.Name)
		var tick func()
		tick = func() {
			if w.now >= w.endAt {
				c.End()
				return
			}
			c.Produce("hb", p, true)
			w.After(w.Between(period*9/10, period*11/10), tick)
		}
		w.After(w.Between(0, period), tick)
	}
}

// idempotentClient streams unique records with idempotence on.
func (w *world) idempotentClient(i int) {
	lib := client.FranzGoIdempotent
	if w.chance(0.5) {
		lib = client.RdkafkaIdempotent
	}
	name := fmt.Sprintf("id%d", i)
	c := w.newClient(name, w.info(name, hostN(i), lib), lib, -1, "idempotent "+lib.Name)
	every := w.Between(10*time.Millisecond, 80*time.Millisecond)
	n := 0
	var tick func()
	tick = func() {
		if w.now >= w.endAt {
			c.End()
			return
		}
		c.Produce(fmt.Sprintf("%sr%d", name, n), int32(w.Intn(kafka.MaxPartitions)), true)
		n++
		w.After(w.Between(every/2, every*3/2), tick)
	}
	w.After(w.Between(0, 50*time.Millisecond), tick)
}

// addFaults schedules the scenario's faults, all before endAt.
func (w *world) addFaults(nrep int) {
	n := w.Intn(5)
	for i := 0; i < n; i++ {
		at := w.Between(100*time.Millisecond, w.endAt)
		switch k := w.Intn(100); {
		case k < 20:
			w.note("answer lost with its connection at %v", at)
			w.At(at, w.loseAnswer)
		case k < 32:
			w.note("connection cut with requests in flight at %v", at)
			w.At(at, func() { w.cutSome(false) })
		case k < 36:
			w.note("connection cut silently at %v", at)
			w.At(at, func() { w.cutSome(true) })
		case k < 50:
			node := w.Intn(w.nodes)
			d := w.Between(200*time.Millisecond, 3*time.Second)
			f := brokerFault{node: node, from: at, to: at + d}
			if w.chance(0.5) {
				f.hold = w.Between(time.Second, 4*time.Second)
			} else {
				f.late = w.Between(time.Second, 4*time.Second)
			}
			w.note("broker %d slower than the clients' timeout from %v for %v (hold %v, late %v)", node, at, d, f.hold, f.late)
			w.brokerFaults = append(w.brokerFaults, f)
		case k < 62:
			node := w.Intn(w.nodes)
			d := w.Between(100*time.Millisecond, 2*time.Second)
			w.note("broker %d answers REQUEST_TIMED_OUT after appending from %v for %v", node, at, d)
			w.brokerFaults = append(w.brokerFaults, brokerFault{node: node, from: at, to: at + d, timeout: 0.5})
		case k < 72:
			if w.nodes > 1 {
				w.At(at, w.moveLeader)
			}
		case k < 78:
			w.note("broker connection cut at %v", at)
			w.At(at, w.cutUpstream)
		case k < 84:
			w.note("middlebox reads answers and closes at %v", at)
			w.At(at, w.middlebox)
		case k < 94:
			if nrep == 1 {
				crash := w.chance(0.5)
				w.note("proxy restart (crash %v) at %v", crash, at)
				w.At(at, func() { w.restart(w.replicas[0], crash) })
			} else {
				node := w.Intn(w.nodes)
				w.note("node %d handed over at %v", node, at)
				w.At(at, func() { w.handOver(node) })
			}
		default:
			w.tailFail = 0.3
			w.note("tail reads fail (30%%)")
		}
	}
}

func (w *world) note(format string, a ...any) { w.faults = append(w.faults, fmt.Sprintf(format, a...)) }

// openConns lists the connections the proxy still serves, in id order.
func (w *world) openConns(pred func(*client.Conn) bool) []*client.Conn {
	var out []*client.Conn
	for _, cn := range w.conns {
		if s := sessionOf(cn); cn.Up() && s != nil && !s.gone && !s.closed && pred(cn) {
			out = append(out, cn)
		}
	}
	return out
}

// loseAnswer: the next answer written on a connection with requests in
// flight is lost, and the connection with it (a lost acknowledgement).
func (w *world) loseAnswer() {
	cs := w.openConns((*client.Conn).Busy)
	if len(cs) == 0 {
		return
	}
	cs[w.Intn(len(cs))].LoseNextAnswer()
}

func (w *world) cutSome(silent bool) {
	cs := w.openConns((*client.Conn).Busy)
	if len(cs) == 0 {
		return
	}
	cs[w.Intn(len(cs))].Cut(silent)
}

// middlebox: something between client and proxy acknowledges the answers
// of a connection and passes none on, then closes it.
func (w *world) middlebox() {
	cs := w.openConns((*client.Conn).Busy)
	if len(cs) == 0 {
		return
	}
	cs[w.Intn(len(cs))].MiddleboxCloses()
}

func (w *world) cutUpstream() {
	cs := w.openConns((*client.Conn).Busy)
	if len(cs) == 0 {
		return
	}
	sessionOf(cs[w.Intn(len(cs))]).cutUpstream()
}

// moveLeader moves a partition's leadership to another node: its requests
// to the old one are answered NOT_LEADER_OR_FOLLOWER from now on.
func (w *world) moveLeader() {
	p := int32(w.Intn(kafka.MaxPartitions))
	from := w.broker.Leader[p]
	to := (from + 1 + w.Intn(w.nodes-1)) % w.nodes
	w.broker.Leader[p] = to
	w.note("partition %d's leader moved from node %d to %d at %v", p, from, to, w.now)
	if w.owner[from] != w.owner[to] {
		// The replica that decided it sees it led by a node it does not
		// serve and forgets its warm-up: should the leadership come back,
		// it reads the tail first (docs/replicas.md, "Leader moves").
		r := w.replicas[w.owner[from]]
		w.rewarms++
		w.script.rewarm(r.core, p)
		r.core.rewarm(p)
	}
}

// brokerHold is how long node holds a request before appending it.
func (w *world) brokerHold(node int) time.Duration {
	for _, f := range w.brokerFaults {
		if f.node == node && w.now >= f.from && w.now < f.to && f.hold > 0 {
			return f.hold
		}
	}
	return 0
}

// handleProduce is the broker node handling one forwarded request: each
// batch appended or refused, and how late it answers.
func (w *world) handleProduce(node int, p *pending) ([]kafka.PartResult, time.Duration) {
	var out []kafka.PartResult
	var late time.Duration
	refused := false
	defer func() {
		if refused {
			w.After(0, func() { sessionOf(p.req.Conn).cutUpstream() })
		}
	}()
	timeoutChance := 0.0
	for _, f := range w.brokerFaults {
		if f.node == node && w.now >= f.from && w.now < f.to {
			late = max(late, f.late)
			timeoutChance = max(timeoutChance, f.timeout)
		}
	}
	p.req.Handled = w.now
	for _, sp := range p.sent {
		res, ok := w.broker.Produce(node, sp.spec, sp.recs, sp.raw, p.req.ID)
		if !ok && p.req.Acks == 0 {
			// Kafka closes the connection of a failed acks=0 write.
			w.led.LostAcks0(p.req, "refused by the broker (acks=0)")
			refused = true
		}
		if ok {
			for _, r := range sp.recs {
				w.led.Records[r.Lid].Written = append(w.led.Records[r.Lid].Written, p.req.ID)
			}
			if p.req.Acks != 0 && w.chance(timeoutChance) {
				res.Code, res.Offset = kerr.RequestTimedOut.Code, -1
			}
		}
		out = append(out, res)
	}
	return out, late
}

// everWritten reports whether a record is in the log.
func (w *world) everWritten(l kafka.Lid) bool { return len(w.led.Records[l].Written) > 0 }

// readTail is a read of partition p's tail for core k: its log, or a
// failure.
func (w *world) readTail(k *core, p int32) {
	if w.chance(w.tailFail) {
		w.tailFails = append(w.tailFails, check.TailRead{Core: k.name, Partition: p, At: w.now})
		w.script.tail(k, p, true)
		w.wake(k.tailFailed(p, w.Wall()), k)
		return
	}
	w.tailReads = append(w.tailReads, check.TailRead{Core: k.name, Partition: p, At: w.now})
	w.script.tail(k, p, false)
	w.wake(k.tailRead(p, w.broker.Tail(p), w.Wall()), k)
}

// wake signals the sessions of core k the core named.
func (w *world) wake(ids []decide.ConnID, k *core) {
	for _, id := range ids {
		if int(id) < len(w.conns) {
			if s := sessionOf(w.conns[id]); s != nil && s.k == k {
				s.woken()
			}
		}
	}
}
