package proxy

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/config"
	"github.com/dedupproxy/dedupproxy/metrics"
)

// TestLegacyRetryOnNewConnection: a legacy producer's batch is stored, its
// acknowledgement lost with the connection; the same batch on a new
// connection is answered with the original offset and not written again.
// The same records sent again where the acknowledgement went are new data,
// and each prevented duplicate gets a log line.
func TestLegacyRetryOnNewConnection(t *testing.T) {
	t.Parallel()
	const topic = "legacy"
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	pc := countProduce(c)
	p := startProxy(t, c, nil)
	b := recordBatch(t, -1, -1, -1, 3, "charge account 7")
	req := produceParts(topic, -1, part{0, b})
	first := dialRaw(t, p.addr())
	first.learnTopics(topic)
	if r := onlyPartition(t, first.roundTrip(req)); r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("original: %+v", r)
	}
	first.abort() // as if its acknowledgement had been lost: a reset
	clientsGone(t, p)
	retry := dialRaw(t, p.addr())
	if r := onlyPartition(t, retry.roundTrip(req)); r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("retry: %+v, want the original's offset 0", r)
	}
	if pc.requests.Load() != 1 {
		t.Fatalf("%d produce requests reached the broker, want 1", pc.requests.Load())
	}
	// The retry's connection has the acknowledgement now: the same records
	// sent there again are new.
	if r := onlyPartition(t, retry.roundTrip(req)); r.ErrorCode != 0 || r.BaseOffset != 3 {
		t.Fatalf("new data with the same records: %+v, want offset 3", r)
	}
	if n := testutil.ToFloat64(p.Metrics.Batches[metrics.OutLegacyDuplicate]); n != 1 {
		t.Fatalf("legacy_duplicate counted %v", n)
	}
	if !strings.Contains(p.logs.String(), `msg="answered as a retry with the original's offset" conn=2`) ||
		!strings.Contains(p.logs.String(), "topic=legacy partition=0 client_id=raw") {
		t.Fatalf("no log line for the prevented duplicate:\n%s", p.logs.String())
	}
}

// TestLegacyHeartbeatsAllLand: a producer sending identical single-record
// batches on one healthy connection, each after the previous one's
// acknowledgement or pipelined behind it, loses none.
func TestLegacyHeartbeatsAllLand(t *testing.T) {
	t.Parallel()
	const topic = "heartbeat"
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	p := startProxy(t, c, nil)
	raw := dialRaw(t, p.addr())
	raw.learnTopics(topic)
	req := produceParts(topic, -1, part{0, recordBatch(t, -1, -1, -1, 1, "alive")})
	for i := 0; i < 10; i++ {
		if r := onlyPartition(t, raw.roundTrip(req)); r.ErrorCode != 0 || r.BaseOffset != int64(i) {
			t.Fatalf("heartbeat %d: %+v", i, r)
		}
	}
	var corrs []int32
	for i := 0; i < 10; i++ {
		corrs = append(corrs, raw.send(req))
	}
	for i, corr := range corrs {
		if r := onlyPartition(t, raw.recv(req, corr)); r.ErrorCode != 0 || r.BaseOffset != int64(10+i) {
			t.Fatalf("pipelined heartbeat %d: %+v", i, r)
		}
	}
}

