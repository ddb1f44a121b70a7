package config

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Layout is the replicas configuration resolved: every replica's
// advertised bootstrap and admin address, this replica's index, and which
// replica owns which broker node (docs/replicas.md).
type Layout struct {
	Self, Count int
	Addrs       []string // advertised bootstrap address, by index
	Hosts       []string
	Ports       []int
	Admins      []string // admin address, by index
	Owners      map[int32]int
	Digest      string // layoutDigest: published, compared with the peers'
}

// Owner returns the index of the replica that owns broker node id: the
// override if any, else id mod the replica count.
func (l *Layout) Owner(id int32) int {
	if i, ok := l.Owners[id]; ok {
		return i
	}
	if id < 0 {
		return l.Self // the bootstrap listener (-1) is every replica's own
	}
	return int(id % int32(l.Count))
}

// indexTemplate stands for the replica index in a replicas or
// replica_admin address.
const indexTemplate = "{i}"

// ordinalSuffix is the number that ends a StatefulSet pod's name.
var ordinalSuffix = regexp.MustCompile(`-([0-9]+)$`)

// ReplicaLayout resolves the replicas configuration, or returns nil when
// the proxy runs on its own. The host name's ordinal suffix is the index
// when replica_index is not set. Errors are in the configuration's own
// terms.
func (c *Config) ReplicaLayout() (*Layout, error) {
	if len(c.Replicas) == 0 {
		switch {
		case c.ReplicaIndex != nil:
			return nil, fmt.Errorf("replica_index %d is set but replicas is empty: list every replica's advertised address (--replicas ADDR0,ADDR1,...)", *c.ReplicaIndex)
		case c.ReplicaCount != 0:
			return nil, fmt.Errorf("replica_count %d is set but replicas is empty: give the replicas' address, e.g. --replicas 'dedupproxy-{i}.dedupproxy-headless:9092'", c.ReplicaCount)
		case len(c.ReplicaOwners) > 0:
			return nil, fmt.Errorf("replica_owners is set but replicas is empty")
		case len(c.ReplicaAdmin) > 0:
			return nil, fmt.Errorf("replica_admin is set but replicas is empty")
		}
		return nil, nil
	}
	if c.ReplicaCount < 0 {
		return nil, fmt.Errorf("replica_count %d is negative", c.ReplicaCount)
	}
	addrs, err := expandReplicaAddrs("replicas", c.Replicas, c.ReplicaCount)
	if err != nil {
		return nil, err
	}
	l := &Layout{Count: len(addrs), Addrs: addrs, Owners: map[int32]int{}}
	seen := map[string]int{}
	for i, a := range addrs {
		host, port, err := SplitHostPort(a)
		switch {
		case err != nil:
			return nil, fmt.Errorf("replicas[%d] %q: %v (want host:port, the address clients use for that replica's bootstrap listener)", i, a, err)
		case port == 0:
			return nil, fmt.Errorf("replicas[%d] %q: port 0 cannot be advertised", i, a)
		case host == "" || unspecifiedHost(host):
			return nil, fmt.Errorf("replicas[%d] %q: clients cannot connect to that host; give the replica's own name or address", i, a)
		}
		if j, dup := seen[a]; dup {
			return nil, fmt.Errorf("replicas[%d] and replicas[%d] are both %q: each replica needs its own address", j, i, a)
		}
		seen[a] = i
		l.Hosts = append(l.Hosts, host)
		l.Ports = append(l.Ports, port)
	}
	if c.ReplicaIndex != nil {
		l.Self = *c.ReplicaIndex
		if l.Self < 0 || l.Self >= l.Count {
			return nil, fmt.Errorf("replica_index %d: there are %d replicas, so want 0..%d", l.Self, l.Count, l.Count-1)
		}
	} else {
		name, err := hostname()
		if err != nil {
			return nil, fmt.Errorf("replica_index is not set and the host name cannot be read (%v): set --replica-index", err)
		}
		m := ordinalSuffix.FindStringSubmatch(name)
		if m == nil {
			return nil, fmt.Errorf("replica_index is not set and the host name %q does not end in -N as StatefulSet pods do (dedupproxy-0, dedupproxy-1, ...): set --replica-index", name)
		}
		i, err := strconv.Atoi(m[1])
		if err != nil || i >= l.Count {
			return nil, fmt.Errorf("the host name %q makes this replica %s, but there are %d replicas (0..%d): check replicas and replica_count, or set --replica-index", name, m[1], l.Count, l.Count-1)
		}
		l.Self = i
	}
	ids := make([]int32, 0, len(c.ReplicaOwners))
	for id := range c.ReplicaOwners {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		i := c.ReplicaOwners[id]
		if id < 0 {
			return nil, fmt.Errorf("replica_owners: node id %d is negative", id)
		}
		if i < 0 || i >= l.Count {
			return nil, fmt.Errorf("replica_owners[%d]: replica %d does not exist (there are %d replicas: 0..%d)", id, i, l.Count, l.Count-1)
		}
		l.Owners[id] = i
	}

	// Node N of every replica is advertised at that replica's port shifted
	// like this one's node N listener: the shift must be known.
	_, lport, _ := SplitHostPort(c.Listen)
	if lport == 0 {
		return nil, fmt.Errorf("listen %q: with replicas the listen port must be fixed, since node N of every replica is advertised at its replicas address's port + (node N's listen port − listen port)", c.Listen)
	}
	if err := servesEntry(c.Listen, addrs[l.Self]); err != nil {
		return nil, fmt.Errorf("listen %q cannot serve replicas[%d] %q, this replica's own entry (%v): clients and peers are sent to that entry, so listen on it (--listen) or correct this replica's entry in --replicas", c.Listen, l.Self, addrs[l.Self], err)
	}
	if c.Advertise != "" && c.Advertise != addrs[l.Self] {
		return nil, fmt.Errorf("advertise %q differs from replicas[%d] %q: with replicas, a replica's advertised address is its entry in replicas (leave advertise empty)", c.Advertise, l.Self, addrs[l.Self])
	}
	for id, n := range c.Nodes {
		if n.Advertise != "" {
			return nil, fmt.Errorf("nodes[%d].advertise cannot be combined with replicas: node %d is advertised at the address of the replica that serves it (its replicas host, port + 1 + node id by default); move its port with nodes[%d].listen or node_port_base instead", id, id, id)
		}
	}

	if len(c.ReplicaAdmin) > 0 {
		count := 0 // a list names its own count
		if len(c.ReplicaAdmin) == 1 && strings.Contains(c.ReplicaAdmin[0], indexTemplate) {
			count = l.Count
		}
		if l.Admins, err = expandReplicaAddrs("replica_admin", c.ReplicaAdmin, count); err != nil {
			return nil, err
		}
		if len(l.Admins) != l.Count {
			return nil, fmt.Errorf("replica_admin lists %d addresses for %d replicas", len(l.Admins), l.Count)
		}
		for i, a := range l.Admins {
			if _, p, err := SplitHostPort(a); err != nil || p == 0 {
				return nil, fmt.Errorf("replica_admin[%d] %q: want the host:port of replica %d's admin listener", i, a, i)
			}
		}
		seen := map[string]int{}
		for i, a := range l.Admins {
			if j, dup := seen[a]; dup {
				return nil, fmt.Errorf("replica_admin[%d] and replica_admin[%d] are both %q: each replica has its own admin listener, where its peers read its state; give each its own address (--replica-admin)", j, i, a)
			}
			seen[a] = i
		}
	} else if l.Count > 1 {
		if c.Admin == "off" {
			return nil, fmt.Errorf("replicas need the admin listener (admin is off): a replica reads its peers' state from /replica on their admin port during a handover")
		}
		_, aport, err := SplitHostPort(c.Admin)
		if err != nil || aport == 0 {
			return nil, fmt.Errorf("admin %q: with replicas the admin port must be fixed, since peers reach it at their replicas host and this port (or set replica_admin)", c.Admin)
		}
		seen := map[string]int{}
		for i, h := range l.Hosts {
			a := net.JoinHostPort(h, strconv.Itoa(aport))
			if j, dup := seen[a]; dup {
				// Several replicas on one host: each would take its own
				// admin listener for the other's, read its own state as
				// theirs, and on SIGTERM hand nothing over.
				return nil, fmt.Errorf("replicas[%d] and replicas[%d] are both on host %q, so without replica_admin both would be read at %q (this replica's admin port on their host), and each would take its own state for the other's: give every replica's admin address with --replica-admin (replica_admin)", j, i, h, a)
			}
			seen[a] = i
			l.Admins = append(l.Admins, a)
		}
	}
	l.Digest = layoutDigest(c, l)
	if l.Count > 1 && c.Admin != "off" {
		if err := servesEntry(c.Admin, l.Admins[l.Self]); err != nil {
			return nil, fmt.Errorf("admin %q cannot serve %q, where this replica's peers read its state (%v): listen there (--admin), or give every replica's admin address with --replica-admin (replica_admin)", c.Admin, l.Admins[l.Self], err)
		}
		for i, a := range l.Admins {
			if i != l.Self && sameListener(c.Admin, a) {
				return nil, fmt.Errorf("replica %d's admin address %q is this replica's own admin listener (admin %q): it would read its own state as replica %d's and hand nothing over; give every replica's own admin address, in index order, with --replica-admin (replica_admin)", i, a, c.Admin, i)
			}
		}
	}
	return l, nil
}

