package proxy

import (
	"context"
	"errors"
	"io"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/dedupproxy/dedupproxy/auth"
	"github.com/dedupproxy/dedupproxy/config"
	"github.com/dedupproxy/dedupproxy/decide"
	"github.com/dedupproxy/dedupproxy/metrics"
)

// The security boundary (docs/security.md), against kfake with SASL and
// ACLs: alice may write the topic, mallory may only describe it, and the
// proxy authenticates itself as a third user.

const (
	secTopic                = "secure"
	aliceUser, alicePass    = "alice", "alice-secret"
	malloryUser, malloryPwd = "mallory", "mallory-secret"
	proxyUser, proxyPass    = "dedupproxy", "proxy-secret"
)

func securityCluster(t *testing.T, partitions int32, extra ...kfake.Opt) *kfake.Cluster {
	describe := kfake.ACL{Resource: kmsg.ACLResourceTypeTopic, Name: secTopic, Pattern: kmsg.ACLResourcePatternTypeLiteral,
		Operation: kmsg.ACLOperationDescribe, Allow: true}
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.Superuser(config.SASLScramSHA256, proxyUser, proxyPass),
		kfake.User(config.SASLPlain, aliceUser, alicePass,
			kfake.ACL{Resource: kmsg.ACLResourceTypeTopic, Name: secTopic, Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationAll, Allow: true},
			kfake.ACL{Resource: kmsg.ACLResourceTypeCluster, Name: "kafka-cluster", Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationIdempotentWrite, Allow: true}),
		kfake.User(config.SASLPlain, malloryUser, malloryPwd, describe),
		kfake.User(config.SASLScramSHA256, malloryUser, malloryPwd, describe),
		kfake.SeedTopics(partitions, secTopic)}
	return newCluster(t, append(opts, extra...)...)
}

func startSecureProxy(t *testing.T, c *kfake.Cluster, mod func(*Config)) *testProxy {
	own := withProxySASL(t, config.SASLScramSHA256, proxyUser, proxyPass)
	return startProxy(t, c, func(cfg *Config) {
		own(cfg)
		if mod != nil {
			mod(cfg)
		}
	})
}

// login opens a connection to the proxy as user (PLAIN) and learns the
// topic, as a client does before producing.
func login(t *testing.T, p *testProxy, user, pass string) *rawConn {
	t.Helper()
	r := dialRaw(t, p.addr())
	if err := r.authenticate(p.Server, mechanism(config.SASLPlain, user, pass)); err != nil {
		t.Fatalf("%s: %v", user, err)
	}
	r.learnTopics(secTopic)
	return r
}

// holdProduceN makes kfake hold the n-th Produce request it receives
// (counted from 1) until release is closed; entered closes when it
// arrives. Other requests are served meanwhile.
func holdProduceN(c *kfake.Cluster, n int64) (entered, release chan struct{}) {
	entered, release = make(chan struct{}), make(chan struct{})
	var seen atomic.Int64
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if seen.Add(1) == n {
			close(entered)
			c.SleepControl(func() { <-release })
		}
		return nil, nil, false
	})
	return entered, release
}

func waitClosed(t *testing.T, ch chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// TestSecurityCopiedBatchNeedsWrite: mallory, who may not write the topic,
// sends a byte-identical copy of a legacy batch alice wrote (her connection
// then broke). The broker answers mallory TOPIC_AUTHORIZATION_FAILED, and
// the proxy must not answer in its place: no offset, no content oracle.
// Alice's own retry is still recognised, and her state is hers: her next
// identical send on the connection that has the acknowledgement is new
// data.
func TestSecurityCopiedBatchNeedsWrite(t *testing.T) {
	t.Parallel()
	c := securityCluster(t, 1)
	p := startSecureProxy(t, c, nil)
	batch := recordBatch(t, -1, -1, -1, 3, "pay 100 to bob")
	req := produceParts(secTopic, -1, part{0, batch})

	alice := login(t, p, aliceUser, alicePass)
	if r := onlyPartition(t, alice.roundTrip(req)); r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("alice's original: %+v", r)
	}
	alice.abort()
	clientsGone(t, p) // her batch is one a retry of hers could repeat now

	mallory := login(t, p, malloryUser, malloryPwd)
	if r := onlyPartition(t, mallory.roundTrip(req)); r.ErrorCode != kerr.TopicAuthorizationFailed.Code {
		t.Fatalf("mallory's copy answered %+v, want TOPIC_AUTHORIZATION_FAILED from the broker", r)
	}

	again := login(t, p, aliceUser, alicePass)
	if r := onlyPartition(t, again.roundTrip(req)); r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("alice's retry on a new connection: %+v, want the original's offset 0", r)
	}
	if r := onlyPartition(t, again.roundTrip(req)); r.ErrorCode != 0 || r.BaseOffset != 3 {
		t.Fatalf("alice's next identical send where she holds the acknowledgement: %+v, want it written at 3", r)
	}
	lo := kmsg.NewPtrListOffsetsRequest()
	lo.SetVersion(4)
	lt := kmsg.NewListOffsetsRequestTopic()
	lt.Topic = secTopic
	lp := kmsg.NewListOffsetsRequestTopicPartition()
	lp.Timestamp = -1
	lt.Partitions = append(lt.Partitions, lp)
	lo.Topics = append(lo.Topics, lt)
	if end := again.roundTrip(lo).(*kmsg.ListOffsetsResponse).Topics[0].Partitions[0].Offset; end != 6 {
		t.Fatalf("log end %d, want 6", end)
	}
}

