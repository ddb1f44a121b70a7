package proxy

import (
	"encoding/binary"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// Unit tests of the planner's legacy rules (docs/legacy.md), no sockets.

func legacyBatch(t *testing.T, n int, value string) []byte {
	return recordBatch(t, -1, -1, -1, n, value)
}

// TestPlanLegacyRetryFromAnotherConnection: a legacy batch appended with
// acks=all is answered with its original offset when the same records come
// again on another connection (the acknowledgement was lost with the first
// one); on the same connection they are new data (a heartbeat).
func TestPlanLegacyRetryFromAnotherConnection(t *testing.T) {
	h := newPlanHarness(t, DedupEnforce)
	b := legacyBatch(t, 3, "charge")
	pl := h.plan(produce(7, -1, 1000, b), true)
	if d := pl.decisions[0]; !d.legacy || d.lresult.Decision != seqstate.LegacyNew || d.act != actForward || !d.pending {
		t.Fatalf("first: %+v", d)
	}
	h.complete(pl, map[int32]brokerResult{0: {offset: 30}})
	h.conn = 2 // the client reconnected
	pl = h.plan(produce(7, -1, 1000, b), true)
	if r := h.answer(pl, nil)[0]; pl.decisions[0].act != actAnswer || r.ErrorCode != 0 || r.BaseOffset != 30 {
		t.Fatalf("retry on a new connection: act %v %+v", pl.decisions[0].act, r)
	}
	pl = h.plan(produce(7, -1, 1000, b), true)
	if d := pl.decisions[0]; d.act != actForward || d.lresult.Decision != seqstate.LegacyNew {
		t.Fatalf("the same records again where the acknowledgement went: %v", d.lresult.Decision)
	}
	if n := testutil.ToFloat64(h.pn.metrics.legacy[seqstate.LegacyDuplicate]); n != 1 {
		t.Fatalf("legacy_duplicate counted %v", n)
	}
}

// TestPlanLegacyInFlightWaits: a retry on another connection while the
// original is in flight waits for its outcome and is never forwarded.
func TestPlanLegacyInFlightWaits(t *testing.T) {
	h := newPlanHarness(t, DedupEnforce)
	b := legacyBatch(t, 2, "x")
	orig := h.plan(produce(7, -1, 1000, b), true)
	h.conn = 2
	retry := h.plan(produce(7, -1, 1000, b), true)
	if d := retry.decisions[0]; d.act != actWait || retry.nWaits != 1 {
		t.Fatalf("retry while in flight: act %v waits %d", d.act, retry.nWaits)
	}
	h.complete(orig, map[int32]brokerResult{0: {offset: 8}})
	if r := h.answer(retry, nil)[0]; r.ErrorCode != 0 || r.BaseOffset != 8 {
		t.Fatalf("waiting retry answered %+v", r)
	}
}

// TestPlanLegacyUnknownOutcomeForwarded: when the original's upstream
// connection fails its fate is unknown; waiters get the retriable
// REQUEST_TIMED_OUT and the next copy is forwarded (never lost; a duplicate
// only if the broker had appended it, which the log will resolve).
func TestPlanLegacyUnknownOutcomeForwarded(t *testing.T) {
	h := newPlanHarness(t, DedupEnforce)
	b := legacyBatch(t, 2, "x")
	orig := h.plan(produce(7, -1, 1000, b), true)
	h.conn = 2
	retry := h.plan(produce(7, -1, 1000, b), true)
	h.pn.fail(orig)
	if r := h.answer(retry, nil)[0]; r.ErrorCode != kerr.RequestTimedOut.Code {
		t.Fatalf("waiter of a lost original: %+v", r)
	}
	h.conn = 3
	again := h.plan(produce(7, -1, 1000, b), true)
	if d := again.decisions[0]; d.act != actForward || d.lresult.Decision != seqstate.LegacyNew {
		t.Fatalf("after an unknown outcome: %v", d.lresult.Decision)
	}
}

// TestPlanLegacyTimedOutAppend: REQUEST_TIMED_OUT means the broker appended
// it; the retry is answered success with offset -1 rather than written
// twice.
func TestPlanLegacyTimedOutAppend(t *testing.T) {
	h := newPlanHarness(t, DedupEnforce)
	b := legacyBatch(t, 2, "x")
	pl := h.plan(produce(7, -1, 1000, b), true)
	h.complete(pl, map[int32]brokerResult{0: {err: kerr.RequestTimedOut.Code}})
	h.conn = 2
	pl = h.plan(produce(7, -1, 1000, b), true)
	if r := h.answer(pl, nil)[0]; r.ErrorCode != 0 || r.BaseOffset != -1 {
		t.Fatalf("retry of a timed-out append: %+v", r)
	}
}

// TestPlanLegacyAcksOneAndErrorsNotRemembered: an acks=1 append, or a
// rejected batch, is not remembered: the same records from another
// connection are forwarded.
func TestPlanLegacyAcksOneAndErrorsNotRemembered(t *testing.T) {
	for _, tc := range []struct {
		name string
		acks int16
		res  brokerResult
	}{
		{"acks=1", 1, brokerResult{offset: 4}},
		{"rejected", -1, brokerResult{err: kerr.NotLeaderForPartition.Code}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newPlanHarness(t, DedupEnforce)
			b := legacyBatch(t, 2, "x")
			pl := h.plan(produce(7, tc.acks, 1000, b), true)
			h.complete(pl, map[int32]brokerResult{0: tc.res})
			h.conn = 2
			pl = h.plan(produce(7, -1, 1000, b), true)
			if d := pl.decisions[0]; d.act != actForward {
				t.Fatalf("same records from another connection: %v", d.lresult.Decision)
			}
		})
	}
}