// TestLegacyRebatchedRetryOverSockets: a legacy batch is stored and its
// connection breaks; the client resends its records followed by newer ones
// in one batch on a new connection (librdkafka does). Only the new records
// reach the broker, the client is told the original's offset, and the log
// holds every record once.
func TestLegacyRebatchedRetryOverSockets(t *testing.T) {
	t.Parallel()
	const topic = "rebatch"
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	var brokerRecords atomic.Int64
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		for _, tp := range req.(*kmsg.ProduceRequest).Topics {
			for _, pp := range tp.Partitions {
				var rb kmsg.RecordBatch
				if rb.ReadFrom(pp.Records) == nil {
					brokerRecords.Add(int64(rb.NumRecords))
				}
			}
		}
		return nil, nil, false
	})
	p := startProxy(t, c, nil)
	first := dialRaw(t, p.addr())
	first.learnTopics(topic)
	if r := onlyPartition(t, first.roundTrip(produceParts(topic, -1, part{0, recordBatch(t, -1, -1, -1, 4, "order")}))); r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("original: %+v", r)
	}
	first.abort()
	waitFor(t, 10*time.Second, "the broken connection to be cleaned up", func() bool {
		return testutil.ToFloat64(p.Metrics.ClientConnections) == 0
	})
	retry := dialRaw(t, p.addr())
	r := onlyPartition(t, retry.roundTrip(produceParts(topic, -1, part{0, recordBatch(t, -1, -1, -1, 7, "order")})))
	if r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("re-batched retry: %+v, want the original's offset 0", r)
	}
	if n := brokerRecords.Load(); n != 7 {
		t.Fatalf("the broker received %d records, want 4 + 3 new", n)
	}
	if r := onlyPartition(t, retry.roundTrip(produceParts(topic, -1, part{0, recordBatch(t, -1, -1, -1, 1, "next")}))); r.BaseOffset != 7 {
		t.Fatalf("next batch at %d, want 7: the log holds each record once", r.BaseOffset)
	}
	if n := testutil.ToFloat64(p.Metrics.Batches[metrics.OutLegacyRebatched]); n != 1 {
		t.Fatalf("legacy_rebatched %v", n)
	}
}

// TestIdempotencyKeysTwoInstances: two instances of a legacy producer (an
// application restarted, an outbox relay republishing) send the same
// logical operations, named by an idempotency-key header. On a topic with
// keys on, each key lands once; on a topic without, both copies land.
func TestIdempotencyKeysTwoInstances(t *testing.T) {
	t.Parallel()
	const keyed, plain, n = "keyed", "plain", 50
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(2, keyed, plain))
	p := startProxy(t, c, func(cfg *Config) {
		cfg.Dedup.Topics = map[string]TopicDedupConfig{keyed: {IdempotencyKey: &IdempotencyKeyConfig{}}}
	})
	for instance := 0; instance < 2; instance++ {
		cl, err := kgo.NewClient(kgo.SeedBrokers(p.addr()), kgo.DisableIdempotentWrite(),
			kgo.ProducerBatchCompression(kgo.NoCompression()), kgo.RequiredAcks(kgo.AllISRAcks()))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		for i := 0; i < n; i++ {
			for _, topic := range []string{keyed, plain} {
				r := &kgo.Record{Topic: topic, Value: []byte(fmt.Sprintf("instance %d op %d", instance, i)),
					Headers: []kgo.RecordHeader{{Key: config.DefaultKeyHeader, Value: []byte(fmt.Sprintf("op-%d", i))}}}
				if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
					t.Fatalf("instance %d op %d: %v", instance, i, err)
				}
			}
		}
		cancel()
		cl.Close()
	}
	// The log's end offsets tell how many records each topic holds.
	raw := dialRaw(t, c.ListenAddrs()[0])
	stored := func(topic string) int64 {
		req := kmsg.NewPtrListOffsetsRequest()
		req.SetVersion(4)
		rt := kmsg.NewListOffsetsRequestTopic()
		rt.Topic = topic
		for part := int32(0); part < 2; part++ {
			rp := kmsg.NewListOffsetsRequestTopicPartition()
			rp.Partition, rp.Timestamp = part, -1
			rt.Partitions = append(rt.Partitions, rp)
		}
		req.Topics = append(req.Topics, rt)
		var sum int64
		for _, pp := range raw.roundTrip(req).(*kmsg.ListOffsetsResponse).Topics[0].Partitions {
			sum += pp.Offset
		}
		return sum
	}
	if got := stored(keyed); got != n {
		t.Fatalf("keyed topic holds %d records, want %d (each key once)", got, n)
	}
	if got := stored(plain); got != 2*n {
		t.Fatalf("plain topic holds %d records, want %d (both instances)", got, 2*n)
	}
	if d := testutil.ToFloat64(p.Metrics.KeysDropped); d != n {
		t.Fatalf("key duplicates dropped: %v, want %d", d, n)
	}
}

