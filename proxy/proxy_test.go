package proxy

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestKgoProduceConsume10k sends 10,000 records to 6 partitions through the
// proxy with franz-go and reads them back through the proxy with a consumer
// group: all arrive, in order per partition, and no real broker address ever
// reaches the client.
func TestKgoProduceConsume10k(t *testing.T) {
	t.Parallel()
	const topic, partitions, total = "orders", 6, 10000
	c := newCluster(t, kfake.SeedTopics(partitions, topic))
	p := startProxy(t, c, nil)
	tap := newAddrTap()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	prod, err := kgo.NewClient(kgo.SeedBrokers(p.addr()), kgo.Dialer(tap.dial),
		kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	recs := make([]*kgo.Record, total)
	for i := range recs {
		part := int32(i % partitions)
		recs[i] = &kgo.Record{Partition: part, Value: []byte(strconv.Itoa(i / partitions))}
	}
	if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}

	cons, err := kgo.NewClient(kgo.SeedBrokers(p.addr()), kgo.Dialer(tap.dial),
		kgo.ConsumerGroup("g-10k"), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	next := make([]int, partitions)
	got := 0
	for polls := 0; got < total && polls < 10000; polls++ {
		fs := cons.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of %d: %v", got, total, err)
		}
		fs.EachError(func(_ string, _ int32, err error) { t.Errorf("fetch: %v", err) })
		fs.EachRecord(func(r *kgo.Record) {
			v, _ := strconv.Atoi(string(r.Value))
			if v != next[r.Partition] {
				t.Fatalf("partition %d: record %d, want %d (out of order or duplicated)", r.Partition, v, next[r.Partition])
			}
			next[r.Partition]++
			got++
		})
	}
	if got != total {
		t.Fatalf("consumed %d records, want %d", got, total)
	}
	if err := cons.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatalf("commit through proxy: %v", err)
	}
	assertOnlyProxyAddrs(t, c, p, tap)
}

// assertOnlyProxyAddrs checks that the tap saw broker addresses and that
// every one of them is a proxy listener, none a real broker.
func assertOnlyProxyAddrs(t *testing.T, c *kfake.Cluster, p *testProxy, tap *addrTap) {
	t.Helper()
	addrs, seen, errs := tap.snapshot()
	for _, err := range errs {
		t.Errorf("client received an undecodable response: %v", err)
	}
	if len(addrs) == 0 {
		t.Fatal("the client received no broker address at all")
	}
	real := realAddrs(c)
	proxyAddrs := map[string]bool{p.addr(): true}
	for id := int32(0); id < 16; id++ {
		if a, ok := p.nodes.Advertised(id); ok {
			proxyAddrs[a] = true
		}
	}
	for a, n := range addrs {
		if real[a] {
			t.Errorf("real broker address %s leaked to the client %d times", a, n)
		} else if !proxyAddrs[a] {
			t.Errorf("client was told %s, which is not a proxy listener (%v)", a, proxyAddrs)
		}
	}
	t.Logf("address-bearing responses decoded per api: %v; addresses: %v", seen, addrs)
}