// TestPlanLegacyMatchModes: exact needs the same header timestamps;
// restamped retries (kafka-go, kafkajs) match in records mode; off passes
// through, per topic.
func TestPlanLegacyMatchModes(t *testing.T) {
	restamp := func(b []byte, ts int64) []byte {
		c := append([]byte(nil), b...)
		for i := 0; i < 8; i++ {
			c[27+i] = byte(ts >> (56 - 8*i)) // FirstTimestamp
			c[35+i] = byte(ts >> (56 - 8*i)) // MaxTimestamp
		}
		return fixBatchLengthAndCRC(c)
	}
	for _, tc := range []struct {
		match    string
		perTopic bool
		want     action
	}{
		{MatchRecords, false, actAnswer},
		{MatchExact, false, actForward},
		{MatchExact, true, actForward},
	} {
		h := newPlanHarness(t, DedupEnforce)
		if tc.perTopic {
			h.pn.settings.Load().topicMatch[planTopic] = tc.match
		} else {
			h.pn.settings.Load().legacyMatch = tc.match
		}
		b := legacyBatch(t, 2, "x")
		pl := h.plan(produce(7, -1, 1000, b), true)
		h.complete(pl, map[int32]brokerResult{0: {offset: 1}})
		h.conn = 2
		pl = h.plan(produce(7, -1, 1000, restamp(b, 1800000000000)), true)
		if d := pl.decisions[0]; d.act != tc.want {
			t.Fatalf("match %s (per topic %v): restamped retry act %v, want %v", tc.match, tc.perTopic, d.act, tc.want)
		}
	}
	h := newPlanHarness(t, DedupEnforce)
	h.pn.settings.Load().topicMatch[planTopic] = MatchOff
	if pl := h.plan(produce(7, -1, 1000, legacyBatch(t, 1, "x")), true); pl != nil {
		t.Fatal("legacy batch planned on a topic with legacy_match off")
	}
}

