package rewrite

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// addr is one broker address as the mapper saw it.
type addr struct {
	node int32
	host string
	port int32
}

// nodeMapper advertises node N as proxy-N.test:19000+N, whatever the real
// address, so rewriting its own output is a fixed point. It records every
// call, like the proxy learning addresses.
type nodeMapper struct{ seen []addr }

func (m *nodeMapper) MapBroker(nodeID int32, host string, port int32) (string, int32) {
	m.seen = append(m.seen, addr{nodeID, host, port})
	return advertised(nodeID)
}

// advertised is a valid address for any node id (the fuzz targets make up
// ids): a negative port would mean OmitBroker.
func advertised(nodeID int32) (string, int32) {
	return fmt.Sprintf("proxy-%d.test", nodeID), 19000 + int32(uint32(nodeID)%10000)
}

// realHost is the upstream address of node id in every fixture.
func realHost(id int32) (string, int32) { return fmt.Sprintf("broker-%d.internal", id), 9092 + id }

func strp(s string) *string { return &s }

func tags(kv ...any) kmsg.Tags {
	var t kmsg.Tags
	for i := 0; i < len(kv); i += 2 {
		t.Set(uint32(kv[i].(int)), []byte(kv[i+1].(string)))
	}
	return t
}

// The fixtures below fill every field a version has, with unknown tags
// wherever the version is flexible, so that "every other field is
// unchanged" is a real check. withNodes controls the KIP-951 NodeEndpoints.

func metadataFixture(v int16) kmsg.Response {
	r := kmsg.NewPtrMetadataResponse()
	r.Version = v
	r.ThrottleMillis = 11
	r.ClusterID = strp("cluster-a")
	r.ControllerID = 2
	r.AuthorizedOperations = 0x0f
	r.ErrorCode = 0
	for id := int32(1); id <= 3; id++ {
		b := kmsg.NewMetadataResponseBroker()
		b.NodeID = id
		b.Host, b.Port = realHost(id)
		b.Rack = strp(fmt.Sprintf("rack-%d", id))
		b.UnknownTags = tags(40, "broker-tag")
		r.Brokers = append(r.Brokers, b)
	}
	for ti := range 2 {
		t := kmsg.NewMetadataResponseTopic()
		t.Topic = strp(fmt.Sprintf("topic-%d", ti))
		t.TopicID = [16]byte{byte(ti + 1), 2, 3}
		t.IsInternal = ti == 1
		t.AuthorizedOperations = 7
		for pi := range 3 {
			p := kmsg.NewMetadataResponseTopicPartition()
			p.Partition = int32(pi)
			p.Leader = int32(pi%3 + 1)
			p.LeaderEpoch = 5
			p.Replicas = []int32{1, 2, 3}
			p.ISR = []int32{1, 2}
			p.OfflineReplicas = []int32{3}
			t.Partitions = append(t.Partitions, p)
		}
		r.Topics = append(r.Topics, t)
	}
	r.UnknownTags = tags(30, "top-tag")
	return r
}

func findCoordinatorFixture(v int16) kmsg.Response {
	r := kmsg.NewPtrFindCoordinatorResponse()
	r.Version = v
	r.ThrottleMillis = 3
	r.ErrorMessage = strp("")
	r.NodeID = 2
	r.Host, r.Port = realHost(2)
	for i, id := range []int32{1, -1, 3} {
		c := kmsg.NewFindCoordinatorResponseCoordinator()
		c.Key = fmt.Sprintf("group-%d", i)
		c.NodeID = id
		if id < 0 {
			// Kafka's Node.noNode() placeholder on error.
			c.Host, c.Port = "", -1
			c.ErrorCode = kerr.CoordinatorNotAvailable.Code
			c.ErrorMessage = strp("not yet")
		} else {
			c.Host, c.Port = realHost(id)
		}
		r.Coordinators = append(r.Coordinators, c)
	}
	r.UnknownTags = tags(9, "fc")
	return r
}

func describeClusterFixture(v int16) kmsg.Response {
	r := kmsg.NewPtrDescribeClusterResponse()
	r.Version = v
	r.ThrottleMillis = 1
	r.EndpointType = 1
	r.ClusterID = "cluster-a"
	r.ControllerID = 1
	r.ClusterAuthorizedOperations = 0x3ff
	for id := int32(1); id <= 3; id++ {
		b := kmsg.NewDescribeClusterResponseBroker()
		b.NodeID = id
		b.Host, b.Port = realHost(id)
		b.Rack = strp("r")
		b.IsFenced = id == 3
		b.UnknownTags = tags(4, "x")
		r.Brokers = append(r.Brokers, b)
	}
	r.UnknownTags = tags(5, "dc")
	return r
}

