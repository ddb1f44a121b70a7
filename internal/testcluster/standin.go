package testcluster

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/dedupproxy/dedupproxy/internal/testpki"
)

// StandIn starts a kfake of brokers brokers that requires TLS (and, with
// sasl, SCRAM-SHA-256 as user stand-in, password stand-in-secret) and
// names it in the environment as DEDUPPROXY_TEST_UPSTREAM names a real
// cluster, for the test's duration: the tests of the switch itself reach
// it only through FromEnv, as they would a real one. It returns the CA too,
// for a test that checks the cluster directly.
func StandIn(t testing.TB, brokers int, sasl bool) (*kfake.Cluster, *testpki.CA) {
	t.Helper()
	root, err := testpki.NewCA("stand-in cluster root")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := root.Issue("broker", testpki.Opts{Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	opts := []kfake.Opt{kfake.NumBrokers(brokers), kfake.TLS(&tls.Config{Certificates: []tls.Certificate{leaf.TLS()}})}
	if sasl {
		opts = append(opts, kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", StandInUser, StandInPassword))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, root.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvUpstream, strings.Join(c.ListenAddrs(), ","))
	t.Setenv(EnvTLSCA, ca)
	if sasl {
		t.Setenv(EnvSASLMechanism, "SCRAM-SHA-256")
		t.Setenv(EnvSASLUser, StandInUser)
		t.Setenv(EnvSASLPassword, StandInPassword)
	}
	return c, root
}

// StandIn's credentials.
const (
	StandInUser     = "stand-in"
	StandInPassword = "stand-in-secret"
)
