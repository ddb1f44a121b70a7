package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/clock"
	"github.com/dedupproxy/dedupproxy/config"
	"github.com/dedupproxy/dedupproxy/internal/testpki"
	"github.com/dedupproxy/dedupproxy/metrics"
)

// testCerts is one test's PKI: a root CA and an intermediate that issues
// the server and client certificates, so every certificate file is a chain
// (leaf, then intermediate) that verifies against the root alone.
type testCerts struct {
	t      testing.TB
	dir    string
	root   *testpki.CA
	inter  *testpki.CA
	caFile string // the root, PEM
}

func newTestCerts(t testing.TB) *testCerts {
	t.Helper()
	root, err := testpki.NewCA("dedupproxy test root")
	if err != nil {
		t.Fatal(err)
	}
	inter, err := root.Intermediate("dedupproxy test intermediate")
	if err != nil {
		t.Fatal(err)
	}
	tc := &testCerts{t: t, dir: t.TempDir(), root: root, inter: inter}
	tc.caFile = filepath.Join(tc.dir, "ca.pem")
	if err := os.WriteFile(tc.caFile, root.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return tc
}

func (tc *testCerts) issue(cn string, o testpki.Opts) *testpki.Leaf {
	tc.t.Helper()
	l, err := tc.inter.Issue(cn, o)
	if err != nil {
		tc.t.Fatal(err)
	}
	return l
}

// server issues a server certificate for hosts (default 127.0.0.1, where
// kfake and the proxy listen).
func (tc *testCerts) server(cn string, hosts ...string) *testpki.Leaf {
	if len(hosts) == 0 {
		hosts = []string{"127.0.0.1"}
	}
	return tc.issue(cn, testpki.Opts{Hosts: hosts})
}

func (tc *testCerts) client(cn string) *testpki.Leaf {
	return tc.issue(cn, testpki.Opts{Client: true})
}

// expired issues a certificate that expired an hour ago.
func (tc *testCerts) expired(cn string, client bool) *testpki.Leaf {
	return tc.issue(cn, testpki.Opts{Hosts: []string{"127.0.0.1"}, Client: client,
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
}

// write puts l's chain and key in the test's directory as name.crt and
// name.key, replacing what was there.
func (tc *testCerts) write(l *testpki.Leaf, name string) (certFile, keyFile string) {
	tc.t.Helper()
	certFile, keyFile, err := l.Write(tc.dir, name)
	if err != nil {
		tc.t.Fatal(err)
	}
	return certFile, keyFile
}

// clientConfig trusts the root; with leaf it presents it (mutual TLS).
func (tc *testCerts) clientConfig(leaf *testpki.Leaf) *tls.Config {
	c := &tls.Config{RootCAs: tc.root.Pool}
	if leaf != nil {
		c.Certificates = []tls.Certificate{leaf.TLS()}
	}
	return c
}

// tlsCluster starts a kfake cluster whose brokers speak TLS with leaf.
func tlsCluster(t testing.TB, leaf *testpki.Leaf, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	return newCluster(t, append(opts, kfake.TLS(&tls.Config{Certificates: []tls.Certificate{leaf.TLS()}}))...)
}

// withClientTLS makes every client listener of the proxy speak TLS with
// leaf, written as name.crt/name.key.
func withClientTLS(tc *testCerts, leaf *testpki.Leaf, name string) func(*Config) {
	certFile, keyFile := tc.write(leaf, name)
	return func(cfg *Config) { cfg.TLS.Cert, cfg.TLS.Key = certFile, keyFile }
}

func both(mods ...func(*Config)) func(*Config) {
	return func(cfg *Config) {
		for _, m := range mods {
			if m != nil {
				m(cfg)
			}
		}
	}
}

// dialRawTLS is dialRaw over TLS.
func dialRawTLS(t testing.TB, addr string, cfg *tls.Config) *rawConn {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return &rawConn{t: t, conn: c}
}

// apiVersions round-trips an ApiVersions request: the connection works.
func (r *rawConn) apiVersions() {
	r.t.Helper()
	req := kmsg.NewPtrApiVersionsRequest()
	req.SetVersion(3)
	req.ClientSoftwareName, req.ClientSoftwareVersion = "raw", "1"
	if resp := r.roundTrip(req).(*kmsg.ApiVersionsResponse); resp.ErrorCode != 0 {
		r.t.Fatalf("ApiVersions: error %d", resp.ErrorCode)
	}
}

// expectClosed sends an ApiVersions request on conn and expects the
// connection to be closed instead of answered; it returns the read error.
func expectClosed(t *testing.T, conn net.Conn) error {
	t.Helper()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	req := kmsg.NewPtrApiVersionsRequest()
	frame := kmsg.NewRequestFormatter().AppendRequest(nil, req, 1)
	if _, err := conn.Write(frame); err != nil {
		return err
	}
	_, err := readFrame(conn)
	if err == nil {
		t.Fatal("connection answered; want it closed")
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("connection neither answered nor closed")
	}
	return err
}

// peerCN is the common name of the certificate the server presented.
func peerCN(t testing.TB, r *rawConn) string {
	t.Helper()
	return r.conn.(*tls.Conn).ConnectionState().PeerCertificates[0].Subject.CommonName
}

// awaitLog waits (bounded) for a log line containing want.
func (p *testProxy) awaitLog(t testing.TB, want string) {
	t.Helper()
	waitFor(t, 10*time.Second, "log line "+strconv.Quote(want), func() bool { return strings.Contains(p.logs.String(), want) })
}

// kgoRoundTrip produces n idempotent records to topic through addr with
// franz-go and consumes them back, over TLS when tlsCfg is set.
func kgoRoundTrip(t *testing.T, addr string, tlsCfg *tls.Config, topic string, n int, opts ...kgo.Opt) {
	t.Helper()
	base := []kgo.Opt{kgo.SeedBrokers(addr), kgo.MetadataMinAge(100 * time.Millisecond)}
	if tlsCfg != nil {
		base = append(base, kgo.DialTLSConfig(tlsCfg.Clone()))
	}
	base = append(base, opts...)
	prod, err := kgo.NewClient(append(base, kgo.DefaultProduceTopic(topic))...)
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Value: []byte(strconv.Itoa(i))}
	}
	if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("kgo produce through %s: %v", addr, err)
	}
	// A short fetch wait: a long-polling Fetch still in flight would hold
	// up the proxy's drain at the end of the test.
	cons, err := kgo.NewClient(append(base, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200*time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	consumeValues(ctx, t, cons, n)
}

// consumeValues polls until values 0..n-1 have each been read once.
func consumeValues(ctx context.Context, t *testing.T, cl *kgo.Client, n int) {
	t.Helper()
	seen := make(map[string]int, n)
	got := 0
	for polls := 0; got < n && polls < 1000 && ctx.Err() == nil; polls++ {
		fs := cl.PollFetches(ctx)
		for _, e := range fs.Errors() {
			if !errors.Is(e.Err, context.DeadlineExceeded) {
				t.Fatalf("consume: %v", e.Err)
			}
		}
		fs.EachRecord(func(r *kgo.Record) { seen[string(r.Value)]++; got++ })
	}
	for i := 0; i < n; i++ {
		if k := seen[strconv.Itoa(i)]; k != 1 {
			t.Fatalf("record %d consumed %d times (%d read in all)", i, k, got)
		}
	}
}

// saramaProduce produces n idempotent records with sarama through addr.
func saramaProduce(t *testing.T, addr string, tlsCfg *tls.Config, topic string, n int) {
	t.Helper()
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_8_0_0
	cfg.Producer.Idempotent = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Return.Successes = true
	cfg.Net.MaxOpenRequests = 1
	cfg.Metadata.Retry.Backoff = 50 * time.Millisecond
	if tlsCfg != nil {
		cfg.Net.TLS.Enable = true
		cfg.Net.TLS.Config = tlsCfg.Clone()
	}
	prod, err := sarama.NewSyncProducer([]string{addr}, cfg)
	if err != nil {
		t.Fatalf("sarama through %s: %v", addr, err)
	}
	defer prod.Close()
	msgs := make([]*sarama.ProducerMessage, n)
	for i := range msgs {
		msgs[i] = &sarama.ProducerMessage{Topic: topic, Value: sarama.StringEncoder(strconv.Itoa(i))}
	}
	if err := prod.SendMessages(msgs); err != nil {
		t.Fatalf("sarama produce: %v", err)
	}
}

// TestTLSLegs runs franz-go and sarama through the proxy with TLS on each
// leg and on both: records produced are consumed back, the batches were
// decided (TLS changes nothing above the connection), and every broker
// address the clients see is a proxy listener speaking TLS too.
func TestTLSLegs(t *testing.T) {
	t.Parallel()
	certs := newTestCerts(t)
	brokerCert := certs.server("broker", "127.0.0.1", "localhost")
	for _, legs := range []struct {
		name             string
		client, upstream bool
	}{
		{"clients=tls,brokers=tls", true, true},
		{"clients=tls,brokers=plain", true, false},
		{"clients=plain,brokers=tls", false, true},
	} {
		t.Run(legs.name, func(t *testing.T) {
			t.Parallel()
			const topic = "legs"
			var c *kfake.Cluster
			mods := []func(*Config){}
			if legs.upstream {
				c = tlsCluster(t, brokerCert, kfake.SeedTopics(3, topic))
				mods = append(mods, func(cfg *Config) { cfg.UpstreamTLS.CA = certs.caFile })
			} else {
				c = newCluster(t, kfake.SeedTopics(3, topic))
			}
			var clientCfg *tls.Config
			if legs.client {
				mods = append(mods, withClientTLS(certs, certs.server("proxy"), "proxy-"+strings.ReplaceAll(legs.name, ",", "-")))
				clientCfg = certs.clientConfig(nil)
			}
			p := startProxy(t, c, both(mods...))
			if err := p.Probe(context.Background()); err != nil {
				t.Fatalf("readiness probe: %v", err)
			}
			kgoRoundTrip(t, p.addr(), clientCfg, topic, 500)
			saramaProduce(t, p.addr(), clientCfg, topic, 200)
			if n := testutil.ToFloat64(p.Metrics.Batches[metrics.OutAccepted]); n < 2 {
				t.Fatalf("%v batches decided; want every idempotent batch decided", n)
			}
			for id := int32(0); id < 3; id++ {
				if addr, ok := p.nodes.Advertised(id); ok && clientCfg != nil {
					dialRawTLS(t, addr, clientCfg).apiVersions()
				}
			}
		})
	}
}

// TestTLSMutualClients: with tls.client_ca the proxy requires a client
// certificate issued by that CA. A client without one, with an expired
// one, or with one from another CA is refused with a log line naming the
// reason; a client with a good one, and connections already open, are
// unaffected.
func TestTLSMutualClients(t *testing.T) {
	t.Parallel()
	const topic = "mtls"
	certs := newTestCerts(t)
	c := newCluster(t, kfake.SeedTopics(3, topic))
	p := startProxy(t, c, both(withClientTLS(certs, certs.server("proxy"), "proxy"),
		func(cfg *Config) { cfg.TLS.ClientCA = certs.caFile }))
	good := certs.clientConfig(certs.client("good-client"))
	open := dialRawTLS(t, p.addr(), good)
	open.apiVersions()

	other := newTestCerts(t)
	for _, bad := range []struct {
		name string
		cert *testpki.Leaf
		log  string
	}{
		{"no certificate", nil, "client didn't provide a certificate"},
		{"expired certificate", certs.expired("expired-client", true), "certificate has expired"},
		{"certificate from another CA", other.client("stranger"), "certificate signed by unknown authority"},
	} {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", p.addr(), certs.clientConfig(bad.cert))
		if err == nil { // TLS 1.3: the server checks the client's certificate after the client's handshake ends
			err = expectClosed(t, conn)
			conn.Close()
		}
		t.Logf("%s: the client sees %v", bad.name, err)
		p.awaitLog(t, bad.log)
	}
	if n := testutil.ToFloat64(p.Metrics.ClientErrors.WithLabelValues(metrics.ClientHandshake)); n != 3 {
		t.Errorf("tls_handshake errors counted %v, want 3", n)
	}
	open.apiVersions()
	kgoRoundTrip(t, p.addr(), good, topic, 100)
}

// TestTLSClientMistakes: the mistakes a client makes with a TLS proxy each
// get a clear error, on that connection only: plaintext to a TLS listener
// (one log line on the proxy), a client that does not trust the proxy's
// CA, a proxy certificate for another host, an expired one.
func TestTLSClientMistakes(t *testing.T) {
	t.Parallel()
	const topic = "mistakes"
	certs := newTestCerts(t)
	c := newCluster(t, kfake.SeedTopics(3, topic))
	p := startProxy(t, c, withClientTLS(certs, certs.server("proxy"), "proxy"))
	trust := certs.clientConfig(nil)
	open := dialRawTLS(t, p.addr(), trust)
	open.apiVersions()

	t.Run("plaintext to a TLS listener", func(t *testing.T) {
		plain := dialRaw(t, p.addr())
		expectClosed(t, plain.conn)
		p.awaitLog(t, "client sent plaintext to a TLS listener")
		waitFor(t, 10*time.Second, "plaintext counted", func() bool {
			return testutil.ToFloat64(p.Metrics.ClientErrors.WithLabelValues(metrics.ClientPlaintext)) == 1
		})
		if n := strings.Count(p.logs.String(), "client sent plaintext to a TLS listener"); n != 1 {
			t.Errorf("%d log lines for one plaintext connection, want 1", n)
		}
	})
	t.Run("client does not trust the proxy's CA", func(t *testing.T) {
		other := newTestCerts(t)
		_, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", p.addr(), other.clientConfig(nil))
		if err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
			t.Fatalf("client error %v, want unknown authority", err)
		}
		p.awaitLog(t, "TLS handshake failed")
	})
	for _, bad := range []struct {
		name string
		cert *testpki.Leaf
		want string
	}{
		{"proxy certificate for another host", certs.server("wrong-host", "proxy.other.example", "10.9.9.9"), "certificate is valid for 10.9.9.9, not 127.0.0.1"},
		{"expired proxy certificate", certs.expired("expired-proxy", false), "certificate has expired"},
	} {
		t.Run(bad.name, func(t *testing.T) {
			q := startProxy(t, c, withClientTLS(certs, bad.cert, strings.ReplaceAll(bad.name, " ", "-")))
			_, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", q.addr(), trust)
			if err == nil || !strings.Contains(err.Error(), bad.want) {
				t.Fatalf("client error %v, want %q", err, bad.want)
			}
			cl, err := kgo.NewClient(kgo.SeedBrokers(q.addr()), kgo.DialTLSConfig(trust.Clone()))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := cl.Ping(ctx); err == nil || !strings.Contains(err.Error(), bad.want) {
				t.Fatalf("franz-go: %v, want %q", err, bad.want)
			}
		})
	}
	open.apiVersions()
	kgoRoundTrip(t, p.addr(), trust, topic, 100)
}

// TestTLSBrokerMistakes: a broker whose certificate does not verify (wrong
// CA, expired, issued for another host) fails the connections to that
// broker with the reason in the log line; connections to the others work.
// upstream_tls.server_name verifies every broker against one name.
func TestTLSBrokerMistakes(t *testing.T) {
	t.Parallel()
	const topic = "brokers"
	certs := newTestCerts(t)
	// Each kfake broker serves the certificate for its own port.
	var mu sync.Mutex
	byPort := map[string]*tls.Certificate{}
	serve := func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
		_, port, _ := net.SplitHostPort(hello.Conn.LocalAddr().String())
		mu.Lock()
		defer mu.Unlock()
		return byPort[port], nil
	}
	c := newCluster(t, kfake.SeedTopics(3, topic), kfake.TLS(&tls.Config{GetCertificate: serve}))
	other := newTestCerts(t)
	leaves := []*testpki.Leaf{
		certs.server("good-broker"),
		certs.expired("expired-broker", false),
		certs.server("elsewhere-broker", "broker.other.example", "10.9.9.9"),
	}
	addrs := c.ListenAddrs()
	mu.Lock()
	for i, a := range addrs {
		_, port, _ := net.SplitHostPort(a)
		cert := leaves[i].TLS()
		byPort[port] = &cert
	}
	mu.Unlock()

	p := startProxy(t, c, func(cfg *Config) {
		cfg.Upstream = addrs[:1] // the good broker bootstraps
		cfg.UpstreamTLS.CA = certs.caFile
	})
	if err := p.Probe(context.Background()); err != nil {
		t.Fatalf("probe through the good broker: %v", err)
	}
	// The proxy's listener for the broker at addrs[i].
	listener := func(i int) string {
		for id := int32(0); id < 3; id++ {
			if up, _ := p.nodes.Upstream(id); up == addrs[i] {
				if a, ok := p.nodes.ListenAddr(id); ok {
					return a
				}
			}
		}
		t.Fatalf("no listener for broker %s", addrs[i])
		return ""
	}
	open := dialRaw(t, listener(0))
	open.apiVersions()
	for i, want := range map[int]string{
		1: "x509: certificate has expired",
		2: "x509: certificate is valid for 10.9.9.9, not 127.0.0.1",
	} {
		expectClosed(t, dialRaw(t, listener(i)).conn)
		p.awaitLog(t, want)
	}
	if n := testutil.ToFloat64(p.Metrics.BrokerErrors.WithLabelValues(metrics.BrokerTLS)); n != 2 {
		t.Errorf("broker tls errors counted %v, want 2", n)
	}
	open.apiVersions()
	dialRaw(t, listener(0)).apiVersions()

	t.Run("wrong CA", func(t *testing.T) {
		q := startProxy(t, c, func(cfg *Config) { cfg.Upstream = addrs[:1]; cfg.UpstreamTLS.CA = other.caFile })
		err := q.Probe(context.Background())
		if err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
			t.Fatalf("probe: %v, want unknown authority", err)
		}
		expectClosed(t, dialRaw(t, q.addr()).conn)
		q.awaitLog(t, "certificate signed by unknown authority")
	})
	t.Run("plaintext to a TLS broker", func(t *testing.T) {
		q := startProxy(t, c, func(cfg *Config) { cfg.Upstream = addrs[:1] })
		err := q.Probe(context.Background())
		if err == nil || !strings.Contains(err.Error(), "upstream_tls") {
			t.Fatalf("probe: %v, want a hint at upstream_tls", err)
		}
	})
	t.Run("server_name override", func(t *testing.T) {
		q := startProxy(t, c, func(cfg *Config) {
			cfg.Upstream = addrs[2:3]
			cfg.UpstreamTLS.CA = certs.caFile
			cfg.UpstreamTLS.ServerName = "broker.other.example"
		})
		if err := q.Probe(context.Background()); err != nil {
			t.Fatalf("probe with server_name: %v", err)
		}
		dialRaw(t, q.addr()).apiVersions()
	})
}