func produceFixture(withNodes bool) func(int16) kmsg.Response {
	return func(v int16) kmsg.Response {
		r := kmsg.NewPtrProduceResponse()
		r.Version = v
		r.ThrottleMillis = 17
		for ti := range 2 {
			t := kmsg.NewProduceResponseTopic()
			t.Topic = fmt.Sprintf("topic-%d", ti)
			t.TopicID = [16]byte{byte(ti + 1)}
			for pi := range 3 {
				p := kmsg.NewProduceResponseTopicPartition()
				p.Partition = int32(pi)
				p.BaseOffset = int64(100 * pi)
				p.LogAppendTime = 1234
				p.LogStartOffset = 5
				if pi == 1 {
					p.ErrorCode = kerr.NotLeaderForPartition.Code
					p.ErrorMessage = strp("moved")
					p.CurrentLeader.LeaderID = 3
					p.CurrentLeader.LeaderEpoch = 8
					p.BaseOffset = -1
				}
				if pi == 2 {
					e := kmsg.NewProduceResponseTopicPartitionErrorRecord()
					e.RelativeOffset = 4
					e.ErrorMessage = strp("bad record")
					p.ErrorRecords = append(p.ErrorRecords, e)
					p.UnknownTags = tags(6, "pt")
				}
				t.Partitions = append(t.Partitions, p)
			}
			r.Topics = append(r.Topics, t)
		}
		if withNodes {
			for _, id := range []int32{3, 1} {
				b := kmsg.NewProduceResponseBroker()
				b.NodeID = id
				b.Host, b.Port = realHost(id)
				b.Rack = strp("rack")
				b.UnknownTags = tags(2, "nt")
				r.Brokers = append(r.Brokers, b)
			}
		}
		r.UnknownTags = tags(7, "unknown-top")
		return r
	}
}

// fetchFixture builds a Fetch response with topics×partitions partitions,
// each carrying recordBytes of (opaque) record batches.
func fetchFixture(withNodes bool, topics, partitions, recordBytes int) func(int16) kmsg.Response {
	records := bytes.Repeat([]byte{0xab}, recordBytes)
	return func(v int16) kmsg.Response {
		r := kmsg.NewPtrFetchResponse()
		r.Version = v
		r.ThrottleMillis = 2
		r.SessionID = 77
		for ti := range topics {
			t := kmsg.NewFetchResponseTopic()
			t.Topic = fmt.Sprintf("topic-%d", ti)
			t.TopicID = [16]byte{byte(ti + 1), 9}
			for pi := range partitions {
				p := kmsg.NewFetchResponseTopicPartition()
				p.Partition = int32(pi)
				p.HighWatermark = 1000
				p.LastStableOffset = 990
				p.LogStartOffset = 10
				p.PreferredReadReplica = -1
				p.RecordBatches = records
				switch pi % 4 {
				case 1:
					p.ErrorCode = kerr.NotLeaderForPartition.Code
					p.CurrentLeader.LeaderID = 2
					p.CurrentLeader.LeaderEpoch = 9
					p.RecordBatches = nil
				case 2:
					a := kmsg.NewFetchResponseTopicPartitionAbortedTransaction()
					a.ProducerID, a.FirstOffset = 42, 900
					p.AbortedTransactions = append(p.AbortedTransactions, a)
					p.DivergingEpoch.Epoch, p.DivergingEpoch.EndOffset = 3, 800
				case 3:
					p.SnapshotID.EndOffset, p.SnapshotID.Epoch = 700, 2
					p.UnknownTags = tags(11, "pt")
				}
				t.Partitions = append(t.Partitions, p)
			}
			r.Topics = append(r.Topics, t)
		}
		if withNodes {
			for _, id := range []int32{2, 5} {
				b := kmsg.NewFetchResponseBroker()
				b.NodeID = id
				b.Host, b.Port = realHost(id)
				b.UnknownTags = tags(1, "nt")
				r.Brokers = append(r.Brokers, b)
			}
		}
		r.UnknownTags = tags(9, "unknown-top")
		return r
	}
}

func shareFetchFixture(withNodes bool) func(int16) kmsg.Response {
	return func(v int16) kmsg.Response {
		r := kmsg.NewPtrShareFetchResponse()
		r.Version = v
		r.ErrorMessage = strp("")
		r.AcquisitionLockTimeoutMillis = 30000
		t := kmsg.NewShareFetchResponseTopic()
		t.TopicID = [16]byte{1}
		for pi := range 2 {
			p := kmsg.NewShareFetchResponseTopicPartition()
			p.Partition = int32(pi)
			p.Records = []byte("opaque record batches")
			p.CurrentLeader.LeaderID = 1
			p.CurrentLeader.LeaderEpoch = 4
			a := kmsg.NewShareFetchResponseTopicPartitionAcquiredRecord()
			a.FirstOffset, a.LastOffset, a.DeliveryCount = 1, 9, 2
			p.AcquiredRecords = append(p.AcquiredRecords, a)
			t.Partitions = append(t.Partitions, p)
		}
		r.Topics = append(r.Topics, t)
		if withNodes {
			for _, id := range []int32{1, 4} {
				n := kmsg.NewShareFetchResponseNodeEndpoint()
				n.NodeID = id
				n.Host, n.Port = realHost(id)
				r.NodeEndpoints = append(r.NodeEndpoints, n)
			}
		}
		r.UnknownTags = tags(3, "sf")
		return r
	}
}

