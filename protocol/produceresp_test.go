package protocol

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// keepPatterns are the keep functions the reduce and merge tests try.
var keepPatterns = []struct {
	name string
	keep func(ti, pi int) bool
}{
	{"none", func(int, int) bool { return false }},
	{"all", func(int, int) bool { return true }},
	{"alternate", func(ti, pi int) bool { return (ti+pi)%2 == 0 }},
	{"first topic", func(ti, _ int) bool { return ti == 0 }},
	{"last partitions", func(_, pi int) bool { return pi >= 2 }},
}

// filterRequest is the reference ReduceProduce: decode with kmsg, filter,
// drop topics left empty.
func filterRequest(t *testing.T, body []byte, version int16, keep func(ti, pi int) bool) *kmsg.ProduceRequest {
	t.Helper()
	req := kmsg.NewPtrProduceRequest()
	req.Version = version
	if err := req.ReadFrom(body); err != nil {
		t.Fatal(err)
	}
	var topics []kmsg.ProduceRequestTopic
	for ti, tp := range req.Topics {
		var parts []kmsg.ProduceRequestTopicPartition
		for pi, p := range tp.Partitions {
			if keep(ti, pi) {
				parts = append(parts, p)
			}
		}
		if len(parts) > 0 {
			tp.Partitions = parts
			topics = append(topics, tp)
		}
	}
	req.Topics = topics
	return req
}

func decodeRequest(t *testing.T, body []byte, version int16) *kmsg.ProduceRequest {
	t.Helper()
	req := kmsg.NewPtrProduceRequest()
	req.Version = version
	if err := req.ReadFrom(body); err != nil {
		t.Fatalf("reduced request does not decode: %v", err)
	}
	return req
}

// TestReduceProduceKeepsChosenPartitions: the reduced request decodes with
// kmsg to exactly the kept partitions, in order, with the request-level
// fields and every unknown tag (KIP-482) preserved.
func TestReduceProduceKeepsChosenPartitions(t *testing.T) {
	t.Parallel()
	for _, v := range scanVersions {
		for _, kp := range keepPatterns {
			t.Run(fmt.Sprintf("v%d/%s", v, kp.name), func(t *testing.T) {
				t.Parallel()
				body := testProduceRequest(v, strPtr("txn"), 4, 5).AppendTo(nil)
				prefix := []byte("prefix")
				out, n, err := ReduceProduce(slices.Clone(prefix), body, v, kp.keep)
				if err != nil {
					t.Fatal(err)
				}
				if string(out[:len(prefix)]) != string(prefix) {
					t.Fatal("dst prefix overwritten")
				}
				got := decodeRequest(t, out[len(prefix):], v)
				want := filterRequest(t, body, v, kp.keep)
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("reduced request\n got %+v\nwant %+v", got, want)
				}
				if wantN := len(kmsgPartitions(want)); n != wantN {
					t.Fatalf("kept %d, want %d", n, wantN)
				}
				if _, mismatch := compareScan(out[len(prefix):], v); mismatch != nil {
					t.Fatal(mismatch)
				}
			})
		}
	}
}

// TestReduceProduceWideCompactCounts: more than 126 topics or partitions
// need a multi-byte compact array length (KIP-482 uvarint length+1), which
// ReduceProduce widens in place.
func TestReduceProduceWideCompactCounts(t *testing.T) {
	t.Parallel()
	for _, v := range []int16{8, 9, 13} {
		for _, shape := range [][2]int{{200, 1}, {1, 300}} {
			body := testProduceRequest(v, nil, shape[0], shape[1]).AppendTo(nil)
			for _, kp := range keepPatterns {
				out, _, err := ReduceProduce(nil, body, v, kp.keep)
				if err != nil {
					t.Fatal(err)
				}
				if got, want := decodeRequest(t, out, v), filterRequest(t, body, v, kp.keep); !reflect.DeepEqual(got, want) {
					t.Fatalf("v%d %v %s: reduced request differs", v, shape, kp.name)
				}
			}
		}
	}
}

