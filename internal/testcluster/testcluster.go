// Package testcluster points tests and benchmarks at a real Kafka cluster
// instead of the in-process kfake they start by default: set
// DEDUPPROXY_TEST_UPSTREAM to its bootstrap brokers, and the TLS and SASL
// variables below to what it requires (docs/real-cluster.md). Tests that
// need kfake's fault hooks skip under a real cluster, saying which hook.
//
// It lives under internal/ because e2e and bench use it.
package testcluster

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/dedupproxy/dedupproxy/auth"
	"github.com/dedupproxy/dedupproxy/config"
	"github.com/dedupproxy/dedupproxy/internal/upstream"
	"github.com/dedupproxy/dedupproxy/proxy"
)

// The environment that names a real cluster. Only EnvUpstream is needed
// for a plaintext cluster without authentication.
const (
	// EnvUpstream: the cluster's bootstrap brokers, host:port[,host:port].
	EnvUpstream = "DEDUPPROXY_TEST_UPSTREAM"
	// EnvTLS=1: TLS to the brokers, verified against the system roots
	// (implied by any other TLS variable).
	EnvTLS = "DEDUPPROXY_TEST_TLS"
	// EnvTLSCA: a PEM file of the CA that issued the brokers' certificates.
	EnvTLSCA = "DEDUPPROXY_TEST_TLS_CA"
	// EnvTLSCert and EnvTLSKey: a client certificate, for brokers that
	// require one.
	EnvTLSCert = "DEDUPPROXY_TEST_TLS_CERT"
	EnvTLSKey  = "DEDUPPROXY_TEST_TLS_KEY"
	// EnvTLSServerName: the name broker certificates are verified
	// against, when not each broker's host.
	EnvTLSServerName = "DEDUPPROXY_TEST_TLS_SERVER_NAME"
	// EnvTLSInsecure=1: accept any broker certificate (a test cluster
	// with a self-signed one).
	EnvTLSInsecure = "DEDUPPROXY_TEST_TLS_INSECURE"
	// EnvSASLMechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512. The same
	// credentials serve the test's clients (through the proxy, which
	// relays their SASL) and the proxy's own connections.
	EnvSASLMechanism = "DEDUPPROXY_TEST_SASL_MECHANISM"
	EnvSASLUser      = "DEDUPPROXY_TEST_SASL_USER"
	// EnvSASLPassword, or EnvSASLPasswordFile: a file holding it.
	EnvSASLPassword     = "DEDUPPROXY_TEST_SASL_PASSWORD"
	EnvSASLPasswordFile = "DEDUPPROXY_TEST_SASL_PASSWORD_FILE"
	// EnvReplication: the replication factor of the topics the tests
	// create. Default: the brokers' default.replication.factor.
	EnvReplication = "DEDUPPROXY_TEST_REPLICATION"
)

// Cluster is a real cluster named by the environment.
type Cluster struct {
	// Config holds the cluster's part of a proxy configuration: Upstream,
	// UpstreamTLS and UpstreamSASL.
	Config proxy.Config
	// SASL is the clients' mechanism, user and password; Mechanism is
	// empty when the cluster does not authenticate.
	SASL        SASL
	replication int16
	tls         *tls.Config
}

// SASL is a set of credentials.
type SASL struct{ Mechanism, User, Password string }

// FromEnv returns the cluster the environment names, nil when
// DEDUPPROXY_TEST_UPSTREAM is unset. dir is where a password given in the
// environment is written for the proxy, which reads passwords from files.
func FromEnv(dir string) (*Cluster, error) {
	seeds := os.Getenv(EnvUpstream)
	if seeds == "" {
		return nil, nil
	}
	c := &Cluster{replication: -1}
	for _, s := range strings.Split(seeds, ",") {
		if s = strings.TrimSpace(s); s != "" {
			c.Config.Upstream = append(c.Config.Upstream, s)
		}
	}
	u := &c.Config.UpstreamTLS
	u.CA, u.Cert, u.Key = os.Getenv(EnvTLSCA), os.Getenv(EnvTLSCert), os.Getenv(EnvTLSKey)
	u.ServerName, u.InsecureSkipVerify = os.Getenv(EnvTLSServerName), os.Getenv(EnvTLSInsecure) == "1"
	u.Enabled = os.Getenv(EnvTLS) == "1" || u.CA != "" || u.Cert != "" || u.ServerName != "" || u.InsecureSkipVerify
	if mech := os.Getenv(EnvSASLMechanism); mech != "" {
		c.SASL = SASL{Mechanism: mech, User: os.Getenv(EnvSASLUser), Password: os.Getenv(EnvSASLPassword)}
		file := os.Getenv(EnvSASLPasswordFile)
		switch {
		case file != "":
			b, err := os.ReadFile(file)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", EnvSASLPasswordFile, err)
			}
			c.SASL.Password = strings.TrimRight(string(b), "\r\n")
		case c.SASL.Password != "":
			file = filepath.Join(dir, "sasl-password")
			if err := os.WriteFile(file, []byte(c.SASL.Password), 0o600); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("%s is set: set %s or %s too", EnvSASLMechanism, EnvSASLPassword, EnvSASLPasswordFile)
		}
		c.Config.UpstreamSASL = proxy.SASLConfig{Mechanism: mech, User: c.SASL.User, PasswordFile: file}
	}
	if r := os.Getenv(EnvReplication); r != "" {
		n, err := strconv.ParseInt(r, 10, 16)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%s=%q: want a replication factor", EnvReplication, r)
		}
		c.replication = int16(n)
	}
	check := c.Config
	check.Listen, check.Admin = "127.0.0.1:0", "off"
	check.EnsureDefaults()
	if err := check.Validate(); err != nil {
		return nil, fmt.Errorf("the cluster of %s: %w", EnvUpstream, err)
	}
	tc, err := auth.UpstreamClientConfig(c.Config.UpstreamTLS)
	if err != nil {
		return nil, err
	}
	c.tls = tc
	return c, nil
}