// TestPlanLegacyRebatchedRetry: librdkafka resends a lost batch's records
// followed by newer ones in one bigger batch. Once the original's
// connection closed, the prefix is recognised: only the new records go
// upstream, rebuilt, and the answer's base offset is the prefix's when the
// new records follow it directly, -1 otherwise.
func TestPlanLegacyRebatchedRetry(t *testing.T) {
	for _, tc := range []struct {
		name     string
		upOffset int64
		want     int64
	}{
		{"contiguous", 13, 10},
		{"other writes in between", 20, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newPlanHarness(t, DedupEnforce)
			lost := legacyBatch(t, 3, "a")
			pl := h.plan(produce(7, -1, 1000, lost), true)
			d := pl.decisions[0]
			h.complete(pl, map[int32]brokerResult{0: {offset: 10}})
			h.pn.orphanBatches(1, []legacyRef{{id: d.ident, topic: d.key.Topic, partition: 0, count: d.batch.Count, size: d.size, first: d.first}}, h.now)
			h.conn = 2
			superset := legacyBatch(t, 5, "a")
			pl = h.plan(produce(7, -1, 1000, superset), true)
			if d := pl.decisions[0]; d.act != actRebatch || !pl.anyUp || !pl.anyLocal {
				t.Fatalf("superset: act %v", d.act)
			}
			var bh protocol.BatchHeader
			rebuilt := pl.rebuilt[pl.decisions[0].rebuiltAt:pl.decisions[0].rebuiltEnd]
			if _, err := protocol.ReadBatch(rebuilt, &bh); err != nil || bh.NumRecords != 2 || protocol.BatchValid(rebuilt, &bh) != 0 {
				t.Fatalf("rebuilt batch: %v %+v", err, bh)
			}
			up := h.complete(pl, map[int32]brokerResult{0: {offset: tc.upOffset}})
			if r := h.answer(pl, up)[0]; r.ErrorCode != 0 || r.BaseOffset != tc.want {
				t.Fatalf("answer %+v, want offset %d", r, tc.want)
			}
			if n := testutil.ToFloat64(h.pn.metrics.legacyRebatched); n != 1 {
				t.Fatalf("legacy_rebatched %v", n)
			}
			// The superset itself is now remembered: its own retry is a
			// duplicate.
			h.conn = 3
			pl = h.plan(produce(7, -1, 1000, superset), true)
			if d := pl.decisions[0]; d.act != actAnswer || d.local.BaseOffset != tc.want {
				t.Fatalf("retry of the superset: act %v %+v", d.act, d.local)
			}
		})
	}
	// While the original's connection is open, a longer batch starting with
	// the same records is new data.
	h := newPlanHarness(t, DedupEnforce)
	pl := h.plan(produce(7, -1, 1000, legacyBatch(t, 3, "a")), true)
	h.complete(pl, map[int32]brokerResult{0: {offset: 10}})
	h.conn = 2
	if pl = h.plan(produce(7, -1, 1000, legacyBatch(t, 5, "a")), true); pl.decisions[0].act != actForward {
		t.Fatalf("superset while the original's connection is open: act %v", pl.decisions[0].act)
	}
}

// keyedLegacyBatch is a legacy batch whose record i has header
// idempotency-key = keys[i] and value values[i].
func keyedLegacyBatch(t *testing.T, keys, values []string) []byte {
	t.Helper()
	var recs []byte
	for i, k := range keys {
		rec := []byte{0}
		rec = binary.AppendVarint(rec, 0)
		rec = binary.AppendVarint(rec, int64(i))
		rec = binary.AppendVarint(rec, -1)
		rec = binary.AppendVarint(rec, int64(len(values[i])))
		rec = append(rec, values[i]...)
		rec = binary.AppendVarint(rec, 1)
		rec = binary.AppendVarint(rec, int64(len(DefaultKeyHeader)))
		rec = append(rec, DefaultKeyHeader...)
		rec = binary.AppendVarint(rec, int64(len(k)))
		rec = append(rec, k...)
		recs = append(binary.AppendVarint(recs, int64(len(rec))), rec...)
	}
	b := kmsg.RecordBatch{Magic: 2, ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1, NumRecords: int32(len(keys)),
		LastOffsetDelta: int32(len(keys) - 1), FirstTimestamp: 1700000000000, MaxTimestamp: 1700000000000, Records: recs}
	return fixBatchLengthAndCRC(b.AppendTo(nil))
}

