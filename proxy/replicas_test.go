package proxy

import (
	"errors"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestReplicaConfigErrors: the replicas settings are checked at start and
// told in the configuration's own terms.
func TestReplicaConfigErrors(t *testing.T) {
	two := 2
	neg := -1
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		host string
		want string
	}{
		{"index out of range", func(c *Config) { c.Replicas = []string{"a:9092", "b:9092"}; c.ReplicaIndex = &two }, "", "replica_index 2: there are 2 replicas, so want 0..1"},
		{"negative index", func(c *Config) { c.Replicas = []string{"a:9092", "b:9092"}; c.ReplicaIndex = &neg }, "", "replica_index -1"},
		{"template without count", func(c *Config) { c.Replicas = []string{"p-{i}.h:9092"} }, "p-0", "{i} stands for the replica index, so replica_count (--replica-count) must say how many"},
		{"count disagrees", func(c *Config) { c.Replicas = []string{"a:9092", "b:9092"}; c.ReplicaCount = 3 }, "p-0", "replica_count is 3 but replicas lists 2 addresses"},
		{"no port", func(c *Config) { c.Replicas = []string{"a", "b:9092"} }, "p-0", `replicas[0] "a"`},
		{"port 0", func(c *Config) { c.Replicas = []string{"a:0", "b:9092"} }, "p-0", "port 0 cannot be advertised"},
		{"every interface", func(c *Config) { c.Replicas = []string{"0.0.0.0:9092", "b:9092"} }, "p-0", "clients cannot connect to that host"},
		{"duplicate", func(c *Config) { c.Replicas = []string{"a:9092", "a:9092"} }, "p-0", "replicas[0] and replicas[1] are both"},
		{"host name without ordinal", func(c *Config) { c.Replicas = []string{"a:9092", "b:9092"} }, "proxyhost", `the host name "proxyhost" does not end in -N as StatefulSet pods do`},
		{"host ordinal too large", func(c *Config) { c.Replicas = []string{"a:9092", "b:9092"} }, "dedupproxy-5", `the host name "dedupproxy-5" makes this replica 5, but there are 2 replicas`},
		{"owner out of range", func(c *Config) { c.Replicas = []string{"a:9092", "b:9092"}; c.ReplicaOwners = map[int32]int{7: 2} }, "p-1", "replica_owners[7]: replica 2 does not exist"},
		{"free listen port", func(c *Config) { c.Replicas = []string{"a:9092", "b:9092"}; c.Listen = "127.0.0.1:0" }, "p-1", "with replicas the listen port must be fixed"},
		{"advertise differs", func(c *Config) { c.Replicas = []string{"a:9092", "b:9092"}; c.Advertise = "c:9092" }, "p-1", `advertise "c:9092" differs from replicas[1] "b:9092"`},
		{"node advertise", func(c *Config) {
			c.Replicas = []string{"a:9092", "b:9092"}
			c.Nodes = map[int32]NodeConfig{3: {Advertise: "x:1"}}
		}, "p-1", "nodes[3].advertise cannot be combined with replicas"},
		{"admin off", func(c *Config) { c.Replicas = []string{"a:9092", "b:9092"}; c.Admin = "off" }, "p-1", "replicas need the admin listener (admin is off)"},
		{"admin list length", func(c *Config) { c.Replicas = []string{"a:9092", "b:9092"}; c.ReplicaAdmin = []string{"a:9080"} }, "p-1", "replica_admin lists 1 addresses for 2 replicas"},
		{"index without replicas", func(c *Config) { c.ReplicaIndex = &two }, "", "replica_index 2 is set but replicas is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := hostnameFunc
			hostnameFunc = func() (string, error) { return tc.host, nil }
			defer func() { hostnameFunc = old }()
			c := Config{Upstream: []string{"k:9092"}, Listen: "127.0.0.1:9092"}
			tc.mod(&c)
			c.EnsureDefaults()
			err := c.Validate()
			if err == nil || !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate: %v; want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestReplicaLayout: the {i} template, the host name's ordinal, the
// default ownership (node id mod the count) with overrides, and where
// each replica advertises a node.
func TestReplicaLayout(t *testing.T) {
	old := hostnameFunc
	hostnameFunc = func() (string, error) { return "dedupproxy-2", nil }
	defer func() { hostnameFunc = old }()
	c := Config{Upstream: []string{"k:9092"}, Listen: "0.0.0.0:9092", Admin: "0.0.0.0:9080",
		Replicas: []string{"dedupproxy-{i}.dedupproxy-headless.kafka.svc:9092"}, ReplicaCount: 3,
		ReplicaOwners: map[int32]int{4: 0}}
	c.EnsureDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	l, err := c.replicaLayout(hostnameFunc)
	if err != nil {
		t.Fatal(err)
	}
	if l.self != 2 || l.count != 3 || l.addrs[1] != "dedupproxy-1.dedupproxy-headless.kafka.svc:9092" {
		t.Fatalf("layout %+v", l)
	}
	if l.admins[0] != "dedupproxy-0.dedupproxy-headless.kafka.svc:9080" {
		t.Errorf("admin of replica 0: %s", l.admins[0])
	}
	for id, want := range map[int32]int{0: 0, 1: 1, 2: 2, 3: 0, 4: 0, 5: 2, 1001: 2} {
		if got := l.owner(id); got != want {
			t.Errorf("owner of node %d: %d, want %d", id, got, want)
		}
	}
	if h, p, ok := l.nodeAddr(&c, 1, 5); !ok || h != "dedupproxy-1.dedupproxy-headless.kafka.svc" || p != 9098 {
		t.Errorf("node 5 at replica 1: %s:%d %v, want port 9092 + 1 + 5", h, p, ok)
	}
}

// TestReplicasAdvertiseOwners: three replicas in front of a three-broker
// cluster. Whichever replica a client asks, and through whichever of its
// listeners (the bootstrap, a node it owns, a node it does not), node N is
// advertised at its owner's address: replica N mod 3's host, at that
// replica's port + 1 + N.
func TestReplicasAdvertiseOwners(t *testing.T) {
	c := newCluster(t)
	f := newFleet(t, c, 3, 3, nil)
	for i := range 3 {
		for _, via := range []string{f.listen[i], f.nodeAddr(i, 0), f.nodeAddr(i, 1), f.nodeAddr(i, 2)} {
			req := kmsg.NewPtrMetadataRequest()
			req.SetVersion(12)
			resp := dialRaw(t, via).roundTrip(req).(*kmsg.MetadataResponse)
			if len(resp.Brokers) != 3 {
				t.Fatalf("replica %d via %s: %d brokers, want 3", i, via, len(resp.Brokers))
			}
			for _, b := range resp.Brokers {
				want := f.nodeAddr(int(b.NodeID)%3, b.NodeID)
				if got := addrString(b.Host, b.Port); got != want {
					t.Errorf("replica %d via %s: node %d at %s, want its owner's %s", i, via, b.NodeID, got, want)
				}
			}
		}
	}
}