// sendAll writes reqs in one write, as a client pipelining them does, and
// returns their correlation ids.
func (r *rawConn) sendAll(reqs ...kmsg.Request) []int32 {
	r.t.Helper()
	id := r.clientID
	if id == "" {
		id = "raw"
	}
	f := kmsg.NewRequestFormatter(kmsg.FormatterClientID(id))
	var buf []byte
	var corrs []int32
	for _, req := range reqs {
		r.corr++
		// AppendRequest writes the size at the start of its dst: one
		// frame at a time.
		buf = append(buf, f.AppendRequest(nil, req, r.corr)...)
		corrs = append(corrs, r.corr)
	}
	if _, err := r.conn.Write(buf); err != nil {
		r.t.Fatal(err)
	}
	return corrs
}

func saslHandshake(mech string) *kmsg.SASLHandshakeRequest {
	req := kmsg.NewPtrSASLHandshakeRequest()
	req.SetVersion(1)
	req.Mechanism = mech
	return req
}

func saslAuth(msg []byte) *kmsg.SASLAuthenticateRequest {
	req := kmsg.NewPtrSASLAuthenticateRequest()
	req.SetVersion(1)
	req.SASLAuthBytes = msg
	return req
}

// TestSecurityPipelinedSASLBorrowsNoPrincipal: mallory, who may not write
// the topic, authenticates and, in the same write, begins a second
// exchange as alice with a wrong password. The broker authenticates
// mallory and answers the second exchange ILLEGAL_SASL_STATE. Her copy of
// a batch alice wrote (alice's connection then broke) must reach the
// broker, which refuses it (TOPIC_AUTHORIZATION_FAILED): the proxy pairs
// each answer with the request it answers, so the first exchange's
// success means mallory, never alice, and the pipelined exchange makes the
// connection relayed only. PLAIN, and SCRAM-SHA-256 for the first exchange
// with the second as PLAIN or as SCRAM.
func TestSecurityPipelinedSASLBorrowsNoPrincipal(t *testing.T) {
	t.Parallel()
	plainAuth := func(user, pass string) []byte { return []byte("\x00" + user + "\x00" + pass) }
	scramFirst := func(t *testing.T, user, pass string) (sasl.Session, []byte) {
		s, first, err := scram.Auth{User: user, Pass: pass}.AsSha256Mechanism().Authenticate(context.Background(), "127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		return s, first
	}
	for _, c := range []struct {
		name string
		// second is the second exchange, as alice with a wrong
		// password, pipelined behind mallory's last message.
		second func(t *testing.T) []kmsg.Request
		scram  bool
	}{
		{name: "PLAIN", second: func(*testing.T) []kmsg.Request {
			return []kmsg.Request{saslHandshake(config.SASLPlain), saslAuth(plainAuth(aliceUser, "wrong"))}
		}},
		{name: "SCRAM then PLAIN", scram: true, second: func(*testing.T) []kmsg.Request {
			return []kmsg.Request{saslHandshake(config.SASLPlain), saslAuth(plainAuth(aliceUser, "wrong"))}
		}},
		{name: "SCRAM then SCRAM", scram: true, second: func(t *testing.T) []kmsg.Request {
			_, first := scramFirst(t, aliceUser, "wrong")
			return []kmsg.Request{saslHandshake(config.SASLScramSHA256), saslAuth(first)}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cl := securityCluster(t, 1)
			p := startSecureProxy(t, cl, nil)
			req := produceParts(secTopic, -1, part{0, recordBatch(t, -1, -1, -1, 3, "pay 100 to bob")})
			alice := login(t, p, aliceUser, alicePass)
			if r := onlyPartition(t, alice.roundTrip(req)); r.ErrorCode != 0 || r.BaseOffset != 0 {
				t.Fatalf("alice's original: %+v", r)
			}
			alice.abort()
			clientsGone(t, p) // a retry of hers could repeat her batch now

			r := dialRaw(t, p.addr())
			// The client id alice's connection began with (login's): a
			// client instance is its principal, client id and host.
			r.clientID = "dedupproxy-probe"
			var reqs []kmsg.Request
			if c.scram {
				if resp := r.roundTrip(saslHandshake(config.SASLScramSHA256)).(*kmsg.SASLHandshakeResponse); resp.ErrorCode != 0 {
					t.Fatalf("handshake: %d", resp.ErrorCode)
				}
				sess, first := scramFirst(t, malloryUser, malloryPwd)
				resp := r.roundTrip(saslAuth(first)).(*kmsg.SASLAuthenticateResponse)
				if resp.ErrorCode != 0 {
					t.Fatalf("server-first: %d", resp.ErrorCode)
				}
				_, final, err := sess.Challenge(resp.SASLAuthBytes)
				if err != nil {
					t.Fatal(err)
				}
				reqs = append(reqs, saslAuth(final))
			} else {
				reqs = append(reqs, saslHandshake(config.SASLPlain), saslAuth(plainAuth(malloryUser, malloryPwd)))
			}
			reqs = append(reqs, c.second(t)...)
			corrs := r.sendAll(reqs...)
			var codes []int16
			for i, q := range reqs {
				switch resp := r.recv(q, corrs[i]).(type) {
				case *kmsg.SASLHandshakeResponse:
					codes = append(codes, resp.ErrorCode)
				case *kmsg.SASLAuthenticateResponse:
					codes = append(codes, resp.ErrorCode)
				}
			}
			n := len(codes)
			if codes[n-3] != 0 || codes[n-2] != kerr.IllegalSaslState.Code || codes[n-1] != kerr.IllegalSaslState.Code {
				t.Fatalf("the broker answered %v, want mallory authenticated and the second exchange ILLEGAL_SASL_STATE", codes)
			}
			r.learnTopics(secTopic)
			if got := onlyPartition(t, r.roundTrip(req)); got.ErrorCode != kerr.TopicAuthorizationFailed.Code {
				t.Fatalf("mallory's copy of alice's batch answered %+v, want TOPIC_AUTHORIZATION_FAILED from the broker", got)
			}
			if n := testutil.ToFloat64(p.Metrics.DupAnswered[metrics.DupByProxy]); n != 0 {
				t.Fatalf("the proxy answered %v duplicates itself", n)
			}
			// pipelined, or, when the broker's answer to mallory's last
			// message was read before the second handshake (the proxy
			// reads and forwards one request at a time), a
			// re-authentication as another principal.
			pipelined := testutil.ToFloat64(p.Metrics.AuthRelayedOnly.WithLabelValues(auth.RelayPipelined))
			reauth := testutil.ToFloat64(p.Metrics.AuthRelayedOnly.WithLabelValues(auth.RelayReauth))
			if pipelined+reauth != 1 {
				t.Fatalf("client_auth_relayed_only_total: pipelined %v, reauth_changed %v; want one connection", pipelined, reauth)
			}
			p.awaitLog(t, "relayed undecided from now on")
		})
	}
}

// TestSecuritySCRAMWithoutProof: a client sends SCRAM's first message, gets
// the broker's server-first answer (error 0, before it proved anything)
// and then a copy of alice's batch. It is not authenticated: the proxy
// answers nothing itself and relays the request, which the broker refuses.
func TestSecuritySCRAMWithoutProof(t *testing.T) {
	t.Parallel()
	c := securityCluster(t, 1)
	p := startSecureProxy(t, c, nil)
	batch := recordBatch(t, -1, -1, -1, 2, "secret")
	req := produceParts(secTopic, -1, part{0, batch})
	alice := login(t, p, aliceUser, alicePass)
	if r := onlyPartition(t, alice.roundTrip(req)); r.ErrorCode != 0 {
		t.Fatalf("alice: %+v", r)
	}
	alice.conn.Close()

	r := dialRaw(t, p.addr())
	hs := kmsg.NewPtrSASLHandshakeRequest()
	hs.SetVersion(1)
	hs.Mechanism = config.SASLScramSHA256
	if resp := r.roundTrip(hs).(*kmsg.SASLHandshakeResponse); resp.ErrorCode != 0 {
		t.Fatalf("handshake: %d", resp.ErrorCode)
	}
	_, first, err := scram.Auth{User: malloryUser, Pass: "never sent"}.AsSha256Mechanism().Authenticate(context.Background(), "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	auth := kmsg.NewPtrSASLAuthenticateRequest()
	auth.SetVersion(1)
	auth.SASLAuthBytes = first
	if resp := r.roundTrip(auth).(*kmsg.SASLAuthenticateResponse); resp.ErrorCode != 0 || len(resp.SASLAuthBytes) == 0 {
		t.Fatalf("server-first: error %d, %d bytes", resp.ErrorCode, len(resp.SASLAuthBytes))
	}
	corr := r.send(req)
	body, err := readFrame(r.conn)
	switch {
	case err != nil && (errors.Is(err, io.EOF) || isReset(err)):
		// The broker closed the connection, as Kafka does for a request
		// in the middle of an exchange.
	case err != nil:
		t.Fatalf("reading the answer: %v", err)
	default:
		resp := kmsg.NewPtrProduceResponse()
		resp.SetVersion(req.GetVersion())
		if int32(body[0])<<24|int32(body[1])<<16|int32(body[2])<<8|int32(body[3]) != corr || resp.ReadFrom(body[5:]) != nil {
			t.Fatalf("an undecodable answer to the produce")
		}
		if pr := resp.Topics[0].Partitions[0]; pr.ErrorCode == 0 {
			t.Fatalf("an unauthenticated client's copy was answered %+v", pr)
		}
	}
	if n := testutil.ToFloat64(p.Metrics.DupAnswered[metrics.DupByProxy]); n != 0 {
		t.Fatalf("the proxy answered %v duplicates itself", n)
	}
	if n := testutil.ToFloat64(p.Metrics.Passthrough[decide.PassUnauthenticated]); n != 1 {
		t.Fatalf("%v batches relayed as unauthenticated, want 1", n)
	}
}

// TestSecurityForgedProducerID: mallory sends a batch carrying alice's
// producer id, epoch and next sequence with other records; the broker
// holds it, then refuses it (no WRITE). Meanwhile alice's real batch must
// be written, not answered OUT_OF_ORDER_SEQUENCE_NUMBER by a proxy that
// took mallory's batch as hers.
func TestSecurityForgedProducerID(t *testing.T) {
	t.Parallel()
	c := securityCluster(t, 1)
	entered, release := holdProduceN(c, 2)
	p := startSecureProxy(t, c, nil)
	alice := login(t, p, aliceUser, alicePass)
	init := kmsg.NewPtrInitProducerIDRequest()
	init.SetVersion(4)
	ir := alice.roundTrip(init).(*kmsg.InitProducerIDResponse)
	if ir.ErrorCode != 0 {
		t.Fatalf("InitProducerId: %d", ir.ErrorCode)
	}
	pid, epoch := ir.ProducerID, ir.ProducerEpoch
	if r := onlyPartition(t, alice.roundTrip(produceParts(secTopic, -1, part{0, recordBatch(t, pid, epoch, 0, 3, "alice")}))); r.ErrorCode != 0 {
		t.Fatalf("alice's first batch: %+v", r)
	}

	mallory := login(t, p, malloryUser, malloryPwd)
	forged := produceParts(secTopic, -1, part{0, recordBatch(t, pid, epoch, 3, 3, "mallory")})
	corr := mallory.send(forged)
	waitClosed(t, entered, "the broker to hold mallory's batch")

	if r := onlyPartition(t, alice.roundTrip(produceParts(secTopic, -1, part{0, recordBatch(t, pid, epoch, 3, 3, "alice")}))); r.ErrorCode != 0 || r.BaseOffset != 3 {
		t.Fatalf("alice's next batch while mallory's forged one is held: %+v, want written at 3", r)
	}
	close(release)
	if r := onlyPartition(t, mallory.recv(forged, corr)); r.ErrorCode != kerr.TopicAuthorizationFailed.Code {
		t.Fatalf("mallory's forged batch: %+v, want TOPIC_AUTHORIZATION_FAILED", r)
	}
	// And alice's producer goes on as if mallory never was.
	if r := onlyPartition(t, alice.roundTrip(produceParts(secTopic, -1, part{0, recordBatch(t, pid, epoch, 6, 1, "alice")}))); r.ErrorCode != 0 || r.BaseOffset != 6 {
		t.Fatalf("alice's third batch: %+v", r)
	}
}

// TestSecurityWaiterNotAnsweredFromAnother: an authorized client's batch
// identical to one in flight from an unauthorized one neither waits for it
// nor inherits its refusal: it goes to the broker and is written.
func TestSecurityWaiterNotAnsweredFromAnother(t *testing.T) {
	t.Parallel()
	c := securityCluster(t, 1)
	entered, release := holdProduceN(c, 1)
	p := startSecureProxy(t, c, nil)
	req := produceParts(secTopic, -1, part{0, recordBatch(t, -1, -1, -1, 1, "order 42")})
	mallory := login(t, p, malloryUser, malloryPwd)
	corr := mallory.send(req)
	waitClosed(t, entered, "the broker to hold mallory's batch")
	alice := login(t, p, aliceUser, alicePass)
	done := make(chan kmsg.ProduceResponseTopicPartition, 1)
	go func() { done <- onlyPartition(t, alice.roundTrip(req)) }()
	var r kmsg.ProduceResponseTopicPartition
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("alice's batch waited for mallory's")
	}
	close(release)
	if r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("alice: %+v, want written at 0", r)
	}
	if m := onlyPartition(t, mallory.recv(req, corr)); m.ErrorCode != kerr.TopicAuthorizationFailed.Code {
		t.Fatalf("mallory: %+v", m)
	}
}

