package e2e

import (
	"testing"

	"github.com/dedupproxy/dedupproxy/internal/testcluster"
	"github.com/dedupproxy/dedupproxy/internal/testskip"
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
		testskip.Skipf(t, "the run is against %s already", real.Describe())
	}
	goClient := map[string]bool{"franz-go": true, "sarama": true, "kafka-go": true}
	for _, setup := range []struct {
		name string
		sasl bool
	}{{"SASL_SSL", true}, {"SSL", false}} {
		t.Run(setup.name, func(t *testing.T) {
			// One broker, as TestLegacyLostAck's kfake runs: the switch is
			// under test here, not the proxy on more brokers.
			testcluster.StandIn(t, 1, setup.sasl)
			real, err := testcluster.FromEnv(t.TempDir())
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
