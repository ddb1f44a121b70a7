package e2e

import (
	"context"
	"flag"
	"fmt"
	"net"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupproxy/dedupproxy/internal/testcluster"
	"github.com/dedupproxy/dedupproxy/internal/testskip"
)

var update = flag.Bool("update", false, "write results/legacy-clients.md from this run")

func writeResults() bool { return *update || os.Getenv("E2E_WRITE_RESULTS") == "1" }

// produceResult is what a client reported about its own run.
type produceResult struct {
	version string
	// acked lists the indices of the values the client reported delivered,
	// when it reports per record (perValue). kcat only reports failures
	// counted, so for it ackedCount is sent minus failed.
	acked      []int
	perValue   bool
	ackedCount int
	failed     int
	errors     []string // the first few delivery errors, for the log
}

// legacyClient drives one real client as a legacy (non-idempotent) producer.
type legacyClient struct {
	name string
	// clientID is the client id it sends: with the host and principal,
	// what makes it one client instance to the proxy (docs/legacy.md).
	clientID string
	// retries: docs/clients.md §3 measured that this client retries a batch
	// whose acknowledgement was lost, so the control run must show
	// duplicates and the client must report every record delivered.
	retries bool
	// resendsOnSameSocket: after a request timeout the client sends the
	// retry down the same connection, behind the original the broker is
	// still holding (kafkajs). The proxy takes a copy pipelined on the
	// original's own connection for new data (docs/legacy.md), so the slow
	// run reports its duplicates without failing on them.
	resendsOnSameSocket bool
	// restampsResends: the client stamps a resent record with a new
	// timestamp (kafka-go, kafkajs). After a restart the proxy knows
	// records only from the log, and matches them by content and
	// timestamp (docs/legacy.md, "After a restart"): its restart and drain
	// runs report their duplicates and skip.
	restampsResends bool
	// repartitionsRetries: the client assigns keyless records to
	// partitions anew on every attempt and resends only to the brokers
	// that did not answer (kafkajs, docs/legacy.md rule 4). Through
	// replicas its retry carries records to partitions another replica
	// serves, and a NOT_LEADER_OR_FOLLOWER from one broker of a send makes
	// it lose some records and write others twice, with or without the
	// proxy (TestReplicasLostAck runs that control).
	repartitionsRetries bool
	// inFlight is how many records the client can have in flight when an
	// answer is lost (its requests pipelined on its connections, times
	// the records of each): a bound on what it writes twice where the
	// proxy is documented to miss its resend (knownMiss).
	inFlight int
	// recordsPerRequest is how many records one of its requests carries
	// at most (kafkajs: one send).
	recordsPerRequest int
	// ownFailures bounds, per mode, the records the client reports failed
	// by its own doing whatever the proxy does: kafka-python expires the
	// batches that wait in its queue longer than its request timeout,
	// behind a request the broker holds (straight to the broker as
	// through the proxy).
	ownFailures map[string]int
	// idempotent: the client runs with idempotence on, as the control row
	// for the proxy's idempotent path under the same faults. The broker
	// deduplicates its retries itself, so every mode, control included,
	// must show none, and none of its batches may be legacy.
	idempotent bool
	// dropAt is which Produce request (acks != 0, counted from 1 across
	// connections) loses its response: late enough that the client is in
	// its stride (librdkafka's first requests carry a handful of records
	// while kcat reads stdin), early enough that records are still to be
	// sent.
	dropAt int64
	// paced: the client's source hands it records as a live one does
	// (paceSource) and the client lingers pacedLinger ms, so its requests
	// carry records of several bursts; and the faults that can repeat hit
	// several of its requests (faults), so that librdkafka re-splits the
	// records of several failed requests at new boundaries.
	paced bool
	// available returns nil when the client can run here.
	available func() error
	// produce writes values value(0..o.n-1) to topic via bootstrap with
	// acks=all and idempotence off, as o says, and returns what the client
	// reported.
	produce func(ctx context.Context, t *testing.T, bootstrap, topic string, o produceOpts) (produceResult, error)
}

// produceOpts is how a client runs.
type produceOpts struct {
	n    int              // records: values value(0..n-1)
	auth testcluster.SASL // authenticates with it when it names a mechanism
	// timeout, when set, is how long the client waits for a Produce answer
	// before it gives up on the request and resends its records: its own
	// request or read timeout (slowBrokerTimeout). Zero: the client's
	// usual settings of these tests (5 s; franz-go 2 s).
	timeout time.Duration
}

// software is the client software name the client sends in ApiVersions
// (KIP-511), "" for one that names none: a replay of its request must say
// the same, so that the proxy sees the same client (docs/legacy.md, "What
// a record is").
func (c legacyClient) software() string {
	switch {
	case c.name == "sarama":
		return "sarama"
	case c.restampsResends || strings.HasPrefix(c.name, "kafka-python"):
		return "" // kafka-go, kafkajs, kafka-python
	}
	return "kgo" // any name of a client that keeps its timestamps
}

// recordsPerRun is how many records each client writes: enough for a few
// dozen Produce requests, so the lost acknowledgement is mid-stream, and
// small enough that the slowest client (kafka-python) stays within seconds.
const recordsPerRun = 3000

// value is the unique record value with index i.
func value(i int) string { return fmt.Sprintf("r-%06d", i) }