func shareAcknowledgeFixture(v int16) kmsg.Response {
	r := kmsg.NewPtrShareAcknowledgeResponse()
	r.Version = v
	r.AcquisitionLockTimeoutMillis = 100
	t := kmsg.NewShareAcknowledgeResponseTopic()
	t.TopicID = [16]byte{2}
	p := kmsg.NewShareAcknowledgeResponseTopicPartition()
	p.ErrorCode = kerr.NotLeaderForPartition.Code
	p.CurrentLeader.LeaderID = 2
	t.Partitions = append(t.Partitions, p)
	r.Topics = append(r.Topics, t)
	n := kmsg.NewShareAcknowledgeResponseNodeEndpoint()
	n.NodeID = 2
	n.Host, n.Port = realHost(2)
	r.NodeEndpoints = append(r.NodeEndpoints, n)
	return r
}

// addrRef points at one broker address inside a decoded response.
type addrRef struct {
	node int32
	host *string
	port *int32
}

// addrsOf lists the broker addresses in r that the rewriter must map. It is
// the test's oracle, written from the Kafka schemas independently of
// rewrite.go.
func addrsOf(r kmsg.Response) []addrRef {
	var refs []addrRef
	switch r := r.(type) {
	case *kmsg.MetadataResponse:
		for i := range r.Brokers {
			b := &r.Brokers[i]
			refs = append(refs, addrRef{b.NodeID, &b.Host, &b.Port})
		}
	case *kmsg.FindCoordinatorResponse:
		if r.Version < 4 {
			if r.ErrorCode == 0 && r.NodeID >= 0 {
				refs = append(refs, addrRef{r.NodeID, &r.Host, &r.Port})
			}
			break
		}
		for i := range r.Coordinators {
			c := &r.Coordinators[i]
			if c.ErrorCode == 0 && c.NodeID >= 0 {
				refs = append(refs, addrRef{c.NodeID, &c.Host, &c.Port})
			}
		}
	case *kmsg.DescribeClusterResponse:
		for i := range r.Brokers {
			b := &r.Brokers[i]
			refs = append(refs, addrRef{b.NodeID, &b.Host, &b.Port})
		}
	case *kmsg.ProduceResponse:
		if r.Version >= 10 {
			for i := range r.Brokers {
				b := &r.Brokers[i]
				refs = append(refs, addrRef{b.NodeID, &b.Host, &b.Port})
			}
		}
	case *kmsg.FetchResponse:
		if r.Version >= 16 {
			for i := range r.Brokers {
				b := &r.Brokers[i]
				refs = append(refs, addrRef{b.NodeID, &b.Host, &b.Port})
			}
		}
	case *kmsg.ShareFetchResponse:
		for i := range r.NodeEndpoints {
			n := &r.NodeEndpoints[i]
			refs = append(refs, addrRef{n.NodeID, &n.Host, &n.Port})
		}
	case *kmsg.ShareAcknowledgeResponse:
		for i := range r.NodeEndpoints {
			n := &r.NodeEndpoints[i]
			refs = append(refs, addrRef{n.NodeID, &n.Host, &n.Port})
		}
	}
	return refs
}

func decode(t testing.TB, key, version int16, body []byte) kmsg.Response {
	t.Helper()
	r := kmsg.ResponseForKey(key)
	r.SetVersion(version)
	if err := r.ReadFrom(body); err != nil {
		t.Fatalf("kmsg cannot decode %s v%d: %v", kmsg.NameForKey(key), version, err)
	}
	return r
}

