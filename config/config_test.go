package config

import (
	"errors"
	"strings"
	"testing"
)

// TestNodeAddrs pins the port rule: node N listens on node_port_base +
// (N − node_id_offset), node_port_base defaulting to listen port + 1, and is
// advertised shifted like the bootstrap listener; a port outside 1..65535
// or an id below the offset is an error, not a wrapped-around port.
func TestNodeAddrs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name              string
		cfg               Config
		id                int32
		wantBind, wantAdv string
		wantErr           string
	}{
		{"default", Config{Listen: "127.0.0.1:9092"}, 0, "127.0.0.1:9093", "", ""},
		{"default node 2", Config{Listen: "127.0.0.1:9092"}, 2, "127.0.0.1:9095", "", ""},
		{"free ports", Config{Listen: "127.0.0.1:0"}, 1001, "127.0.0.1:0", "", ""},
		{"ZooKeeper ids", Config{Listen: "127.0.0.1:9092", NodeIDOffset: 1000}, 1001, "127.0.0.1:9094", "", ""},
		{"base and offset", Config{Listen: "127.0.0.1:9092", NodePortBase: 19000, NodeIDOffset: 1001}, 1003, "127.0.0.1:19002", "", ""},
		{"base with free bootstrap port", Config{Listen: "127.0.0.1:0", NodePortBase: 19000}, 3, "127.0.0.1:19003", "", ""},
		{"advertise", Config{Listen: "0.0.0.0:9092", Advertise: "proxy.example:9092"}, 1, "0.0.0.0:9094", "proxy.example:9094", ""},
		{"advertise shifted", Config{Listen: "0.0.0.0:9092", Advertise: "proxy.example:29092", NodePortBase: 19000, NodeIDOffset: 1000}, 1002, "0.0.0.0:19002", "proxy.example:39002", ""},
		{"override", Config{Listen: "127.0.0.1:9092", Nodes: map[int32]NodeConfig{7: {Listen: "127.0.0.1:7777", Advertise: "p:7"}}}, 7, "127.0.0.1:7777", "p:7", ""},
		{"override listen only", Config{Listen: "127.0.0.1:9092", NodeIDOffset: 1000, Nodes: map[int32]NodeConfig{3: {Listen: "127.0.0.1:7777"}}}, 3, "127.0.0.1:7777", "", ""},
		{"beyond 65535", Config{Listen: "127.0.0.1:64600"}, 1001, "", "", "port 65602"},
		{"last port", Config{Listen: "127.0.0.1:65000"}, 534, "127.0.0.1:65535", "", ""},
		{"below offset", Config{Listen: "127.0.0.1:9092", NodeIDOffset: 1000}, 3, "", "", "below node_id_offset"},
		{"advertised beyond 65535", Config{Listen: "0.0.0.0:9092", Advertise: "p:60000"}, 6000, "", "", "advertised at port 66001"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bind, adv, err := tc.cfg.NodeAddrs(tc.id)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %s, %s, %v; want an error containing %q", bind, adv, err, tc.wantErr)
				}
				return
			}
			if err != nil || bind != tc.wantBind || adv != tc.wantAdv {
				t.Fatalf("got bind %q adv %q err %v; want %q %q", bind, adv, err, tc.wantBind, tc.wantAdv)
			}
		})
	}
}

