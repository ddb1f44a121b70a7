package proxy

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/dedupproxy/dedupproxy/auth"
	"github.com/dedupproxy/dedupproxy/config"
	"github.com/dedupproxy/dedupproxy/decide"
	"github.com/dedupproxy/dedupproxy/metrics"
	"github.com/dedupproxy/dedupproxy/tail"
)

// The SASL users of the test clusters: one per mechanism, all superusers.
const (
	plainUser, plainPass   = "plain-user", "plain-secret"
	scram256User, scram256 = "scram256-user", "scram256-secret"
	scram512User, scram512 = "scram512-user", "scram512-secret"
)

// saslOpts makes a kfake cluster require SASL, with the three users.
func saslOpts() []kfake.Opt {
	return []kfake.Opt{kfake.EnableSASL(),
		kfake.Superuser(config.SASLPlain, plainUser, plainPass),
		kfake.Superuser(config.SASLScramSHA256, scram256User, scram256),
		kfake.Superuser(config.SASLScramSHA512, scram512User, scram512)}
}

// mechanism is the franz-go client mechanism for name with user and pass.
func mechanism(name, user, pass string) sasl.Mechanism {
	switch name {
	case config.SASLPlain:
		return plain.Auth{User: user, Pass: pass}.AsMechanism()
	case config.SASLScramSHA256:
		return scram.Auth{User: user, Pass: pass}.AsSha256Mechanism()
	}
	return scram.Auth{User: user, Pass: pass}.AsSha512Mechanism()
}

