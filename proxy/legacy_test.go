package proxy

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/seqstate"
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
	first.conn.Close() // as if its acknowledgement had been lost
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
	if n := testutil.ToFloat64(p.Metrics.legacy[seqstate.LegacyDuplicate]); n != 1 {
		t.Fatalf("legacy_duplicate counted %v", n)
	}
	if !strings.Contains(p.logs.String(), `msg="duplicate prevented: answered with the original's offset" conn=2`) ||
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
	first.conn.Close()
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
	if n := testutil.ToFloat64(p.Metrics.legacyRebatched); n != 1 {
		t.Fatalf("legacy_rebatched %v", n)
	}
}
