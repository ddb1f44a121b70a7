package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/clock"
	"github.com/dedupproxy/dedupproxy/proxy"
)

// runDemo tells the story the proxy exists for, on an embedded cluster: a
// payment whose acknowledgement is lost, so the producer retries; once
// straight to the cluster and once through the proxy.
func runDemo(ctx context.Context, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "legacy-direct", "legacy-proxy", "payments-direct", "payments-proxy", "reuse-direct", "reuse-proxy"))
	if err != nil {
		return err
	}
	defer cluster.Close()
	var reached int
	cluster.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		reached++ // the cluster's single goroutine runs this; read it only between steps
		return nil, nil, false
	})
	direct := cluster.ListenAddrs()[0]
	srv := &proxy.Server{
		Config: proxy.Config{Upstream: []string{direct}, Listen: "127.0.0.1:0", Admin: "off"},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if err := srv.Start(ctx); err != nil {
		return err
	}
	defer srv.Shutdown(context.Background())
	viaProxy := srv.Addr().String()

	fmt.Fprintf(out, "An embedded Kafka cluster is running, and dedupproxy in front of it.\n\n")
	fmt.Fprintf(out, "1. A payment service charges account 7 $42. Its Kafka client has no idempotence (kafka-go,\n"+
		"   kafka-python, or any client with enable.idempotence=false: producer id -1). The cluster\n"+
		"   stores the charge, but the acknowledgement is lost on the way back (the connection drops).\n"+
		"   The producer retries on a new connection.\n\n")
	for _, path := range []struct{ name, addr, topic string }{{"straight to the cluster", direct, "legacy-direct"}, {"through dedupproxy     ", viaProxy, "legacy-proxy"}} {
		charge := batch(-1, -1, -1, "account=7 amount=42")
		if err := sendLosingAck(ctx, path.addr, path.topic, charge, func() bool { return hwm(ctx, direct, path.topic) >= 1 }); err != nil {
			return err
		}
		code, err := send(ctx, path.addr, path.topic, charge) // the retry
		if err != nil {
			return err
		}
		total, n, err := charged(ctx, direct, path.topic)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "   %s: retry answered %s; account 7 charged $%d in %d record(s)\n", path.name, codeName(code), total, n)
	}
	fmt.Fprintf(out, "\n   Kafka cannot tell a retry of a producer-id -1 batch from new data: it stores it again.\n"+
		"   The proxy recognises the same records arriving on a new connection within 2 minutes and\n"+
		"   answers with the original offset (dedupproxy_batches_total{outcome=\"legacy_duplicate\"}).\n\n")
	fmt.Fprintf(out, "2. The same with an idempotent producer (producer id, epoch and sequence numbers).\n\n")
	for _, path := range []struct{ name, addr, topic string }{{"straight to the cluster", direct, "payments-direct"}, {"through dedupproxy     ", viaProxy, "payments-proxy"}} {
		before := reached
		pid := int64(1000 + len(path.topic))
		charge := batch(pid, 0, 0, "account=7 amount=42")
		if err := sendLosingAck(ctx, path.addr, path.topic, charge, func() bool { return hwm(ctx, direct, path.topic) >= 1 }); err != nil {
			return err
		}
		code, err := send(ctx, path.addr, path.topic, charge) // the retry
		if err != nil {
			return err
		}
		total, n, err := charged(ctx, direct, path.topic)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "   %s: retry answered %s; account 7 charged $%d in %d record(s); writes that reached the cluster: %d\n",
			path.name, codeName(code), total, n, reached-before)
	}
	fmt.Fprintf(out, "\n   An idempotent producer is safe either way: Kafka's broker drops the retry itself.\n"+
		"   Through the proxy the broker never sees it: the proxy answers with the original offset,\n"+
		"   exactly as the broker would, and counts it in dedupproxy_batches_total{outcome=\"duplicate\"}.\n\n")

	fmt.Fprintf(out, "3. The same, but the client (kafkajs 2.2.4 does this) rolls its sequence number back after\n"+
		"   the failed send, and uses it for the NEXT payment: $17, different records, same sequence.\n\n")
	for _, path := range []struct{ name, addr, topic string }{{"straight to the cluster", direct, "reuse-direct"}, {"through dedupproxy     ", viaProxy, "reuse-proxy"}} {
		pid := int64(2000 + len(path.topic))
		if err := sendLosingAck(ctx, path.addr, path.topic, batch(pid, 0, 0, "account=7 amount=42"), func() bool { return hwm(ctx, direct, path.topic) >= 1 }); err != nil {
			return err
		}
		code, err := send(ctx, path.addr, path.topic, batch(pid, 0, 0, "account=7 amount=17"))
		if err != nil {
			return err
		}
		total, n, err := charged(ctx, direct, path.topic)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "   %s: the $17 payment was answered %s; the log holds %d record(s), $%d\n", path.name, codeName(code), n, total)
	}
	fmt.Fprintf(out, "\n   Straight to Kafka the $17 payment is acknowledged as a success and silently lost.\n"+
		"   Through the proxy it is refused, so the client sees the failure instead of losing money.\n")
	return nil
}

func codeName(code int16) string {
	if code == 0 {
		return "success"
	}
	if e, ok := kerr.ErrorForCode(code).(*kerr.Error); ok {
		return e.Message
	}
	return fmt.Sprintf("error %d", code)
}