// checkRewrite is the differential check shared by the table tests: the
// output decodes with kmsg to the input's decoding with only the addresses
// replaced by the mapper's, the mapper saw exactly the real addresses, the
// output is what kmsg itself would encode, and rewriting again is a no-op.
func checkRewrite(t *testing.T, key, version int16, body []byte) (out []byte, changed bool) {
	t.Helper()
	m := &nodeMapper{}
	out, changed, err := Addresses(nil, key, version, body, m)
	if err != nil {
		t.Fatalf("Addresses: %v", err)
	}

	want := decode(t, key, version, body)
	var wantSeen []addr
	for _, ref := range addrsOf(want) {
		wantSeen = append(wantSeen, addr{ref.node, *ref.host, *ref.port})
		*ref.host, *ref.port = advertised(ref.node)
	}
	if !slices.Equal(m.seen, wantSeen) {
		t.Errorf("mapper saw %v, want %v", m.seen, wantSeen)
	}
	got := decode(t, key, version, out)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("decoded output differs beyond addresses:\n got %+v\nwant %+v", got, want)
	}
	if wantChanged := len(wantSeen) > 0; changed != wantChanged {
		t.Errorf("changed = %v, want %v", changed, wantChanged)
	}
	if !changed && !sameSlice(out, body) {
		t.Errorf("unchanged output is not the input slice")
	}
	// Fixtures are kmsg-encoded, so splicing must give kmsg's bytes.
	if enc := want.AppendTo(nil); !bytes.Equal(out, enc) {
		t.Errorf("output is not kmsg's encoding of the rewritten response:\n got %x\nwant %x", out, enc)
	}

	again, changedAgain, err := Addresses(nil, key, version, out, &nodeMapper{})
	if err != nil || changedAgain || !bytes.Equal(again, out) {
		t.Errorf("second rewrite is not a fixed point: changed=%v err=%v", changedAgain, err)
	}
	return out, changed
}

func sameSlice(a, b []byte) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// rewriteCases lists each covered API with a fixture; every version kmsg
// knows is exercised.
var rewriteCases = []struct {
	name    string
	key     kmsg.Key
	fixture func(int16) kmsg.Response
}{
	{"Metadata", kmsg.Metadata, metadataFixture},
	{"FindCoordinator", kmsg.FindCoordinator, findCoordinatorFixture},
	{"DescribeCluster", kmsg.DescribeCluster, describeClusterFixture},
	{"Produce/NodeEndpoints", kmsg.Produce, produceFixture(true)},
	{"Produce/NoNodeEndpoints", kmsg.Produce, produceFixture(false)},
	{"Fetch/NodeEndpoints", kmsg.Fetch, fetchFixture(true, 2, 4, 64)},
	{"Fetch/NoNodeEndpoints", kmsg.Fetch, fetchFixture(false, 2, 4, 64)},
	{"ShareFetch/NodeEndpoints", kmsg.ShareFetch, shareFetchFixture(true)},
	{"ShareFetch/NoNodeEndpoints", kmsg.ShareFetch, shareFetchFixture(false)},
	{"ShareAcknowledge", kmsg.ShareAcknowledge, shareAcknowledgeFixture},
}

// TestRewriteAddressesAllVersions rewrites each covered response at every
// version kmsg knows and checks it against kmsg (see checkRewrite).
func TestRewriteAddressesAllVersions(t *testing.T) {
	t.Parallel()
	for _, tc := range rewriteCases {
		mv, _ := MaxVersion(tc.key.Int16())
		for v := int16(0); v <= mv; v++ {
			t.Run(fmt.Sprintf("%s/v%d", tc.name, v), func(t *testing.T) {
				t.Parallel()
				body := tc.fixture(v).AppendTo(nil)
				checkRewrite(t, tc.key.Int16(), v, body)
			})
		}
	}
}