// TestTLSCertificateRotation: the client listeners' certificate files are
// replaced; after SIGHUP (ReloadTLS) or the next periodic check, new
// connections get the new certificate and open ones keep working. A
// half-replaced pair (new certificate, old key) keeps the old certificate
// until the key follows.
func TestTLSCertificateRotation(t *testing.T) {
	t.Parallel()
	certs := newTestCerts(t)
	c := newCluster(t, kfake.NumBrokers(1))
	trust := certs.clientConfig(nil)

	t.Run("SIGHUP", func(t *testing.T) {
		t.Parallel()
		p := startProxy(t, c, both(withClientTLS(certs, certs.server("gen-1"), "hup"),
			func(cfg *Config) { cfg.CertReloadInterval = time.Hour }))
		old := dialRawTLS(t, p.addr(), trust)
		old.apiVersions()
		if cn := peerCN(t, old); cn != "gen-1" {
			t.Fatalf("first certificate %q", cn)
		}

		gen2 := certs.server("gen-2")
		certFile, keyFile := certs.write(gen2, "hup")
		if cn := peerCN(t, dialRawTLS(t, p.addr(), trust)); cn != "gen-1" {
			t.Fatalf("certificate changed before the reload: %q", cn)
		}
		if err := p.ReloadTLS(); err != nil {
			t.Fatal(err)
		}
		if cn := peerCN(t, dialRawTLS(t, p.addr(), trust)); cn != "gen-2" {
			t.Fatalf("after reload, new connections get %q, want gen-2", cn)
		}
		old.apiVersions() // the open connection keeps working

		// The certificate is replaced before its key: the pair does not
		// load, the previous one stays, one warning says so.
		gen3 := certs.server("gen-3")
		if err := testpki.WriteFile(certFile, gen3.ChainPEM); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := p.ReloadTLS(); err == nil {
				t.Fatal("a certificate with another certificate's key loaded")
			}
		}
		if cn := peerCN(t, dialRawTLS(t, p.addr(), trust)); cn != "gen-2" {
			t.Fatalf("half-replaced files: new connections get %q, want gen-2", cn)
		}
		if n := strings.Count(p.logs.String(), "keeping the previous certificate"); n != 1 {
			t.Errorf("%d warnings for one bad pair, want 1", n)
		}
		if err := testpki.WriteFile(keyFile, gen3.KeyPEM); err != nil {
			t.Fatal(err)
		}
		if err := p.ReloadTLS(); err != nil {
			t.Fatal(err)
		}
		if cn := peerCN(t, dialRawTLS(t, p.addr(), trust)); cn != "gen-3" {
			t.Fatalf("after the key followed: %q, want gen-3", cn)
		}
		old.apiVersions()
	})
	t.Run("files change", func(t *testing.T) {
		t.Parallel()
		// The files are checked every hour of the proxy's clock, which the
		// test moves.
		clk := clock.NewManual(time.Now())
		p := startProxyWith(t, c, both(withClientTLS(certs, certs.server("poll-1"), "poll"),
			func(cfg *Config) { cfg.CertReloadInterval = time.Hour }), func(s *Server) { s.Clock = clk })
		old := dialRawTLS(t, p.addr(), trust)
		old.apiVersions()
		certs.write(certs.server("poll-2"), "poll")
		if cn := peerCN(t, dialRawTLS(t, p.addr(), trust)); cn != "poll-1" {
			t.Fatalf("before the check: %q, want poll-1", cn)
		}
		clk.Advance(time.Hour)
		waitFor(t, 10*time.Second, "new connections to get the new certificate", func() bool {
			return peerCN(t, dialRawTLS(t, p.addr(), trust)) == "poll-2"
		})
		old.apiVersions()
		p.awaitLog(t, "TLS certificate reloaded")
	})
}