// The paced rows' source and faults: pacedBurst records every pacedEvery
// (recordsPerRun in 1.2 s), as a live source hands them over, to a client
// lingering pacedLinger ms, retrying pacedRetries times, with batches of at
// most pacedBatch records: each burst leaves as several requests pipelined
// on one connection, so a lost answer (its connection closed) loses
// several batches of a partition, whose records librdkafka then batches
// again at other boundaries (as a broker slower than the linger does with
// bigger batches). Its reconnection backoff starts at pacedBackoff ms and
// doubles up to pacedBackoffMax ms: with librdkafka's defaults (100 ms, up
// to 10 s) ten breaks in a row stall it past the run's deadline, and the
// faults keep to the seconds the source runs. One
// Produce answer in pacedDropEvery lost (or timed out, or cut), at most
// pacedMaxDrops in a run.
const (
	pacedBurst      = 50
	pacedEvery      = 20 * time.Millisecond
	pacedLinger     = 20
	pacedRetries    = 10
	pacedBatch      = 20
	pacedBackoff    = 50
	pacedBackoffMax = 200
	pacedDropEvery  = 7
	pacedMaxDrops   = 10
	pacedMinDrops   = 3 // fewer, and the run did not lose several answers
)

// pacedConfig is the librdkafka configuration of the paced rows, beside
// the one every row has.
func pacedConfig() map[string]int {
	return map[string]int{
		"linger.ms":                pacedLinger,
		"retries":                  pacedRetries,
		"batch.num.messages":       pacedBatch,
		"retry.backoff.ms":         pacedBackoff,
		"reconnect.backoff.ms":     pacedBackoff,
		"reconnect.backoff.max.ms": pacedBackoffMax,
	}
}

