package rewrite

import (
	"fmt"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestRewriteTopTagsSameSize: a Fetch v16+ response's NodeEndpoints (KIP-951)
// rewritten in a tag section of unchanged size, for proxy addresses shorter,
// equal and longer than the broker's, and 1 to 3 nodes: the response still
// decodes with kmsg, keeps its other tags and records, and names only the
// proxy's addresses, or, where the rewrite cannot fit, no node at all.
func TestRewriteTopTagsSameSize(t *testing.T) {
	t.Parallel()
	const brokerHost = "broker-1.kafka.internal.example"
	for _, v := range []int16{16, 17} {
		if mv, _ := MaxVersion(int16(kmsg.Fetch)); v > mv {
			continue
		}
		for nodes := 1; nodes <= 3; nodes++ {
			for delta := -len(brokerHost) + 1; delta <= 40; delta++ {
				proxyHost := strings.Repeat("p", len(brokerHost)+delta)
				name := fmt.Sprintf("v%d/nodes=%d/delta=%d", v, nodes, delta)
				resp := kmsg.NewPtrFetchResponse()
				resp.SetVersion(v)
				tp := kmsg.NewFetchResponseTopic()
				tp.TopicID = [16]byte{1}
				pp := kmsg.NewFetchResponseTopicPartition()
				pp.RecordBatches = []byte("records")
				pp.ErrorCode = 6
				tp.Partitions = append(tp.Partitions, pp)
				resp.Topics = append(resp.Topics, tp)
				for i := 0; i < nodes; i++ {
					b := kmsg.NewFetchResponseBroker()
					b.NodeID, b.Host, b.Port = int32(i), brokerHost, 9092
					resp.Brokers = append(resp.Brokers, b)
				}
				resp.UnknownTags.Set(5, []byte("kept"))
				body := resp.AppendTo(nil)
				w := newRespWalker(body)
				w.walkFetch(v)
				tagsAt := w.pos()
				m := mapperFunc(func(id int32, _ string, _ int32) (string, int32) { return proxyHost, 30000 + id })
				out, changed, err := TopTagsSameSize(nil, body[tagsAt:], m)
				if err != nil || !changed || len(out) != len(body)-tagsAt {
					t.Fatalf("%s: changed %v, %d bytes for %d, err %v", name, changed, len(out), len(body)-tagsAt, err)
				}
				got := kmsg.NewPtrFetchResponse()
				got.SetVersion(v)
				if err := got.ReadFrom(append(body[:tagsAt:tagsAt], out...)); err != nil {
					t.Fatalf("%s: kmsg cannot decode the result: %v", name, err)
				}
				if string(got.Topics[0].Partitions[0].RecordBatches) != "records" {
					t.Fatalf("%s: records changed", name)
				}
				var kept string
				got.UnknownTags.Each(func(k uint32, v []byte) {
					if k == 5 {
						kept = string(v)
					}
				})
				if kept != "kept" {
					t.Fatalf("%s: tag 5 is %q", name, kept)
				}
				if len(got.Brokers) != 0 && len(got.Brokers) != nodes {
					t.Fatalf("%s: %d nodes, want %d or none", name, len(got.Brokers), nodes)
				}
				for i, b := range got.Brokers {
					if b.Host != proxyHost || b.Port != 30000+int32(i) {
						t.Fatalf("%s: node %d is %s:%d, want the proxy's", name, b.NodeID, b.Host, b.Port)
					}
				}
				// A rewrite that fits keeps the nodes; only one too long,
				// or one or two bytes short, leaves them out.
				fits := delta <= 0 && delta != -1 && delta != -2
				if nodes > 1 && delta < 0 {
					fits = delta*nodes < -2 || delta == 0
				}
				if fits && len(got.Brokers) == 0 {
					t.Fatalf("%s: the nodes were left out though the rewrite fits", name)
				}
			}
		}
	}
}

// TestRewriteTopTagsSameSizeNoNodes: a section without nodes is returned as
// it is; a malformed one is an error.
func TestRewriteTopTagsSameSizeNoNodes(t *testing.T) {
	t.Parallel()
	m := mapperFunc(func(int32, string, int32) (string, int32) { t.Fatal("mapper called"); return "", 0 })
	for _, tags := range [][]byte{{0}, {1, 5, 1, 'x'}, {1, 0, 1, 1}} {
		out, changed, err := TopTagsSameSize(nil, tags, m)
		if err != nil || changed || string(out) != string(tags) {
			t.Fatalf("%v: %v %v %v", tags, out, changed, err)
		}
	}
	for _, tags := range [][]byte{{}, {1}, {1, 0, 5, 1}, {0, 0}} {
		if _, _, err := TopTagsSameSize(nil, tags, m); err == nil {
			t.Fatalf("%v: no error", tags)
		}
	}
}

// FuzzRewriteTopTagsSameSize holds the same-size rewrite of a Fetch v16+
// top-level tag section to its invariants: it never panics; when it
// succeeds, the section keeps its length, still walks, decodes with kmsg
// inside a Fetch response, and every node it names carries the mapper's
// address (never the input's); a section it leaves unchanged names no
// node.
func FuzzRewriteTopTagsSameSize(f *testing.F) {
	for _, host := range []string{"b", "broker-0.kafka.internal.example"} {
		resp := kmsg.NewPtrFetchResponse()
		resp.SetVersion(16)
		b := kmsg.NewFetchResponseBroker()
		b.NodeID, b.Host, b.Port = 3, host, 9092
		resp.Brokers = append(resp.Brokers, b)
		resp.UnknownTags.Set(9, []byte("x"))
		body := resp.AppendTo(nil)
		f.Add(body[4+2+4+1:]) // after ThrottleMillis, ErrorCode, SessionID, empty Topics
	}
	f.Add([]byte{})
	f.Add([]byte{0})
	f.Add([]byte{1, 0, 1, 1})
	f.Add([]byte{1, 0, 12, 2, 0, 0, 0, 1, 2, 'h', 0, 0, 0, 1, 0, 0})
	mapHost := func(id int32) (string, int32) {
		return strings.Repeat("p", int(uint32(id)%40)+1), 30000 + int32(uint32(id)%1000)
	}
	m := mapperFunc(func(id int32, _ string, _ int32) (string, int32) { return mapHost(id) })
	f.Fuzz(func(t *testing.T, tags []byte) {
		out, changed, err := TopTagsSameSize(nil, tags, m)
		if err != nil {
			return
		}
		if len(out) != len(tags) {
			t.Fatalf("length %d, want %d", len(out), len(tags))
		}
		w := newRespWalker(out)
		hasNodes := w.walkTopTags()
		if !w.Ok() || len(w.Src) != 0 {
			t.Fatal("the result does not walk")
		}
		if !changed && hasNodes {
			t.Fatal("unchanged, yet it names nodes")
		}
		body := append([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, out...)
		resp := kmsg.NewPtrFetchResponse()
		resp.SetVersion(16)
		if err := resp.ReadFrom(body); err != nil {
			t.Fatalf("kmsg cannot decode the result: %v", err)
		}
		for _, b := range resp.Brokers {
			if h, p := mapHost(b.NodeID); b.Host != h || b.Port != p {
				t.Fatalf("node %d is %s:%d, not the mapper's %s:%d", b.NodeID, b.Host, b.Port, h, p)
			}
		}
	})
}