// TestLeaderMovesClientFollows moves partition leaders while franz-go
// produces through the proxy: the client follows through proxy listeners,
// and no address it receives — Metadata, FindCoordinator, DescribeCluster,
// or the KIP-951 NodeEndpoints of Produce v10+ and Fetch v16+ — is a real
// broker's.
func TestLeaderMovesClientFollows(t *testing.T) {
	t.Parallel()
	const topic, partitions = "moving", 6
	c := newCluster(t, kfake.SeedTopics(partitions, topic))
	p := startProxy(t, c, nil)
	tap := newAddrTap()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	cl, err := kgo.NewClient(kgo.SeedBrokers(p.addr()), kgo.Dialer(tap.dial), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.MetadataMinAge(50*time.Millisecond),
		kgo.ConsumerGroup("g-move"), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	const rounds, perRound = 12, 60
	for round := 0; round < rounds; round++ {
		recs := make([]*kgo.Record, perRound)
		for i := range recs {
			recs[i] = &kgo.Record{Partition: int32(i % partitions), Value: fmt.Appendf(nil, "%d-%d", round, i)}
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		// Move one partition to the next broker, so the client's next
		// produce hits a stale leader and learns the new one.
		part := int32(round % partitions)
		leader := c.LeaderFor(topic, part)
		if err := c.MoveTopicPartition(topic, part, (leader+1)%3); err != nil {
			t.Fatal(err)
		}
	}
	got := 0
	for polls := 0; got < rounds*perRound && polls < 1000; polls++ {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d: %v", got, ctx.Err())
		}
		got += fs.NumRecords()
	}
	if got != rounds*perRound {
		t.Fatalf("consumed %d, want %d", got, rounds*perRound)
	}

	// The responses a client may not happen to trigger above, requested
	// directly: DescribeCluster, both FindCoordinator forms, and a Produce
	// and a Fetch sent to a broker that is not the leader, whose response
	// carries NodeEndpoints.
	raw := dialRaw(t, p.addr())
	for _, v := range []int16{0, 1} {
		req := kmsg.NewPtrDescribeClusterRequest()
		req.SetVersion(v)
		tapResponse(t, tap, raw, req)
	}
	for _, v := range []int16{3, 4, 6} {
		req := kmsg.NewPtrFindCoordinatorRequest()
		req.SetVersion(v)
		req.CoordinatorKey, req.CoordinatorKeys = "g-move", []string{"g-move"}
		tapResponse(t, tap, raw, req)
	}
	notLeaderNode := (c.LeaderFor(topic, 0) + 1) % 3
	nodeAddr, ok := p.nodes.Advertised(notLeaderNode)
	if !ok {
		t.Fatalf("no proxy listener for node %d", notLeaderNode)
	}
	wrong := dialRaw(t, nodeAddr)
	topicID := topicIDOf(t, raw, topic)
	produce := kmsg.NewPtrProduceRequest()
	produce.SetVersion(12) // names, v10+: NodeEndpoints
	produce.Acks = -1
	produce.TimeoutMillis = 5000
	pt := kmsg.NewProduceRequestTopic()
	pt.Topic = topic
	pp := kmsg.NewProduceRequestTopicPartition()
	pp.Partition = 0
	pp.Records = oneRecordBatch(t)
	pt.Partitions = append(pt.Partitions, pp)
	produce.Topics = append(produce.Topics, pt)
	presp := tapResponse(t, tap, wrong, produce).(*kmsg.ProduceResponse)
	if code := presp.Topics[0].Partitions[0].ErrorCode; code != 6 /* NOT_LEADER_FOR_PARTITION */ {
		t.Fatalf("produce to non-leader: error %d, want NOT_LEADER_FOR_PARTITION", code)
	}
	if len(presp.Brokers) == 0 {
		t.Fatal("produce v12 NOT_LEADER response carried no NodeEndpoints")
	}
	fetch := kmsg.NewPtrFetchRequest()
	fetch.SetVersion(16)
	fetch.MaxWaitMillis = 10
	fetch.MaxBytes = 1 << 20
	ft := kmsg.NewFetchRequestTopic()
	ft.TopicID = topicID
	fp := kmsg.NewFetchRequestTopicPartition()
	fp.Partition = 0
	fp.PartitionMaxBytes = 1 << 20
	fp.CurrentLeaderEpoch = -1
	ft.Partitions = append(ft.Partitions, fp)
	fetch.Topics = append(fetch.Topics, ft)
	fresp := tapResponse(t, tap, wrong, fetch).(*kmsg.FetchResponse)
	if len(fresp.Brokers) == 0 {
		t.Fatalf("fetch v16 to a non-leader carried no NodeEndpoints (error %d)", fresp.Topics[0].Partitions[0].ErrorCode)
	}
	_, seen, _ := tap.snapshot()
	for _, k := range []kmsg.Key{kmsg.Metadata, kmsg.FindCoordinator, kmsg.DescribeCluster, kmsg.Produce, kmsg.Fetch} {
		if seen[int16(k)] == 0 {
			t.Errorf("no address-bearing %s response was checked", kmsg.NameForKey(int16(k)))
		}
	}
	assertOnlyProxyAddrs(t, c, p, tap)
}

// tapResponse sends req on raw, decodes the response and feeds it to the tap.
func tapResponse(t *testing.T, tap *addrTap, raw *rawConn, req kmsg.Request) kmsg.Response {
	t.Helper()
	corr := raw.send(req)
	body, err := readFrame(raw.conn)
	if err != nil {
		t.Fatalf("%s: %v", kmsg.NameForKey(req.Key()), err)
	}
	tap.observe(req.Key(), req.GetVersion(), body)
	_ = corr
	resp := req.ResponseKind()
	off := 4
	if resp.IsFlexible() {
		off++
	}
	if err := resp.ReadFrom(body[off:]); err != nil {
		t.Fatalf("decode %s: %v", kmsg.NameForKey(req.Key()), err)
	}
	return resp
}

func topicIDOf(t *testing.T, raw *rawConn, topic string) [16]byte {
	t.Helper()
	req := kmsg.NewPtrMetadataRequest()
	req.SetVersion(12)
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, mt)
	resp := raw.roundTrip(req).(*kmsg.MetadataResponse)
	if len(resp.Topics) != 1 || resp.Topics[0].ErrorCode != 0 {
		t.Fatalf("metadata for %s: %+v", topic, resp.Topics)
	}
	return resp.Topics[0].TopicID
}