// TestRewriteAddressesVersionBoundaries pins, by name, the versions where
// the address-bearing shape changes, and how many addresses each must map.
func TestRewriteAddressesVersionBoundaries(t *testing.T) {
	t.Parallel()
	mv := func(k kmsg.Key) int16 { v, _ := MaxVersion(k.Int16()); return v }
	tests := []struct {
		name     string
		key      kmsg.Key
		version  int16
		fixture  func(int16) kmsg.Response
		rewrites bool
		addrs    int
	}{
		{"Metadata/v0 no racks", kmsg.Metadata, 0, metadataFixture, true, 3},
		{"Metadata/v1 racks", kmsg.Metadata, 1, metadataFixture, true, 3},
		{"Metadata/v9 first flexible", kmsg.Metadata, 9, metadataFixture, true, 3},
		{"Metadata/v12 topic IDs", kmsg.Metadata, 12, metadataFixture, true, 3},
		{"Metadata/newest", kmsg.Metadata, mv(kmsg.Metadata), metadataFixture, true, 3},
		{"FindCoordinator/v0 single", kmsg.FindCoordinator, 0, findCoordinatorFixture, true, 1},
		{"FindCoordinator/v3 single flexible", kmsg.FindCoordinator, 3, findCoordinatorFixture, true, 1},
		// KIP-699: batched; the errored coordinator (NodeID -1) is left alone.
		{"FindCoordinator/v4 batched", kmsg.FindCoordinator, 4, findCoordinatorFixture, true, 2},
		{"FindCoordinator/newest", kmsg.FindCoordinator, mv(kmsg.FindCoordinator), findCoordinatorFixture, true, 2},
		{"DescribeCluster/v0", kmsg.DescribeCluster, 0, describeClusterFixture, true, 3},
		{"DescribeCluster/v1 endpoint type", kmsg.DescribeCluster, 1, describeClusterFixture, true, 3},
		{"DescribeCluster/newest", kmsg.DescribeCluster, mv(kmsg.DescribeCluster), describeClusterFixture, true, 3},
		// KIP-951 added NodeEndpoints in Produce v10; v9's schema has no
		// tag 0, so the walker is not even run.
		{"Produce/v9 before KIP-951", kmsg.Produce, 9, produceFixture(true), false, 0},
		{"Produce/v10 NodeEndpoints", kmsg.Produce, 10, produceFixture(true), true, 2},
		{"Produce/v10 without NodeEndpoints", kmsg.Produce, 10, produceFixture(false), true, 0},
		{"Produce/newest NodeEndpoints", kmsg.Produce, mv(kmsg.Produce), produceFixture(true), true, 2},
		{"Produce/newest without NodeEndpoints", kmsg.Produce, mv(kmsg.Produce), produceFixture(false), true, 0},
		{"Fetch/v15 before KIP-951", kmsg.Fetch, 15, fetchFixture(true, 1, 2, 16), false, 0},
		{"Fetch/v16 NodeEndpoints", kmsg.Fetch, 16, fetchFixture(true, 1, 2, 16), true, 2},
		{"Fetch/v16 without NodeEndpoints", kmsg.Fetch, 16, fetchFixture(false, 1, 2, 16), true, 0},
		{"Fetch/newest NodeEndpoints", kmsg.Fetch, mv(kmsg.Fetch), fetchFixture(true, 1, 2, 16), true, 2},
		{"Fetch/newest without NodeEndpoints", kmsg.Fetch, mv(kmsg.Fetch), fetchFixture(false, 1, 2, 16), true, 0},
		{"ShareFetch/v0", kmsg.ShareFetch, 0, shareFetchFixture(true), true, 2},
		{"ShareFetch/v1 lock timeout", kmsg.ShareFetch, 1, shareFetchFixture(true), true, 2},
		{"ShareAcknowledge/newest", kmsg.ShareAcknowledge, mv(kmsg.ShareAcknowledge), shareAcknowledgeFixture, true, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			key := tc.key.Int16()
			if got := CarriesAddresses(key, tc.version); got != tc.rewrites {
				t.Fatalf("CarriesAddresses(%d, %d) = %v, want %v", key, tc.version, got, tc.rewrites)
			}
			body := tc.fixture(tc.version).AppendTo(nil)
			if !tc.rewrites {
				m := &nodeMapper{}
				out, changed, err := Addresses(nil, key, tc.version, body, m)
				if err != nil || changed || !sameSlice(out, body) || len(m.seen) > 0 {
					t.Fatalf("got changed=%v err=%v calls=%v; want the body untouched", changed, err, m.seen)
				}
				return
			}
			m := &nodeMapper{}
			if _, _, err := Addresses(nil, key, tc.version, body, m); err != nil {
				t.Fatal(err)
			}
			if len(m.seen) != tc.addrs {
				t.Errorf("mapped %d addresses (%v), want %d", len(m.seen), m.seen, tc.addrs)
			}
			checkRewrite(t, key, tc.version, body)
		})
	}
}

// TestRewriteAddressesOtherAPIsUntouched: APIs without broker addresses are
// returned as is, unread, even if the bytes are garbage.
func TestRewriteAddressesOtherAPIsUntouched(t *testing.T) {
	t.Parallel()
	for _, key := range []kmsg.Key{kmsg.ListOffsets, kmsg.OffsetCommit, kmsg.ApiVersions, kmsg.DescribeQuorum, kmsg.Key(9999)} {
		body := []byte("not a response")
		m := &nodeMapper{}
		out, changed, err := Addresses(nil, key.Int16(), 1, body, m)
		if err != nil || changed || !sameSlice(out, body) || len(m.seen) > 0 {
			t.Errorf("%s: changed=%v err=%v calls=%v", key.Name(), changed, err, m.seen)
		}
	}
}

// TestRewriteAddressesVersionTooNew: a version kmsg cannot decode fails
// closed rather than leaking whatever addresses it holds.
func TestRewriteAddressesVersionTooNew(t *testing.T) {
	t.Parallel()
	for _, key := range []kmsg.Key{kmsg.Metadata, kmsg.Produce, kmsg.Fetch, kmsg.FindCoordinator} {
		mv, _ := MaxVersion(key.Int16())
		if !CarriesAddresses(key.Int16(), mv+1) {
			t.Errorf("%s v%d: CarriesAddresses = false; a newer version must fail closed", key.Name(), mv+1)
		}
		_, _, err := Addresses(nil, key.Int16(), mv+1, []byte{0, 0, 0, 0}, &nodeMapper{})
		if !errors.Is(err, ErrUndecodableVersion) {
			t.Errorf("%s v%d: err = %v, want ErrUndecodableVersion", key.Name(), mv+1, err)
		}
	}
}

