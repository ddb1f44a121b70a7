package proxy

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/internal/testfetch"
	"github.com/dedupproxy/dedupproxy/protocol/rewrite"
	"github.com/dedupproxy/dedupproxy/relay"
)

// fetchBody is testfetch.Body.
var fetchBody = testfetch.Body

func fetchRequest(v int16) *kmsg.FetchRequest {
	req := kmsg.NewPtrFetchRequest()
	req.SetVersion(v)
	req.MaxBytes = 64 << 20
	ft := kmsg.NewFetchRequestTopic()
	ft.Topic, ft.TopicID = "relay", [16]byte{0xfa, 0xce}
	fp := kmsg.NewFetchRequestTopicPartition()
	fp.PartitionMaxBytes = 64 << 20
	ft.Partitions = append(ft.Partitions, fp)
	req.Topics = append(req.Topics, ft)
	return req
}

// TestFetchRelayLarge relays Fetch responses of every size class through
// the proxy, on the splice path and the copy path, pipelined so that
// small and large frames follow each other on one connection, with
// requests of other APIs between them: every response arrives whole, in
// order, byte for byte as the broker sent it (no NodeEndpoints here: v16+
// is walked and passed unchanged).
func TestFetchRelayLarge(t *testing.T) {
	t.Parallel()
	sizes := []int{100, relay.SpliceMinFrame - 200, relay.SpliceMinFrame + 1, 200 << 10, 3 << 20}
	bodies := map[int16]map[int][]byte{}
	versions := []int16{4, 11, 12, 15, 16}
	if mv, _ := rewrite.MaxVersion(int16(kmsg.Fetch)); mv > 16 {
		versions = append(versions, mv)
	}
	for _, v := range versions {
		bodies[v] = map[int][]byte{}
		for _, n := range sizes {
			bodies[v][n] = fetchBody(v, n)
		}
	}
	for _, copyOnly := range []bool{false, true} {
		t.Run(fmt.Sprintf("copyOnly=%v", copyOnly), func(t *testing.T) {
			t.Parallel()
			for _, v := range versions {
				next := make(chan int, 64)
				sb := newSinkBrokerWith(t, "relay", 2, func(int16) []byte { return bodies[v][<-next] })
				p := startProxyWith(t, nil, func(cfg *Config) { cfg.Upstream = []string{sb.addr()} },
					func(s *Server) { s.copyOnly = copyOnly })
				raw := dialRaw(t, p.addr())
				order := []int{3 << 20, 100, 200 << 10, relay.SpliceMinFrame + 1, relay.SpliceMinFrame - 200, 3 << 20, 100, 100, 200 << 10}
				var corrs []int32
				var reqs []kmsg.Request
				for i, n := range order {
					next <- n
					corrs = append(corrs, raw.send(fetchRequest(v)))
					reqs = append(reqs, nil)
					if i%3 == 1 { // another API between the fetches
						req := kmsg.NewPtrApiVersionsRequest()
						corrs = append(corrs, raw.send(req))
						reqs = append(reqs, req)
					}
				}
				k := 0
				for i, corr := range corrs {
					if reqs[i] != nil {
						raw.recv(reqs[i], corr)
						continue
					}
					n := order[k]
					k++
					frame, err := readFrame(raw.conn)
					if err != nil {
						t.Fatalf("v%d fetch %d (%d bytes): %v", v, k, n, err)
					}
					off := 4
					if v >= 12 {
						off++
					}
					if got := int32(frame[0])<<24 | int32(frame[1])<<16 | int32(frame[2])<<8 | int32(frame[3]); got != corr {
						t.Fatalf("v%d fetch %d: correlation id %d, want %d", v, k, got, corr)
					}
					if !bytes.Equal(frame[off:], bodies[v][n]) {
						t.Fatalf("v%d fetch %d (%d bytes): body differs from the broker's (%d bytes)", v, k, n, len(frame)-off)
					}
				}
			}
		})
	}
}

// TestFetchRelayClientGone: a client that stops reading and leaves in the
// middle of a spliced frame does not make the proxy lose its place in the
// broker's responses: the Produce pipelined behind the Fetch is still read
// and committed, so its retry on a new connection is answered by the proxy.
func TestFetchRelayClientGone(t *testing.T) {
	t.Parallel()
	for _, v := range []int16{15, 16} {
		t.Run(fmt.Sprintf("v%d", v), func(t *testing.T) {
			t.Parallel()
			testFetchRelayClientGone(t, v)
		})
	}
}