// paceSource hands values 0..n-1 to emit in bursts of pacedBurst, one burst
// every pacedEvery from its start, and stops early when ctx ends or emit
// fails. The pause is the workload's shape, not a synchronisation.
func paceSource(ctx context.Context, n int, emit func(i int) error) error {
	start := time.Now()
	var timer *time.Timer
	for i := 0; i < n; i++ {
		if i > 0 && i%pacedBurst == 0 {
			d := time.Until(start.Add(time.Duration(i/pacedBurst) * pacedEvery))
			if timer == nil {
				timer = time.NewTimer(d)
				defer timer.Stop()
			} else {
				timer.Reset(d)
			}
			select {
			case <-timer.C:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if err := emit(i); err != nil {
			return err
		}
	}
	return nil
}

// faultPlan is which Produce requests (acks != 0, counted from 1 across
// connections) a fault hits: the at-th, and with every > 0 each every-th
// after it, max in all.
type faultPlan struct{ at, every, max int64 }

func (p faultPlan) hits(n int64) bool {
	switch {
	case n == p.at:
		return true
	case p.every <= 0 || n < p.at || (n-p.at)%p.every != 0:
		return false
	}
	return (n-p.at)/p.every < p.max
}

// repeats reports whether the plan hits more than one request.
func (p faultPlan) repeats() bool { return p.every > 0 && p.max > 1 }

func (p faultPlan) String() string {
	if !p.repeats() {
		return fmt.Sprintf("#%d", p.at)
	}
	return fmt.Sprintf("#%d, every %dth after, ≤%d", p.at, p.every, p.max)
}

// faults is the plan of mode's fault for c: the dropAt-th Produce request,
// and for a paced client every pacedDropEvery-th after it too, except in
// the modes that hold one request (slow, abort).
func (c legacyClient) faults(mode string) faultPlan {
	if slowBrokerMode(mode) {
		return faultPlan{at: c.dropAt, every: slowBrokerEvery, max: slowBrokerHolds}
	}
	if !c.paced || mode == modeSlow || mode == modeAbort {
		return faultPlan{at: c.dropAt}
	}
	return faultPlan{at: c.dropAt, every: pacedDropEvery, max: pacedMaxDrops}
}

// legacyClients are the clients under test, in the order of the results
// table.
func legacyClients() []legacyClient {
	return []legacyClient{
		franzClient(),
		saramaClient(),
		kafkaGoClient(),
		kcatClient(false),
		confluentPythonClient(false),
		confluentGoClient(false),
		kafkaPythonClient(5),
		kafkaPythonClient(0),
		kafkajsClient(),
		franzIdempotentClient(),
	}
}

// matrixClients are the rows of TestLegacyLostAck: legacyClients, then
// every librdkafka client with a paced source (legacyClient.paced).
func matrixClients() []legacyClient {
	return append(legacyClients(), kcatClient(true), confluentPythonClient(true), confluentGoClient(true))
}

const (
	modeControl = "control" // client → shim → kfake
	modeProxy   = "proxy"   // client → shim → dedupproxy → kfake
	// restart: as proxy, but instead of only losing the acknowledgement the
	// proxy is killed there (connections cut, tables gone) and a new one
	// starts at once on the same ports: the retry reaches a proxy that never
	// saw the original and must find it in the log (docs/warm.md).
	modeRestart = "restart"
	// drain: as restart, but the proxy is stopped gracefully (SIGTERM's
	// Shutdown: in-flight responses drained, then closed) before the new
	// one starts.
	modeDrain = "drain"
	// timedout: through the proxy, nothing dropped by the shim; instead
	// the broker appends the dropAt-th Produce and answers it
	// REQUEST_TIMED_OUT (kfake's fault hook), which every client retries.
	modeTimedOut = "timedout"
	// cut: through the proxy, nothing dropped by the shim; instead the
	// proxy's own connection to the broker breaks right after the
	// dropAt-th Produce is written to it: the proxy cannot know whether
	// the broker appended it.
	modeCut = "cut"
	// leader: through the proxy, on a two-broker cluster; at the lost
	// acknowledgement every partition's leader moves to the other broker,
	// so the retry is refused with NOT_LEADER_OR_FOLLOWER, and after the
	// client's metadata refresh reaches another broker through another of
	// the proxy's node listeners (docs/produce-path.md: one table for all).
	modeLeader = "leader"
	// slow: through the proxy, nothing dropped by the shim; the broker
	// holds the dropAt-th Produce past the client's request timeout (the
	// client gives up on it and retries), then appends it. It is released
	// once the proxy holds the retry waiting on the original, or after
	// slowHold for a client whose retry never reaches the proxy as one.
	modeSlow = "slow"
	// slowcontrol: client → shim → kfake, nothing dropped; the broker
	// holds some Produce requests slowBrokerHold before it appends them,
	// longer than the client waits for an answer (slowBrokerTimeout): the
	// client gives up on each and sends its records again on a new
	// connection (kafkajs: on the same one), and the broker appends both.
	modeSlowControl = "slowcontrol"
	// slowbroker: the same through the proxy, which must write each record
	// once and fail no send.
	modeSlowBroker = "slowbroker"
	// abort: through the proxy; while the broker holds the dropAt-th
	// Produce the client is killed (its context ends, its connections are
	// cut, no new ones are accepted), then the broker appends it and
	// answers a proxy whose client is gone. That request, sent again
	// as it was on a fresh connection, must be answered from what the proxy
	// committed after its client left, not written again.
	modeAbort = "abort"
)

// slowHold bounds how long the slow mode holds a Produce: longer than
// every client's request timeout (5 s, franz-go 2 s).
const slowHold = 8 * time.Second

// The slow-broker modes: the broker holds a Produce request slowBrokerHold
// before appending it, three times in a run (the client's dropAt-th
// request, then every slowBrokerEvery-th after it, one hold at a time),
// to clients that give up on a request after slowBrokerTimeout and write
// slowBrokerRecords records.
const (
	slowBrokerHold    = 3 * time.Second
	slowBrokerTimeout = time.Second
	slowBrokerEvery   = 10
	slowBrokerHolds   = 3
	slowBrokerRecords = 5000
)

// slowBrokerMode reports whether mode is one of the slow-broker runs.
func slowBrokerMode(mode string) bool { return mode == modeSlowControl || mode == modeSlowBroker }

// shimDrops reports whether the fault of mode is the shim's lost
// acknowledgement.
func shimDrops(mode string) bool {
	return mode != modeTimedOut && mode != modeCut && mode != modeSlow && mode != modeAbort && !slowBrokerMode(mode)
}

// modes are the runs of each client, in the order of the results table.
var modes = []string{modeControl, modeProxy, modeRestart, modeDrain, modeTimedOut, modeCut, modeLeader, modeSlow, modeAbort, modeSlowControl, modeSlowBroker}

// tally is one run's figures.
type tally struct {
	client, version, mode string
	sent, acked, failed   int
	ackedExact            bool // acknowledged values known one by one
	stored, duplicated    int
	lost                  int // acknowledged values not in the log; a lower bound if !ackedExact
	unackedStored         int // values reported failed (or never reported) that are in the log anyway
	foreign               int // stored values the client never sent
	shim                  shimStats
	plan                  faultPlan
	faults                int64   // how often the fault fired
	legacyPassthrough     float64 // proxy: batches it relayed as legacy
	waitTimeouts          float64 // proxy: requests it answered REQUEST_TIMED_OUT after waiting
	bound                 int     // the documented miss's bound on duplicated (knownMiss), 0 if none
	elapsed               time.Duration
}

func (r tally) String() string {
	lost := fmt.Sprint(r.lost)
	if !r.ackedExact {
		lost = "≥" + lost
	}
	s := fmt.Sprintf("%s (%s) %s: sent %d, acknowledged %d (failed %d, of which stored anyway %d), stored %d, duplicated %d, lost %s; "+
		"shim: %d Produce requests, %d batches (%d legacy, %d carrying records sent before, %d of them re-split), %d records, fault at %v (fired %d, %d dropped by the shim), %d records forwarded by the first; %v",
		r.client, r.version, r.mode, r.sent, r.acked, r.failed, r.unackedStored, r.stored, r.duplicated, lost,
		r.shim.Produces, r.shim.Batches, r.shim.LegacyBatches, r.shim.Resent, r.shim.Merged, r.shim.Records, r.plan, r.faults, r.shim.Dropped, r.shim.RecordsAtDrop,
		r.elapsed.Round(time.Millisecond))
	if r.mode != modeControl {
		s += fmt.Sprintf("; proxy relayed %v legacy batches", r.legacyPassthrough)
	}
	return s
}

// results collects every run's figures for results/legacy-clients.md.
var results struct {
	mu   sync.Mutex
	runs map[string]map[string]tally // client -> mode -> figures
}

func record(r tally) {
	results.mu.Lock()
	defer results.mu.Unlock()
	if results.runs == nil {
		results.runs = map[string]map[string]tally{}
	}
	if results.runs[r.client] == nil {
		results.runs[r.client] = map[string]tally{}
	}
	results.runs[r.client][r.mode] = r
}

// TestLegacyLostAck holds the promise that a legacy producer's retried batch
// is never written twice. Each real client writes recordsPerRun unique values with
// acks=all and idempotence off; the shim drops the acknowledgement of one
// Produce request after the broker appended it and closes the connection
// (docs/clients.md §3, "close"). Kafka cannot deduplicate a producer id -1
// batch (docs/kafka-rules.md), so a client that retries writes it twice:
//
//   - control (client → shim → kfake) must show duplicates for every client
//     that retries, or the test is not testing anything;
//   - proxy (client → shim → dedupproxy → kfake) must show none
//     (docs/legacy.md);
//   - restart: the same, but at the lost acknowledgement the proxy is
//     killed and a new one starts on the same ports, so the retry reaches
//     a proxy that never saw the original: it must find it in the log
//     (docs/warm.md) and show none either;
//   - and the other faults of modes, the slow broker among them
//     (slowcontrol straight to the broker, slowbroker through the proxy).
//
// Through the proxy a run may write twice only what a documented miss
// allows, within its bound (knownMiss); in every mode nothing acknowledged
// may be missing from the log.
func TestLegacyLostAck(t *testing.T) {
	clients := matrixClients()
	for _, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			requireClient(t, c.name, c.available())
			for _, mode := range modes {
				t.Run(mode, func(t *testing.T) { runLostAck(t, c, mode) })
			}
		})
	}
	if !writeResults() {
		return
	}
	if t.Failed() {
		t.Log("not writing results/legacy-clients.md: the run failed")
		return
	}
	var missing []string
	results.mu.Lock()
	for _, c := range clients {
		for _, mode := range modes {
			if _, ok := results.runs[c.name][mode]; !ok {
				missing = append(missing, c.name+"/"+mode)
			}
		}
	}
	results.mu.Unlock()
	if len(missing) > 0 {
		t.Errorf("not writing results/legacy-clients.md: no figures for %s (skipped, or filtered out with -run)", strings.Join(missing, ", "))
		return
	}
	path := filepath.Join("results", "legacy-clients.md")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	if err := os.WriteFile(path, []byte(resultsMarkdown(clients, now)), 0o644); err != nil {
		t.Fatal(err)
	}
	results.mu.Lock()
	table := summaryTable(clients, now.Format("2006-01-02"))
	results.mu.Unlock()
	if err := updateReadme(table); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s and the README's table", path)
}

