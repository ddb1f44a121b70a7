package proxy

import (
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// manyRecordsBatch builds a legacy batch of the given values, every one
// stamped ts.
func manyRecordsBatch(t testing.TB, values []string, ts int64) []byte {
	t.Helper()
	stamps := make([]int64, len(values))
	for i := range stamps {
		stamps[i] = ts
	}
	return stampedLegacyBatch(t, values, stamps)
}

// pipelineAndAbort sends reqs on a new connection of client id, all before
// reading the first answer, reads every answer, and closes the connection
// with a reset: every record it sent is one whose acknowledgement the
// proxy must take as maybe lost.
func pipelineAndAbort(t *testing.T, addr, id, topic string, reqs []kmsg.Request) {
	t.Helper()
	c := dialRaw(t, addr)
	c.clientID = id
	c.learnTopics(topic)
	var corrs []int32
	for _, r := range reqs {
		corrs = append(corrs, c.send(r))
	}
	for i, corr := range corrs {
		if r := onlyPartition(t, c.recv(reqs[i], corr)); r.ErrorCode != 0 {
			t.Fatalf("%s request %d: %+v", id, i, r)
		}
	}
	c.abort()
}

// TestFairShareOverSockets: a client fills dedup.legacy.max_records with
// distinct records and leaves; another client's acknowledgement is then
// lost and its retry must still be answered, not written twice
// (docs/security.md, "Fair shares"). Same principal (ANONYMOUS), other
// client id, other topic, as the attack was found.
func TestFairShareOverSockets(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, "fill", "orders"))
	p := startProxy(t, c, func(cfg *Config) { cfg.Dedup.Legacy.MaxRecords = 4096 })
	ts := time.Now().UnixMilli()
	var fill []kmsg.Request
	for i := range 32 {
		vs := make([]string, 256)
		for j := range vs {
			vs[j] = fmt.Sprintf("f%d-%d", i, j)
		}
		fill = append(fill, produceParts("fill", -1, part{0, manyRecordsBatch(t, vs, ts)}))
	}
	pipelineAndAbort(t, p.addr(), "filler", "fill", fill)
	clientsGone(t, p)

	order := produceParts("orders", -1, part{0, manyRecordsBatch(t, []string{"charge 1", "charge 2"}, ts)})
	pipelineAndAbort(t, p.addr(), "victim", "orders", []kmsg.Request{order}) // its answer lost
	clientsGone(t, p)
	retry := dialRaw(t, p.addr())
	retry.clientID = "victim"
	retry.learnTopics("orders")
	if r := onlyPartition(t, retry.roundTrip(order)); r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("the victim's retry: %+v, want the original's offset 0", r)
	}
	if end := partitionEnd(t, c.ListenAddrs()[0], "orders", 0); end != 2 {
		t.Fatalf("orders holds %d records, want 2: the retry was written again", end)
	}
}

// TestIdenticalRecordsAnsweredPromptly: 64 requests of 16,384 identical
// empty records from one client instance, then a reset; the next request of
// that instance, and another client's, are answered within 100 ms
// (docs/security.md, "Bounded work per client"). The index probed
// linearly on one hash: the next request was never answered, and clients
// sharing its lock stalled.
func TestIdenticalRecordsAnsweredPromptly(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, "same"))
	p := startProxy(t, c, nil)
	same := make([]string, 16384)
	ts := time.Now().UnixMilli()
	b := manyRecordsBatch(t, same, ts)
	var reqs []kmsg.Request
	for range 64 {
		reqs = append(reqs, produceParts("same", -1, part{0, b}))
	}
	pipelineAndAbort(t, p.addr(), "same", "same", reqs)
	clientsGone(t, p)
	limit := 100 * time.Millisecond
	if raceEnabled {
		// The race detector's bookkeeping of a heap this size costs
		// pauses of a few hundred ms; before, the answer never came.
		limit = time.Second
	}
	for _, id := range []string{"same", "other"} {
		conn := dialRaw(t, p.addr())
		conn.clientID = id
		conn.learnTopics("same")
		for _, v := range []string{"", "x"} {
			one := produceParts("same", -1, part{0, manyRecordsBatch(t, []string{v}, ts)})
			start := time.Now()
			r := onlyPartition(t, conn.roundTrip(one))
			if took := time.Since(start); r.ErrorCode != 0 || took > limit {
				t.Fatalf("client %s's next request (%q): %+v after %v, want answered within %v", id, v, r, took, limit)
			}
		}
	}
}