// TestReduceProduceMalformed: a malformed body is an error and dst comes
// back unchanged.
func TestReduceProduceMalformed(t *testing.T) {
	t.Parallel()
	body := testProduceRequest(9, nil, 2, 2).AppendTo(nil)
	dst := []byte("keep")
	for i := range len(body) {
		out, n, err := ReduceProduce(dst, body[:i], 9, func(int, int) bool { return true })
		if !errors.Is(err, ErrMalformedProduce) || n != 0 || string(out) != "keep" {
			t.Fatalf("truncated at %d: %q, %d, %v", i, out, n, err)
		}
	}
}

// upstreamAnswer is what the fake upstream answers for a partition it got:
// distinct values derived from the partition so the merge can be checked.
func upstreamAnswer(p int32, topicIdx int) kmsg.ProduceResponseTopicPartition {
	rp := kmsg.NewProduceResponseTopicPartition()
	rp.Partition = p
	rp.BaseOffset = int64(1000*topicIdx) + int64(p)*10
	rp.LogAppendTime = 5000 + int64(p)
	rp.LogStartOffset = 7 + int64(p)
	if p%4 == 3 {
		rp.ErrorCode = kerr.NotLeaderForPartition.Code
		rp.BaseOffset, rp.LogAppendTime, rp.LogStartOffset = -1, -1, -1
		rp.CurrentLeader.LeaderID, rp.CurrentLeader.LeaderEpoch = 2, 9
		msg := "not leader"
		rp.ErrorMessage = &msg
	}
	return rp
}

