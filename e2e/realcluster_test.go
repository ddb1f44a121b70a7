package e2e

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/dedupproxy/dedupproxy/internal/testcluster"
	"github.com/dedupproxy/dedupproxy/internal/testpki"
)

// TestRealClusterSwitch runs the lost-acknowledgement harness against a
// cluster named only by the environment, as DEDUPPROXY_TEST_UPSTREAM names
// a real one: here a kfake that requires TLS (and, for the Go clients,
// SCRAM-SHA-256 too), started apart from the harness, which reaches it
// only through internal/testcluster. Every client goes through the shim
// and the proxy with the cluster's settings; the control run shows the
// duplicates and the proxy run none; the faults that need kfake's hooks
// skip, saying which hook.
//
// Only the Go clients authenticate here: kfake accepts SaslHandshake v1
// alone and leaves its mechanism list empty on success, which librdkafka
// (kcat, confluent-kafka-python), kafka-python (v0) and kafkajs (the list)
// refuse; a real Kafka serves them all (docs/real-cluster.md).
func TestRealClusterSwitch(t *testing.T) {
	if real, _ := realCluster(); real != nil {
		t.Skipf("the run is against %s already", real.Describe())
	}
	root, err := testpki.NewCA("e2e real-cluster root")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := root.Issue("broker", testpki.Opts{Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	goClient := map[string]bool{"franz-go": true, "sarama": true, "kafka-go": true}
	for _, setup := range []struct {
		name string
		sasl bool
	}{{"SASL_SSL", true}, {"SSL", false}} {
		t.Run(setup.name, func(t *testing.T) {
			dir := t.TempDir()
			opts := []kfake.Opt{kfake.NumBrokers(2), kfake.TLS(&tls.Config{Certificates: []tls.Certificate{leaf.TLS()}})}
			if setup.sasl {
				opts = append(opts, kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", "e2e", "e2e-secret"))
			}
			c, err := kfake.NewCluster(opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ca := filepath.Join(dir, "ca.pem")
			if err := os.WriteFile(ca, root.PEM, 0o600); err != nil {
				t.Fatal(err)
			}
			t.Setenv(testcluster.EnvUpstream, strings.Join(c.ListenAddrs(), ","))
			t.Setenv(testcluster.EnvTLSCA, ca)
			if setup.sasl {
				t.Setenv(testcluster.EnvSASLMechanism, "SCRAM-SHA-256")
				t.Setenv(testcluster.EnvSASLUser, "e2e")
				t.Setenv(testcluster.EnvSASLPassword, "e2e-secret")
			}
			real, err := testcluster.FromEnv(dir)
			if err != nil {
				t.Fatal(err)
			}
			forcedReal.Store(real)
			defer forcedReal.Store(nil)
			for _, client := range legacyClients() {
				if client.name == "kafka-python retries=0" || client.name == "franz-go idempotent" || setup.sasl && !goClient[client.name] {
					continue
				}
				t.Run(client.name, func(t *testing.T) {
					requireClient(t, client.name, client.available())
					for _, mode := range []string{modeControl, modeProxy, modeTimedOut, modeCut} {
						t.Run(mode, func(t *testing.T) { runLostAck(t, client, mode) })
					}
				})
			}
		})
	}
}