// TestLegacySlowBroker: the broker takes longer to append a legacy batch
// than the client waits; the client (franz-go, idempotence off) times the
// request out, drops the connection and retries on a new one while the
// original is still being appended. The retry waits for the original's
// outcome instead of being written again.
func TestLegacySlowBroker(t *testing.T) {
	t.Parallel()
	const topic = "slow"
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	entered, release, reached := holdFirstProduce(c)
	p := startProxy(t, c, nil)
	cl, err := kgo.NewClient(kgo.SeedBrokers(p.addr()), kgo.DisableIdempotentWrite(),
		kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ProducerBatchCompression(kgo.NoCompression()),
		kgo.ProduceRequestTimeout(300*time.Millisecond), kgo.RequestTimeoutOverhead(200*time.Millisecond),
		kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond }), kgo.MetadataMinAge(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		done <- cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("charge account 7 $42")}).FirstErr()
	}()
	<-entered
	// The client gives up on the held request and retries on a new
	// connection; the proxy parks the retry on the original.
	waitFor(t, 10*time.Second, "the client's retry to wait on the original", func() bool {
		return p.waitingRequests() >= 1
	})
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("produce: %v", err)
	}
	if end := logEnd(t, c.ListenAddrs()[0], topic); end != 1 {
		t.Fatalf("the log holds %d records, want 1 (%d produce requests reached the broker)", end, reached.Load())
	}
}

// heldLegacy is a proxy in front of a one-partition cluster that holds the
// first Produce: the legacy batch a, b, c, sent on connection first and
// held by the broker until release is closed. t0 is its records' time.
type heldLegacy struct {
	c        *kfake.Cluster
	p        *testProxy
	topic    string
	t0       int64
	original []byte
	first    *rawConn
	release  chan struct{}
}

func startHeldLegacy(t *testing.T, topic string) *heldLegacy {
	t.Helper()
	h := &heldLegacy{topic: topic, t0: time.Now().UnixMilli()}
	h.c = newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	entered, release, _ := holdFirstProduce(h.c)
	h.release = release
	h.p = startProxy(t, h.c, nil)
	h.original = stampedLegacyBatch(t, []string{"a", "b", "c"}, []int64{h.t0, h.t0, h.t0})
	h.first = h.dial(t)
	h.first.send(produceParts(topic, -1, part{0, h.original}))
	<-entered
	return h
}

// dial opens another connection of the same client (address and client id).
func (h *heldLegacy) dial(t *testing.T) *rawConn {
	t.Helper()
	conn := dialRaw(t, h.p.addr())
	conn.learnTopics(h.topic)
	return conn
}

// logHolds fails t unless the partition holds want records.
func (h *heldLegacy) logHolds(t *testing.T, want int64, what string) {
	t.Helper()
	if end := logEnd(t, h.c.ListenAddrs()[0], h.topic); end != want {
		t.Fatalf("the log holds %d records, want %d (%s)", end, want, what)
	}
}

// TestLegacyResplitAfterClientLeft: a client gives up on a Produce the
// broker is still holding, closes its connection and sends the records
// again on a new one, cut at another boundary with a newer record behind
// them (librdkafka after a request timeout). The new request waits for the
// original's outcome, and the records already appended are not written
// twice; the answer's offset is the one true for the whole batch.
func TestLegacyResplitAfterClientLeft(t *testing.T) {
	t.Parallel()
	h := startHeldLegacy(t, "resplit")
	h.first.conn.Close() // the client timed the request out

	second := h.dial(t)
	req := produceParts(h.topic, -1, part{0, stampedLegacyBatch(t, []string{"b", "c", "d"}, []int64{h.t0, h.t0, h.t0 + 1})})
	corr := second.send(req)
	waitFor(t, 10*time.Second, "the resent records to wait for the original", func() bool {
		return h.p.waitingRequests() >= 1
	})
	close(h.release)
	if r := onlyPartition(t, second.recv(req, corr)); r.ErrorCode != 0 || r.BaseOffset != 1 {
		t.Fatalf("resent records with a new one: %+v, want error 0, offset 1 (b, c at 1, 2, d written at 3)", r)
	}
	if n := testutil.ToFloat64(h.p.Metrics.RetryRecords[0]); n != 2 {
		t.Fatalf("legacy_retry_records_total{action=dropped} %v, want 2", n)
	}
	h.logHolds(t, 4, "a, b, c, d once each")
}