// TestRewriteAddressesHostTooLong: a Kafka string holds at most
// math.MaxInt16 bytes; a mapper returning more is an error, not a
// silently truncated length prefix.
func TestRewriteAddressesHostTooLong(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("h", 1<<15)
	m := mapperFunc(func(int32, string, int32) (string, int32) { return long, 1 })
	for _, tc := range []struct {
		key     kmsg.Key
		version int16
		fixture func(int16) kmsg.Response
	}{
		{kmsg.Metadata, 12, metadataFixture},
		{kmsg.Fetch, 17, fetchFixture(true, 1, 1, 1)},
		{kmsg.FindCoordinator, 2, findCoordinatorFixture},
	} {
		body := tc.fixture(tc.version).AppendTo(nil)
		_, _, err := Addresses(nil, tc.key.Int16(), tc.version, body, m)
		if !errors.Is(err, ErrHostTooLong) {
			t.Errorf("%s: err = %v, want ErrHostTooLong", tc.key.Name(), err)
		}
	}
}

type mapperFunc func(int32, string, int32) (string, int32)

func (f mapperFunc) MapBroker(id int32, h string, p int32) (string, int32) { return f(id, h, p) }

// TestRewriteAddressesIdentityMapperIsNoop: when the mapper keeps every
// address (the broker already advertises the proxy), nothing is copied.
func TestRewriteAddressesIdentityMapperIsNoop(t *testing.T) {
	t.Parallel()
	identity := mapperFunc(func(_ int32, h string, p int32) (string, int32) { return h, p })
	for _, tc := range rewriteCases {
		mv, _ := MaxVersion(tc.key.Int16())
		body := tc.fixture(mv).AppendTo(nil)
		out, changed, err := Addresses(make([]byte, 0, 8), tc.key.Int16(), mv, body, identity)
		if err != nil || changed || !sameSlice(out, body) {
			t.Errorf("%s: changed=%v err=%v", tc.name, changed, err)
		}
	}
}

// TestRewriteAgreesWithKmsgOnTruncation is the walker's differential test
// on malformed input: for every prefix of every fixture, Addresses
// fails with ErrMalformedResponse exactly when kmsg fails to decode it, and
// never calls the mapper on a body it rejects.
func TestRewriteAgreesWithKmsgOnTruncation(t *testing.T) {
	t.Parallel()
	for _, tc := range rewriteCases {
		mv, _ := MaxVersion(tc.key.Int16())
		for _, v := range []int16{0, mv / 2, mv} {
			if !CarriesAddresses(tc.key.Int16(), v) {
				continue
			}
			t.Run(fmt.Sprintf("%s/v%d", tc.name, v), func(t *testing.T) {
				t.Parallel()
				body := tc.fixture(v).AppendTo(nil)
				for n := range len(body) {
					prefix := body[:n:n]
					m := &nodeMapper{}
					_, _, err := Addresses(nil, tc.key.Int16(), v, prefix, m)
					r := kmsg.ResponseForKey(tc.key.Int16())
					r.SetVersion(v)
					derr := r.ReadFrom(prefix)
					if (err == nil) != (derr == nil) {
						t.Fatalf("prefix %d/%d: rewrite err %v, kmsg err %v", n, len(body), err, derr)
					}
					if err != nil {
						if !errors.Is(err, ErrMalformedResponse) {
							t.Fatalf("prefix %d: err %v does not wrap ErrMalformedResponse", n, err)
						}
						if len(m.seen) > 0 {
							t.Fatalf("prefix %d: mapper called on a rejected body: %v", n, m.seen)
						}
					}
				}
			})
		}
	}
}

