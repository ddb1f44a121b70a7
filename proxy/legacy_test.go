package proxy

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"

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