// TestLegacyRetryBeforeCloseSettles: the client's retry of a held batch
// reaches the proxy before the proxy has seen the client's old connection
// close (librdkafka reconnects fast; the close can be noticed later). The
// retry alone shows the old connection's client gave up: it waits for the
// original, and a resend cut at another boundary, pipelined behind it
// before its answer, is not written twice.
func TestLegacyRetryBeforeCloseSettles(t *testing.T) {
	t.Parallel()
	h := startHeldLegacy(t, "retrybeforeclose")
	second := h.dial(t)
	retry := produceParts(h.topic, -1, part{0, h.original})
	retryCorr := second.send(retry)
	waitFor(t, 10*time.Second, "the retry to wait", func() bool { return h.p.waitingRequests() >= 1 })
	h.first.conn.Close() // noticed by now or not: the partition already waits
	resend := produceParts(h.topic, -1, part{0, stampedLegacyBatch(t, []string{"b", "c", "d"}, []int64{h.t0, h.t0, h.t0 + 1})})
	resendCorr := second.send(resend)
	close(h.release)
	if r := onlyPartition(t, second.recv(retry, retryCorr)); r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("retry of the held batch: %+v, want error 0 at offset 0", r)
	}
	if r := onlyPartition(t, second.recv(resend, resendCorr)); r.ErrorCode != 0 || r.BaseOffset != 1 {
		t.Fatalf("resent records with a new one: %+v, want error 0, offset 1", r)
	}
	h.logHolds(t, 4, "a, b, c, d once each")
}

// TestLegacyResendBeforeCloseSettles: librdkafka times a request out,
// reconnects and resends before the proxy has read its old connection's
// close, and its first resent batch already holds more than the original
// (a, b, c, then d). Records in flight on another connection of the same
// client to the same partition are its retry: the request waits for the
// original, and only d is written.
func TestLegacyResendBeforeCloseSettles(t *testing.T) {
	t.Parallel()
	h := startHeldLegacy(t, "resendbeforeclose")
	second := h.dial(t) // the same client: same address, same client id
	resend := produceParts(h.topic, -1, part{0, stampedLegacyBatch(t, []string{"a", "b", "c", "d"}, []int64{h.t0, h.t0, h.t0, h.t0 + 1})})
	corr := second.send(resend)
	waitFor(t, 10*time.Second, "the resend to wait for the original", func() bool { return h.p.waitingRequests() >= 1 })
	close(h.release)
	if r := onlyPartition(t, second.recv(resend, corr)); r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("resent records with a new one: %+v, want error 0, offset 0 (a, b, c at 0-2, d written at 3)", r)
	}
	h.logHolds(t, 4, "a, b, c, d once each")
}

