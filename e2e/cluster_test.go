package e2e

import (
	"context"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"

	"github.com/dedupproxy/dedupproxy/internal/testcluster"
	"github.com/dedupproxy/dedupproxy/internal/testskip"
	"github.com/dedupproxy/dedupproxy/proxy"
)

// testCluster is the Kafka cluster a test runs against: an in-process
// kfake (the default), or the real cluster DEDUPPROXY_TEST_UPSTREAM names
// (internal/testcluster; docs/real-cluster.md), on which each test creates
// its own topics under fresh names and deletes them at its end.
//
// A test that can run against any cluster takes its topic name from
// topic(), its proxy from startProxy and its clients' credentials from
// sasl(); a test that needs one of kfake's hooks asks kfake(t, why), which
// skips it under a real cluster saying why.
type testCluster struct {
	fake   *kfake.Cluster
	real   *testcluster.Cluster
	topics map[string]string // the test's topic name -> the cluster's
}

// realCluster is the environment's cluster, read once; its password, if
// the environment gives one, goes to a file in runDir for the proxy.
var realCluster = sync.OnceValues(func() (*testcluster.Cluster, error) {
	dir, err := runDir()
	if err != nil {
		return nil, err
	}
	return testcluster.FromEnv(dir)
})

// forcedReal, when set, is the real cluster instead of the environment's
// (TestRealClusterSwitch's, named by an environment it sets itself).
var forcedReal atomic.Pointer[testcluster.Cluster]

// runDir is a directory for the whole run, removed by TestMain.
var runDir = sync.OnceValues(func() (string, error) { return os.MkdirTemp("", "dedupproxy-e2e-") })

// newTestCluster starts a kfake cluster of brokers brokers with topics
// seeded at legacyPartitions partitions, or, under a real cluster, creates
// those topics there (under fresh names: see topic).
func newTestCluster(t testing.TB, brokers int, topics ...string) *testCluster {
	t.Helper()
	real, err := realCluster()
	if err != nil {
		t.Fatalf("%s: %v", testcluster.EnvUpstream, err)
	}
	if f := forcedReal.Load(); f != nil {
		real = f
	}
	c := &testCluster{real: real, topics: map[string]string{}}
	if real == nil {
		fake, err := kfake.NewCluster(kfake.NumBrokers(brokers), kfake.SeedTopics(legacyPartitions, topics...))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(fake.Close)
		c.fake = fake
		for _, topic := range topics {
			c.topics[topic] = topic
		}
		return c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, topic := range topics {
		name := testcluster.TopicName("dedupproxy-e2e-" + topic)
		if err := real.CreateTopic(ctx, name, legacyPartitions); err != nil {
			t.Fatal(err)
		}
		c.topics[topic] = name
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := real.DeleteTopic(ctx, name); err != nil {
				t.Logf("deleting topic %s: %v", name, err)
			}
		})
	}
	t.Logf("against the real cluster %s, topics %v", real.Describe(), c.topics)
	return c
}

// topic is the cluster's name for the test's topic.
func (c *testCluster) topic(name string) string {
	if n, ok := c.topics[name]; ok {
		return n
	}
	return name
}

// kfake returns the in-process cluster, or skips the test under a real
// cluster: need says which of kfake's hooks the test uses.
func (c *testCluster) kfake(t testing.TB, need string) *kfake.Cluster {
	t.Helper()
	if c.fake == nil {
		testskip.Skipf(t, "needs kfake's %s, which a real cluster (%s) does not have", need, testcluster.EnvUpstream)
	}
	return c.fake
}

// addrs are the bootstrap brokers.
func (c *testCluster) addrs() []string {
	if c.fake != nil {
		return c.fake.ListenAddrs()
	}
	return c.real.Config.Upstream
}

// proxyConfig is the proxy's configuration in front of the cluster: its
// brokers, TLS and SASL.
func (c *testCluster) proxyConfig(listen string) proxy.Config {
	cfg := proxy.Config{Upstream: c.addrs(), Listen: listen, Admin: "off"}
	if c.real != nil {
		cfg.UpstreamTLS, cfg.UpstreamSASL = c.real.Config.UpstreamTLS, c.real.Config.UpstreamSASL
	}
	return cfg
}

// clientOpts reach the cluster directly (for reading back what it holds).
func (c *testCluster) clientOpts(t testing.TB) []kgo.Opt {
	t.Helper()
	if c.fake != nil {
		return []kgo.Opt{kgo.SeedBrokers(c.fake.ListenAddrs()...)}
	}
	opts, err := c.real.ClientOpts()
	if err != nil {
		t.Fatal(err)
	}
	return opts
}

// dial connects to a broker of the cluster (TLS when it speaks TLS), for
// the shim's upstream side.
func (c *testCluster) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if c.real != nil {
		return c.real.Dial(ctx, network, addr)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// sasl is what the test's clients authenticate with: nothing on kfake.
func (c *testCluster) sasl() testcluster.SASL {
	if c.real != nil {
		return c.real.SASL
	}
	return testcluster.SASL{}
}

// tls reports whether the cluster speaks TLS: then only the proxy and the
// shim reach it, and a fault that reads Kafka frames on the proxy's broker
// connection (cut) cannot run.
func (c *testCluster) tls() bool { return c.real != nil && c.real.Config.UpstreamTLS.Enabled }

// kgoSASL is franz-go's mechanism for s, nil without one.
func kgoSASL(s testcluster.SASL) sasl.Mechanism {
	return (&testcluster.Cluster{SASL: s}).ClientSASL()
}