// TestRewriteTaggedNodesPreservesUnknownBytes builds a Fetch body by hand in
// a layout kmsg never writes: an unknown top-level tag before NodeEndpoints,
// slack bytes inside the NodeEndpoints value (kmsg reads the tag with its
// own reader and ignores them) and trailing bytes after the body (kmsg does
// not check for them). Only the host, port and tag size may change.
func TestRewriteTaggedNodesPreservesUnknownBytes(t *testing.T) {
	t.Parallel()
	const v = 17
	base := fetchFixture(false, 1, 2, 8)(v).(*kmsg.FetchResponse)
	base.UnknownTags = kmsg.Tags{}
	enc := base.AppendTo(nil)
	prefix := enc[:len(enc)-1] // drop the empty top-level tag section

	node := func(id int32, host string, port int32) []byte {
		b := kbin.AppendInt32(nil, id)
		b = kbin.AppendCompactString(b, host)
		b = kbin.AppendInt32(b, port)
		b = kbin.AppendCompactNullableString(b, nil)
		return append(b, 0) // no tags
	}
	nodesVal := func(host string, port int32) []byte {
		v := kbin.AppendCompactArrayLen(nil, 1)
		v = append(v, node(4, host, port)...)
		return append(v, "slack"...)
	}
	tagged := func(host string, port int32) []byte {
		b := kbin.AppendUvarint(nil, 2) // two tags
		b = kbin.AppendUvarint(b, 33)   // unknown tag first
		b = kbin.AppendUvarint(b, 3)
		b = append(b, "abc"...)
		val := nodesVal(host, port)
		b = kbin.AppendUvarint(b, 0)
		b = kbin.AppendUvarint(b, uint32(len(val)))
		b = append(b, val...)
		return append(b, "trailing"...)
	}
	realH, realP := realHost(4)
	body := slices.Concat(prefix, tagged(realH, realP))
	// A long host makes the tag size prefix grow from one byte to two.
	longHost := strings.Repeat("p", 200)
	m := mapperFunc(func(id int32, h string, p int32) (string, int32) {
		if id != 4 || h != realH || p != realP {
			t.Errorf("mapper got (%d, %q, %d)", id, h, p)
		}
		return longHost, 29092
	})
	out, changed, err := Addresses(nil, kmsg.Fetch.Int16(), v, body, m)
	if err != nil || !changed {
		t.Fatalf("changed=%v err=%v", changed, err)
	}
	want := slices.Concat(prefix, tagged(longHost, 29092))
	if !bytes.Equal(out, want) {
		t.Fatalf("got  %x\nwant %x", out, want)
	}
	got := decode(t, kmsg.Fetch.Int16(), v, out).(*kmsg.FetchResponse)
	if len(got.Brokers) != 1 || got.Brokers[0].Host != longHost || got.Brokers[0].Port != 29092 {
		t.Fatalf("decoded brokers %+v", got.Brokers)
	}
}

// TestRewriteDuplicateNodeEndpointsTags: kmsg keeps the last of two tag-0
// values; both are rewritten so neither leaks.
func TestRewriteDuplicateNodeEndpointsTags(t *testing.T) {
	t.Parallel()
	const v = 12
	base := produceFixture(false)(v).(*kmsg.ProduceResponse)
	base.Version = v
	base.UnknownTags = kmsg.Tags{}
	enc := base.AppendTo(nil)
	prefix := enc[:len(enc)-1]
	val := func(id int32) []byte {
		h, p := realHost(id)
		b := kbin.AppendCompactArrayLen(nil, 1)
		b = kbin.AppendInt32(b, id)
		b = kbin.AppendCompactString(b, h)
		b = kbin.AppendInt32(b, p)
		b = kbin.AppendCompactNullableString(b, nil)
		return append(b, 0)
	}
	body := slices.Clone(prefix)
	body = kbin.AppendUvarint(body, 2)
	for _, id := range []int32{1, 2} {
		body = kbin.AppendUvarint(body, 0)
		body = kbin.AppendUvarint(body, uint32(len(val(id))))
		body = append(body, val(id)...)
	}
	m := &nodeMapper{}
	out, changed, err := Addresses(nil, kmsg.Produce.Int16(), v, body, m)
	if err != nil || !changed {
		t.Fatalf("changed=%v err=%v", changed, err)
	}
	if len(m.seen) != 2 {
		t.Fatalf("mapper saw %v, want both nodes", m.seen)
	}
	for _, id := range []int32{1, 2} {
		h, _ := realHost(id)
		if bytes.Contains(out, []byte(h)) {
			t.Errorf("output still contains %q", h)
		}
	}
	got := decode(t, kmsg.Produce.Int16(), v, out).(*kmsg.ProduceResponse)
	if h, p := advertised(2); len(got.Brokers) != 1 || got.Brokers[0].Host != h || got.Brokers[0].Port != p {
		t.Errorf("decoded brokers %+v", got.Brokers)
	}
}

// TestRewriteDstReused: the output is appended to dst[:0], so a caller's
// buffer is reused when it is big enough.
func TestRewriteDstReused(t *testing.T) {
	t.Parallel()
	body := metadataFixture(12).AppendTo(nil)
	dst := make([]byte, 3, 4096)
	out, changed, err := Addresses(dst, kmsg.Metadata.Int16(), 12, body, &nodeMapper{})
	if err != nil || !changed {
		t.Fatalf("changed=%v err=%v", changed, err)
	}
	if &out[0] != &dst[:1][0] {
		t.Errorf("output did not reuse dst")
	}
	body = fetchFixture(true, 1, 2, 32)(18).AppendTo(nil)
	out, _, _ = Addresses(dst, kmsg.Fetch.Int16(), 18, body, &nodeMapper{})
	if &out[0] != &dst[:1][0] {
		t.Errorf("fetch output did not reuse dst")
	}
}

