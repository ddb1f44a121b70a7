package e2e

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/proxy"
)

// TestDrainCancelsTailRead: a retry that reaches a proxy just restarted
// waits for its partition's tail to be read (docs/warm.md); when the proxy
// is drained (SIGTERM) before that read has dialled the broker, the drain
// cancels the read, and the retry must not then be written as new data: a
// drained proxy can leave it to the next one, which reads the tail. The
// paced drain rows of TestLegacyLostAck found it (one batch of 20 records
// written twice in about one drain run in eight, its proxy logging "cannot
// read partition tail" with "operation was canceled").
func TestDrainCancelsTailRead(t *testing.T) {
	const name = "drain-tail"
	cluster := newCluster(t, name)
	fake := cluster.kfake(t, "holding the proxy's Metadata request (ControlKey)")
	topic := cluster.topic(name)
	const clientID = "e2e-drain-tail"
	req := legacyProduceRequest(topic, 0, time.Now().UnixMilli(), "drain-tail-0", "drain-tail-1")

	// The original, through a first proxy, appended; then that proxy is
	// killed, and the client's retry goes to the next one.
	listen := freeListenPair(t)
	first := startProxyOn(t, cluster, listen)
	if err := rawProduce(first.addr(), clientID, req); err != nil {
		t.Fatalf("the original: %v", err)
	}
	first.kill()

	logs := &syncBuffer{}
	next := &proxy.Server{
		Config:  cluster.proxyConfig(listen),
		Logger:  slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Metrics: proxy.NewMetrics(prometheus.NewRegistry()),
	}
	startCtx, cancelStart := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelStart()
	if err := next.Start(startCtx); err != nil {
		t.Fatal(err)
	}
	drained := make(chan struct{})
	drain := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		next.Shutdown(ctx)
		close(drained)
	}
	t.Cleanup(func() {
		// Stopped at once if the test ended before its drain did.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		next.Shutdown(ctx)
		if t.Failed() {
			t.Logf("the drained proxy's log:\n%s", logs.String())
		}
	})

	// The next Metadata request the broker gets is the one the proxy sends
	// to find the partition's leader before reading its tail: it is held
	// until the drain has begun.
	var fired atomic.Bool
	held, release := make(chan struct{}), make(chan struct{})
	var released atomic.Bool
	releaseOnce := func() {
		if released.CompareAndSwap(false, true) {
			close(release)
		}
	}
	defer releaseOnce()
	fake.ControlKey(int16(kmsg.Metadata), func(kmsg.Request) (kmsg.Response, error, bool) {
		fake.KeepControl()
		if !fired.CompareAndSwap(false, true) {
			return nil, nil, false
		}
		close(held)
		fake.SleepControl(func() { <-release }) // the slowness under test
		return nil, nil, false
	})

	retried := make(chan error, 1)
	go func() { retried <- rawProduce(next.Addr().String(), clientID, req) }()
	select {
	case <-held:
	case err := <-retried:
		t.Fatalf("the retry was answered before the proxy asked for the partition's leader: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the proxy sent no Metadata request for the retry's partition within 10 s")
	}
	go drain()
	// The drain closes the listeners, then cancels the proxy's dials at
	// once, long before the held answer can reach the proxy.
	if !eventually(10*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", next.Addr().String(), time.Second)
		if err == nil {
			c.Close()
		}
		return err != nil
	}) {
		t.Fatal("the proxy did not begin its drain within 10 s")
	}
	releaseOnce()
	select {
	case <-drained:
	case <-time.After(15 * time.Second):
		t.Fatal("the drain did not end within 15 s")
	}
	err := <-retried
	t.Logf("the retry, through the drained proxy: %v", err)

	copies, _ := storedValues(t, cluster, topic)
	for _, v := range []string{"drain-tail-0", "drain-tail-1"} {
		if copies[v] != 1 {
			t.Errorf("%s is in the log %d times, want once: the retry whose tail read the drain cancelled was written as new data", v, copies[v])
		}
	}
}

// legacyProduceRequest is an acks=all Produce request (v7) of one
// uncompressed batch with producer id -1 of records with values, null keys
// and timestamp ts (ms), to topic's partition.
func legacyProduceRequest(topic string, partition int32, ts int64, values ...string) *kmsg.ProduceRequest {
	b := kmsg.RecordBatch{
		Magic: 2, ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1,
		NumRecords: int32(len(values)), LastOffsetDelta: int32(len(values) - 1),
		FirstTimestamp: ts, MaxTimestamp: ts,
	}
	for i, v := range values {
		rec := []byte{0}                              // attributes
		rec = binary.AppendVarint(rec, 0)             // timestamp delta
		rec = binary.AppendVarint(rec, int64(i))      // offset delta
		rec = binary.AppendVarint(rec, -1)            // null key
		rec = binary.AppendVarint(rec, int64(len(v))) // value
		rec = append(rec, v...)                       //
		rec = binary.AppendVarint(rec, 0)             // no headers
		b.Records = append(binary.AppendVarint(b.Records, int64(len(rec))), rec...)
	}
	raw := b.AppendTo(nil)
	// Length counts from the partition leader epoch (offset 12); the CRC
	// (offset 17) covers everything after it (offset 21).
	binary.BigEndian.PutUint32(raw[8:], uint32(len(raw)-12))
	binary.BigEndian.PutUint32(raw[17:], crc32.Checksum(raw[21:], crc32.MakeTable(crc32.Castagnoli)))
	req := kmsg.NewPtrProduceRequest()
	req.SetVersion(7)
	req.Acks, req.TimeoutMillis = -1, 5000
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Partition, rp.Records = partition, raw
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	return req
}

// rawProduce sends req on a new connection to addr as client clientID and
// reads its answer: an error if there is none or it holds one.
func rawProduce(addr, clientID string, req *kmsg.ProduceRequest) error {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := conn.Write(kmsg.NewRequestFormatter(kmsg.FormatterClientID(clientID)).AppendRequest(nil, req, 1)); err != nil {
		return err
	}
	frame, err := readFrame(conn)
	if err != nil {
		return fmt.Errorf("no answer: %w", err)
	}
	resp := kmsg.NewPtrProduceResponse()
	resp.SetVersion(req.GetVersion())
	body := frame[8:]
	if resp.IsFlexible() {
		r := kbin.Reader{Src: body}
		kmsg.SkipTags(&r)
		body = r.Src
	}
	if err := resp.ReadFrom(body); err != nil {
		return err
	}
	var errs []error
	for _, tr := range resp.Topics {
		for _, pr := range tr.Partitions {
			if pr.ErrorCode != 0 {
				errs = append(errs, fmt.Errorf("%s[%d]: error %d", tr.Topic, pr.Partition, pr.ErrorCode))
			}
		}
	}
	return errors.Join(errs...)
}