// TestLegacyUnreadAnswers: answers the proxy wrote to a connection that
// then broke may never have been read, and the client resends what it
// holds no answer for: B whole, and C and D cut at other boundaries with a
// new record behind them. None is written twice. The retry and the re-cut
// batch come in separate requests or in one, to the same proxy or to a new
// one (a restart: it knows only the log, whose records it matches by
// content and timestamp for this ANONYMOUS client).
func TestLegacyUnreadAnswers(t *testing.T) {
	for _, tc := range []struct{ together, restart bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		t.Run(fmt.Sprintf("together=%v,restart=%v", tc.together, tc.restart), func(t *testing.T) {
			t.Parallel()
			const topic = "unread"
			c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(2, topic))
			p := startProxy(t, c, nil)
			t0 := time.Now().UnixMilli()
			batch := func(values ...string) []byte {
				ts := make([]int64, len(values))
				for i := range ts {
					ts[i] = t0
				}
				return stampedLegacyBatch(t, values, ts)
			}
			first := dialRaw(t, p.addr())
			first.learnTopics(topic)
			// The answers are read here, which the proxy cannot see: the
			// connection is reset (as by a middlebox that loses them), so
			// to the proxy they were written and may have been lost.
			for _, b := range []part{{0, batch("a1", "a2")}, {1, batch("b1", "b2")}, {0, batch("c1", "c2")}, {0, batch("d1", "d2")}} {
				if r := onlyPartition(t, first.roundTrip(produceParts(topic, -1, b))); r.ErrorCode != 0 {
					t.Fatalf("original batch to partition %d: %+v", b.partition, r)
				}
			}
			first.abort()
			if tc.restart {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := p.Shutdown(ctx); err != nil {
					t.Fatal(err)
				}
				p = startProxy(t, c, nil)
			} else {
				clientsGone(t, p)
			}

			second := dialRaw(t, p.addr())
			second.learnTopics(topic)
			retry, recut := part{1, batch("b1", "b2")}, part{0, batch("c1", "c2", "d1", "d2", "e1")}
			var answers []kmsg.ProduceResponseTopicPartition
			if tc.together {
				resp := second.roundTrip(produceParts(topic, -1, retry, recut)).(*kmsg.ProduceResponse)
				if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 2 {
					t.Fatalf("answer to the retry and the re-cut batch: %+v", resp)
				}
				answers = resp.Topics[0].Partitions
			} else {
				answers = append(answers, onlyPartition(t, second.roundTrip(produceParts(topic, -1, retry))))
				answers = append(answers, onlyPartition(t, second.roundTrip(produceParts(topic, -1, recut))))
			}
			for _, r := range answers {
				want := int64(0) // B's own offset
				if r.Partition == 0 {
					want = 2 // c1, c2, d1, d2 at 2-5, e1 written at 6
				}
				if r.ErrorCode != 0 || r.BaseOffset != want {
					t.Errorf("partition %d answered %+v, want error 0 at offset %d", r.Partition, r, want)
				}
			}
			if end := partitionEnd(t, c.ListenAddrs()[0], topic, 0); end != 7 {
				t.Errorf("partition 0 holds %d records, want 7 (a, c, d and e once each)", end)
			}
			if end := partitionEnd(t, c.ListenAddrs()[0], topic, 1); end != 2 {
				t.Errorf("partition 1 holds %d records, want 2 (b once)", end)
			}
		})
	}
}

// stampedLegacyBatch builds a legacy batch of values, record i stamped at
// ts[i] (ms).
func stampedLegacyBatch(t testing.TB, values []string, ts []int64) []byte {
	t.Helper()
	var recs []byte
	for i, v := range values {
		rec := []byte{0}
		rec = binary.AppendVarint(rec, ts[i]-ts[0])
		rec = binary.AppendVarint(rec, int64(i))
		rec = binary.AppendVarint(rec, -1)
		rec = binary.AppendVarint(rec, int64(len(v)))
		rec = append(rec, v...)
		rec = binary.AppendVarint(rec, 0)
		recs = append(binary.AppendVarint(recs, int64(len(rec))), rec...)
	}
	b := kmsg.RecordBatch{Magic: 2, ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1, NumRecords: int32(len(values)),
		LastOffsetDelta: int32(len(values) - 1), FirstTimestamp: ts[0], MaxTimestamp: ts[len(ts)-1], Records: recs}
	return fixBatchLengthAndCRC(b.AppendTo(nil))
}

// clientsGone waits until the proxy has seen every client connection
// close.
func clientsGone(t *testing.T, p *testProxy) {
	t.Helper()
	waitFor(t, 10*time.Second, "the proxy to see its clients leave", func() bool {
		return testutil.ToFloat64(p.Metrics.ClientConnections) == 0
	})
}