// batch encodes a one-record v2 batch; producer id -1 is a legacy producer.
func batch(pid int64, epoch int16, seq int32, value string) []byte {
	b := kmsg.RecordBatch{Magic: 2, ProducerID: pid, ProducerEpoch: epoch, FirstSequence: seq, NumRecords: 1,
		FirstTimestamp: clock.Real.Now().UnixMilli(), MaxTimestamp: clock.Real.Now().UnixMilli()}
	var rec []byte
	rec = append(rec, 0)               // attributes
	rec = binary.AppendVarint(rec, 0)  // timestamp delta
	rec = binary.AppendVarint(rec, 0)  // offset delta
	rec = binary.AppendVarint(rec, -1) // null key
	rec = binary.AppendVarint(rec, int64(len(value)))
	rec = append(rec, value...)
	rec = binary.AppendVarint(rec, 0) // headers
	b.Records = append(binary.AppendVarint(nil, int64(len(rec))), rec...)
	raw := b.AppendTo(nil)
	binary.BigEndian.PutUint32(raw[8:], uint32(len(raw)-12))
	binary.BigEndian.PutUint32(raw[17:], crc32.Checksum(raw[21:], crc32.MakeTable(crc32.Castagnoli)))
	return raw
}

func produceFrame(topic string, records []byte) []byte {
	req := kmsg.NewPtrProduceRequest()
	req.SetVersion(9)
	req.Acks, req.TimeoutMillis = -1, 5000
	t := kmsg.NewProduceRequestTopic()
	t.Topic = topic
	p := kmsg.NewProduceRequestTopicPartition()
	p.Records = records
	t.Partitions = append(t.Partitions, p)
	req.Topics = append(req.Topics, t)
	return kmsg.NewRequestFormatter(kmsg.FormatterClientID("payments")).AppendRequest(nil, req, 1)
}

// askMetadata sends a Metadata request for topic on conn and reads the
// answer, as every client does before producing: the proxy decides batches
// only for topics it has seen in a Metadata response.
func askMetadata(conn net.Conn, topic string) error {
	req := kmsg.NewPtrMetadataRequest()
	req.SetVersion(9)
	t := kmsg.NewMetadataRequestTopic()
	t.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, t)
	if _, err := conn.Write(kmsg.NewRequestFormatter(kmsg.FormatterClientID("payments")).AppendRequest(nil, req, 0)); err != nil {
		return err
	}
	_, err := readResponse(conn)
	return err
}

func readResponse(conn net.Conn) ([]byte, error) {
	var head [4]byte
	if _, err := io.ReadFull(conn, head[:]); err != nil {
		return nil, err
	}
	body := make([]byte, binary.BigEndian.Uint32(head[:]))
	_, err := io.ReadFull(conn, body)
	return body, err
}

// sendLosingAck sends a Produce and drops the connection before reading the
// acknowledgement, once landed() says the write is stored.
func sendLosingAck(ctx context.Context, addr, topic string, records []byte, landed func() bool) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	conn.SetDeadline(clock.Real.Now().Add(10 * time.Second))
	if err := askMetadata(conn, topic); err != nil {
		conn.Close()
		return err
	}
	if _, err := conn.Write(produceFrame(topic, records)); err != nil {
		conn.Close()
		return err
	}
	for i := 0; i < 1000 && !landed(); i++ {
		t := clock.Real.NewTimer(5 * time.Millisecond)
		<-t.C
	}
	conn.Close() // the acknowledgement is lost
	if !landed() {
		return errors.New("demo: the first write never landed")
	}
	// The proxy may still be reading the broker's answer it owns: a retry
	// arriving first waits for it (decision in_flight_wait), so no pause.
	return nil
}

// send produces and returns the partition's error code.
func send(ctx context.Context, addr, topic string, records []byte) (int16, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	conn.SetDeadline(clock.Real.Now().Add(10 * time.Second))
	if err := askMetadata(conn, topic); err != nil {
		return 0, err
	}
	if _, err := conn.Write(produceFrame(topic, records)); err != nil {
		return 0, err
	}
	body, err := readResponse(conn)
	if err != nil {
		return 0, err
	}
	resp := kmsg.NewPtrProduceResponse()
	resp.SetVersion(9)
	if err := resp.ReadFrom(body[5:]); err != nil {
		return 0, err
	}
	return resp.Topics[0].Partitions[0].ErrorCode, nil
}

func hwm(ctx context.Context, addr, topic string) int64 {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		return -1
	}
	defer cl.Close()
	req := kmsg.NewPtrListOffsetsRequest()
	req.SetVersion(4)
	t := kmsg.NewListOffsetsRequestTopic()
	t.Topic = topic
	p := kmsg.NewListOffsetsRequestTopicPartition()
	p.Timestamp = -1
	t.Partitions = append(t.Partitions, p)
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil || len(resp.Topics) == 0 || len(resp.Topics[0].Partitions) == 0 {
		return -1
	}
	return resp.Topics[0].Partitions[0].Offset
}

// charged reads the topic straight from the cluster and sums the amounts.
func charged(ctx context.Context, addr, topic string) (total, n int, err error) {
	end := hwm(ctx, addr, topic)
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return 0, 0, err
	}
	defer cl.Close()
	for polls := 0; int64(n) < end && polls < 100; polls++ {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return 0, 0, ctx.Err()
		}
		fs.EachRecord(func(r *kgo.Record) {
			var acct, amount int
			if _, err := fmt.Sscanf(string(r.Value), "account=%d amount=%d", &acct, &amount); err == nil {
				total += amount
			}
			n++
		})
	}
	return total, n, nil
}