// fakeUpstream answers a reduced request the way a broker could: every
// partition answered, topics in reverse order (Kafka builds responses from a
// map, so the order is not guaranteed), throttle and KIP-951 node endpoints
// set.
func fakeUpstream(t *testing.T, reduced []byte, version int16) []byte {
	t.Helper()
	req := decodeRequest(t, reduced, version)
	resp := kmsg.NewPtrProduceResponse()
	resp.Version = version
	resp.ThrottleMillis = 42
	if version >= 10 {
		b := kmsg.NewProduceResponseBroker()
		b.NodeID, b.Host, b.Port = 2, "broker-2", 9092
		resp.Brokers = append(resp.Brokers, b)
	}
	for i := len(req.Topics) - 1; i >= 0; i-- {
		tp := req.Topics[i]
		rt := kmsg.NewProduceResponseTopic()
		rt.Topic, rt.TopicID = tp.Topic, tp.TopicID
		for _, p := range tp.Partitions {
			rt.Partitions = append(rt.Partitions, upstreamAnswer(p.Partition, topicNumber(tp)))
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp.AppendTo(nil)
}

// topicNumber recovers t from testProduceRequest's "topic-t" / ID.
func topicNumber(tp kmsg.ProduceRequestTopic) int {
	var n int
	if _, err := fmt.Sscanf(tp.Topic, "topic-%d", &n); err == nil {
		return n
	}
	return int(tp.TopicID[15])
}

// localAnswer is the proxy's own answer: for even partitions a duplicate
// (error 0, the original base offset and append time), for odd ones
// OUT_OF_ORDER_SEQUENCE_NUMBER with the real log start offset
// (docs/kafka-rules.md §4).
func localAnswer(ti, pi int) LocalPartitionResult {
	if pi%2 == 0 {
		return LocalPartitionResult{ErrorCode: 0, BaseOffset: int64(100000 + ti*100 + pi), LogAppendTime: 1700000000000 + int64(pi), LogStartOffset: 3}
	}
	return LocalPartitionResult{ErrorCode: kerr.OutOfOrderSequenceNumber.Code, BaseOffset: -1, LogAppendTime: -1, LogStartOffset: 3}
}

// TestMergeProduceResponse: all-local, all-upstream and mixed answers come
// back in the client's request order, decode with kmsg at the request
// version, carry topic IDs at v13 (KIP-516), and keep upstream's throttle
// and NodeEndpoints (KIP-951); fields absent at a version decode to kmsg's
// defaults.
func TestMergeProduceResponse(t *testing.T) {
	t.Parallel()
	for _, v := range scanVersions {
		for _, kp := range keepPatterns { // keep = sent upstream
			t.Run(fmt.Sprintf("v%d/upstream=%s", v, kp.name), func(t *testing.T) {
				t.Parallel()
				body := testProduceRequest(v, nil, 4, 5).AppendTo(nil)
				reduced, n, err := ReduceProduce(nil, body, v, kp.keep)
				if err != nil {
					t.Fatal(err)
				}
				var upstream []byte
				if n > 0 {
					upstream = fakeUpstream(t, reduced, v)
				}
				local := func(ti, pi int) (LocalPartitionResult, bool) {
					if kp.keep(ti, pi) {
						return LocalPartitionResult{}, false
					}
					return localAnswer(ti, pi), true
				}
				out, err := MergeProduceResponse([]byte{0xaa}, v, body, upstream, local)
				if err != nil {
					t.Fatal(err)
				}
				if out[0] != 0xaa {
					t.Fatal("dst prefix overwritten")
				}
				resp := kmsg.NewPtrProduceResponse()
				resp.Version = v
				if err := resp.ReadFrom(out[1:]); err != nil {
					t.Fatalf("merged response does not decode: %v", err)
				}
				req := decodeRequest(t, body, v)
				checkMerged(t, req, resp, n > 0, local)
			})
		}
	}
}

// checkMerged compares a merged response with the request and the answers.
func checkMerged(t *testing.T, req *kmsg.ProduceRequest, resp *kmsg.ProduceResponse, sentUp bool, local func(ti, pi int) (LocalPartitionResult, bool)) {
	t.Helper()
	v := req.Version
	if sentUp && resp.ThrottleMillis != 42 && v >= 1 {
		t.Errorf("throttle %d, want upstream's 42", resp.ThrottleMillis)
	}
	if wantBrokers := sentUp && v >= 10; (len(resp.Brokers) == 1) != wantBrokers {
		t.Errorf("node endpoints %+v, want upstream's: %v", resp.Brokers, wantBrokers)
	}
	rt := 0
	for ti, tp := range req.Topics {
		if len(tp.Partitions) == 0 {
			continue
		}
		if rt >= len(resp.Topics) {
			t.Fatalf("response has %d topics, request more", len(resp.Topics))
		}
		got := resp.Topics[rt]
		rt++
		if v >= 13 && got.TopicID != tp.TopicID || v < 13 && got.Topic != tp.Topic {
			t.Fatalf("topic %d is %q/%x, want %q/%x", ti, got.Topic, got.TopicID, tp.Topic, tp.TopicID)
		}
		if len(got.Partitions) != len(tp.Partitions) {
			t.Fatalf("topic %d: %d partitions, want %d", ti, len(got.Partitions), len(tp.Partitions))
		}
		for pi, p := range tp.Partitions {
			g := got.Partitions[pi]
			var want kmsg.ProduceResponseTopicPartition
			if r, ok := local(ti, pi); ok {
				want = kmsg.NewProduceResponseTopicPartition()
				want.Partition = p.Partition
				want.ErrorCode, want.BaseOffset, want.LogAppendTime, want.LogStartOffset = r.ErrorCode, r.BaseOffset, r.LogAppendTime, r.LogStartOffset
			} else {
				want = upstreamAnswer(p.Partition, topicNumber(tp))
			}
			// Fields a version does not carry decode to kmsg's defaults.
			if v < 5 {
				want.LogStartOffset = -1
			}
			if v < 8 {
				want.ErrorMessage = nil
			}
			if v < 9 { // kmsg carries the tagged CurrentLeader at every flexible version
				want.CurrentLeader.LeaderID, want.CurrentLeader.LeaderEpoch = -1, -1
			}
			if !reflect.DeepEqual(g, want) {
				t.Errorf("topic %d partition %d:\n got %+v\nwant %+v", ti, pi, g, want)
			}
		}
	}
	if rt != len(resp.Topics) {
		t.Errorf("response has %d topics, want %d", len(resp.Topics), rt)
	}
}

// TestMergeDuplicateAnswer: the proxy's answer to a duplicate is what Kafka
// sends (UnifiedLog.analyzeAndValidateProducerState, docs/kafka-rules.md
// §4): error 0 with the original batch's base offset, at every version.
func TestMergeDuplicateAnswer(t *testing.T) {
	t.Parallel()
	for _, v := range scanVersions {
		body := testProduceRequest(v, nil, 1, 1).AppendTo(nil)
		dup := LocalPartitionResult{ErrorCode: 0, BaseOffset: 4242, LogAppendTime: 1700000000999, LogStartOffset: 17}
		out, err := MergeProduceResponse(nil, v, body, nil, func(int, int) (LocalPartitionResult, bool) { return dup, true })
		if err != nil {
			t.Fatal(err)
		}
		resp := kmsg.NewPtrProduceResponse()
		resp.Version = v
		if err := resp.ReadFrom(out); err != nil {
			t.Fatal(err)
		}
		p := resp.Topics[0].Partitions[0]
		wantLSO := dup.LogStartOffset
		if v < 5 {
			wantLSO = -1
		}
		if p.ErrorCode != 0 || p.BaseOffset != 4242 || p.LogAppendTime != dup.LogAppendTime || p.LogStartOffset != wantLSO {
			t.Errorf("v%d: %+v", v, p)
		}
	}
}

// TestMergeProduceResponseErrors: a partition sent upstream but not
// answered, an undecodable upstream response, and nothing from upstream when
// something was sent are errors wrapping ErrProduceResponse.
func TestMergeProduceResponseErrors(t *testing.T) {
	t.Parallel()
	const v = 9
	body := testProduceRequest(v, nil, 2, 3).AppendTo(nil)
	upOnly := func(ti, pi int) (LocalPartitionResult, bool) { return localAnswer(ti, pi), ti != 0 || pi != 0 }
	reduced, _, err := ReduceProduce(nil, body, v, func(ti, pi int) bool { return ti == 0 && pi == 0 })
	if err != nil {
		t.Fatal(err)
	}
	full := fakeUpstream(t, reduced, v)
	empty := kmsg.NewPtrProduceResponse()
	empty.Version = v
	for name, upstream := range map[string][]byte{
		"missing partition": empty.AppendTo(nil),
		"truncated":         full[:len(full)-3],
		"nil":               nil,
	} {
		if _, err := MergeProduceResponse(nil, v, body, upstream, upOnly); !errors.Is(err, ErrProduceResponse) {
			t.Errorf("%s: error %v, want ErrProduceResponse", name, err)
		}
	}
	if _, err := MergeProduceResponse(nil, v, body[:len(body)-1], full, upOnly); !errors.Is(err, ErrMalformedProduce) {
		t.Errorf("malformed request: error %v", err)
	}
}

// TestAppendResponseHeader: response header v1 (flexible, KIP-482) adds an
// empty tag section, except for ApiVersions, whose response header is always
// v0 (KIP-511); ResponseBodyOffset must agree.
func TestAppendResponseHeader(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		key, version int16
		want         []byte
	}{
		{int16(kmsg.Produce), 8, []byte{0, 0, 1, 2}},
		{int16(kmsg.Produce), 9, []byte{0, 0, 1, 2, 0}},
		{int16(kmsg.Produce), 13, []byte{0, 0, 1, 2, 0}},
		{int16(kmsg.ApiVersions), 3, []byte{0, 0, 1, 2}},
		{int16(kmsg.Metadata), 9, []byte{0, 0, 1, 2, 0}},
	} {
		got := AppendResponseHeader([]byte{}, tc.key, tc.version, 0x102)
		if string(got) != string(tc.want) {
			t.Errorf("%s v%d: %x, want %x", kmsg.NameForKey(tc.key), tc.version, got, tc.want)
		}
		frame := append(got, 9, 9)
		if off, err := ResponseBodyOffset(frame, tc.key, tc.version); err != nil || off != len(got) || ResponseCorrelationID(frame) != 0x102 {
			t.Errorf("%s v%d: body offset %d, %v", kmsg.NameForKey(tc.key), tc.version, off, err)
		}
	}
}

func BenchmarkReduceProduce(b *testing.B) {
	body := testProduceRequest(13, nil, 4, 8).AppendTo(nil)
	dst := make([]byte, 0, len(body))
	keep := func(ti, pi int) bool { return (ti+pi)%2 == 0 }
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		dst, _, _ = ReduceProduce(dst[:0], body, 13, keep)
	}
}

func BenchmarkMergeProduceResponse(b *testing.B) {
	body := testProduceRequest(13, nil, 4, 8).AppendTo(nil)
	local := func(ti, pi int) (LocalPartitionResult, bool) { return localAnswer(ti, pi), true }
	var dst []byte
	b.ReportAllocs()
	for b.Loop() {
		dst, _ = MergeProduceResponse(dst[:0], 13, body, nil, local)
	}
}