// TestShadowModePerTopic: one topic in observe mode, one in enforce, both
// listed with metrics: true, a third unlisted. A legacy retry to each: the
// observe topic writes it and logs what enforce would have done ("would
// ..."), the enforce topic answers it; the listed topics' counters say so
// by topic, the unlisted one gets no series. A SIGHUP-style SetDedup that
// unlists a topic deletes its series and moves the observe topic to
// enforce: its next retry is answered.
func TestShadowModePerTopic(t *testing.T) {
	t.Parallel()
	const shadow, enforced, unlisted = "shadow", "enforced", "unlisted"
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, shadow, enforced, unlisted))
	topics := map[string]TopicDedupConfig{shadow: {Mode: config.DedupObserve, Metrics: true}, enforced: {Metrics: true}}
	p := startProxy(t, c, func(cfg *Config) { cfg.Dedup.Topics = topics })
	retry := func(topic, value string) (orig, again kmsg.ProduceResponseTopicPartition) {
		t.Helper()
		req := produceParts(topic, -1, part{0, recordBatch(t, -1, -1, -1, 2, value)})
		first := dialRaw(t, p.addr())
		first.learnTopics(topic)
		orig = onlyPartition(t, first.roundTrip(req))
		first.abort() // its acknowledgement lost
		clientsGone(t, p)
		second := dialRaw(t, p.addr())
		second.learnTopics(topic)
		again = onlyPartition(t, second.roundTrip(req))
		second.conn.Close()
		return orig, again
	}
	topicMetric := func(name, topic, label, value string) float64 {
		mfs, err := p.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				var gotTopic, gotLabel string
				for _, lp := range m.GetLabel() {
					switch lp.GetName() {
					case "topic":
						gotTopic = lp.GetValue()
					case label:
						gotLabel = lp.GetValue()
					}
				}
				if gotTopic == topic && gotLabel == value {
					return m.GetCounter().GetValue()
				}
			}
		}
		return -1 // no such series
	}
	if o, a := retry(shadow, "shadow charge"); o.ErrorCode != 0 || a.ErrorCode != 0 || a.BaseOffset != 2 {
		t.Fatalf("observe topic: original %+v, retry %+v: want the retry written at offset 2", o, a)
	}
	if o, a := retry(enforced, "enforced charge"); o.ErrorCode != 0 || a.ErrorCode != 0 || a.BaseOffset != 0 {
		t.Fatalf("enforce topic: original %+v, retry %+v: want the retry answered with offset 0", o, a)
	}
	retry(unlisted, "unlisted charge")
	logs := p.logs.String()
	if !strings.Contains(logs, `msg="would answer as a retry (observe mode: written)"`) ||
		!strings.Contains(logs, "topic=shadow partition=0 client_id=raw principal=User:ANONYMOUS rule=retry records=2 dropped=2 original_offset=0") {
		t.Errorf("no 'would' line with topic, client id, principal, rule, records and original for the observe topic:\n%s", logs)
	}
	if !strings.Contains(logs, "client=127.0.0.1:") {
		t.Errorf("the lines do not name the client address:\n%s", logs)
	}
	for _, tc := range []struct {
		name, topic, label, value string
		want                      float64
	}{
		{"dedupproxy_topic_batches_total", shadow, "outcome", "legacy_duplicate", 1},
		{"dedupproxy_topic_batches_total", shadow, "outcome", "legacy_accepted", 1},
		{"dedupproxy_topic_legacy_retry_records_total", shadow, "action", "observed", 2},
		{"dedupproxy_topic_legacy_retry_records_total", shadow, "action", "dropped", 0},
		{"dedupproxy_topic_batches_total", enforced, "outcome", "legacy_duplicate", 1},
		{"dedupproxy_topic_legacy_retry_records_total", enforced, "action", "dropped", 2},
		{"dedupproxy_topic_batches_total", unlisted, "outcome", "legacy_duplicate", -1},
	} {
		if got := topicMetric(tc.name, tc.topic, tc.label, tc.value); got != tc.want {
			t.Errorf("%s{topic=%q,%s=%q} = %v, want %v (-1: no series)", tc.name, tc.topic, tc.label, tc.value, got, tc.want)
		}
	}
	next := p.Config.Dedup
	next.Topics = map[string]TopicDedupConfig{shadow: {Mode: config.DedupEnforce, Metrics: true}}
	applied, err := p.SetDedup(next)
	if err != nil || !slices.Contains(applied, "dedup.topics") {
		t.Fatalf("SetDedup: %v, applied %v", err, applied)
	}
	if got := topicMetric("dedupproxy_topic_batches_total", enforced, "outcome", "legacy_duplicate"); got != -1 {
		t.Errorf("the unlisted topic's series stayed: %v", got)
	}
	if _, a := retry(shadow, "shadow charge 2"); a.ErrorCode != 0 || a.BaseOffset != 4 {
		t.Fatalf("the topic moved to enforce: retry %+v, want answered with the original's offset 4", a)
	}
	if got := topicMetric("dedupproxy_topic_legacy_retry_records_total", shadow, "action", "dropped"); got != 2 {
		t.Errorf("after enforce, dropped records on the topic: %v, want 2", got)
	}
}