func testFetchRelayClientGone(t *testing.T, v int16) {
	big := fetchBody(v, 16<<20)
	sb := newSinkBrokerWith(t, "relay", 2, func(int16) []byte { return big })
	p := startProxyWith(t, nil, func(cfg *Config) { cfg.Upstream = []string{sb.addr()} }, nil)
	raw := dialRaw(t, p.addr())
	raw.learnTopics("relay")
	// A tiny receive buffer, so the proxy's splice blocks on the client.
	raw.conn.(*net.TCPConn).SetReadBuffer(4 << 10)
	raw.send(fetchRequest(v))
	batch := recordBatch(t, 77, 0, 0, 1, "x")
	produce := produceParts("relay", -1, part{0, batch})
	raw.send(produce)
	// Read a little of the fetch, then hang up with an RST.
	buf := make([]byte, 1024)
	if _, err := raw.conn.Read(buf); err != nil {
		t.Fatal(err)
	}
	raw.conn.(*net.TCPConn).SetLinger(0)
	raw.conn.Close()

	again := dialRaw(t, p.addr())
	again.learnTopics("relay")
	resp := again.roundTrip(produceParts("relay", -1, part{0, batch})).(*kmsg.ProduceResponse)
	if code := resp.Topics[0].Partitions[0].ErrorCode; code != 0 {
		t.Fatalf("retry answered with error %d", code)
	}
	// The original, read behind the fetch, went upstream (the retry then
	// waited for it and was answered by the proxy) or, decided after the
	// proxy heard the connection break, did not (the retry went instead):
	// one copy either way.
	waitFor(t, 10*time.Second, "the first connection's session to end", func() bool {
		return testutil.ToFloat64(p.Metrics.ClientConnections) == 1
	})
	if n := sb.produces.Load(); n != 1 {
		t.Fatalf("the broker read %d Produce requests of the batch, want 1", n)
	}
}

// BenchmarkFetchRelay measures relaying Fetch responses through the proxy
// on the splice path and on the copy path, one request at a time on one
// connection, against a broker that writes a prebuilt response. The
// broker and the reading client run in the same process, so cpu-ms/MB is
// the whole process's CPU (getrusage) per MB fetched: compare the two
// paths' figures, not the absolute ones. Run with -count and alternate.
func BenchmarkFetchRelay(b *testing.B) {
	for _, size := range []int{8 << 10, 64 << 10, 1 << 20} {
		for _, v := range []int16{15, 16} {
			body := fetchBody(v, size)
			for _, copyOnly := range []bool{true, false} {
				path := "splice"
				if copyOnly {
					path = "copy"
				}
				b.Run(fmt.Sprintf("size=%dKiB/v%d/%s", size>>10, v, path), func(b *testing.B) {
					sb := newSinkBrokerWith(b, "relay", 2, func(int16) []byte { return body })
					p := startProxyWith(b, nil, func(cfg *Config) { cfg.Upstream = []string{sb.addr()} },
						func(s *Server) { s.copyOnly = copyOnly })
					raw := dialRaw(b, p.addr())
					req := kmsg.NewRequestFormatter(kmsg.FormatterClientID("bench")).AppendRequest(nil, fetchRequest(v), 1)
					buf := make([]byte, 0, len(body)+64)
					frameLen := 4 + 4 + 1 + len(body)
					if v < 12 {
						frameLen--
					}
					b.SetBytes(int64(frameLen))
					b.ReportAllocs()
					cpu0 := cpuTime()
					for b.Loop() {
						if _, err := raw.conn.Write(req); err != nil {
							b.Fatal(err)
						}
						if _, err := io.ReadFull(raw.conn, buf[:frameLen]); err != nil {
							b.Fatal(err)
						}
					}
					cpu := cpuTime() - cpu0
					b.ReportMetric(cpu.Seconds()*1e3/(float64(b.N)*float64(frameLen)/1e6), "cpu-ms/MB")
				})
			}
		}
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestFetchRelayLargeNodeEndpoints: a large Fetch v16+ response carrying
// KIP-951 NodeEndpoints (beside a NOT_LEADER_OR_FOLLOWER partition) is
// relayed with its records spliced, and the client sees only the proxy's
// address for the node: the rewritten endpoint when the proxy's address
// fits in the broker's bytes, no endpoint (the client falls back to
// Metadata) when it does not; never the broker's. The copy path, for
// comparison, always rewrites.
func TestFetchRelayLargeNodeEndpoints(t *testing.T) {
	t.Parallel()
	mv, _ := rewrite.MaxVersion(int16(kmsg.Fetch))
	for _, v := range []int16{16, mv} {
		for _, brokerHost := range []string{"broker-0.kafka.internal.example", "b"} {
			for _, copyOnly := range []bool{false, true} {
				name := fmt.Sprintf("v%d/host=%s/copyOnly=%v", v, brokerHost, copyOnly)
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					node := kmsg.NewFetchResponseBroker()
					node.NodeID, node.Host, node.Port = 0, brokerHost, 9092
					body := fetchBody(v, 3<<20, node)
					sb := newSinkBrokerWith(t, "relay", 2, func(int16) []byte { return body })
					p := startProxyWith(t, nil, func(cfg *Config) { cfg.Upstream = []string{sb.addr()} },
						func(s *Server) { s.copyOnly = copyOnly })
					raw := dialRaw(t, p.addr())
					raw.learnTopics("relay")
					want, ok := p.nodes.Advertised(0)
					if !ok {
						t.Fatal("no proxy listener for node 0")
					}
					for i := 0; i < 3; i++ {
						resp := raw.roundTrip(fetchRequest(v)).(*kmsg.FetchResponse)
						if got := resp.Topics[0].Partitions[0].RecordBatches; !bytes.Equal(got, fetchBodyRecords(3<<20)) {
							t.Fatalf("records changed (%d bytes)", len(got))
						}
						if resp.Topics[0].Partitions[1].ErrorCode != 6 {
							t.Fatalf("partition 1 error %d", resp.Topics[0].Partitions[1].ErrorCode)
						}
						wantNodes := 1
						if !copyOnly && len(brokerHost) < len(want) {
							wantNodes = 0 // spliced, and the proxy's address does not fit
						}
						if len(resp.Brokers) != wantNodes {
							t.Fatalf("%d nodes in NodeEndpoints, want %d", len(resp.Brokers), wantNodes)
						}
						for _, b := range resp.Brokers {
							if got := addrString(b.Host, b.Port); got != want {
								t.Fatalf("node 0 is %s, want the proxy's %s", got, want)
							}
						}
					}
				})
			}
		}
	}
}

