package wire

import (
	"bufio"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// Sink is a single-broker Kafka-protocol server that answers ApiVersions,
// Metadata, InitProducerId and Produce immediately and keeps nothing. It
// exists so the benchmark can show the proxy's own ceiling: kfake runs every
// request on one goroutine and stores every record, so it saturates before a
// proxy in front of it does.
//
// Every topic exists with Partitions partitions led by node 0 (the sink
// itself). Produce is answered with error 0 and base offsets that increase
// per partition by the record count of the batches, so clients see a
// well-formed log; acks=0 Produce gets no response, as from Kafka.
type Sink struct {
	Partitions int32

	ln   net.Listener
	host string
	port int32

	nextPID atomic.Int64
	mu      sync.Mutex
	offsets map[sinkPartition]*atomic.Int64

	wg    sync.WaitGroup
	connM sync.Mutex
	conns map[net.Conn]struct{}
}

type sinkPartition struct {
	topic     string
	id        [16]byte
	partition int32
}

// sinkAPIs is what the sink claims to support. Produce starts at v3, the
// first with v2 record batches (idempotence needs them).
var sinkAPIs = []struct{ key, min int16 }{
	{int16(kmsg.Produce), 3},
	{int16(kmsg.Metadata), 0},
	{int16(kmsg.ApiVersions), 0},
	{int16(kmsg.InitProducerID), 0},
}

// StartSink listens on addr (use 127.0.0.1:0) and serves until Close.
func StartSink(addr string, partitions int32) (*Sink, error) {
	return StartSinkTLS(addr, partitions, nil)
}

// StartSinkTLS is StartSink speaking TLS with tc (plaintext when nil).
func StartSinkTLS(addr string, partitions int32, tc *tls.Config) (*Sink, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	ta := ln.Addr().(*net.TCPAddr)
	if tc != nil {
		ln = tls.NewListener(ln, tc)
	}
	s := &Sink{Partitions: partitions, ln: ln, host: ta.IP.String(), port: int32(ta.Port),
		offsets: map[sinkPartition]*atomic.Int64{}, conns: map[net.Conn]struct{}{}}
	s.nextPID.Store(1000)
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

// Addr is the sink's listen address.
func (s *Sink) Addr() string { return s.ln.Addr().String() }

// Close stops the listener and every connection and waits for them.
func (s *Sink) Close() {
	s.ln.Close()
	s.connM.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.connM.Unlock()
	s.wg.Wait()
}

func (s *Sink) acceptLoop() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return // closed
		}
		s.connM.Lock()
		s.conns[c] = struct{}{}
		s.connM.Unlock()
		s.wg.Add(1)
		go s.serveConn(c)
	}
}

// serveConn answers requests in order. Responses are buffered and flushed
// when no further request is already buffered, so a pipelining client gets
// several responses per write syscall.
func (s *Sink) serveConn(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		c.Close()
		s.connM.Lock()
		delete(s.conns, c)
		s.connM.Unlock()
	}()
	br := bufio.NewReaderSize(c, 256<<10)
	bw := bufio.NewWriterSize(c, 64<<10)
	var size [4]byte
	var in, out []byte
	for {
		if _, err := io.ReadFull(br, size[:]); err != nil {
			return
		}
		n := int(int32(binary.BigEndian.Uint32(size[:])))
		if n < 8 || n > 128<<20 {
			return
		}
		if cap(in) < n {
			in = make([]byte, n)
		}
		in = in[:n]
		if _, err := io.ReadFull(br, in); err != nil {
			return
		}
		var respond bool
		var err error
		out, respond, err = s.handle(in, out[:0])
		if err != nil {
			return // a benchmark client never sends what the sink cannot parse
		}
		if respond {
			if _, err := bw.Write(out); err != nil {
				return
			}
		}
		if br.Buffered() == 0 {
			if err := bw.Flush(); err != nil {
				return
			}
		}
	}
}

var errSinkRequest = errors.New("sink: bad request")

// handle decodes one request body (after the size prefix) and appends the
// whole response frame to out; respond is false for acks=0 Produce.
func (s *Sink) handle(body, out []byte) (_ []byte, respond bool, _ error) {
	key := int16(binary.BigEndian.Uint16(body[0:]))
	version := int16(binary.BigEndian.Uint16(body[2:]))
	corr := binary.BigEndian.Uint32(body[4:])
	req := kmsg.RequestForKey(key)
	if req == nil || version < 0 || version > req.MaxVersion() {
		return out, false, fmt.Errorf("%w: api %d v%d", errSinkRequest, key, version)
	}
	req.SetVersion(version)
	rest, err := skipRequestHeader(body, req.IsFlexible())
	if err != nil {
		return out, false, err
	}
	if err := req.ReadFrom(rest); err != nil {
		return out, false, fmt.Errorf("%w: %v", errSinkRequest, err)
	}
	var resp kmsg.Response
	switch r := req.(type) {
	case *kmsg.ApiVersionsRequest:
		resp = s.apiVersions(r)
	case *kmsg.MetadataRequest:
		resp = s.metadata(r)
	case *kmsg.InitProducerIDRequest:
		ip := r.ResponseKind().(*kmsg.InitProducerIDResponse)
		ip.ProducerID = s.nextPID.Add(1)
		resp = ip
	case *kmsg.ProduceRequest:
		pr := s.produce(r)
		if r.Acks == 0 {
			return out, false, nil
		}
		resp = pr
	default:
		return out, false, fmt.Errorf("%w: unsupported api %s", errSinkRequest, kmsg.NameForKey(key))
	}
	resp.SetVersion(version)
	out = append(out, 0, 0, 0, 0)
	out = binary.BigEndian.AppendUint32(out, corr)
	// The ApiVersions response header is always v0, even when the body is
	// flexible (KIP-511), so clients can parse it before knowing versions.
	if resp.IsFlexible() && key != int16(kmsg.ApiVersions) {
		out = append(out, 0) // empty tagged fields
	}
	out = resp.AppendTo(out)
	binary.BigEndian.PutUint32(out, uint32(len(out)-4))
	return out, true, nil
}