// TestSecurityUnauthenticatedGetsNoWork: a client that never authenticated
// sends a Produce naming 300 partitions of a 2-partition topic: the proxy
// starts no warm-up and decides nothing (the broker closes the
// connection). A 1 MiB frame before authentication closes the connection
// without reaching the broker (Kafka's 512 KiB limit). An authenticated
// client naming the same 300 partitions warms only the 2 that exist.
func TestSecurityUnauthenticatedGetsNoWork(t *testing.T) {
	t.Parallel()
	c := securityCluster(t, 2)
	pc := countProduce(c)
	p := startSecureProxy(t, c, nil)
	if err := p.Probe(context.Background()); err != nil { // learns the topic
		t.Fatal(err)
	}
	many := func() *kmsg.ProduceRequest {
		var parts []part
		for i := int32(0); i < 300; i++ {
			parts = append(parts, part{i, recordBatch(t, -1, -1, -1, 1, "x")})
		}
		return produceParts(secTopic, -1, parts...)
	}()
	warmups := func() float64 {
		n := 0.0
		for i := range p.Metrics.Warmups {
			n += testutil.ToFloat64(p.Metrics.Warmups[i])
		}
		return n
	}

	anon := dialRaw(t, p.addr())
	anon.send(many)
	if _, err := readFrame(anon.conn); err == nil {
		t.Fatal("an unauthenticated produce was answered")
	}
	if n := warmups(); n != 0 {
		t.Fatalf("%v warm-ups for an unauthenticated client", n)
	}
	if n := testutil.ToFloat64(p.Metrics.Passthrough[decide.PassUnauthenticated]); n != 300 {
		t.Fatalf("%v batches relayed as unauthenticated, want 300", n)
	}

	big := dialRaw(t, p.addr())
	frame := make([]byte, 4+1<<20)
	frame[1] = 0x10 // size 1 MiB
	if _, err := big.conn.Write(frame[:64]); err != nil {
		t.Fatal(err)
	}
	if _, err := readFrame(big.conn); err == nil {
		t.Fatal("a 1 MiB frame before authentication was answered")
	}
	if n := testutil.ToFloat64(p.Metrics.ClientErrors.WithLabelValues(metrics.ClientUnauth)); n != 1 {
		t.Fatalf("client_errors_total{reason=%q} = %v, want 1", metrics.ClientUnauth, n)
	}
	if !strings.Contains(p.logs.String(), "request too large before authentication") {
		t.Fatalf("no log line for the large unauthenticated frame:\n%s", p.logs.String())
	}

	before := pc.requests.Load()
	alice := login(t, p, aliceUser, alicePass)
	alice.send(many) // the broker answers UNKNOWN_TOPIC_OR_PARTITION for 298 of them
	waitFor(t, 10*time.Second, "the broker to get alice's request", func() bool { return pc.requests.Load() > before })
	waitFor(t, 10*time.Second, "the warm-ups to end", func() bool { return warmups() >= 2 })
	if n := warmups(); n != 2 {
		t.Fatalf("%v warm-ups for 300 partitions of a 2-partition topic, want 2", n)
	}
}