// TestPlanIdempotencyKeys: on a topic with idempotency keys, a legacy
// record whose key was written within the TTL is dropped, whatever the
// connection; a batch of only known keys is answered with the first
// record's original offset; in an idempotent batch repeated keys are only
// counted.
func TestPlanIdempotencyKeys(t *testing.T) {
	h := newPlanHarness(t, DedupEnforce)
	keys, err := seqstate.NewKeyTable(seqstate.KeyConfig{MaxKeys: 1024})
	if err != nil {
		t.Fatal(err)
	}
	h.pn.keys = keys
	h.pn.settings.Load().keyHeader[planTopic] = DefaultKeyHeader
	pl := h.plan(produce(7, -1, 1000, keyedLegacyBatch(t, []string{"e1", "e2"}, []string{"pay 1", "pay 2"})), true)
	h.complete(pl, map[int32]brokerResult{0: {offset: 5}})

	// Another producer instance (a restart, an outbox relay) sends e2 again
	// with e3: only e3 goes upstream.
	h.conn = 2
	pl = h.plan(produce(7, -1, 1000, keyedLegacyBatch(t, []string{"e2", "e3"}, []string{"pay 2 again", "pay 3"})), true)
	d := pl.decisions[0]
	if d.act != actRebatch || !d.keyDrop {
		t.Fatalf("partly known keys: act %v", d.act)
	}
	var bh protocol.BatchHeader
	if _, err := protocol.ReadBatch(pl.rebuilt[d.rebuiltAt:d.rebuiltEnd], &bh); err != nil || bh.NumRecords != 1 {
		t.Fatalf("rebuilt: %v %+v", err, bh)
	}
	up := h.complete(pl, map[int32]brokerResult{0: {offset: 7}})
	if r := h.answer(pl, up)[0]; r.ErrorCode != 0 || r.BaseOffset != -1 {
		t.Fatalf("partly known keys answered %+v", r)
	}
	// Every key known: answered with the first record's original offset
	// (e3 was written at 7), nothing forwarded.
	pl = h.plan(produce(7, -1, 1000, keyedLegacyBatch(t, []string{"e3", "e1"}, []string{"x", "y"})), true)
	if d := pl.decisions[0]; d.act != actAnswer || d.local.BaseOffset != 7 || pl.anyUp {
		t.Fatalf("all keys known: act %v %+v", d.act, d.local)
	}
	if n := testutil.ToFloat64(h.pn.metrics.keysDropped); n != 3 {
		t.Fatalf("key duplicates dropped: %v, want 3", n)
	}
	// An idempotent batch is never cut: its repeated key is counted.
	b := keyedLegacyBatch(t, []string{"e1"}, []string{"z"})
	idem := append([]byte(nil), b...)
	binary.BigEndian.PutUint64(idem[43:], 99) // producer id
	binary.BigEndian.PutUint16(idem[51:], 0)  // epoch
	binary.BigEndian.PutUint32(idem[53:], 0)  // base sequence
	pl = h.plan(produce(9, -1, 1000, fixBatchLengthAndCRC(idem)), true)
	if d := pl.decisions[0]; d.legacy || d.act != actForward {
		t.Fatalf("idempotent keyed batch: legacy %v act %v", d.legacy, d.act)
	}
	if n := testutil.ToFloat64(h.pn.metrics.keysObserved); n != 1 {
		t.Fatalf("keys observed %v", n)
	}
}