// servesEntry says why a listener bound at bind cannot take the
// connections sent to entry, or returns nil when it may. Only what is
// certain is refused: another port, or two different IP addresses. A
// host name is not resolved (a StatefulSet pod's name may not resolve
// before the pod is ready), so a name is taken to be this host's.
func servesEntry(bind, entry string) error {
	bhost, bport, err := SplitHostPort(bind)
	if err != nil {
		return err
	}
	ehost, eport, err := SplitHostPort(entry)
	if err != nil {
		return err
	}
	if bport != eport {
		return fmt.Errorf("port %d, not %d", bport, eport)
	}
	bip, eip := net.ParseIP(bhost), net.ParseIP(ehost)
	if bip != nil && !bip.IsUnspecified() && eip != nil && !bip.Equal(eip) {
		return fmt.Errorf("bound to %s, not %s", bhost, ehost)
	}
	return nil
}

// sameListener reports whether addr certainly reaches the listener bound
// at bind on this host: the same port, at the bound address, or at a
// loopback address when it is bound to every address or to loopback.
func sameListener(bind, addr string) bool {
	bhost, bport, err1 := SplitHostPort(bind)
	host, port, err2 := SplitHostPort(addr)
	if err1 != nil || err2 != nil || bport != port {
		return false
	}
	if bhost == host {
		return true
	}
	loopback := func(h string) bool {
		ip := net.ParseIP(h)
		return h == "localhost" || ip != nil && ip.IsLoopback()
	}
	bip, ip := net.ParseIP(bhost), net.ParseIP(host)
	switch {
	case bip != nil && ip != nil:
		return bip.Equal(ip) || bip.IsUnspecified() && ip.IsLoopback()
	case unspecifiedHost(bhost):
		return loopback(host)
	}
	// localhost and a loopback address of its own.
	return loopback(bhost) && loopback(host) && (bhost == "localhost" || host == "localhost")
}

