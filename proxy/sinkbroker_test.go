package proxy

import (
	"encoding/binary"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/protocol/rewrite"
)

// sinkBroker is a one-node Kafka that keeps nothing: it answers
// ApiVersions, Metadata (one topic), ListOffsets and Fetch (an empty log)
// and Produce (every batch appended at the next offset, not stored). A
// test that measures the proxy's own memory uses it instead of kfake,
// which keeps every record in the same process.
type sinkBroker struct {
	ln         net.Listener
	topic      string
	partitions int32
	mu         sync.Mutex
	next       map[int32]int64
	wg         sync.WaitGroup
	// fetchBody, when set, answers every Fetch with the body it returns
	// for the request's version (the bytes after the response header),
	// written as it is without encoding: a Fetch relay benchmark measures
	// the proxy, not kmsg.
	fetchBody func(version int16) []byte
	// holdFirstProduce, when set, holds the answer to the first Produce
	// (acks != 0) until it is closed; held is set once it is held.
	holdFirstProduce chan struct{}
	held             atomic.Bool
	produces         atomic.Int64 // Produce requests (acks != 0) read
}

func newSinkBroker(t testing.TB, topic string, partitions int32) *sinkBroker {
	t.Helper()
	return newSinkBrokerWith(t, topic, partitions, nil)
}

// newSinkBrokerWith is newSinkBroker whose Fetch answers are fetchBody's.
func newSinkBrokerWith(t testing.TB, topic string, partitions int32, fetchBody func(version int16) []byte) *sinkBroker {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &sinkBroker{ln: ln, topic: topic, partitions: partitions, next: map[int32]int64{}, fetchBody: fetchBody}
	b.wg.Add(1)
	go b.accept()
	t.Cleanup(func() { ln.Close(); b.wg.Wait() })
	return b
}

func (b *sinkBroker) addr() string { return b.ln.Addr().String() }

func (b *sinkBroker) accept() {
	defer b.wg.Done()
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			defer c.Close()
			b.serve(c)
		}()
	}
}

func (b *sinkBroker) serve(c net.Conn) {
	var buf []byte
	for {
		body, nb, err := protocol.ReadFrame(c, buf, 100<<20, protocol.RequestMinSize)
		buf = nb
		if err != nil {
			return
		}
		h, err := protocol.ParseRequestHeader(body)
		if err != nil || h.BodyOffset == 0 {
			return
		}
		if h.APIKey == int16(kmsg.Fetch) && b.fetchBody != nil {
			body := b.fetchBody(h.APIVersion)
			head := binary.BigEndian.AppendUint32(nil, 0)
			head = binary.BigEndian.AppendUint32(head, uint32(h.CorrelationID))
			if h.APIVersion >= 12 {
				head = append(head, 0) // empty header tags
			}
			binary.BigEndian.PutUint32(head, uint32(len(head)-4+len(body)))
			if _, err := (&net.Buffers{head, body}).WriteTo(c); err != nil {
				return
			}
			continue
		}
		req := kmsg.RequestForKey(h.APIKey)
		req.SetVersion(h.APIVersion)
		if err := req.ReadFrom(body[h.BodyOffset:]); err != nil {
			return
		}
		if pr, ok := req.(*kmsg.ProduceRequest); ok && pr.Acks != 0 {
			if b.produces.Add(1) == 1 && b.holdFirstProduce != nil {
				b.held.Store(true)
				<-b.holdFirstProduce
			}
		}
		resp := b.answer(req)
		if resp == nil { // acks=0
			continue
		}
		out := binary.BigEndian.AppendUint32(make([]byte, 4), uint32(h.CorrelationID))
		if resp.IsFlexible() && h.APIKey != int16(kmsg.ApiVersions) {
			out = append(out, 0) // empty header tags
		}
		out = resp.AppendTo(out)
		binary.BigEndian.PutUint32(out, uint32(len(out)-4))
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

func (b *sinkBroker) answer(req kmsg.Request) kmsg.Response {
	switch r := req.(type) {
	case *kmsg.ApiVersionsRequest:
		resp := r.ResponseKind().(*kmsg.ApiVersionsResponse)
		for _, k := range []kmsg.Key{kmsg.Produce, kmsg.Fetch, kmsg.ListOffsets, kmsg.Metadata, kmsg.ApiVersions} {
			mv, _ := rewrite.MaxVersion(int16(k))
			v := kmsg.NewApiVersionsResponseApiKey()
			v.ApiKey, v.MinVersion, v.MaxVersion = int16(k), 0, mv
			resp.ApiKeys = append(resp.ApiKeys, v)
		}
		return resp
	case *kmsg.MetadataRequest:
		resp := r.ResponseKind().(*kmsg.MetadataResponse)
		host, port, _ := net.SplitHostPort(b.addr())
		p, _ := strconv.Atoi(port)
		br := kmsg.NewMetadataResponseBroker()
		br.NodeID, br.Host, br.Port = 0, host, int32(p)
		resp.Brokers = append(resp.Brokers, br)
		t := kmsg.NewMetadataResponseTopic()
		t.Topic = kmsg.StringPtr(b.topic)
		t.TopicID = [16]byte{0xfa, 0xce}
		for i := int32(0); i < b.partitions; i++ {
			mp := kmsg.NewMetadataResponseTopicPartition()
			mp.Partition, mp.Leader = i, 0
			t.Partitions = append(t.Partitions, mp)
		}
		resp.Topics = append(resp.Topics, t)
		return resp
	case *kmsg.ListOffsetsRequest:
		resp := r.ResponseKind().(*kmsg.ListOffsetsResponse)
		for _, rt := range r.Topics {
			t := kmsg.NewListOffsetsResponseTopic()
			t.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				p := kmsg.NewListOffsetsResponseTopicPartition()
				p.Partition, p.Offset, p.Timestamp = rp.Partition, 0, -1
				t.Partitions = append(t.Partitions, p)
			}
			resp.Topics = append(resp.Topics, t)
		}
		return resp
	case *kmsg.FetchRequest:
		resp := r.ResponseKind().(*kmsg.FetchResponse)
		for _, rt := range r.Topics {
			t := kmsg.NewFetchResponseTopic()
			t.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				p := kmsg.NewFetchResponseTopicPartition()
				p.Partition = rp.Partition
				t.Partitions = append(t.Partitions, p)
			}
			resp.Topics = append(resp.Topics, t)
		}
		return resp
	case *kmsg.ProduceRequest:
		if r.Acks == 0 {
			return nil
		}
		resp := r.ResponseKind().(*kmsg.ProduceResponse)
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, rt := range r.Topics {
			t := kmsg.NewProduceResponseTopic()
			t.Topic, t.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				var bh protocol.BatchHeader
				n := int64(1)
				if _, err := protocol.ReadBatch(rp.Records, &bh); err == nil {
					n = int64(bh.NumRecords)
				}
				p := kmsg.NewProduceResponseTopicPartition()
				p.Partition, p.BaseOffset, p.LogAppendTime = rp.Partition, b.next[rp.Partition], -1
				b.next[rp.Partition] += n
				t.Partitions = append(t.Partitions, p)
			}
			resp.Topics = append(resp.Topics, t)
		}
		return resp
	}
	return nil
}