// TestPlanLegacyErrorAnswerIsNotAnAcknowledgement: a legacy batch appended
// but answered with an error (REQUEST_TIMED_OUT), or appended in a request
// where another partition failed, gave its client no acknowledgement: the
// client retries on the same connection (kafkajs resends the whole
// request), and that retry is answered, not written again.
func TestPlanLegacyErrorAnswerIsNotAnAcknowledgement(t *testing.T) {
	h := newPlanHarness(t, DedupEnforce)
	a, b := legacyBatch(t, 2, "a"), legacyBatch(t, 2, "b")
	pl := h.plan(produce(7, -1, 1000, a, b), true)
	h.complete(pl, map[int32]brokerResult{0: {err: kerr.RequestTimedOut.Code}, 1: {offset: 9}})
	pl = h.plan(produce(7, -1, 1000, a, b), true) // same connection
	for i, d := range pl.decisions {
		if d.act != actAnswer {
			t.Fatalf("partition %d resent on the same connection after a partial error: act %v (%v)", i, d.act, d.lresult.Decision)
		}
	}
	if r := h.answer(pl, nil); r[1].BaseOffset != 9 {
		t.Fatalf("appended partition answered %+v, want its offset 9", r[1])
	}
}

// TestPlanLegacyMovedBesideARetry: kafkajs assigns partitions afresh on each
// attempt and resends only to the brokers that did not answer, so one retry
// request can carry records whose acknowledgement was lost (their connection
// closed) and records another broker acknowledged on a connection still
// open, each to another partition than before. Beside the recognised retry
// the second are part of it; alone they are new data (a broadcast).
func TestPlanLegacyMovedBesideARetry(t *testing.T) {
	h := newPlanHarness(t, DedupEnforce)
	a, b, c, d := legacyBatch(t, 3, "a"), legacyBatch(t, 3, "b"), legacyBatch(t, 2, "c"), legacyBatch(t, 2, "d")
	// Broker X, connection 1: a to partition 0, acknowledgement lost.
	pl := h.plan(produce(7, -1, 1000, a), true)
	da := pl.decisions[0]
	h.complete(pl, map[int32]brokerResult{0: {offset: 10}})
	h.pn.orphanBatches(1, []legacyRef{{id: da.ident, topic: da.key.Topic, partition: 0, count: da.batch.Count, size: da.size, first: da.first}}, h.now)
	// Broker Y, connection 2 (stays open): c to 0, b to 1, acknowledged.
	h.conn = 2
	pl = h.plan(produce(7, -1, 1000, c, b), true)
	h.complete(pl, map[int32]brokerResult{0: {offset: 20}, 1: {offset: 30}})
	pending := h.pn.pending.Load()
	// The retry on connection 3: b now to 0 (moved, listed first), a to 1.
	h.conn = 3
	pl = h.plan(produce(7, -1, 1000, b, a), true)
	if pl.anyUp {
		t.Fatalf("a retry request sends something upstream: %+v", pl.decisions)
	}
	for i, r := range h.answer(pl, nil) {
		if d := pl.decisions[i]; d.act != actAnswer || d.pending || r.ErrorCode != 0 || r.BaseOffset != -1 {
			t.Fatalf("partition %d: act %v pending %v answer %+v", i, d.act, d.pending, r)
		}
	}
	if got := h.pn.pending.Load(); got != pending {
		t.Fatalf("pending batches %v after the retry, want %v", got, pending)
	}
	if n := testutil.ToFloat64(h.pn.metrics.legacy[seqstate.LegacyDuplicate]); n != 2 {
		t.Fatalf("legacy_duplicate counted %v, want 2", n)
	}
	// b to another partition again, now from connection 4 beside new
	// records only: a broadcast while connection 3 is open, forwarded.
	h.conn = 4
	pl = h.plan(produce(7, -1, 1000, d, b), true)
	for i, dd := range pl.decisions {
		if dd.act != actForward || dd.lresult.Decision != seqstate.LegacyNew || !dd.pending {
			t.Fatalf("partition %d alone beside new records: act %v %+v", i, dd.act, dd.lresult)
		}
	}
	h.complete(pl, map[int32]brokerResult{0: {offset: 40}, 1: {offset: 31}})
}