func (s *Sink) apiVersions(r *kmsg.ApiVersionsRequest) kmsg.Response {
	resp := r.ResponseKind().(*kmsg.ApiVersionsResponse)
	for _, a := range sinkAPIs {
		resp.ApiKeys = append(resp.ApiKeys, kmsg.ApiVersionsResponseApiKey{
			ApiKey: a.key, MinVersion: a.min, MaxVersion: kmsg.RequestForKey(a.key).MaxVersion()})
	}
	return resp
}

func (s *Sink) metadata(r *kmsg.MetadataRequest) kmsg.Response {
	resp := r.ResponseKind().(*kmsg.MetadataResponse)
	resp.Brokers = []kmsg.MetadataResponseBroker{{NodeID: 0, Host: s.host, Port: s.port}}
	cluster := "dedupproxy-bench-sink"
	resp.ClusterID = &cluster
	resp.ControllerID = 0
	for _, t := range r.Topics {
		if t.Topic == nil {
			continue // by topic id only: kgo asks by name, so this never happens here
		}
		name := *t.Topic
		mt := kmsg.NewMetadataResponseTopic()
		mt.Topic = &name
		mt.TopicID = sinkTopicID(name)
		for p := range s.Partitions {
			mp := kmsg.NewMetadataResponseTopicPartition()
			mp.Partition = p
			mp.Leader = 0
			mp.Replicas = []int32{0}
			mp.ISR = []int32{0}
			mt.Partitions = append(mt.Partitions, mp)
		}
		resp.Topics = append(resp.Topics, mt)
	}
	return resp
}

// produce acknowledges every partition with increasing offsets.
func (s *Sink) produce(r *kmsg.ProduceRequest) *kmsg.ProduceResponse {
	resp := r.ResponseKind().(*kmsg.ProduceResponse)
	resp.Topics = make([]kmsg.ProduceResponseTopic, len(r.Topics))
	for i, t := range r.Topics {
		rt := &resp.Topics[i]
		rt.Topic, rt.TopicID = t.Topic, t.TopicID
		rt.Partitions = make([]kmsg.ProduceResponseTopicPartition, len(t.Partitions))
		for j, p := range t.Partitions {
			rp := &rt.Partitions[j]
			*rp = kmsg.NewProduceResponseTopicPartition()
			rp.Partition = p.Partition
			rp.LogAppendTime = -1
			n := countRecords(p.Records)
			rp.BaseOffset = s.offset(sinkPartition{t.Topic, t.TopicID, p.Partition}).Add(n) - n
		}
	}
	return resp
}

func (s *Sink) offset(k sinkPartition) *atomic.Int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.offsets[k]
	if o == nil {
		k.topic = strings.Clone(k.topic)
		o = new(atomic.Int64)
		s.offsets[k] = o
	}
	return o
}

// countRecords sums NumRecords over the v2 record batches in records; a
// malformed tail is ignored (the sink keeps nothing, so only offsets suffer).
func countRecords(records []byte) int64 {
	var n int64
	for len(records) >= 61 {
		batchLen := int(int32(binary.BigEndian.Uint32(records[8:]))) + 12
		if batchLen < 61 || batchLen > len(records) {
			break
		}
		n += int64(int32(binary.BigEndian.Uint32(records[57:])))
		records = records[batchLen:]
	}
	if n == 0 {
		n = 1
	}
	return n
}

func sinkTopicID(name string) [16]byte {
	sum := sha256.Sum256([]byte(name))
	var id [16]byte
	copy(id[:], sum[:])
	return id
}

// skipRequestHeader returns the request body after the header: api key,
// version, correlation id, client id (a nullable int16 string even in
// flexible versions) and, for flexible requests, tagged fields (KIP-482).
func skipRequestHeader(b []byte, flexible bool) ([]byte, error) {
	if len(b) < 10 {
		return nil, errSinkRequest
	}
	cl := int(int16(binary.BigEndian.Uint16(b[8:])))
	b = b[10:]
	if cl > 0 {
		if cl > len(b) {
			return nil, errSinkRequest
		}
		b = b[cl:]
	}
	if flexible {
		return skipTags(b)
	}
	return b, nil
}

func skipTags(b []byte) ([]byte, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 {
		return nil, errSinkRequest
	}
	b = b[k:]
	for range n {
		if _, k = binary.Uvarint(b); k <= 0 {
			return nil, errSinkRequest
		}
		b = b[k:]
		size, k := binary.Uvarint(b)
		if k <= 0 || size > uint64(len(b)-k) {
			return nil, errSinkRequest
		}
		b = b[k+int(size):]
	}
	return b, nil
}
