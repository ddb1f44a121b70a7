package rewrite

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

type topicRecorder struct {
	fixedMapper
	got []TopicInfo
}

func (r *topicRecorder) ObserveTopics(ts []TopicInfo) { r.got = append(r.got, ts...) }

type fixedMapper struct{}

func (fixedMapper) MapBroker(int32, string, int32) (string, int32) { return "proxy", 1 }

// TestMetadataTopicsObserved: the name↔ID pairs of a Metadata response reach
// a TopicObserver, topics with an error or without a name do not.
func TestMetadataTopicsObserved(t *testing.T) {
	for _, v := range []int16{4, 9, 10, 12} {
		resp := kmsg.NewPtrMetadataResponse()
		resp.SetVersion(v)
		b := kmsg.NewMetadataResponseBroker()
		b.NodeID, b.Host, b.Port = 1, "kafka-1", 9092
		resp.Brokers = append(resp.Brokers, b)
		for i, name := range []string{"orders", "missing", ""} {
			tp := kmsg.NewMetadataResponseTopic()
			n := name
			tp.Topic = &n
			tp.TopicID[0] = byte(i + 1)
			if name == "missing" {
				tp.ErrorCode = 3
			}
			resp.Topics = append(resp.Topics, tp)
		}
		r := &topicRecorder{}
		if _, _, err := Addresses(nil, 3, v, resp.AppendTo(nil), r); err != nil {
			t.Fatalf("v%d: %v", v, err)
		}
		if len(r.got) != 1 || r.got[0].Name != "orders" {
			t.Fatalf("v%d: observed %+v, want only orders", v, r.got)
		}
		wantID := [16]byte{}
		if v >= 10 {
			wantID[0] = 1
		}
		if r.got[0].ID != wantID {
			t.Fatalf("v%d: id %x, want %x", v, r.got[0].ID, wantID)
		}
	}
}