func runLostAck(t *testing.T, c legacyClient, mode string) {
	brokers := 1
	if mode == modeLeader {
		brokers = 2
	}
	name := "legacy-" + strings.NewReplacer(" ", "-", "=", "-").Replace(c.name)
	cluster := newClusterOf(t, brokers, name)
	topic := cluster.topic(name)
	// The faults that need kfake's hooks; on a real cluster the others run.
	var fake *kfake.Cluster
	switch mode {
	case modeTimedOut:
		fake = cluster.kfake(t, "fault injection (Fault: REQUEST_TIMED_OUT after the append)")
	case modeLeader:
		fake = cluster.kfake(t, "partition moves (MoveTopicPartition)")
	case modeSlow, modeAbort, modeSlowControl, modeSlowBroker:
		fake = cluster.kfake(t, "held Produce requests (ControlKey, SleepControl)")
	case modeCut:
		if cluster.tls() {
			testskip.Skip(t, "cut reads Kafka frames on the proxy's broker connection, which TLS hides")
		}
	}
	target := cluster.addrs()[0]
	var px *testProxy
	// restart: what the shim's goroutine did at each lost acknowledgement.
	var restart struct {
		sync.Mutex
		done    int
		proxies []*testProxy // the restarted ones, in order
		err     error
	}
	plan := c.faults(mode)
	var faults atomic.Int64 // how often the fault fired
	switch mode {
	case modeProxy:
		px = startProxy(t, cluster)
		target = px.addr()
	case modeTimedOut:
		var produces atomic.Int64
		fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.RequestTimedOut, Count: int(max(1, plan.max)),
			When: func(req kmsg.Request) bool {
				if req.(*kmsg.ProduceRequest).Acks == 0 || !plan.hits(produces.Add(1)) {
					return false
				}
				faults.Add(1)
				return true
			}})
		px = startProxy(t, cluster)
		target = px.addr()
	case modeCut:
		px = startProxyDial(t, cluster, cutAfterProduce(plan, &faults))
		target = px.addr()
	case modeLeader:
		px = startProxy(t, cluster)
		target = px.addr()
	case modeSlow, modeAbort, modeSlowBroker:
		px = startProxy(t, cluster)
		target = px.addr()
	case modeRestart, modeDrain:
		listen := freeListenPair(t)
		px = startProxyOn(t, cluster, listen)
		target = px.addr()
	}
	var dropAt int64
	if shimDrops(mode) {
		dropAt = c.dropAt
	}
	// The shim reaches the cluster as its clients would (TLS when it
	// speaks TLS), the proxy in plaintext.
	dial := cluster.dial
	if px != nil {
		var d net.Dialer
		dial = d.DialContext
	}
	shim := newAckShim(t, target, dropAt, dial)
	if shimDrops(mode) {
		shim.setDrops(plan)
	}
	if os.Getenv("E2E_DEBUG") == "1" {
		shim.setTrace(func(line string) { t.Log("shim: " + line) })
	}
	var moveErr atomic.Pointer[error]
	if mode == modeLeader {
		shim.setOnDrop(func() {
			for p := int32(0); p < legacyPartitions; p++ {
				if err := fake.MoveTopicPartition(topic, p, 1-fake.LeaderFor(topic, p)); err != nil {
					moveErr.Store(&err)
					return
				}
			}
			faults.Add(1)
		})
	}
	if mode == modeRestart || mode == modeDrain {
		listen := px.addr()
		shim.setOnDrop(func() {
			// Held throughout: two drops at once restart one after the
			// other, never two proxies on the same ports.
			restart.Lock()
			defer restart.Unlock()
			if restart.err != nil {
				return
			}
			cur := px
			if n := len(restart.proxies); n > 0 {
				cur = restart.proxies[n-1]
			}
			if mode == modeDrain {
				cur.drain()
			} else {
				cur.kill()
			}
			next, err := startProxyOnErr(cluster, listen)
			restart.done++
			if err != nil {
				restart.err = err
				return
			}
			restart.proxies = append(restart.proxies, next)
		})
		t.Cleanup(func() {
			restart.Lock()
			defer restart.Unlock()
			for i, p := range restart.proxies {
				p.kill()
				if t.Failed() {
					t.Logf("restarted proxy %d log:\n%s", i+1, p.logs.String())
				}
			}
		})
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clientCtx, killClient := context.WithCancel(ctx)
	defer killClient()
	var held *heldProduce
	released := func() bool { return true } // every request the broker held has been appended
	switch mode {
	case modeSlow:
		held = holdProduce(fake, c.dropAt, &faults, func() {
			// The retry waits in the proxy on the held original; a client
			// that never retries, or retries on the same connection, is
			// released by the bound.
			eventually(slowHold, func() bool { return px.metric("dedupproxy_produce_waiting_retries", "") >= 1 })
		})
	case modeAbort:
		held = holdProduce(fake, c.dropAt, &faults, func() {
			killClient()
			shim.close()
		})
	case modeSlowControl, modeSlowBroker:
		released = holdProduces(fake, plan, slowBrokerHold, &faults)
	}
	opts := produceOpts{n: recordsPerRun, auth: cluster.sasl()}
	if slowBrokerMode(mode) {
		opts.n, opts.timeout = slowBrokerRecords, slowBrokerTimeout
	}
	start := time.Now()
	res, err := c.produce(clientCtx, t, shim.Addr(), topic, opts)
	elapsed := time.Since(start)
	aborted := mode == modeAbort && faults.Load() == 1
	switch {
	case err != nil && aborted:
		t.Logf("%s, killed with its Produce in flight: %v", c.name, err)
		res.failed = opts.n - len(res.acked)
	case err != nil:
		t.Fatalf("%s: %v", c.name, err)
	}
	if aborted {
		replayHeld(t, px, held, c.idempotent, c.clientID, c.software())
	}
	if !eventually(2*slowBrokerHold, released) {
		t.Fatalf("the broker still holds a Produce request %v after the client finished", 2*slowBrokerHold)
	}
	copies, stored := storedValues(t, cluster, topic)

	r := tally{
		client: c.name, version: res.version, mode: mode,
		sent: opts.n, failed: res.failed, stored: stored,
		shim: shim.Stats(), plan: plan, faults: faults.Load(), elapsed: elapsed,
	}
	if shimDrops(mode) {
		r.faults = r.shim.Dropped
	}
	sent := make(map[string]bool, opts.n)
	for i := 0; i < opts.n; i++ {
		sent[value(i)] = true
	}
	var twice []string
	for v, n := range copies {
		if !sent[v] {
			r.foreign += n
			continue
		}
		r.duplicated += n - 1
		if n > 1 {
			twice = append(twice, v)
		}
	}
	if len(twice) > 0 {
		sort.Strings(twice)
		t.Logf("written more than once, the first ones: %v", twice[:min(20, len(twice))])
		if os.Getenv("E2E_DEBUG") == "1" {
			where := make(map[string]bool, len(twice))
			for _, v := range twice {
				where[v] = true
			}
			logWhereStored(t, cluster, topic, where, stored)
		}
	}
	switch {
	case res.perValue:
		r.acked, r.ackedExact = len(res.acked), true
		acked := make(map[string]bool, len(res.acked))
		for _, i := range res.acked {
			acked[value(i)] = true
			if copies[value(i)] == 0 {
				r.lost++
			}
		}
		for v := range sent {
			if !acked[v] && copies[v] > 0 {
				r.unackedStored++
			}
		}
	default:
		// Only counts: exact when nothing failed (every value was
		// acknowledged), else a lower bound.
		r.acked, r.ackedExact = res.ackedCount, res.failed == 0 && !aborted
		distinct := 0
		for v := range sent {
			if copies[v] > 0 {
				distinct++
			}
		}
		r.lost = max(0, r.acked-distinct)
	}
	if px != nil {
		r.legacyPassthrough = px.metric("dedupproxy_batches_passthrough_total", "reason=legacy")
		r.waitTimeouts = px.metric("dedupproxy_produce_wait_timeouts_total", "")
	}
	miss := c.knownMiss(mode, r.faults)
	r.bound = miss.bound
	if mode == modeRestart || mode == modeDrain {
		restart.Lock()
		switch {
		case restart.err != nil:
			t.Errorf("restarting the proxy: %v", restart.err)
		case int64(restart.done) != r.shim.Dropped:
			t.Errorf("the proxy was restarted %d times, but the shim dropped %d responses", restart.done, r.shim.Dropped)
		}
		restart.Unlock()
	}
	if err := moveErr.Load(); err != nil {
		t.Errorf("moving the leaders: %v", *err)
	}
	if mode == modeLeader && faults.Load() != r.shim.Dropped {
		t.Errorf("the leaders moved %d times, but the shim dropped %d responses", faults.Load(), r.shim.Dropped)
	}
	if cluster.real == nil { // the results table is kfake's
		record(r)
	}
	t.Log(r)
	if len(res.errors) > 0 {
		t.Logf("%s reported errors, the first ones: %s", c.name, strings.Join(res.errors, "; "))
	}

	// The harness itself: the fault fired mid-stream on legacy batches,
	// once, or for a repeating plan several times.
	switch {
	case slowBrokerMode(mode):
		if r.faults < 1 || r.faults > plan.max {
			t.Fatalf("the broker held %d Produce requests, want 1 to %d: the client sent %d, the holds are at %v",
				r.faults, plan.max, r.shim.Produces, plan)
		}
	case !plan.repeats() && r.faults != 1:
		t.Fatalf("the %s fault fired %d times, want 1: the client sent %d Produce requests, the fault is at %v",
			mode, r.faults, r.shim.Produces, plan)
	case plan.repeats() && (r.faults < pacedMinDrops || r.faults > plan.max):
		t.Fatalf("the %s fault fired %d times, want %d to %d: the client sent %d Produce requests, the fault is at %v",
			mode, r.faults, pacedMinDrops, plan.max, r.shim.Produces, plan)
	}
	if shimDrops(mode) && (r.shim.RecordsAtDrop <= 0 || r.shim.RecordsAtDrop >= int64(r.sent)) {
		t.Errorf("the acknowledgement was not lost mid-stream: %d of %d records forwarded when it was dropped",
			r.shim.RecordsAtDrop, r.sent)
	}
	switch {
	case c.idempotent && r.shim.LegacyBatches != 0:
		t.Errorf("%d of %d batches had no producer id: the client is not producing idempotently",
			r.shim.LegacyBatches, r.shim.Batches)
	case !c.idempotent && r.shim.LegacyBatches != r.shim.Batches:
		t.Errorf("%d of %d batches had a producer id: the client is not producing as a legacy producer",
			r.shim.Batches-r.shim.LegacyBatches, r.shim.Batches)
	}
	if r.foreign > 0 {
		t.Errorf("%d stored records carry values the client never sent", r.foreign)
	}

	// Nothing acknowledged is lost, with or without the proxy.
	if r.lost > 0 {
		t.Errorf("%d acknowledged records are not in the log", r.lost)
	}
	// A killed client acknowledges what it got to. A client that retries
	// fails no record but by its own doing (ownFailures: kafka-python
	// expires the batches queued behind a request the broker holds; their
	// records are not stored, so nothing is lost).
	own := c.ownFailures[mode]
	switch {
	case !c.retries || mode == modeAbort:
	case own == 0 && r.acked != r.sent:
		t.Errorf("%s retries a lost acknowledgement (docs/clients.md §3), yet acknowledged %d of %d records", c.name, r.acked, r.sent)
	case r.sent-r.acked > own:
		t.Errorf("%s acknowledged %d of %d records: %d failed, more than the %d its own queue may expire (docs/legacy.md, \"What is left\")",
			c.name, r.acked, r.sent, r.sent-r.acked, own)
	case r.acked != r.sent:
		t.Logf("%s expired %d records of its own queue, unsent, as straight to the broker: at most %d (docs/legacy.md, \"What is left\")", c.name, r.sent-r.acked, own)
	}
	if own > 0 && r.unackedStored > 0 {
		t.Errorf("%d records %s reported failed are in the log: the failures are not only the batches it expired unsent", r.unackedStored, c.name)
	}
	if r.waitTimeouts > 0 {
		// A retry waits for its original at most the request's own
		// timeout (plus 1 s); past it the client is told to retry.
		t.Logf("the proxy answered %v retries REQUEST_TIMED_OUT, their originals still in flight past the requests' timeouts", r.waitTimeouts)
	}

	switch mode {
	case modeControl:
		if c.idempotent && r.duplicated > 0 {
			t.Errorf("the broker wrote %d records of an idempotent producer twice", r.duplicated)
		} else if c.retries && !c.idempotent && r.duplicated == 0 {
			t.Errorf("control run without duplicates: %s retries a lost acknowledgement (docs/clients.md §3), "+
				"so the shim did not reproduce the problem this test is for", c.name)
		}
	case modeSlowControl:
		if c.idempotent && r.duplicated > 0 {
			t.Errorf("the broker wrote %d records of an idempotent producer twice", r.duplicated)
		} else if c.retries && !c.idempotent && r.duplicated == 0 {
			t.Errorf("control run without duplicates: %s gives up on a request the broker holds and sends its records again, "+
				"so the slow broker did not reproduce the problem this run is for", c.name)
		}
	default:
		// Through the proxy: nothing written twice but a documented
		// miss, within its bound.
		switch {
		case r.duplicated > miss.bound && miss.bound > 0:
			t.Errorf("through the proxy (%s), %d records were written twice, more than the %d documented (%s)", mode, r.duplicated, miss.bound, miss.why)
		case r.duplicated > miss.bound:
			t.Errorf("through the proxy (%s), %d records were written twice", mode, r.duplicated)
		case r.duplicated > 0:
			t.Logf("not caught, as documented, within its bound: %d written twice, at most %d (%s)", r.duplicated, miss.bound, miss.why)
		}
	}
	// The idempotent row exercises the proxy's own answer, not only the
	// broker's: the retry of the batch whose acknowledgement the shim
	// dropped never reaches the broker.
	if c.idempotent && mode == modeProxy {
		if n := px.metric("dedupproxy_produce_duplicates_total", "answered_by=proxy"); n < 1 {
			t.Errorf("the proxy answered %v duplicates itself, want at least the retried batch", n)
		}
	}
}