// sinks keep the compiler from discarding benchmarked and alloc-pinned work.
var (
	sinkBytes   []byte
	sinkChanged bool
)

// TestRewritePassthroughNoAllocs pins the hot path: a Produce or Fetch
// response without NodeEndpoints (every response but a NOT_LEADER one) is
// walked, never copied, and returned as is with zero allocations.
func TestRewritePassthroughNoAllocs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		key     kmsg.Key
		version int16
		body    []byte
	}{
		{"Fetch/v18 8 topics x 32 partitions x 4KiB", kmsg.Fetch, 18, fetchFixture(false, 8, 32, 4096)(18).AppendTo(nil)},
		{"Fetch/v16 1 partition", kmsg.Fetch, 16, fetchFixture(false, 1, 1, 100)(16).AppendTo(nil)},
		{"Produce/v13 2 topics x 3 partitions", kmsg.Produce, 13, produceFixture(false)(13).AppendTo(nil)},
		{"Produce/v10", kmsg.Produce, 10, produceFixture(false)(10).AppendTo(nil)},
		{"ShareFetch/v1", kmsg.ShareFetch, 1, shareFetchFixture(false)(1).AppendTo(nil)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &nodeMapper{}
			var err error
			allocs := testing.AllocsPerRun(100, func() {
				sinkBytes, sinkChanged, err = Addresses(nil, tc.key.Int16(), tc.version, tc.body, m)
			})
			if err != nil || sinkChanged || !sameSlice(sinkBytes, tc.body) {
				t.Fatalf("changed=%v err=%v sameSlice=%v", sinkChanged, err, sameSlice(sinkBytes, tc.body))
			}
			if allocs != 0 {
				t.Errorf("%v allocs per run, want 0", allocs)
			}
		})
	}
}

// BenchmarkRewriteFetchPassthrough measures the consume hot path: walking a
// Fetch response without NodeEndpoints to find there is nothing to rewrite.
func BenchmarkRewriteFetchPassthrough(b *testing.B) {
	for _, parts := range []int{1, 32, 256} {
		b.Run(fmt.Sprintf("partitions=%d", parts), func(b *testing.B) {
			body := fetchFixture(false, 1, parts, 16<<10)(18).AppendTo(nil)
			m := &nodeMapper{}
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				sinkBytes, sinkChanged, _ = Addresses(nil, kmsg.Fetch.Int16(), 18, body, m)
			}
			b.ReportMetric(float64(parts), "partitions/op")
		})
	}
}

// BenchmarkRewriteFetchNodeEndpoints measures the rare NOT_LEADER path:
// walk, then splice the NodeEndpoints tag.
func BenchmarkRewriteFetchNodeEndpoints(b *testing.B) {
	body := fetchFixture(true, 1, 32, 16<<10)(18).AppendTo(nil)
	dst := make([]byte, 0, len(body)+256)
	m := mapperFunc(func(id int32, _ string, _ int32) (string, int32) { return advertised(id) })
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		sinkBytes, sinkChanged, _ = Addresses(dst, kmsg.Fetch.Int16(), 18, body, m)
	}
}

// BenchmarkRewriteMetadata measures a Metadata rewrite (kmsg decode, map,
// re-encode into a reused buffer).
func BenchmarkRewriteMetadata(b *testing.B) {
	for _, brokers := range []int{3, 30} {
		b.Run(fmt.Sprintf("brokers=%d", brokers), func(b *testing.B) {
			r := metadataFixture(12).(*kmsg.MetadataResponse)
			for id := int32(4); id <= int32(brokers); id++ {
				br := kmsg.NewMetadataResponseBroker()
				br.NodeID = id
				br.Host, br.Port = realHost(id)
				r.Brokers = append(r.Brokers, br)
			}
			body := r.AppendTo(nil)
			dst := make([]byte, 0, 2*len(body))
			hosts := map[int32]string{}
			for id := int32(0); id <= int32(brokers); id++ {
				hosts[id], _ = advertised(id)
			}
			m := mapperFunc(func(id int32, _ string, _ int32) (string, int32) { return hosts[id], 19000 + id })
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				sinkBytes, sinkChanged, _ = Addresses(dst, kmsg.Metadata.Int16(), 12, body, m)
			}
			b.ReportMetric(float64(brokers), "brokers/op")
		})
	}
}