// withProxySASL gives the proxy its own credentials, the password in a file.
func withProxySASL(t testing.TB, mech, user, pass string) func(*Config) {
	path := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(path, []byte(pass+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return func(cfg *Config) { cfg.UpstreamSASL = SASLConfig{Mechanism: mech, User: user, PasswordFile: path} }
}

// authenticate runs a client's SASL exchange on a raw connection, with
// the proxy's own client code (auth.Authenticate).
func (r *rawConn) authenticate(s *Server, mech sasl.Mechanism) error {
	r.t.Helper()
	rt := func(conn net.Conn, req kmsg.Request, resp kmsg.Response, corr int32) error {
		return tail.RoundTrip(conn, req, resp, corr, s.Config.MaxFrameBytes)
	}
	next, err := auth.Authenticate(context.Background(), r.conn, mech, "127.0.0.1", r.corr+1, rt)
	if err == nil {
		r.corr = next - 1
	}
	return err
}

// TestSASLClientsThroughProxy: franz-go clients authenticate with PLAIN,
// SCRAM-SHA-256 and SCRAM-SHA-512 through the proxy (relayed untouched on
// their own broker connection), produce idempotently and consume back; a
// wrong password fails that client only, while an authenticated connection
// opened before keeps working. The proxy's own connections authenticate
// with upstream_sasl, which leaves client connections untrusted until they
// authenticate themselves.
func TestSASLClientsThroughProxy(t *testing.T) {
	t.Parallel()
	c := newCluster(t, append(saslOpts(), kfake.SeedTopics(3, config.SASLPlain, config.SASLScramSHA256, config.SASLScramSHA512))...)
	p := startProxy(t, c, withProxySASL(t, config.SASLScramSHA512, scram512User, scram512))
	if err := p.Probe(context.Background()); err != nil {
		t.Fatalf("probe with the proxy's own credentials: %v", err)
	}
	if p.openUpstream.Load() {
		t.Fatal("an authenticated probe marked the cluster open: clients would be trusted without authenticating")
	}
	open := dialRaw(t, p.addr())
	if err := open.authenticate(p.Server, mechanism(config.SASLPlain, plainUser, plainPass)); err != nil {
		t.Fatal(err)
	}
	open.apiVersions()

	for _, m := range []struct{ name, user, pass string }{
		{config.SASLPlain, plainUser, plainPass},
		{config.SASLScramSHA256, scram256User, scram256},
		{config.SASLScramSHA512, scram512User, scram512},
	} {
		t.Run(m.name, func(t *testing.T) {
			kgoRoundTrip(t, p.addr(), nil, m.name, 300, kgo.SASL(mechanism(m.name, m.user, m.pass)))

			bad := dialRaw(t, p.addr())
			if err := bad.authenticate(p.Server, mechanism(m.name, m.user, "wrong")); err == nil {
				t.Fatal("a wrong password authenticated")
			}
			cl, err := kgo.NewClient(kgo.SeedBrokers(p.addr()), kgo.SASL(mechanism(m.name, m.user, "wrong")))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := cl.Ping(ctx); err == nil {
				t.Fatal("franz-go with a wrong password: ping succeeded")
			}
			open.apiVersions()
		})
	}
	if n := testutil.ToFloat64(p.Metrics.Batches[metrics.OutAccepted]); n < 3 {
		t.Fatalf("%v batches decided on authenticated connections", n)
	}
	if n := testutil.ToFloat64(p.Metrics.Panics); n != 0 {
		t.Fatalf("%v panics", n)
	}
}

// TestSASLProxyOwnCredentials: the readiness probe authenticates with each
// mechanism; a wrong password or none says why /readyz fails; the password
// file is read again for every authentication, so rotating it needs no
// restart.
func TestSASLProxyOwnCredentials(t *testing.T) {
	t.Parallel()
	c := newCluster(t, saslOpts()...)
	for _, m := range []struct{ name, user, pass string }{
		{config.SASLPlain, plainUser, plainPass},
		{config.SASLScramSHA256, scram256User, scram256},
		{config.SASLScramSHA512, scram512User, scram512},
	} {
		p := startProxy(t, c, withProxySASL(t, m.name, m.user, m.pass))
		if err := p.Probe(context.Background()); err != nil {
			t.Errorf("%s: probe: %v", m.name, err)
		}
		if p.openUpstream.Load() {
			t.Errorf("%s: openUpstream set by an authenticated probe", m.name)
		}
		if _, ok := p.nodes.ListenAddr(0); !ok {
			t.Errorf("%s: no node listener learned at start", m.name)
		}
	}

	none := startProxy(t, c, nil)
	err := none.Probe(context.Background())
	if err == nil || !strings.Contains(err.Error(), "SASL (upstream_sasl") {
		t.Errorf("probe without credentials: %v, want a hint at upstream_sasl", err)
	}
	none.awaitLog(t, "upstream not reachable yet")

	rotate := withProxySASL(t, config.SASLScramSHA512, scram512User, "old-and-wrong")
	p := startProxy(t, c, rotate)
	err = p.Probe(context.Background())
	if !errors.Is(err, auth.ErrUpstreamAuth) || !strings.Contains(err.Error(), scram512User) {
		t.Fatalf("probe with a wrong password: %v, want ErrUpstreamAuth naming the user", err)
	}
	if err := os.WriteFile(p.Config.UpstreamSASL.PasswordFile, []byte(scram512), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.Probe(context.Background()); err != nil {
		t.Fatalf("probe after the password file was rotated: %v", err)
	}
}

// TestSASLSSLRetryOnNewConnection: SASL_SSL end to end (TLS to the proxy,
// TLS to the brokers, SCRAM-SHA-512 relayed). A producer's batch is
// appended on one authenticated connection; its retry on a new
// authenticated connection (the acknowledgement was lost) is answered by
// the proxy with the original offset and never reaches the broker. A
// connection that skips authentication is closed by the broker and leaves
// the table untouched.
func TestSASLSSLRetryOnNewConnection(t *testing.T) {
	t.Parallel()
	const topic = "sasl-ssl"
	certs := newTestCerts(t)
	c := tlsCluster(t, certs.server("broker"), append(saslOpts(), kfake.NumBrokers(1), kfake.SeedTopics(1, topic))...)
	pc := countProduce(c)
	p := startProxy(t, c, both(withClientTLS(certs, certs.server("proxy"), "proxy"),
		func(cfg *Config) { cfg.UpstreamTLS.CA = certs.caFile },
		withProxySASL(t, config.SASLScramSHA512, scram512User, scram512)))
	trust := certs.clientConfig(nil)
	batch := recordBatch(t, 41, 0, 0, 3, "payment")
	req := produceParts(topic, -1, part{0, batch})
	entries := p.table.Len()

	skip := dialRawTLS(t, p.addr(), trust)
	skip.send(req)
	if _, err := readFrame(skip.conn); err == nil {
		t.Fatal("an unauthenticated Produce was answered")
	}
	if n := p.table.Len(); n != entries {
		t.Fatalf("an unauthenticated batch reached the table (%d entries, was %d)", n, entries)
	}

	first := dialRawTLS(t, p.addr(), trust)
	if err := first.authenticate(p.Server, mechanism(config.SASLScramSHA512, scram512User, scram512)); err != nil {
		t.Fatal(err)
	}
	first.learnTopics(topic)
	if r := onlyPartition(t, first.roundTrip(req)); r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("first send: %+v", r)
	}
	first.conn.Close() // the acknowledgement is "lost": the producer reconnects
	appended := pc.requests.Load()

	retry := dialRawTLS(t, p.addr(), trust)
	if err := retry.authenticate(p.Server, mechanism(config.SASLScramSHA512, scram512User, scram512)); err != nil {
		t.Fatal(err)
	}
	if r := onlyPartition(t, retry.roundTrip(req)); r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("retry on a new connection: %+v, want the original offset 0", r)
	}
	if pc.requests.Load() != appended {
		t.Fatal("the retry reached the broker")
	}
	if n := testutil.ToFloat64(p.Metrics.Batches[metrics.OutDuplicate]); n != 1 {
		t.Fatalf("duplicates answered %v, want 1", n)
	}
}

// TestLostAckSASL: franz-go's idempotent producer, authenticated with
// SCRAM-SHA-512 through the proxy, loses an acknowledgement (a shim drops
// it and cuts the connection), reconnects, authenticates again and
// retries; the proxy answers the retry, and the topic holds every record
// exactly once.
func TestLostAckSASL(t *testing.T) {
	t.Parallel()
	const topic, n = "lostack-sasl", 2000
	c := newCluster(t, append(saslOpts(), kfake.NumBrokers(1), kfake.SeedTopics(3, topic))...)
	bl := logBatches(c)
	shim := newAckDropShim(t, 3)
	p := startProxy(t, c, both(withProxySASL(t, config.SASLScramSHA512, scram512User, scram512), func(cfg *Config) {
		cfg.Nodes = map[int32]NodeConfig{0: {Advertise: shim.ln.Addr().String()}}
	}))
	target, ok := p.nodes.ListenAddr(0)
	if !ok {
		t.Fatal("no listener for node 0")
	}
	shim.target.Store(target)
	auth := kgo.SASL(mechanism(config.SASLScramSHA512, scram512User, scram512))
	cl, err := kgo.NewClient(kgo.SeedBrokers(p.addr()), kgo.DefaultProduceTopic(topic), auth,
		kgo.MetadataMinAge(100*time.Millisecond), kgo.ProducerLinger(5*time.Millisecond),
		kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for chunk := 0; chunk < n; chunk += 200 {
		recs := make([]*kgo.Record, 200)
		for i := range recs {
			recs[i] = &kgo.Record{Value: []byte(strconv.Itoa(chunk + i))}
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
	if shim.dropped.Load() != 1 {
		t.Fatalf("the shim dropped %d acknowledgements, want 1", shim.dropped.Load())
	}
	cons, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), auth, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	consumeValues(ctx, t, cons, n)
	distinct, repeated := bl.repeats()
	dups := testutil.ToFloat64(p.Metrics.Batches[metrics.OutDuplicate]) + testutil.ToFloat64(p.Metrics.Batches[metrics.OutInFlight])
	t.Logf("batches reaching kfake: %d distinct, %d repeated; retries answered by the proxy: %v", distinct, repeated, dups)
	if repeated != 0 || dups < 1 {
		t.Errorf("repeated at the broker %d, answered by the proxy %v", repeated, dups)
	}
}

// TestSASLSSLFranzGo: franz-go with SASL_SSL through a proxy with TLS on
// both legs.
func TestSASLSSLFranzGo(t *testing.T) {
	t.Parallel()
	const topic = "sasl-ssl-kgo"
	certs := newTestCerts(t)
	c := tlsCluster(t, certs.server("broker"), append(saslOpts(), kfake.SeedTopics(3, topic))...)
	p := startProxy(t, c, both(withClientTLS(certs, certs.server("proxy"), "proxy"),
		func(cfg *Config) { cfg.UpstreamTLS.CA = certs.caFile },
		withProxySASL(t, config.SASLPlain, plainUser, plainPass)))
	kgoRoundTrip(t, p.addr(), certs.clientConfig(nil), topic, 300, kgo.SASL(mechanism(config.SASLScramSHA512, scram512User, scram512)))
	if n := testutil.ToFloat64(p.Metrics.Batches[metrics.OutAccepted]); n < 1 {
		t.Fatalf("%v batches decided", n)
	}
}

// TestSASLReauthenticationKeepsDeciding: with connections.max.reauth.ms
// set, the broker gives every session a lifetime and franz-go
// re-authenticates (KIP-368) before its next request. A re-authentication
// as the same principal keeps the connection decided: every batch is
// decided, none relayed as unauthenticated, and no connection is made
// relayed only.
func TestSASLReauthenticationKeepsDeciding(t *testing.T) {
	t.Parallel()
	const topic, batches = "reauth", 4
	c := newCluster(t, append(saslOpts(), kfake.NumBrokers(1), kfake.SeedTopics(1, topic),
		// Shorter than franz-go's 1 s margin: it re-authenticates
		// before every request.
		kfake.BrokerConfigs(map[string]string{"connections.max.reauth.ms": "1000"}))...)
	p := startProxy(t, c, withProxySASL(t, config.SASLScramSHA512, scram512User, scram512))
	cl, err := kgo.NewClient(kgo.SeedBrokers(p.addr()), kgo.DefaultProduceTopic(topic),
		kgo.SASL(mechanism(config.SASLScramSHA256, scram256User, scram256)))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range batches {
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte(strconv.Itoa(i))}).FirstErr(); err != nil {
			t.Fatalf("produce %d: %v", i, err)
		}
	}
	handshakes := testutil.ToFloat64(p.Metrics.Requests.WithLabelValues("SASLHandshake"))
	// Two connections (bootstrap, then the broker's), each
	// re-authenticated before its later requests.
	if handshakes < batches+2 {
		t.Fatalf("%v SASL handshakes, want re-authentications before the produce requests", handshakes)
	}
	if n := testutil.ToFloat64(p.Metrics.Batches[metrics.OutAccepted]); n != batches {
		t.Fatalf("%v batches decided and accepted, want %d", n, batches)
	}
	if n := testutil.ToFloat64(p.Metrics.Passthrough[decide.PassUnauthenticated]); n != 0 {
		t.Fatalf("%v batches relayed as unauthenticated", n)
	}
	for _, r := range []string{auth.RelayPipelined, auth.RelayReauth} {
		if n := testutil.ToFloat64(p.Metrics.AuthRelayedOnly.WithLabelValues(r)); n != 0 {
			t.Fatalf("client_auth_relayed_only_total{reason=%q} = %v", r, n)
		}
	}
}