// oneRecordBatch returns a valid non-idempotent v2 record batch with one record.
func oneRecordBatch(t testing.TB) []byte {
	t.Helper()
	return recordBatch(t, -1, -1, -1, 1, "x")
}

// recordBatch encodes a v2 record batch of n records.
func recordBatch(t testing.TB, pid int64, epoch int16, seq int32, n int, value string) []byte {
	return recordBatchAt(t, pid, epoch, seq, n, value, 1700000000000)
}

// recordBatchAt is recordBatch with the batch timestamps at ts (ms).
func recordBatchAt(t testing.TB, pid int64, epoch int16, seq int32, n int, value string, ts int64) []byte {
	t.Helper()
	b := kmsg.RecordBatch{
		FirstOffset: 0, Magic: 2, LastOffsetDelta: int32(n - 1),
		FirstTimestamp: ts, MaxTimestamp: ts,
		ProducerID: pid, ProducerEpoch: epoch, FirstSequence: seq, NumRecords: int32(n),
	}
	var recs []byte
	for i := 0; i < n; i++ {
		recs = appendRecord(recs, i, value)
	}
	b.Records = recs
	raw := b.AppendTo(nil)
	return fixBatchLengthAndCRC(raw)
}

// asKafkaGo writes a legacy batch as kafka-go does (partition leader
// epoch -1, from a client that names no software): a client the proxy
// knows to stamp its resends anew (docs/legacy.md, "What a record is").
func asKafkaGo(b []byte) []byte {
	binary.BigEndian.PutUint32(b[12:], 0xffffffff)
	return b
}

// appendRecord appends a v2 record (KIP-98 format: zigzag varints) with a
// null key, the given value and no headers.
func appendRecord(dst []byte, offsetDelta int, value string) []byte {
	var rec []byte
	rec = append(rec, 0)              // attributes
	rec = binary.AppendVarint(rec, 0) // timestamp delta
	rec = binary.AppendVarint(rec, int64(offsetDelta))
	rec = binary.AppendVarint(rec, -1) // null key
	rec = binary.AppendVarint(rec, int64(len(value)))
	rec = append(rec, value...)
	rec = binary.AppendVarint(rec, 0) // no headers
	dst = binary.AppendVarint(dst, int64(len(rec)))
	return append(dst, rec...)
}

// fixBatchLengthAndCRC sets a v2 batch's length (bytes after the length
// field) and its CRC-32C (over attributes to the end).
func fixBatchLengthAndCRC(b []byte) []byte {
	binary.BigEndian.PutUint32(b[8:], uint32(len(b)-12))
	binary.BigEndian.PutUint32(b[17:], crc32.Checksum(b[21:], crc32.MakeTable(crc32.Castagnoli)))
	return b
}

func TestMetricsLint(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	p := startProxy(t, c, nil)
	raw := dialRaw(t, p.addr())
	raw.roundTrip(kmsg.NewPtrMetadataRequest())
	problems, err := testutil.GatherAndLint(p.reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, pr := range problems {
		t.Errorf("metric %s: %s", pr.Metric, pr.Text)
	}
	if n := testutil.ToFloat64(p.Metrics.Requests.WithLabelValues("Metadata")); n != 1 {
		t.Errorf("dedupproxy_requests_total{api=Metadata} = %v, want 1", n)
	}
}