// expandReplicaAddrs applies the {i} template: one templated address
// stands for count addresses; in a list, {i} in an entry is its own index.
func expandReplicaAddrs(key string, list []string, count int) ([]string, error) {
	if len(list) == 1 && strings.Contains(list[0], indexTemplate) {
		if count == 0 {
			return nil, fmt.Errorf("%s %q: %s stands for the replica index, so replica_count (--replica-count) must say how many replicas there are", key, list[0], indexTemplate)
		}
		out := make([]string, count)
		for i := range out {
			out[i] = strings.ReplaceAll(list[0], indexTemplate, strconv.Itoa(i))
		}
		return out, nil
	}
	if count != 0 && count != len(list) {
		return nil, fmt.Errorf("replica_count is %d but %s lists %d addresses", count, key, len(list))
	}
	out := make([]string, len(list))
	for i, a := range list {
		out[i] = strings.ReplaceAll(a, indexTemplate, strconv.Itoa(i))
	}
	return out, nil
}

// nodeShift returns how far node id's listen port is from the bootstrap
// listen port: every replica advertises node id at its own advertised
// port plus this. Call it on a validated Config with a fixed listen port.
func (c *Config) nodeShift(id int32) (int, error) {
	bind, _, err := c.NodeAddrs(id)
	if err != nil {
		return 0, err
	}
	_, lport, _ := SplitHostPort(c.Listen)
	_, nport, err := SplitHostPort(bind)
	if err != nil {
		return 0, err
	}
	return nport - lport, nil
}

// NodeAddr returns where replica i serves node id, as clients are told.
func (l *Layout) NodeAddr(c *Config, i int, id int32) (string, int32, bool) {
	shift, err := c.nodeShift(id)
	if err != nil {
		return "", 0, false
	}
	p := l.Ports[i] + shift
	if p < 1 || p > 65535 {
		return "", 0, false
	}
	return l.Hosts[i], int32(p), true
}

// hostname reads the host name, whose ordinal suffix is the replica
// index when replica_index is not set; tests replace it.
var hostname = os.Hostname

// layoutDigest is a digest of what must be the same on every replica for
// them to advertise each node at one address: the replica list, the owners
// that differ from node id mod the count, and how node ports follow the
// listen port. Admin addresses are left out: two replicas may reach a
// third by different names.
func layoutDigest(c *Config, l *Layout) string {
	_, lport, _ := SplitHostPort(c.Listen)
	var b strings.Builder
	fmt.Fprintf(&b, "replicas=%s\n", strings.Join(l.Addrs, ","))
	ids := make([]int32, 0, len(l.Owners))
	for id := range l.Owners {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		fmt.Fprintf(&b, "owner %d=%d\n", id, l.Owners[id])
	}
	fmt.Fprintf(&b, "node ports=listen%+d+(id-%d)\n", c.nodePortBase(lport)-lport, c.NodeIDOffset)
	ids = ids[:0]
	for id, n := range c.Nodes {
		if n.Listen != "" {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		_, p, _ := SplitHostPort(c.Nodes[id].Listen)
		fmt.Fprintf(&b, "node %d=listen%+d\n", id, p-lport)
	}
	sum := sha256.Sum256([]byte(b.String()))
	return hex.EncodeToString(sum[:8])
}
