package e2e

import (
	"bytes"
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestLegacyHeartbeatIdenticalBatches guards legacy deduplication against
// its obvious false positive. A legacy producer (producer id -1) carries no
// sequence number, so a batch that repeats an earlier one byte for byte is
// not necessarily a retry: a heartbeat or a "still alive" record with a fixed
// value and timestamp is written again and again on purpose, each one
// acknowledged before the next. Kafka appends every one of them (no producer
// state for pid -1, docs/kafka-rules.md), and so must the proxy: twenty
// identical single-record batches on one healthy connection, each
// acknowledged, are twenty records in the log.
//
// It passes today (the proxy relays legacy batches) and must keep passing
// when legacy deduplication lands.
func TestLegacyHeartbeatIdenticalBatches(t *testing.T) {
	const (
		topic = "heartbeat"
		beats = 20
	)
	cluster := newCluster(t, topic)
	fake := cluster.kfake(t, "request hook (ControlKey), which shows the batches identical")

	// What reaches the broker, to prove the batches really were identical.
	var (
		mu      sync.Mutex
		batches [][]byte
	)
	fake.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		fake.KeepControl()
		mu.Lock()
		defer mu.Unlock()
		for _, tp := range req.(*kmsg.ProduceRequest).Topics {
			for _, p := range tp.Partitions {
				batches = append(batches, bytes.Clone(p.Records))
			}
		}
		return nil, nil, false // observe only: kfake handles the request
	})

	px := startProxy(t, cluster)
	var disconnects atomic.Int64
	cl, err := kgo.NewClient(
		kgo.WithHooks(disconnectHook{&disconnects}),
		kgo.SeedBrokers(px.addr()),
		kgo.DefaultProduceTopic(topic),
		kgo.DisableIdempotentWrite(),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ClientID("e2e-heartbeat"),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerBatchCompression(kgo.NoCompression()),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// A fixed timestamp: the batch header (first and max timestamp) and so
	// the CRC are the same every time.
	ts := time.UnixMilli(1_700_000_000_000)
	for i := 0; i < beats; i++ {
		r := &kgo.Record{Key: []byte("node-1"), Value: []byte("alive"), Partition: 0, Timestamp: ts}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatalf("heartbeat %d: %v", i, err)
		}
	}

	mu.Lock()
	got := batches
	mu.Unlock()
	if len(got) != beats {
		t.Fatalf("the broker received %d batches, want %d (one per heartbeat)", len(got), beats)
	}
	for i, b := range got {
		if !bytes.Equal(b, got[0]) {
			t.Fatalf("batch %d differs from batch 0: the test must send byte-identical batches", i)
		}
		if n, _, legacy := countBatches(b); n != 1 || legacy != 1 {
			t.Fatalf("batch %d: %d records, legacy=%d; want one legacy record", i, n, legacy)
		}
	}

	copies, stored := storedValues(t, cluster, topic)
	if stored != beats || copies["alive"] != beats {
		t.Errorf("the log holds %d records (%d heartbeats), want %d: identical batches on a healthy connection are separate writes",
			stored, copies["alive"], beats)
	}
	if n := disconnects.Load(); n > 0 {
		t.Errorf("the client lost %d connections while producing: the test is about a healthy connection", n)
	}
}

// disconnectHook counts the client's broker connections that ended.
type disconnectHook struct{ n *atomic.Int64 }

func (h disconnectHook) OnBrokerDisconnect(kgo.BrokerMetadata, net.Conn) { h.n.Add(1) }
