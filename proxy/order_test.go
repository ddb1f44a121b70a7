package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/protocol"
)

func produceRequest(topic string, acks int16, batch []byte) *kmsg.ProduceRequest {
	req := kmsg.NewPtrProduceRequest()
	req.SetVersion(9) // by topic name; v9 is the first flexible version
	req.Acks = acks
	req.TimeoutMillis = 5000
	pt := kmsg.NewProduceRequestTopic()
	pt.Topic = topic
	pp := kmsg.NewProduceRequestTopicPartition()
	pp.Records = batch
	pt.Partitions = append(pt.Partitions, pp)
	req.Topics = append(req.Topics, pt)
	return req
}

// TestPipelinedResponsesInRequestOrder writes a burst of mixed requests
// without reading, including acks=0 Produce, which Kafka never answers, and
// ApiVersions v3, whose response header stays v0 although the body is
// flexible (KIP-511). Responses come back strictly in request order, one per
// request that expects one.
func TestPipelinedResponsesInRequestOrder(t *testing.T) {
	t.Parallel()
	const topic = "pipelined"
	c := newCluster(t, kfake.SeedTopics(1, topic))
	p := startProxy(t, c, nil)
	raw := dialLeader(t, p, c, topic, 0)

	type sent struct {
		req  kmsg.Request
		corr int32
	}
	var want []sent
	acks0 := 0
	for i := 0; i < 60; i++ {
		var req kmsg.Request
		switch i % 5 {
		case 0:
			av := kmsg.NewPtrApiVersionsRequest()
			av.SetVersion(int16(i % 4))
			av.ClientSoftwareName, av.ClientSoftwareVersion = "test", "1"
			req = av
		case 1:
			req = kmsg.NewPtrMetadataRequest()
		case 2:
			req = produceRequest(topic, 1, oneRecordBatch(t))
		case 3:
			req = produceRequest(topic, 0, oneRecordBatch(t))
		case 4:
			req = produceRequest(topic, -1, oneRecordBatch(t))
		}
		corr := raw.send(req)
		if pr, ok := req.(*kmsg.ProduceRequest); ok && pr.Acks == 0 {
			acks0++
			continue // no response comes
		}
		want = append(want, sent{req, corr})
	}
	for _, w := range want {
		resp := raw.recv(w.req, w.corr) // fails on a correlation mismatch
		if pr, ok := resp.(*kmsg.ProduceResponse); ok {
			if code := pr.Topics[0].Partitions[0].ErrorCode; code != 0 {
				t.Fatalf("produce error %d", code)
			}
		}
	}
	// Every produce landed, the acks=0 ones included.
	if got, wantN := logEnd(t, raw.conn.RemoteAddr().String(), topic), int64(36); got != wantN {
		t.Fatalf("high watermark %d, want %d (36 produced, %d with acks=0)", got, wantN, acks0)
	}
}

// TestApiVersionsCapped checks that the proxy caps ApiVersions to what it
// can decode: a broker advertising a newer Metadata version and an API key
// kmsg does not know is presented to the client without them.
func TestApiVersionsCapped(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.ControlKey(int16(kmsg.ApiVersions), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.ApiVersionsRequest)
		resp := req.ResponseKind().(*kmsg.ApiVersionsResponse)
		for _, k := range []struct{ key, max int16 }{{int16(kmsg.Metadata), 99}, {int16(kmsg.Produce), 99}, {int16(kmsg.ApiVersions), 4}, {9999, 3}} {
			ak := kmsg.NewApiVersionsResponseApiKey()
			ak.ApiKey, ak.MinVersion, ak.MaxVersion = k.key, 0, k.max
			resp.ApiKeys = append(resp.ApiKeys, ak)
		}
		return resp, nil, true
	})
	p := startProxy(t, c, nil)
	raw := dialRaw(t, p.addr())
	for _, v := range []int16{0, 3} {
		req := kmsg.NewPtrApiVersionsRequest()
		req.SetVersion(v)
		resp := raw.roundTrip(req).(*kmsg.ApiVersionsResponse)
		got := map[int16]int16{}
		for _, k := range resp.ApiKeys {
			got[k.ApiKey] = k.MaxVersion
		}
		if _, ok := got[9999]; ok {
			t.Errorf("v%d: unknown api key 9999 reached the client", v)
		}
		for _, key := range []kmsg.Key{kmsg.Metadata, kmsg.Produce} {
			maxV, _ := protocol.KnownAPI(int16(key))
			if got[int16(key)] != maxV {
				t.Errorf("v%d: %s max version %d, want it capped to %d", v, kmsg.NameForKey(int16(key)), got[int16(key)], maxV)
			}
		}
	}
}