// TestSecurityLocalAnswersKeepNoRecords: a request waits for its in-flight
// original while its client sends 24 requests of 4 MiB behind it on the same
// connection, each to be answered partly by the proxy. A waiting request
// stops its connection's reading, so the 24 wait in the client's socket,
// not in the proxy's heap; once the original is answered they are decided,
// and each that the proxy answers partly keeps only its skeleton (its
// topics and partitions) for its answer. The heap grows by less than request_memory meanwhile, not by the
// 96 MiB of records (docs/security.md, "Memory"), and every request is
// answered.
func TestSecurityLocalAnswersKeepNoRecords(t *testing.T) {
	const topic, queued, size = "mem", 24, 4 << 20
	sink := newSinkBroker(t, topic, 2)
	hold := make(chan struct{})
	sink.holdFirstProduce = hold
	var once atomic.Bool
	unhold := func() {
		if once.CompareAndSwap(false, true) {
			close(hold)
		}
	}
	p := startProxy(t, nil, func(cfg *Config) { cfg.Upstream = []string{sink.addr()}; cfg.MaxFrameBytes = 8 << 20 })
	t.Cleanup(unhold) // before the sink and the proxy are closed
	small := produceParts(topic, -1, part{0, recordBatch(t, -1, -1, -1, 1, "original")})
	orig := dialRaw(t, p.addr())
	orig.learnTopics(topic)
	origCorr := orig.send(small)
	waitFor(t, 10*time.Second, "the sink to hold the original", func() bool { return sink.held.Load() })

	conn := dialRaw(t, p.addr())
	large := recordBatch(t, -1, -1, -1, 1, strings.Repeat("v", size-100))
	// One large request first, so that the in-process sink's own read
	// buffer for this connection has grown before the heap is measured.
	if r := onlyPartition(t, conn.roundTrip(produceParts(topic, -1, part{1, large}))); r.ErrorCode != 0 {
		t.Fatalf("first large request: %+v", r)
	}
	retryCorr := conn.send(small) // a retry of the held original: it waits
	waitFor(t, 10*time.Second, "the retry to wait", func() bool { return p.waitingRequests() == 1 })
	req := produceParts(topic, -1, part{0, recordBatch(t, -1, -1, -1, 1, "original")}, part{1, large})
	frame := kmsg.NewRequestFormatter(kmsg.FormatterClientID("raw")).AppendRequest(nil, req, 0)
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc
	wrote := make(chan error, 1)
	go func() {
		conn.conn.SetWriteDeadline(time.Now().Add(60 * time.Second))
		for i := range queued {
			copy(frame[4+4:], []byte{0, 0, 0, byte(100 + i)}) // correlation id
			if _, err := conn.conn.Write(frame); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- nil
	}()
	// The client writes as far as the sockets take; the proxy reads none
	// of it while the retry waits.
	before := p.Metrics.ClientReadBytes
	waitFor(t, 10*time.Second, "the client's socket to fill", func() bool {
		readNow := testutil.ToFloat64(before)
		time.Sleep(50 * time.Millisecond)
		return testutil.ToFloat64(before) == readNow
	})
	runtime.GC()
	runtime.ReadMemStats(&ms)
	grown := int64(ms.HeapAlloc) - int64(base)
	t.Logf("heap grew by %d KiB with %d requests of %d MiB sent behind a waiting one", grown>>10, queued, size>>20)
	if limit := int64(p.Config.RequestMemory); grown > limit {
		t.Fatalf("heap grew by %d bytes, more than request_memory (%d)", grown, limit)
	}
	unhold()
	if r := onlyPartition(t, orig.recv(small, origCorr)); r.ErrorCode != 0 {
		t.Fatalf("original: %+v", r)
	}
	if r := onlyPartition(t, conn.recv(small, retryCorr)); r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("retry: %+v, want the original's offset 0", r)
	}
	if err := <-wrote; err != nil {
		t.Fatalf("writing the queued requests: %v", err)
	}
	for i := range queued {
		resp := conn.recv(req, int32(100+i)).(*kmsg.ProduceResponse)
		for _, pr := range resp.Topics[0].Partitions {
			if pr.ErrorCode != 0 {
				t.Fatalf("queued request %d, partition %d: %+v", i, pr.Partition, pr)
			}
		}
	}
}
