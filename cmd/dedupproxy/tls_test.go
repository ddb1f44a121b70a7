package main

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/dedupproxy/dedupproxy/internal/testpki"
	"github.com/dedupproxy/dedupproxy/proxy"
)

// TestTLSFlags: the TLS and SASL flags set their config keys, win over the
// file, --upstream-tls-ca implies --upstream-tls, and no flag takes a
// password.
func TestTLSFlags(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte("upstream: [a:1]\ntls:\n  cert: file.crt\n  key: file.key\n  min_version: \"1.3\"\nupstream_sasl:\n  user: from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig([]string{"--config", path,
		"--tls-cert", "p.crt", "--tls-key", "p.key", "--tls-client-ca", "clients.pem",
		"--tls-principal-mapping-rules", "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,DEFAULT",
		"--upstream-tls-ca", "brokers.pem", "--upstream-tls-cert", "me.crt", "--upstream-tls-key", "me.key",
		"--upstream-tls-server-name", "kafka.internal",
		"--upstream-sasl-mechanism", "scram-sha-512", "--upstream-sasl-user", "proxy", "--upstream-sasl-password-file", "pw",
		"--admin-tls-cert", "a.crt", "--admin-tls-key", "a.key"})
	if err != nil {
		t.Fatal(err)
	}
	want := proxy.Config{
		TLS: proxy.TLSConfig{Cert: "p.crt", Key: "p.key", ClientCA: "clients.pem", MinVersion: "1.3",
			PrincipalMappingRules: "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,DEFAULT"},
		UpstreamTLS:  proxy.UpstreamTLSConfig{Enabled: true, CA: "brokers.pem", Cert: "me.crt", Key: "me.key", ServerName: "kafka.internal", MinVersion: "1.2"},
		UpstreamSASL: proxy.SASLConfig{Mechanism: "SCRAM-SHA-512", User: "proxy", PasswordFile: "pw"},
		AdminTLS:     proxy.TLSConfig{Cert: "a.crt", Key: "a.key", MinVersion: "1.2"},
	}
	got := proxy.Config{TLS: cfg.TLS, UpstreamTLS: cfg.UpstreamTLS, UpstreamSASL: cfg.UpstreamSASL, AdminTLS: cfg.AdminTLS}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("flags gave\n%+v\nwant\n%+v", got, want)
	}
	cfg, err = loadConfig([]string{"--upstream", "a:1", "--upstream-tls"})
	if err != nil || !cfg.UpstreamTLS.Enabled || cfg.UpstreamTLS.CA != "" {
		t.Fatalf("--upstream-tls: %+v, %v", cfg.UpstreamTLS, err)
	}
	if _, err := loadConfig([]string{"--upstream-sasl-password", "hunter2"}); err == nil {
		t.Fatal("a password flag exists; passwords belong in --upstream-sasl-password-file")
	}
	if _, err := loadConfig([]string{"--tls-cert", "p.crt"}); err == nil || !strings.Contains(err.Error(), "cert and key go together") {
		t.Fatalf("--tls-cert alone: %v", err)
	}
	_, err = loadConfig([]string{"--upstream", "a:1", "--tls-cert", "p.crt", "--tls-key", "p.key", "--tls-client-ca", "c.pem",
		"--tls-principal-mapping-rules", "RULE:^CN=(.*?)$/$1/L/U"})
	if err == nil || !strings.Contains(err.Error(), "tls.principal_mapping_rules: rule 1") {
		t.Fatalf("invalid mapping rules: %v, want an error naming the key and the rule", err)
	}
	if code := run(context.Background(), []string{"--upstream-tls", "--listen", "127.0.0.1:0", "--admin", "off"}, io.Discard, io.Discard); code != 2 {
		t.Fatalf("--upstream-tls with the embedded cluster: exit %d, want 2", code)
	}
}

// TestSASLSSLCommand runs the command as a real process in front of a
// cluster that requires TLS and SCRAM-SHA-512 (SASL_SSL, as cloud clusters
// do), with every TLS flag: /readyz over HTTPS is 200 (the proxy
// authenticates with its own credentials), a franz-go client produces and
// consumes with its own, and after the certificate files are replaced
// SIGHUP gives new connections the new certificate while an open one
// keeps working. SIGTERM then exits 0.
func TestSASLSSLCommand(t *testing.T) {
	const topic = "cloud"
	dir := t.TempDir()
	root, err := testpki.NewCA("cmd test root")
	if err != nil {
		t.Fatal(err)
	}
	issue := func(cn string) *testpki.Leaf {
		l, err := root.Issue(cn, testpki.Opts{Hosts: []string{"127.0.0.1", "localhost"}})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	caFile := filepath.Join(dir, "ca.pem")
	pwFile := filepath.Join(dir, "password")
	cfgFile := filepath.Join(dir, "dedupproxy.yaml")
	for path, b := range map[string]string{caFile: string(root.PEM), pwFile: "proxy-secret\n",
		cfgFile: "cert_reload_interval: 1h  # only SIGHUP reloads in this test\n"} {
		if err := os.WriteFile(path, []byte(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	certFile, keyFile, err := issue("gen-1").Write(dir, "proxy")
	if err != nil {
		t.Fatal(err)
	}
	adminCert, adminKey, err := issue("admin").Write(dir, "admin")
	if err != nil {
		t.Fatal(err)
	}
	broker := issue("broker").TLS()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{broker}}),
		kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", "proxy", "proxy-secret"), kfake.Superuser("SCRAM-SHA-512", "app", "app-secret"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	cmd, logs, exited := startChild(t, "--config", cfgFile, "--upstream", strings.Join(c.ListenAddrs(), ","),
		"--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
		"--tls-cert", certFile, "--tls-key", keyFile,
		"--upstream-tls-ca", caFile,
		"--upstream-sasl-mechanism", "SCRAM-SHA-512", "--upstream-sasl-user", "proxy", "--upstream-sasl-password-file", pwFile,
		"--admin-tls-cert", adminCert, "--admin-tls-key", adminKey)
	addr := logs.await(t, `listener=bootstrap addr=(\S+)`)
	admin := logs.await(t, `admin listening" addr=(\S+) scheme=https`)

	trust := &tls.Config{RootCAs: root.Pool}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: trust}}
	resp, err := hc.Get("https://" + admin + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/readyz over HTTPS: %d %s", resp.StatusCode, body)
	}

	auth := kgo.SASL(scram.Auth{User: "app", Pass: "app-secret"}.AsSha512Mechanism())
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DialTLSConfig(trust.Clone()), auth, kgo.DefaultProduceTopic(topic),
		kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("over SASL_SSL")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if fs := cl.PollFetches(ctx); fs.NumRecords() != 1 {
		t.Fatalf("consumed %d records (%v)", fs.NumRecords(), fs.Errors())
	}

	dial := func() *tls.Conn {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, trust)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	cn := func(c *tls.Conn) string { return c.ConnectionState().PeerCertificates[0].Subject.CommonName }
	if got := cn(dial()); got != "gen-1" {
		t.Fatalf("first certificate %q", got)
	}
	if _, _, err := issue("gen-2").Write(dir, "proxy"); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	logs.await(t, `TLS certificate reloaded.*subject="CN=gen-2"`)
	if got := cn(dial()); got != "gen-2" {
		t.Fatalf("after SIGHUP new connections get %q, want gen-2", got)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("after rotation")}).FirstErr(); err != nil {
		t.Fatalf("the open client after rotation: %v", err)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	cl.Close()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("process exit: %v", err)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("process did not exit after SIGTERM")
	}
}