// TestShutdownDrainsInflight starts Shutdown while a Produce is held inside
// the broker: no new connection is accepted, the in-flight Produce still
// gets its acknowledgement, then Shutdown returns and the connection closes.
func TestShutdownDrainsInflight(t *testing.T) {
	t.Parallel()
	const topic = "drain"
	c := newCluster(t, kfake.SeedTopics(1, topic))
	entered, release, _ := holdFirstProduce(c)
	p := startProxy(t, c, nil)
	raw := dialLeader(t, p, c, topic, 0)
	req := produceRequest(topic, -1, oneRecordBatch(t))
	corr := raw.send(req)
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("produce never reached the broker")
	}

	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		done <- p.Shutdown(ctx)
	}()
	waitFor(t, 10*time.Second, "the listener to refuse connections", func() bool {
		conn, err := net.DialTimeout("tcp", p.addr(), time.Second)
		if err == nil {
			conn.Close()
		}
		return err != nil
	})
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned (%v) before the in-flight produce was answered", err)
	default:
	}
	close(release)
	resp := raw.recv(req, corr).(*kmsg.ProduceResponse)
	if code := resp.Topics[0].Partitions[0].ErrorCode; code != 0 {
		t.Fatalf("in-flight produce failed with %d", code)
	}
	if err := <-done; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	raw.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := readFrame(raw.conn); !errors.Is(err, io.EOF) && !isReset(err) {
		t.Fatalf("after shutdown the connection should be closed, read gave %v", err)
	}
}

// dialLeader connects to the proxy listener of the leader of topic/partition.
func dialLeader(t testing.TB, p *testProxy, c *kfake.Cluster, topic string, partition int32) *rawConn {
	t.Helper()
	addr, ok := p.nodes.Advertised(c.LeaderFor(topic, partition))
	if !ok {
		t.Fatalf("no proxy listener for the leader of %s/%d", topic, partition)
	}
	return dialRaw(t, addr)
}

// TestApiVersionsNewerThanKnown: a client opening with an ApiVersions newer
// than the proxy can decode gets what a broker gives for one newer than it
// supports (KIP-511): UNSUPPORTED_VERSION in a v0 body naming the highest
// version to retry with; the retry then works.
func TestApiVersionsNewerThanKnown(t *testing.T) {
	t.Parallel()
	p := startProxy(t, newCluster(t), nil)
	raw := dialRaw(t, p.addr())
	maxV, _ := protocol.KnownAPI(int16(kmsg.ApiVersions))
	frame := []byte{0, 0, 0, 0, 0, byte(kmsg.ApiVersions), 0, byte(maxV + 1), 0, 0, 0, 5, 0xff, 0xff, 0}
	frame[3] = byte(len(frame) - 4)
	if _, err := raw.conn.Write(frame); err != nil {
		t.Fatal(err)
	}
	body, err := readFrame(raw.conn)
	if err != nil {
		t.Fatal(err)
	}
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.SetVersion(0)
	if err := resp.ReadFrom(body[4:]); err != nil {
		t.Fatal(err)
	}
	if resp.ErrorCode != 35 || len(resp.ApiKeys) != 1 || resp.ApiKeys[0].ApiKey != int16(kmsg.ApiVersions) || resp.ApiKeys[0].MaxVersion != maxV {
		t.Fatalf("got %+v", resp)
	}
	retry := kmsg.NewPtrApiVersionsRequest()
	retry.SetVersion(maxV)
	retry.ClientSoftwareName, retry.ClientSoftwareVersion = "test", "1"
	if r := raw.roundTrip(retry).(*kmsg.ApiVersionsResponse); r.ErrorCode != 0 || len(r.ApiKeys) < 10 {
		t.Fatalf("retry at v%d: %+v", maxV, r)
	}
}
