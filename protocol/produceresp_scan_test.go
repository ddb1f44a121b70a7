package protocol

import (
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// produceResponseFixture builds a response with several topics and
// partitions, record errors and error messages where the version has them,
// and unknown tags at every flexible level.
func produceResponseFixture(version int16) *kmsg.ProduceResponse {
	resp := kmsg.NewPtrProduceResponse()
	resp.SetVersion(version)
	resp.ThrottleMillis = 7
	for ti := 0; ti < 3; ti++ {
		t := kmsg.NewProduceResponseTopic()
		t.Topic = []string{"orders", "", "payments-éü"}[ti]
		t.TopicID = [16]byte{byte(ti + 1), 9}
		if version >= 9 {
			t.UnknownTags.Set(99, []byte("topic tag"))
		}
		for pi := 0; pi < ti+1; pi++ {
			p := kmsg.NewProduceResponseTopicPartition()
			p.Partition = int32(pi * 3)
			p.ErrorCode = int16(pi)
			p.BaseOffset = int64(1000*ti + pi)
			p.LogAppendTime = int64(-1 + pi)
			p.LogStartOffset = int64(5 * pi)
			if pi == 1 {
				re := kmsg.NewProduceResponseTopicPartitionErrorRecord()
				re.RelativeOffset = 3
				re.ErrorMessage = kmsg.StringPtr("bad record")
				p.ErrorRecords = append(p.ErrorRecords, re)
				p.ErrorMessage = kmsg.StringPtr("some records failed")
			}
			if version >= 10 && pi == 0 {
				p.CurrentLeader.LeaderID, p.CurrentLeader.LeaderEpoch = 2, 5
			}
			if version >= 9 {
				p.UnknownTags.Set(77, []byte{1, 2, 3})
			}
			t.Partitions = append(t.Partitions, p)
		}
		resp.Topics = append(resp.Topics, t)
	}
	if version >= 10 {
		b := kmsg.NewProduceResponseBroker()
		b.NodeID, b.Host, b.Port = 1, "broker-1", 9092
		resp.Brokers = append(resp.Brokers, b)
	}
	return resp
}

// TestProduceResponseScannerAgreesWithKmsg compares every field the scanner
// yields with kmsg's decoding, at every version from 3 to the newest.
func TestProduceResponseScannerAgreesWithKmsg(t *testing.T) {
	maxV := kmsg.NewPtrProduceResponse().MaxVersion()
	for v := int16(3); v <= maxV; v++ {
		want := produceResponseFixture(v)
		body := want.AppendTo(nil)
		got := kmsg.NewPtrProduceResponse()
		got.SetVersion(v)
		if err := got.ReadFrom(body); err != nil {
			t.Fatalf("v%d: kmsg: %v", v, err)
		}
		var s ProduceResponseScanner
		if err := s.Reset(body, v); err != nil {
			t.Fatalf("v%d: %v", v, err)
		}
		n := 0
		for _, kt := range got.Topics {
			for _, kp := range kt.Partitions {
				if !s.Next() {
					t.Fatalf("v%d: scanner stopped after %d partitions: %v", v, n, s.Err())
				}
				p := s.Partition()
				if v >= 13 && p.TopicID != kt.TopicID || v < 13 && string(p.Topic) != kt.Topic {
					t.Fatalf("v%d partition %d: topic %q/%x, want %q/%x", v, n, p.Topic, p.TopicID, kt.Topic, kt.TopicID)
				}
				wantLSO := kp.LogStartOffset
				if v < 5 {
					wantLSO = -1
				}
				if p.Partition != kp.Partition || p.ErrorCode != kp.ErrorCode || p.BaseOffset != kp.BaseOffset ||
					p.LogAppendTime != kp.LogAppendTime || p.LogStartOffset != wantLSO {
					t.Fatalf("v%d partition %d: %+v, kmsg %+v", v, n, p, kp)
				}
				n++
			}
		}
		if s.Next() || s.Err() != nil {
			t.Fatalf("v%d: scanner went past the end or failed: %v", v, s.Err())
		}
		if n != 6 {
			t.Fatalf("v%d: %d partitions", v, n)
		}
		// Every truncation is an error, never a panic or a silent stop.
		for cut := 0; cut < len(body)-4; cut++ { // the last bytes are throttle and top-level tags
			var s ProduceResponseScanner
			if s.Reset(body[:cut], v) != nil {
				continue
			}
			for s.Next() {
			}
			if s.Err() == nil && countPartitions(body[:cut], v) == 6 {
				continue
			}
			if s.Err() == nil {
				t.Fatalf("v%d cut at %d: no error", v, cut)
			}
			if !errors.Is(s.Err(), ErrMalformedResponse) {
				t.Fatalf("v%d cut at %d: %v", v, cut, s.Err())
			}
		}
	}
}

func countPartitions(body []byte, v int16) int {
	var s ProduceResponseScanner
	s.Reset(body, v)
	n := 0
	for s.Next() {
		n++
	}
	return n
}

func TestProduceResponseScannerNoAllocs(t *testing.T) {
	body := produceResponseFixture(13).AppendTo(nil)
	var s ProduceResponseScanner
	allocs := testing.AllocsPerRun(1000, func() {
		s.Reset(body, 13)
		for s.Next() {
			sinkU32 += uint32(s.Partition().BaseOffset)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations", allocs)
	}
}