// TestValidateNodePorts: what Validate can know at start about node ports.
func TestValidateNodePorts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		mod     func(*Config)
		wantErr string // empty: valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"ZooKeeper ids", func(c *Config) { c.NodeIDOffset = 1000 }, ""},
		{"base in range", func(c *Config) { c.NodePortBase = 65535 }, ""},
		{"base too high", func(c *Config) { c.NodePortBase = 65536 }, "node_port_base 65536"},
		{"base negative", func(c *Config) { c.NodePortBase = -1 }, "node_port_base -1"},
		{"listen 65535 without base", func(c *Config) { c.Listen = "127.0.0.1:65535" }, "set node_port_base"},
		{"listen 65535 with base", func(c *Config) { c.Listen = "127.0.0.1:65535"; c.NodePortBase = 20000 }, ""},
		{"offset negative", func(c *Config) { c.NodeIDOffset = -1 }, "node_id_offset -1"},
		{"override below offset, advertise derived", func(c *Config) {
			c.Listen, c.Advertise, c.NodeIDOffset = "0.0.0.0:9092", "p:9092", 1000
			c.Nodes = map[int32]NodeConfig{3: {Listen: "0.0.0.0:7000"}}
		}, "nodes[3]: node id 3 is below node_id_offset"},
		{"override beyond 65535", func(c *Config) {
			c.Listen = "127.0.0.1:65000"
			c.Nodes = map[int32]NodeConfig{2000: {Advertise: "p:1"}}
		}, "nodes[2000]: node 2000 would listen on port 67001"},
		{"override advertise port 0", func(c *Config) { c.Nodes = map[int32]NodeConfig{1: {Advertise: "p:0"}} }, "port 0 cannot be advertised"},
		{"override binds every interface unadvertised", func(c *Config) { c.Nodes = map[int32]NodeConfig{1: {Listen: ":7000"}} }, "binds every interface"},
		{"override fully set", func(c *Config) {
			c.NodeIDOffset = 1000
			c.Nodes = map[int32]NodeConfig{3: {Listen: "127.0.0.1:7000", Advertise: "p:7000"}}
		}, ""},
		{"advertised node ports out of range", func(c *Config) { c.Advertise = "p:65535" }, "outside 1..65535"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{Upstream: []string{"k:9092"}, Listen: "127.0.0.1:9092", Admin: "off"}
			tc.mod(&c)
			c.EnsureDefaults()
			err := c.Validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate = %v, want valid", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Validate = %v, want ErrInvalidConfig containing %q", err, tc.wantErr)
			}
		})
	}
}

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
		// Three replicas on one host, each with its own admin port: without
		// replica_admin each would read its own state for every peer's.
		{"one host without replica_admin", func(c *Config) {
			c.Replicas = []string{"127.0.0.1:9092", "127.0.0.1:9192", "127.0.0.1:9292"}
			c.Listen, c.Admin = "127.0.0.1:9192", "127.0.0.1:9180"
		}, "p-1", `replicas[0] and replicas[1] are both on host "127.0.0.1", so without replica_admin both would be read at "127.0.0.1:9180"`},
		{"one host without replica_admin names the flag", func(c *Config) {
			c.Replicas = []string{"127.0.0.1:9092", "127.0.0.1:9192", "127.0.0.1:9292"}
			c.Listen, c.Admin = "127.0.0.1:9292", "127.0.0.1:9280"
		}, "p-2", "--replica-admin"},
		{"replica_admin shared", func(c *Config) {
			c.Replicas = []string{"a:9092", "b:9092", "c:9092"}
			c.ReplicaAdmin = []string{"a:9080", "x:9080", "x:9080"}
			c.Admin = "0.0.0.0:9080"
		}, "p-0", `replica_admin[1] and replica_admin[2] are both "x:9080"`},
		{"a peer's admin is this replica's", func(c *Config) {
			c.Replicas = []string{"127.0.0.1:9092", "127.0.0.1:9192"}
			c.ReplicaAdmin = []string{"127.0.0.1:9080", "localhost:9080"}
			c.Admin = "127.0.0.1:9080"
		}, "p-0", `replica 1's admin address "localhost:9080" is this replica's own admin listener`},
		{"admin cannot serve its entry", func(c *Config) {
			c.Replicas = []string{"a:9092", "b:9092"}
			c.ReplicaAdmin = []string{"a:9080", "b:9080"}
			c.Admin = "0.0.0.0:9081"
		}, "p-1", `admin "0.0.0.0:9081" cannot serve "b:9080"`},
		{"admin bound elsewhere", func(c *Config) {
			c.Replicas = []string{"10.0.0.1:9092", "10.0.0.2:9092"}
			c.Listen = "0.0.0.0:9092"
		}, "p-1", `admin "127.0.0.1:9080" cannot serve "10.0.0.2:9080", where this replica's peers read its state (bound to 127.0.0.1, not 10.0.0.2)`},
		{"listen port is not its entry's", func(c *Config) {
			c.Replicas = []string{"a:9092", "b:9092"}
			c.Listen = "0.0.0.0:9192"
		}, "p-1", `listen "0.0.0.0:9192" cannot serve replicas[1] "b:9092", this replica's own entry (port 9192, not 9092)`},
		{"listen address is not its entry's", func(c *Config) {
			c.Replicas = []string{"10.0.0.1:9092", "10.0.0.2:9092"}
			c.Listen = "10.0.0.1:9092"
		}, "p-1", "--listen"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := hostname
			hostname = func() (string, error) { return tc.host, nil }
			defer func() { hostname = old }()
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
	old := hostname
	hostname = func() (string, error) { return "dedupproxy-2", nil }
	defer func() { hostname = old }()
	c := Config{Upstream: []string{"k:9092"}, Listen: "0.0.0.0:9092", Admin: "0.0.0.0:9080",
		Replicas: []string{"dedupproxy-{i}.dedupproxy-headless.kafka.svc:9092"}, ReplicaCount: 3,
		ReplicaOwners: map[int32]int{4: 0}}
	c.EnsureDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	l, err := c.ReplicaLayout()
	if err != nil {
		t.Fatal(err)
	}
	if l.Self != 2 || l.Count != 3 || l.Addrs[1] != "dedupproxy-1.dedupproxy-headless.kafka.svc:9092" {
		t.Fatalf("layout %+v", l)
	}
	if l.Admins[0] != "dedupproxy-0.dedupproxy-headless.kafka.svc:9080" {
		t.Errorf("admin of replica 0: %s", l.Admins[0])
	}
	for id, want := range map[int32]int{0: 0, 1: 1, 2: 2, 3: 0, 4: 0, 5: 2, 1001: 2} {
		if got := l.Owner(id); got != want {
			t.Errorf("owner of node %d: %d, want %d", id, got, want)
		}
	}
	if h, p, ok := l.NodeAddr(&c, 1, 5); !ok || h != "dedupproxy-1.dedupproxy-headless.kafka.svc" || p != 9098 {
		t.Errorf("node 5 at replica 1: %s:%d %v, want port 9092 + 1 + 5", h, p, ok)
	}
}