// fetchBodyRecords is the record bytes fetchBody puts in partition 0.
func fetchBodyRecords(n int) []byte {
	b := make([]byte, n)
	for j := range b {
		b[j] = byte(j * 7)
	}
	return b
}

// TestIdleResponseLoopWokenForLocalAnswers: on an idle connection the
// response loop waits on the broker (waitUpstream); a request the proxy
// answers alone (an ApiVersions newer than it knows, KIP-511), between and
// after forwarded ones, is still answered at once, in order, and the
// connection then closes cleanly.
func TestIdleResponseLoopWokenForLocalAnswers(t *testing.T) {
	t.Parallel()
	sb := newSinkBroker(t, "relay", 1)
	p := startProxyWith(t, nil, func(cfg *Config) { cfg.Upstream = []string{sb.addr()} }, nil)
	raw := dialRaw(t, p.addr())
	newer := func() []byte {
		// ApiVersions v99: header v1 (api key, version, correlation id,
		// client id), an empty body.
		raw.corr++
		b := []byte{0, 0, 0, 0, 0, 18, 0, 99}
		b = append(b, byte(raw.corr>>24), byte(raw.corr>>16), byte(raw.corr>>8), byte(raw.corr))
		b = append(b, 0, 3, 'r', 'a', 'w')
		b[3] = byte(len(b) - 4)
		return b
	}
	for round := 0; round < 20; round++ {
		// Let the response loop go idle on the broker first.
		waitFor(t, 10*time.Second, "the response loop to wait on the broker", func() bool { return responseLoopsIdle(p.Server) })
		raw.conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := raw.conn.Write(newer()); err != nil {
			t.Fatal(err)
		}
		want := raw.corr
		body, err := readFrame(raw.conn)
		if err != nil {
			t.Fatalf("round %d: no answer to the local request: %v", round, err)
		}
		if got := int32(body[0])<<24 | int32(body[1])<<16 | int32(body[2])<<8 | int32(body[3]); got != want {
			t.Fatalf("round %d: correlation id %d, want %d", round, got, want)
		}
		// A forwarded request, then a local one pipelined behind it.
		req := kmsg.NewPtrMetadataRequest()
		corr := raw.send(req)
		if _, err := raw.conn.Write(newer()); err != nil {
			t.Fatal(err)
		}
		local := raw.corr
		raw.recv(req, corr)
		if body, err = readFrame(raw.conn); err != nil {
			t.Fatalf("round %d: no answer to the pipelined local request: %v", round, err)
		}
		if got := int32(binary.BigEndian.Uint32(body)); got != local {
			t.Fatalf("round %d: correlation id %d, want %d", round, got, local)
		}
	}
}