// miss is a documented miss of the proxy (docs/legacy.md, "What is left"):
// at most bound records written twice in a run, for the reason why.
type miss struct {
	bound int
	why   string
}

// knownMiss is client c's documented miss in mode, whose fault fired
// faults times; the zero miss where none is documented (nothing may be
// written twice through the proxy).
func (c legacyClient) knownMiss(mode string, faults int64) miss {
	n := int(max(faults, 1))
	switch {
	case c.resendsOnSameSocket && (mode == modeSlow || mode == modeSlowBroker):
		hold, timeout := slowHold, 5*time.Second
		if mode == modeSlowBroker {
			hold, timeout = slowBrokerHold, slowBrokerTimeout
		}
		resends := int((hold + timeout - 1) / timeout)
		return miss{n * c.recordsPerRequest * resends, fmt.Sprintf("%s resends a timed-out request on the same connection, behind the original, "+
			"which the proxy cannot tell from new data: each held request's records once for each resend before its answer, at most %d", c.name, resends)}
	case c.restampsResends && (mode == modeRestart || mode == modeDrain):
		return miss{n * c.inFlight, fmt.Sprintf("%s stamps a resend anew, and a restarted proxy matches records read back from the log only with their timestamp "+
			"(docs/legacy.md, \"After a restart\"): the records in flight at each lost answer, at most %d", c.name, c.inFlight)}
	case c.repartitionsRetries && mode == modeLeader:
		return miss{n * c.recordsPerRequest, fmt.Sprintf("after NOT_LEADER_OR_FOLLOWER from one broker of a send, %s resends records another broker "+
			"acknowledged on a connection still open, assigned to partitions anew: new records by the rule, written twice without the proxy too; "+
			"at most one send's %d records", c.name, c.recordsPerRequest)}
	}
	return miss{}
}