// TestWaitingRequestOfClosedConnectionNotForwarded: a legacy batch waits
// for its partition's first tail read (held by the broker), and its client
// closes the connection meanwhile (it timed the request out and resends
// elsewhere). Once the read comes, the batch would go upstream as new
// data; its client is gone, so it is not written (its resend is the copy
// that counts).
func TestWaitingRequestOfClosedConnectionNotForwarded(t *testing.T) {
	t.Parallel()
	const topic = "closed-behind"
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	pc := countProduce(c)
	p := startProxy(t, c, nil)
	raw := dialRaw(t, p.addr())
	raw.learnTopics(topic)
	var armed, fired atomic.Bool
	held, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	defer free()
	c.ControlKey(int16(kmsg.Metadata), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if armed.Load() && fired.CompareAndSwap(false, true) {
			close(held)
			c.SleepControl(func() { <-release }) // the broker's slowness under test
		}
		return nil, nil, false
	})
	armed.Store(true)
	raw.send(produceParts(topic, -1, part{0, recordBatch(t, -1, -1, -1, 2, "charge 9")}))
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the proxy asked no Metadata for the partition's tail within 10 s")
	}
	raw.conn.Close()
	free()
	clientsGone(t, p)
	if n := pc.requests.Load(); n != 0 {
		t.Fatalf("%d produce requests reached the broker from a connection its client had closed, want 0", n)
	}
	// The resend on the client's next connection is the copy that counts:
	// nothing of the abandoned request may hold it (it used to wait for
	// an outcome that never came and was answered REQUEST_TIMED_OUT).
	next := dialRaw(t, p.addr())
	next.learnTopics(topic)
	if r := onlyPartition(t, next.roundTrip(produceParts(topic, -1, part{0, recordBatch(t, -1, -1, -1, 2, "charge 9")}))); r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("the resend on the next connection: error %d, base offset %d; want 0, 0 (written)", r.ErrorCode, r.BaseOffset)
	}
	if n := pc.requests.Load(); n != 1 {
		t.Fatalf("%d produce requests reached the broker, want 1 (the resend)", n)
	}
}

// TestCopyAfterReadAnswerIsNew holds the writer of a connection just after
// it wrote an answer, while the same client instance, having read that
// answer, sends the same record on its other connection: its client holds
// the acknowledgement, so the copy is new data (docs/legacy.md, "The rule")
// and is written. The core hears of an answer before it is written; told
// after, the copy was taken for a retry. Not parallel: the hook is global.
func TestCopyAfterReadAnswerIsNew(t *testing.T) {
	const topic = "read-then-copy"
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	p := startProxy(t, c, nil)
	a, b := dialRaw(t, p.addr()), dialRaw(t, p.addr())
	a.learnTopics(topic)
	b.learnTopics(topic)
	written, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	defer free()
	var fired atomic.Bool
	hook := func(at string) {
		if at == "written" && fired.CompareAndSwap(false, true) {
			close(written)
			<-release
		}
	}
	testHookFn.Store(&hook)
	defer testHookFn.Store(nil)
	req := produceParts(topic, -1, part{0, recordBatch(t, -1, -1, -1, 1, "cfg reload")})
	corr := a.send(req)
	select {
	case <-written:
	case <-time.After(10 * time.Second):
		t.Fatal("the first answer was never written")
	}
	if r := onlyPartition(t, a.recv(req, corr)); r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("the first send: error %d, base offset %d; want 0, 0", r.ErrorCode, r.BaseOffset)
	}
	if r := onlyPartition(t, b.roundTrip(req)); r.ErrorCode != 0 || r.BaseOffset != 1 {
		t.Fatalf("the copy sent after reading the first answer: error %d, base offset %d; want 0, 1 (written: new data)", r.ErrorCode, r.BaseOffset)
	}
	free()
	if n := logEnd(t, c.ListenAddrs()[0], topic); n != 2 {
		t.Fatalf("the log holds %d records, want 2", n)
	}
}