// Describe names the cluster for a log line.
func (c *Cluster) Describe() string {
	s := strings.Join(c.Config.Upstream, ",")
	if c.tls != nil {
		s += " (TLS)"
	}
	if c.SASL.Mechanism != "" {
		s += " (SASL " + c.SASL.Mechanism + " as " + c.SASL.User + ")"
	}
	return s
}

// ClientOpts are franz-go options that reach the cluster directly, with
// the credentials held in memory (not read from the proxy's password
// file).
func (c *Cluster) ClientOpts() ([]kgo.Opt, error) {
	cfg := c.Config
	cfg.UpstreamSASL = proxy.SASLConfig{}
	opts, err := upstream.ClientOpts(cfg)
	if mech := c.ClientSASL(); mech != nil && err == nil {
		opts = append(opts, kgo.SASL(mech))
	}
	return opts, err
}

// Dial connects to a broker as a client of the cluster does: TCP, then TLS
// when the cluster speaks it (the server name is the broker's host unless
// DEDUPPROXY_TEST_TLS_SERVER_NAME says otherwise). For a relay in front of
// the cluster that reads the Kafka protocol (the e2e shim).
func (c *Cluster) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil || c.tls == nil {
		return conn, err
	}
	cfg := c.tls.Clone()
	if cfg.ServerName == "" {
		cfg.ServerName, _, _ = net.SplitHostPort(addr)
	}
	tc := tls.Client(conn, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		conn.Close()
		return nil, err
	}
	return tc, nil
}

// TopicName returns prefix with a random suffix: a real cluster keeps
// topics across runs, and several runs may share it.
func TopicName(prefix string) string {
	b := make([]byte, 4)
	rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// admin is an admin client of the cluster; the caller closes cl.
func (c *Cluster) admin() (*kadm.Client, *kgo.Client, error) {
	opts, err := c.ClientOpts()
	if err != nil {
		return nil, nil, err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, nil, err
	}
	return kadm.NewClient(cl), cl, nil
}

// CreateTopic creates topic with partitions partitions and waits until
// every broker's metadata has it.
func (c *Cluster) CreateTopic(ctx context.Context, topic string, partitions int32) error {
	adm, cl, err := c.admin()
	if err != nil {
		return err
	}
	defer cl.Close()
	resp, err := adm.CreateTopic(ctx, partitions, c.replication, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	// Creation reaches every broker's metadata a moment later; a test's
	// first Produce should not race it.
	for i := 0; i < 100; i++ {
		md, err := adm.Metadata(ctx, topic)
		if err == nil {
			if td, ok := md.Topics[topic]; ok && td.Err == nil && len(td.Partitions) == int(partitions) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("topic %s: not in the metadata 5 s after its creation", topic)
}

// DeleteTopic deletes topic; errors are the caller's to log.
func (c *Cluster) DeleteTopic(ctx context.Context, topic string) error {
	adm, cl, err := c.admin()
	if err != nil {
		return err
	}
	defer cl.Close()
	resp, err := adm.DeleteTopic(ctx, topic)
	if err == nil {
		err = resp.Err
	}
	return err
}

// ClientSASL is the clients' SASL mechanism, nil when the cluster does not
// authenticate: for a client that reaches the cluster through the proxy
// (plaintext to the proxy, its own SASL relayed).
func (c *Cluster) ClientSASL() sasl.Mechanism {
	s := c.SASL
	switch s.Mechanism {
	case config.SASLPlain:
		return plain.Auth{User: s.User, Pass: s.Password}.AsMechanism()
	case config.SASLScramSHA256:
		return scram.Auth{User: s.User, Pass: s.Password}.AsSha256Mechanism()
	case config.SASLScramSHA512:
		return scram.Auth{User: s.User, Pass: s.Password}.AsSha512Mechanism()
	}
	return nil
}

// ProxyYAML is the cluster's part of a proxy config file: upstream_tls
// and upstream_sasl (upstream is the caller's).
func (c *Cluster) ProxyYAML() string {
	var b strings.Builder
	if u := c.Config.UpstreamTLS; u.Enabled {
		fmt.Fprintf(&b, "upstream_tls:\n  enabled: true\n")
		for k, v := range map[string]string{"ca": u.CA, "cert": u.Cert, "key": u.Key, "server_name": u.ServerName} {
			if v != "" {
				fmt.Fprintf(&b, "  %s: %q\n", k, v)
			}
		}
		if u.InsecureSkipVerify {
			fmt.Fprintf(&b, "  insecure_skip_verify: true\n")
		}
	}
	if s := c.Config.UpstreamSASL; s.Mechanism != "" {
		fmt.Fprintf(&b, "upstream_sasl:\n  mechanism: %s\n  user: %q\n  password_file: %q\n", s.Mechanism, s.User, s.PasswordFile)
	}
	return b.String()
}