// summaryTable is the one-row-per-client table of a run, also written
// into the README between readmeStart and readmeEnd. Call it with
// results.mu held.
func summaryTable(clients []legacyClient, date string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| client | client version | control: duplicated / lost | through the proxy | proxy killed and restarted at the lost ack | proxy drained (SIGTERM) and restarted | broker answers REQUEST_TIMED_OUT after the append | proxy's broker connection cut after the write | leader moved at the lost ack | broker slower than the client's request timeout | client killed with its Produce in flight | slow broker, straight to it: duplicated / failed | slow broker, through the proxy: duplicated / failed | date |\n")
	fmt.Fprintf(&b, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range clients {
		fmt.Fprintf(&b, "| %s | %s", c.name, results.runs[c.name][modeControl].version)
		for _, mode := range modes {
			fmt.Fprintf(&b, " | %s", resultCell(results.runs[c.name][mode]))
		}
		fmt.Fprintf(&b, " | %s |\n", date)
	}
	return b.String()
}

// resultCell is a run's cell of the summary table: duplicated / lost (the
// slow-broker runs: duplicated / failed), and the bound of a documented
// miss (knownMiss).
func resultCell(r tally) string {
	second := lostCell(r)
	if slowBrokerMode(r.mode) {
		second = fmt.Sprint(r.failed)
	}
	cell := fmt.Sprintf("%d / %s", r.duplicated, second)
	if r.bound > 0 {
		cell += fmt.Sprintf(" (≤ %d known)", r.bound)
	}
	return cell
}

// The README's copy of the summary table lies between these lines.
const (
	readmeStart = "<!-- legacy-clients:start (written by go test ./e2e -update) -->"
	readmeEnd   = "<!-- legacy-clients:end -->"
)

// updateReadme replaces the README's copy of the summary table.
func updateReadme(table string) error {
	const path = "../README.md"
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s := string(raw)
	i, j := strings.Index(s, readmeStart), strings.Index(s, readmeEnd)
	if i < 0 || j < i {
		return fmt.Errorf("%s: no %q ... %q section", path, readmeStart, readmeEnd)
	}
	s = s[:i+len(readmeStart)] + "\n" + table + s[j:]
	return os.WriteFile(path, []byte(s), 0o644)
}

// resultsMarkdown renders results/legacy-clients.md.
func resultsMarkdown(clients []legacyClient, now time.Time) string {
	results.mu.Lock()
	defer results.mu.Unlock()
	date := now.Format("2006-01-02")
	var b strings.Builder
	fmt.Fprintf(&b, "# Legacy producers and a lost acknowledgement\n\n")
	fmt.Fprintf(&b, "Generated by `go test ./e2e -run TestLegacyLostAck -update` (or `E2E_WRITE_RESULTS=1`); do not edit by hand.\n\n")
	fmt.Fprintf(&b, "Each client writes %d records with unique values, acks=all and idempotence off (producer id -1),\n", recordsPerRun)
	fmt.Fprintf(&b, "to a 3-partition topic of an in-process kfake broker. A TCP shim in front drops the response to one\n")
	fmt.Fprintf(&b, "Produce request after the broker appended it and closes the client's connection (docs/clients.md §3,\n")
	fmt.Fprintf(&b, "\"close\"). *control*: client → shim → kfake. *through the proxy*: client → shim → dedupproxy → kfake.\n")
	fmt.Fprintf(&b, "*proxy restarted*: as through the proxy, but at the lost acknowledgement the proxy is killed (connections cut,\n")
	fmt.Fprintf(&b, "tables gone) and a new one starts on the same ports: the retry must be recognised from the log (docs/warm.md).\n")
	fmt.Fprintf(&b, "*proxy drained*: the same with a graceful stop (SIGTERM's drain) instead of a kill. The last two columns lose\n")
	fmt.Fprintf(&b, "nothing at the shim: the broker appends the same Produce request and answers it REQUEST_TIMED_OUT, or the proxy's\n")
	fmt.Fprintf(&b, "connection to the broker breaks right after writing it (the proxy must find the outcome in the log).\n")
	fmt.Fprintf(&b, "*leader moved*: through the proxy to a two-broker cluster; at the lost acknowledgement every partition's leader\n")
	fmt.Fprintf(&b, "moves to the other broker, so the retry reaches another broker through another of the proxy's node listeners.\n")
	fmt.Fprintf(&b, "kafkajs's retry there carries, beside the lost records, records the other broker acknowledged (docs/legacy.md, \"What is left\").\n")
	fmt.Fprintf(&b, "*broker slower than the client's timeout*: nothing dropped; the broker holds one Produce until the client has given up on it\n")
	fmt.Fprintf(&b, "and retried (or %s), then appends it. *client killed*: while the broker holds one Produce the client is killed and\n", slowHold)
	fmt.Fprintf(&b, "its connections cut; once the broker appended it, that request is sent again as it was on a new connection and must be\n")
	fmt.Fprintf(&b, "answered from what the proxy committed after its client left (its figures count what the client reported before dying).\n")
	fmt.Fprintf(&b, "*franz-go idempotent* is franz-go with idempotence on under the same faults, which the broker deduplicates itself.\n")
	fmt.Fprintf(&b, "After a broker error sarama puts the failed records back in its queue behind newer ones, so its retry matches no\n")
	fmt.Fprintf(&b, "earlier batch; the proxy reads those records back from the log and recognises them one by one (docs/legacy.md).\n")
	fmt.Fprintf(&b, "librdkafka (kcat, confluent-kafka-python, confluent-kafka-go) puts the records of every request it gave up on back in\n")
	fmt.Fprintf(&b, "its queue and batches them again at other boundaries; the proxy matches them record by record (docs/legacy.md).\n")
	fmt.Fprintf(&b, "*slow broker*: nothing dropped; the broker holds a Produce request %v before appending it, %d times in a run (the\n", slowBrokerHold, slowBrokerHolds)
	fmt.Fprintf(&b, "client's first fault request, then every %dth after it, one at a time), while every client gives up on a request after\n", slowBrokerEvery)
	fmt.Fprintf(&b, "%v (its own request or read timeout; sarama with 10 retries) and writes %d records: straight to the broker, and through\n", slowBrokerTimeout, slowBrokerRecords)
	fmt.Fprintf(&b, "the proxy; their second figure is the records the client reported failed.\n")
	fmt.Fprintf(&b, "Known misses, each with the bound the test asserts, shown as *(≤ N known)* (docs/legacy.md, \"What is left\"): clients\n")
	fmt.Fprintf(&b, "that stamp a resend anew (kafka-go, kafkajs, sarama) across a restart, where the proxy matches records read back from the\n")
	fmt.Fprintf(&b, "log only with their timestamp (the restart and drain columns: the records they had in flight); kafkajs resends a\n")
	fmt.Fprintf(&b, "timed-out request down the same connection, behind the original (the slow columns: each held request's records once\n")
	fmt.Fprintf(&b, "per resend); kafkajs's retry after a leader move carries records the other broker acknowledged on a connection still\n")
	fmt.Fprintf(&b, "open, which are new records by the rule (it writes them twice without the proxy too; one send's records).\n")
	fmt.Fprintf(&b, "kafka-python's request timeout bounds how long a batch waits in its own queue too: behind a request the broker holds it\n")
	fmt.Fprintf(&b, "expires the batches it has not sent, straight to the broker as through the proxy (bounded, and none of them stored).\n")
	fmt.Fprintf(&b, "The *paced* rows are the librdkafka clients fed as by a live source, %d records every %v, lingering %d ms with\n", pacedBurst, pacedEvery, pacedLinger)
	fmt.Fprintf(&b, "retries=%d, their requests carrying records of several bursts; every fault but the slow and killed ones hits the\n", pacedRetries)
	fmt.Fprintf(&b, "#%d Produce request and every %dth after it, at most %d in a run (each restart, leader move or cut once per\n", pacedDropEvery, pacedDropEvery, pacedMaxDrops)
	fmt.Fprintf(&b, "lost answer), so the retries hold parts of several lost batches, or fewer records than one.\n")
	fmt.Fprintf(&b, "The log is then read straight from kfake. *duplicated*: stored copies beyond the first of each value;\n")
	fmt.Fprintf(&b, "*lost*: values the client reported delivered that are not in the log (≥: the client reports only a count).\n\n")
	fmt.Fprintf(&b, "The figures vary from run to run: how many requests were in flight when the connection closed, and\n")
	fmt.Fprintf(&b, "librdkafka re-batching the retried records, decide how many are written again. *kafka-python retries=0*\n")
	fmt.Fprintf(&b, "is kafka-python's default: it never retries, so it duplicates nothing, but it reports as failed records\n")
	fmt.Fprintf(&b, "that the broker stored (*not acknowledged, stored* below).\n\n")
	fmt.Fprintf(&b, "The test fails if any record is duplicated through the proxy beyond a known miss's bound, any acknowledged record is\n")
	fmt.Fprintf(&b, "lost, or a client that retries fails a record beyond its own expiries.\n\n")
	b.WriteString(summaryTable(clients, date))
	fmt.Fprintf(&b, "\n## Every figure\n\n")
	fmt.Fprintf(&b, "*not acknowledged, stored*: values the client reported failed (or never reported) that are in the log anyway.\n")
	fmt.Fprintf(&b, "*Produce requests*: as counted by the shim, retries included; *fault at*: the Produce requests the fault hit\n")
	fmt.Fprintf(&b, "(counted by the shim, the broker or the proxy's broker connection), and how often it fired; *records forwarded by then*:\n")
	fmt.Fprintf(&b, "records in the Produce requests up to the first one whose response the shim dropped; *batches resent (re-split)*:\n")
	fmt.Fprintf(&b, "batches carrying records the client had sent before, and of them those whose records had gone out in two batches or more.\n\n")
	fmt.Fprintf(&b, "| client | run | sent | acknowledged | not acknowledged, stored | stored | duplicated | lost | Produce requests | fault at (fired) | records forwarded by then | batches resent (re-split) | time |\n")
	fmt.Fprintf(&b, "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range clients {
		for _, mode := range modes {
			r := results.runs[c.name][mode]
			fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %d | %d | %s | %d | %v (%d) | %d | %d (%d) | %.1f s |\n",
				c.name, mode, r.sent, r.acked, r.unackedStored, r.stored, r.duplicated, lostCell(r),
				r.shim.Produces, r.plan, r.faults, r.shim.RecordsAtDrop, r.shim.Resent, r.shim.Merged, r.elapsed.Seconds())
		}
	}
	return b.String()
}

func lostCell(r tally) string {
	if r.ackedExact {
		return fmt.Sprint(r.lost)
	}
	return fmt.Sprintf("≥%d", r.lost)
}