// TestPlanLegacyRebatchedRetryAfterWarm: a proxy that learned a legacy batch
// from the log (restarted between the append and the retry) recognises a
// re-batched retry of it too: librdkafka resends the lost records with
// newer ones behind them.
func TestPlanLegacyRebatchedRetryAfterWarm(t *testing.T) {
	h := newPlanHarness(t, DedupEnforce)
	topic, ok := h.pn.table.LookupTopic([]byte(planTopic))
	if !ok {
		t.Fatal("plan topic not interned")
	}
	lost := legacyBatch(t, 3, "a")
	binary.BigEndian.PutUint64(lost[0:8], 10) // at offset 10 in the log
	if n, _ := h.pn.applyLog(seqstate.Key{ProducerID: -1, Topic: topic, Partition: 0}, lost, h.now); n != 1 {
		t.Fatalf("applied %d batches from the log, want 1", n)
	}
	pl := h.plan(produce(7, -1, 1000, legacyBatch(t, 5, "a")), true)
	d := pl.decisions[0]
	if d.act != actRebatch || d.prefixResult.BaseOffset != 10 {
		t.Fatalf("superset after warm-up: act %v prefix %+v", d.act, d.prefixResult)
	}
	if r := h.answer(pl, h.complete(pl, map[int32]brokerResult{0: {offset: 13}}))[0]; r.ErrorCode != 0 || r.BaseOffset != 10 {
		t.Fatalf("answer %+v, want error 0 at the prefix's offset 10", r)
	}
}