// TestTLSConfigErrors: a TLS configuration that cannot work stops Start
// with the file and the reason.
func TestTLSConfigErrors(t *testing.T) {
	t.Parallel()
	certs := newTestCerts(t)
	certFile, keyFile := certs.write(certs.server("proxy"), "proxy")
	otherCert, _ := certs.write(certs.server("other"), "other")
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"cert without key", func(c *Config) { c.TLS.Cert = certFile }, "cert and key go together"},
		{"missing file", func(c *Config) { c.TLS.Cert, c.TLS.Key = certFile+".missing", keyFile }, "no such file"},
		{"key of another certificate", func(c *Config) { c.TLS.Cert, c.TLS.Key = otherCert, keyFile }, "private key does not match public key"},
		{"client_ca without cert", func(c *Config) { c.TLS.ClientCA = certs.caFile }, "client_ca needs cert and key"},
		{"min_version 1.1", func(c *Config) { c.TLS.Cert, c.TLS.Key, c.TLS.MinVersion = certFile, keyFile, "1.1" }, "want 1.2 or 1.3"},
		{"upstream CA not PEM", func(c *Config) { c.UpstreamTLS.CA = keyFile }, "no PEM certificate"},
		{"sasl without password file", func(c *Config) { c.UpstreamSASL.Mechanism, c.UpstreamSASL.User = "plain", "u" }, "needs user and password_file"},
		{"sasl mechanism GSSAPI", func(c *Config) {
			c.UpstreamSASL = SASLConfig{Mechanism: "GSSAPI", User: "u", PasswordFile: keyFile}
		}, "cannot authenticate with them itself"},
	} {
		cfg := Config{Upstream: []string{"127.0.0.1:1"}, Listen: "127.0.0.1:0", Admin: "off"}
		tc.mod(&cfg)
		s := &Server{Config: cfg, Logger: discardLogger()}
		err := s.Start(context.Background())
		if err == nil {
			s.Shutdown(context.Background())
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Start: %v, want %q", tc.name, err, tc.want)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s.Shutdown(ctx)
		cancel()
	}
}