// richFetchBody is a Fetch response of version v with every shape the
// walk must pass: several topics and partitions, aborted transactions,
// every partition-level tagged field, null, empty, small and large record
// sets, unknown tags at every level, and, with nodes, NodeEndpoints.
func richFetchBody(v int16, nodes ...kmsg.FetchResponseBroker) *kmsg.FetchResponse {
	resp := kmsg.NewPtrFetchResponse()
	resp.SetVersion(v)
	resp.ThrottleMillis, resp.SessionID = 3, 77
	sizes := []int{-1, 0, 300, 20 << 10, 200 << 10, 16<<10 - 1, 1 << 20}
	for ti := 0; ti < 3; ti++ {
		t := kmsg.NewFetchResponseTopic()
		t.TopicID = [16]byte{byte(ti + 1)}
		t.UnknownTags.Set(4, []byte("topic tag"))
		for pi, n := range sizes {
			p := kmsg.NewFetchResponseTopicPartition()
			p.Partition, p.HighWatermark, p.LastStableOffset, p.LogStartOffset = int32(pi), 100, 90, 1
			if n >= 0 {
				p.RecordBatches = fetchBodyRecords(n)
			}
			if pi%2 == 0 {
				a := kmsg.NewFetchResponseTopicPartitionAbortedTransaction()
				a.ProducerID, a.FirstOffset = 5, 6
				a.UnknownTags.Set(2, []byte("aborted tag"))
				p.AbortedTransactions = append(p.AbortedTransactions, a)
			}
			if pi == 1 {
				p.ErrorCode = 6
				p.CurrentLeader.LeaderID, p.CurrentLeader.LeaderEpoch = 0, 9
				p.DivergingEpoch.Epoch, p.DivergingEpoch.EndOffset = 2, 3
				p.SnapshotID.EndOffset, p.SnapshotID.Epoch = 4, 5
			}
			p.UnknownTags.Set(7, []byte("partition tag"))
			t.Partitions = append(t.Partitions, p)
		}
		resp.Topics = append(resp.Topics, t)
	}
	resp.Brokers = nodes
	resp.UnknownTags.Set(3, []byte("top tag"))
	return resp
}

// TestFetchRelayWalkRich relays richFetchBody through the splice path's
// walk (v16+): without NodeEndpoints byte for byte as the broker sent it;
// with them, equal to the broker's response in everything but the
// endpoints, which name only the proxy.
func TestFetchRelayWalkRich(t *testing.T) {
	t.Parallel()
	mv, _ := rewrite.MaxVersion(int16(kmsg.Fetch))
	for _, v := range []int16{16, mv} {
		for _, withNodes := range []bool{false, true} {
			t.Run(fmt.Sprintf("v%d/nodes=%v", v, withNodes), func(t *testing.T) {
				t.Parallel()
				var nodes []kmsg.FetchResponseBroker
				if withNodes {
					n := kmsg.NewFetchResponseBroker()
					n.NodeID, n.Host, n.Port = 0, "broker-0.kafka.internal.example", 9092
					nodes = append(nodes, n)
				}
				sent := richFetchBody(v, nodes...)
				body := sent.AppendTo(nil)
				sb := newSinkBrokerWith(t, "relay", 2, func(int16) []byte { return body })
				p := startProxyWith(t, nil, func(cfg *Config) { cfg.Upstream = []string{sb.addr()} }, nil)
				raw := dialRaw(t, p.addr())
				raw.learnTopics("relay")
				corr := raw.send(fetchRequest(v))
				frame, err := readFrame(raw.conn)
				if err != nil {
					t.Fatal(err)
				}
				if got := int32(binary.BigEndian.Uint32(frame)); got != corr {
					t.Fatalf("correlation id %d, want %d", got, corr)
				}
				got := frame[5:]
				if !withNodes {
					if !bytes.Equal(got, body) {
						t.Fatal("body differs from the broker's")
					}
					return
				}
				if len(got) != len(body) {
					t.Fatalf("%d bytes, the broker sent %d", len(got), len(body))
				}
				resp := kmsg.NewPtrFetchResponse()
				resp.SetVersion(v)
				if err := resp.ReadFrom(got); err != nil {
					t.Fatalf("decode: %v", err)
				}
				want, _ := p.nodes.Advertised(0)
				if len(resp.Brokers) != 1 || addrString(resp.Brokers[0].Host, resp.Brokers[0].Port) != want {
					t.Fatalf("NodeEndpoints %+v, want the proxy's %s", resp.Brokers, want)
				}
				// All but the top-level tags is the broker's, byte for byte.
				sent.Brokers, resp.Brokers = nil, nil
				sent.UnknownTags, resp.UnknownTags = kmsg.Tags{}, kmsg.Tags{}
				if !bytes.Equal(sent.AppendTo(nil), resp.AppendTo(nil)) {
					t.Fatal("the relayed response differs from the broker's beyond NodeEndpoints")
				}
			})
		}
	}
}

// responseLoopsIdle reports whether s has sessions and each one's response
// loop waits on its broker with nothing queued (waitUpstream).
func responseLoopsIdle(s *Server) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for sess := range s.sessions {
		sess.upMu.Lock()
		waiting := sess.upWaiting
		sess.upMu.Unlock()
		if !waiting {
			return false
		}
	}
	return len(s.sessions) > 0
}