// stampedLegacyBatch is a legacy batch of values, record i written at
// absolute time ts[i] (ms), as a client that keeps each record's timestamp
// across resends builds it.
func stampedLegacyBatch(t *testing.T, values []string, ts []int64) []byte {
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

// TestPlanLegacyResentRecords: sarama answers a REQUEST_TIMED_OUT by
// putting the batch's records back in its queue behind newer ones, so they
// come back inside another batch. Once the partition's log is read again
// (the error made the proxy forget it), those records are recognised one by
// one and not written twice: the newer ones go upstream in a rebuilt batch;
// a batch of only resent records is answered with their original offsets.
func TestPlanLegacyResentRecords(t *testing.T) {
	h := newPlanHarness(t, DedupEnforce)
	topic, ok := h.pn.table.LookupTopic([]byte(planTopic))
	if !ok {
		t.Fatal("plan topic not interned")
	}
	const t0 = int64(1700000000000)
	failed := stampedLegacyBatch(t, []string{"a", "b", "c"}, []int64{t0, t0 + 1, t0 + 2})
	pl := h.plan(produce(7, -1, 1000, failed), true)
	h.complete(pl, map[int32]brokerResult{0: {err: kerr.RequestTimedOut.Code}})
	if h.pn.unackedLive(h.now) {
		t.Fatal("records kept before the log was read")
	}
	logged := append([]byte(nil), failed...)
	binary.BigEndian.PutUint64(logged[0:8], 10) // at offset 10 in the log
	if n, _ := h.pn.applyLog(seqstate.Key{ProducerID: -1, Topic: topic, Partition: 0}, logged, h.now); n != 1 {
		t.Fatalf("applied %d batches from the log, want 1", n)
	}

	// Same connection, as sarama resends: newer records first.
	resent := stampedLegacyBatch(t, []string{"x", "y", "a", "b", "c"}, []int64{t0 + 5, t0 + 6, t0, t0 + 1, t0 + 2})
	pl = h.plan(produce(7, -1, 1000, resent), true)
	d := pl.decisions[0]
	if d.act != actRebatch || !d.keyDrop {
		t.Fatalf("batch carrying resent records: act %v", d.act)
	}
	var bh protocol.BatchHeader
	rebuilt := pl.rebuilt[d.rebuiltAt:d.rebuiltEnd]
	if _, err := protocol.ReadBatch(rebuilt, &bh); err != nil || bh.NumRecords != 2 || protocol.BatchValid(rebuilt, &bh) != 0 {
		t.Fatalf("rebuilt batch: %v %+v", err, bh)
	}
	if r := h.answer(pl, h.complete(pl, map[int32]brokerResult{0: {offset: 13}}))[0]; r.ErrorCode != 0 || r.BaseOffset != -1 {
		t.Fatalf("answer %+v, want error 0, offset -1", r)
	}
	if len(pl.keys) != 0 || len(pl.drops) != 0 {
		t.Fatalf("record stamps left in the plan's key buffers: %d %d", len(pl.keys), len(pl.drops))
	}

	// Each record answers for one resend: the same records again are new.
	pl = h.plan(produce(7, -1, 1000, stampedLegacyBatch(t, []string{"a", "b"}, []int64{t0 + 7, t0 + 7})), true)
	if d := pl.decisions[0]; d.act != actForward {
		t.Fatalf("records already resent once, sent again: act %v", d.act)
	}

	// Only resent records, in their order, restamped (sarama stamps a
	// resend with its own time): their original offsets.
	h = newPlanHarness(t, DedupEnforce)
	pl = h.plan(produce(7, -1, 1000, failed), true)
	h.complete(pl, map[int32]brokerResult{0: {err: kerr.RequestTimedOut.Code}})
	h.pn.applyLog(seqstate.Key{ProducerID: -1, Topic: topic, Partition: 0}, logged, h.now)
	h.conn = 2
	pl = h.plan(produce(7, -1, 1000, stampedLegacyBatch(t, []string{"b", "c"}, []int64{t0 + 50, t0 + 50})), true)
	if d := pl.decisions[0]; d.act != actAnswer || d.local.BaseOffset != 11 || d.pending {
		t.Fatalf("only resent records: act %v %+v", d.act, d.local)
	}
	// Out of order: answered, but no single base offset is true.
	h = newPlanHarness(t, DedupEnforce)
	pl = h.plan(produce(7, -1, 1000, failed), true)
	h.complete(pl, map[int32]brokerResult{0: {err: kerr.RequestTimedOut.Code}})
	h.pn.applyLog(seqstate.Key{ProducerID: -1, Topic: topic, Partition: 0}, logged, h.now)
	pl = h.plan(produce(7, -1, 1000, stampedLegacyBatch(t, []string{"c", "a"}, []int64{t0 + 2, t0})), true)
	if d := pl.decisions[0]; d.act != actAnswer || d.local.BaseOffset != -1 {
		t.Fatalf("resent records out of order: act %v %+v", d.act, d.local)
	}
	// Another value is another record.
	pl = h.plan(produce(7, -1, 1000, stampedLegacyBatch(t, []string{"z"}, []int64{t0})), true)
	if d := pl.decisions[0]; d.act != actForward {
		t.Fatalf("another value: act %v", d.act)
	}
	if n := testutil.ToFloat64(h.pn.metrics.resentDropped); n != 2 {
		t.Fatalf("legacy_resent_records_dropped_total %v, want 2", n)
	}
	// After the window nothing is checked.
	if h.pn.unackedLive(h.now.Add(h.pn.legacyWindow)) {
		t.Fatal("records still live after the window")
	}
}

// TestPlanLegacyAcknowledgedRecordsNotStamped: a batch whose append was
// acknowledged leaves nothing to check record by record, after a warm-up
// too.
func TestPlanLegacyAcknowledgedRecordsNotStamped(t *testing.T) {
	h := newPlanHarness(t, DedupEnforce)
	topic, _ := h.pn.table.LookupTopic([]byte(planTopic))
	b := legacyBatch(t, 3, "ok")
	pl := h.plan(produce(7, -1, 1000, b), true)
	h.complete(pl, map[int32]brokerResult{0: {offset: 10}})
	logged := append([]byte(nil), b...)
	binary.BigEndian.PutUint64(logged[0:8], 10)
	h.pn.applyLog(seqstate.Key{ProducerID: -1, Topic: topic, Partition: 0}, logged, h.now)
	if h.pn.unackedLive(h.now) {
		t.Fatal("an acknowledged batch's records are checked one by one")
	}
}