// discardLogger drops every line.
func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// TestTLSUpstreamClientCertificate: brokers that require a client
// certificate (ssl.client.auth=required) accept the proxy's
// (upstream_tls.cert and key), on the proxy's own connections and on
// clients'; without it the probe says the broker wants one.
func TestTLSUpstreamClientCertificate(t *testing.T) {
	t.Parallel()
	const topic = "upstream-mtls"
	certs := newTestCerts(t)
	broker := certs.server("broker").TLS()
	c := newCluster(t, kfake.SeedTopics(3, topic), kfake.TLS(&tls.Config{
		Certificates: []tls.Certificate{broker},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    certs.root.Pool,
	}))
	certFile, keyFile := certs.write(certs.client("the-proxy"), "proxy-client")
	p := startProxy(t, c, func(cfg *Config) {
		cfg.UpstreamTLS = UpstreamTLSConfig{CA: certs.caFile, Cert: certFile, Key: keyFile}
	})
	if err := p.Probe(context.Background()); err != nil {
		t.Fatalf("probe with the proxy's client certificate: %v", err)
	}
	kgoRoundTrip(t, p.addr(), nil, topic, 200)

	q := startProxy(t, c, func(cfg *Config) { cfg.UpstreamTLS.CA = certs.caFile })
	err := q.Probe(context.Background())
	if err == nil || !strings.Contains(err.Error(), "certificate required") {
		t.Fatalf("probe without a client certificate: %v, want the broker's certificate required alert", err)
	}
}

// TestTLSMinVersion: min_version 1.3 refuses a TLS 1.2 client with a
// protocol version alert; the default accepts it.
func TestTLSMinVersion(t *testing.T) {
	t.Parallel()
	certs := newTestCerts(t)
	c := newCluster(t, kfake.NumBrokers(1))
	tls12 := certs.clientConfig(nil)
	tls12.MaxVersion = tls.VersionTLS12
	def := startProxy(t, c, withClientTLS(certs, certs.server("default"), "default"))
	dialRawTLS(t, def.addr(), tls12).apiVersions()

	strict := startProxy(t, c, both(withClientTLS(certs, certs.server("strict"), "strict"),
		func(cfg *Config) { cfg.TLS.MinVersion = config.TLS13 }))
	_, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", strict.addr(), tls12)
	if err == nil || !strings.Contains(err.Error(), "protocol version") {
		t.Fatalf("TLS 1.2 client against min_version 1.3: %v", err)
	}
	strict.awaitLog(t, "TLS handshake failed")
}
