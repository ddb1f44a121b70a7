package rewrite

import (
	"errors"
	"fmt"
	"github.com/dedupproxy/dedupproxy/protocol"
	"math"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Errors returned by [Addresses] and [CapAPIVersions], always wrapped
// with the API name and version; test for them with errors.Is.
var (
	// ErrMalformedResponse means a response body does not decode at the
	// version it was requested with. kmsg's own error (usually
	// kbin.ErrNotEnoughData) is wrapped alongside it.
	ErrMalformedResponse = protocol.ErrMalformedResponse

	// ErrUndecodableVersion means the response version is newer than kmsg
	// can decode, so its broker addresses cannot be found. Callers must
	// not relay such a response: relaying could leak a real broker
	// address. [CapAPIVersions] keeps well-behaved clients below this.
	ErrUndecodableVersion = errors.New("protocol: response version newer than the proxy can decode")

	// ErrHostTooLong means an [AddrMapper] returned a host longer than a
	// Kafka string can hold (math.MaxInt16 bytes).
	ErrHostTooLong = errors.New("protocol: advertised host too long")
)

// AddrMapper decides what address clients are told for broker nodeID, whose real
// (upstream) address is host:port. It is called for every broker address in a
// response; implementations learn the real address as a side effect (the proxy
// uses this to start a listener for a newly discovered node).
//
// The rewriter calls MapBroker only after the whole body has decoded, so a
// malformed response never teaches the mapper an address. host is a fresh
// string the implementation may keep. Returning host and port unchanged
// leaves that address untouched.
//
// Returning advPort [OmitBroker] leaves the broker out of the response, for
// a node clients cannot be given an address of its own (the proxy could not
// start its listener); see [OmitBroker].
type AddrMapper interface {
	MapBroker(nodeID int32, host string, port int32) (advHost string, advPort int32)
}

// OmitBroker is the advPort an [AddrMapper] returns to leave a broker out
// of the response rather than advertise it at an address that is not its
// own: a wrong address sends the client to the wrong broker, and the real
// one leaks past the proxy. Leaving it out is what Kafka itself does for a
// broker that is not alive:
//
//   - Metadata, DescribeCluster: the broker is dropped from Brokers (a
//     partition led by it then looks leaderless to the client, which
//     refreshes its metadata later); a Metadata ControllerID naming it
//     becomes -1, Kafka's "no controller".
//   - FindCoordinator: the coordinator becomes COORDINATOR_NOT_AVAILABLE
//     with Kafka's Node.noNode() placeholder (-1, "", -1), which clients
//     retry.
//   - the KIP-951 NodeEndpoints of Produce, Fetch, ShareFetch and
//     ShareAcknowledge: the entry is dropped (the partition's CurrentLeader
//     still names the node; clients then fall back to a Metadata request).
//     The array's length is rewritten in place; when every entry of a
//     tagged NodeEndpoints is left out the tag stays, holding an empty
//     array (kmsg would leave the tag out; clients decode both alike).
//
// Any negative port means the same; Kafka ports are never negative.
const OmitBroker int32 = -1

// omittedCoordinatorMessage is the ErrorMessage of a FindCoordinator
// answer whose broker was left out.
const omittedCoordinatorMessage = "the coordinator's broker is not reachable through the proxy"

// TopicObserver is an optional interface of an [AddrMapper]: Addresses
// tells it the topics of every well-formed Metadata response that the broker
// answered without error, before any address is mapped. The proxy keys its
// state by topic name and learns the name of each topic ID (Produce v13+
// names topics by ID only) from these pairs, so that every Produce version
// maps to one key per partition. The slice is valid only during the call.
type TopicObserver interface {
	ObserveTopics(topics []TopicInfo)
}

// LeaderObserver is an optional interface of an [AddrMapper]: Addresses
// tells it the leader of every partition of every well-formed Metadata
// response (topics without error), before any address is mapped. The proxy's
// replicas use it to notice a partition led elsewhere (docs/replicas.md).
// The slice is valid only during the call.
type LeaderObserver interface {
	ObserveLeaders(topic string, leaders []PartitionLeader)
}

// PartitionLeader is a partition's leader as a Metadata response names it.
type PartitionLeader struct {
	Partition, Leader int32
}

// TopicInfo is a topic named in a Metadata response. ID is all zero before
// Metadata v10 (KIP-516 topic IDs).
type TopicInfo struct {
	Name       string
	ID         [16]byte
	Partitions int32 // how many partitions the response lists
}

// Responses that carry a broker address, checked against every struct with a
// Host field in kmsg v1.15.1 (generated.go). Covered:
//
//   - Metadata (3), all versions: Brokers. Decoded and re-encoded with kmsg.
//   - FindCoordinator (10): v0-v3 the top-level NodeID/Host/Port; v4+ each of
//     Coordinators (KIP-699 batched lookups). A coordinator with an error or
//     NodeID -1 is Kafka's "no node" placeholder and is left alone.
//     Decoded and re-encoded with kmsg.
//   - DescribeCluster (60), all versions: Brokers (KIP-700). Decoded and
//     re-encoded with kmsg.
//   - Produce (0) v10+ and Fetch (1) v16+: the top-level tagged field
//     NodeEndpoints (tag 0, kmsg's Brokers), which KIP-951 added so clients
//     can move to a new leader without a Metadata round trip; brokers send
//     it alongside NOT_LEADER_OR_FOLLOWER. These are the hot paths, so they
//     are walked with kbin.Reader, skipping records, and only the tag is
//     spliced; see [rewriteTaggedNodes]. Node IDs are never changed, so the
//     per-partition CurrentLeader.LeaderID still names the rewritten node
//     (AutoMQ PR 3546: a mismatch stalls franz-go).
//   - ShareFetch (78), all versions: NodeEndpoints (KIP-932). Walked like
//     Fetch, since it carries records.
//   - ShareAcknowledge (79), all versions: NodeEndpoints (KIP-932). Small,
//     so decoded and re-encoded with kmsg.
//
// Left out, with the reason:
//
//   - DescribeQuorum (55) v2+ Nodes[].Listeners: KRaft *controller*
//     listeners (KIP-853), which clients reach only through
//     bootstrap.controllers (KIP-919), never through a broker listener. Node
//     IDs there are controller IDs; in combined mode they equal broker IDs,
//     so mapping them would point a controller listener at a broker proxy.
//     The address is informational for admin tools only.
//   - Vote, BeginQuorumEpoch, EndQuorumEpoch, FetchSnapshot, UpdateRaftVoter,
//     AddRaftVoter: controller-to-controller Raft APIs, never sent by clients.
//   - LeaderAndISR, UpdateMetadata, BrokerRegistration, ControllerRegistration:
//     requests between brokers and controllers, not client responses.
//   - DescribeACLs/CreateACLs/DeleteACLs Host: an ACL host pattern, not an
//     address. DescribeGroups/ConsumerGroupDescribe ClientHost: the client's
//     own address. StreamsGroupHeartbeat/StreamsGroupDescribe UserEndpoint
//     (KIP-1071): Kafka Streams application endpoints, not brokers.
//
// NOTE: keep this list, CarriesAddresses and Addresses in sync.

// CarriesAddresses reports whether responses of this API key and version can carry a broker address.
//
// It is true also for versions newer than kmsg knows, so that such a response
// reaches [Addresses] and fails closed with [ErrUndecodableVersion]
// instead of leaking an address.
func CarriesAddresses(key, version int16) bool {
	if version < 0 {
		return false
	}
	switch kmsg.Key(key) {
	case kmsg.Metadata, kmsg.FindCoordinator, kmsg.DescribeCluster,
		kmsg.ShareFetch, kmsg.ShareAcknowledge:
		return true
	case kmsg.Produce:
		return version >= 10 // KIP-951 NodeEndpoints
	case kmsg.Fetch:
		return version >= 16 // KIP-951 NodeEndpoints
	}
	return false
}

// Addresses rewrites every broker address in a response body (the bytes after
// the response header) of API key/version. It returns the new body (appended to dst[:0],
// or `body` itself unchanged when nothing needed rewriting) and whether it changed.
//
// For an API key and version that [CarriesAddresses] rejects it returns body
// unchanged without reading it. Otherwise body is fully validated first: a body
// kmsg would not decode yields an error wrapping [ErrMalformedResponse], and no
// MapBroker call is made. dst must not overlap body.
//
// Produce, Fetch and ShareFetch responses without NodeEndpoints, the common
// case, cost one walk over the body (records are skipped by length, not
// read) and zero allocations.
func Addresses(dst []byte, key, version int16, body []byte, m AddrMapper) (out []byte, changed bool, err error) {
	if !CarriesAddresses(key, version) {
		return body, false, nil
	}
	if mv, ok := MaxVersion(key); !ok || version > mv {
		return nil, false, fmt.Errorf("rewrite %s v%d: %w", kmsg.NameForKey(key), version, ErrUndecodableVersion)
	}
	switch kmsg.Key(key) {
	case kmsg.Produce:
		out, changed, err = rewriteTaggedNodes(dst, body, kmsg.Produce, version, m)
	case kmsg.Fetch:
		out, changed, err = rewriteTaggedNodes(dst, body, kmsg.Fetch, version, m)
	case kmsg.ShareFetch:
		out, changed, err = rewriteShareFetch(dst, body, version, m)
	case kmsg.Metadata:
		out, changed, err = rewriteMetadata(dst, body, version, m)
	case kmsg.FindCoordinator:
		out, changed, err = rewriteFindCoordinator(dst, body, version, m)
	case kmsg.DescribeCluster:
		out, changed, err = rewriteDescribeCluster(dst, body, version, m)
	case kmsg.ShareAcknowledge:
		out, changed, err = rewriteShareAcknowledge(dst, body, version, m)
	}
	if err != nil {
		return nil, false, fmt.Errorf("rewrite %s v%d: %w", kmsg.NameForKey(key), version, err)
	}
	return out, changed, nil
}

// malformed wraps a kmsg decode error so that both it and
// ErrMalformedResponse match errors.Is.
func malformed(err error) error { return fmt.Errorf("%w: %w", ErrMalformedResponse, err) }

// mapAddr asks m for the advertised address of one broker and reports
// whether it differs from the real one, and whether the broker is to be
// left out ([OmitBroker]; the address is then not touched).
func mapAddr(m AddrMapper, nodeID int32, host *string, port *int32) (changed, omit bool, err error) {
	h, p := m.MapBroker(nodeID, *host, *port)
	if p < 0 {
		return true, true, nil
	}
	if h == *host && p == *port {
		return false, false, nil
	}
	if len(h) > math.MaxInt16 {
		return false, false, fmt.Errorf("node %d: %d bytes: %w", nodeID, len(h), ErrHostTooLong)
	}
	*host, *port = h, p
	return true, false, nil
}

// The kmsg-based rewriters below handle the rare, small responses: decode,
// map, and re-encode only if an address changed. ReadFrom (not
// UnsafeReadFrom) so the host strings handed to the mapper are its own.

func rewriteMetadata(dst, body []byte, version int16, m AddrMapper) ([]byte, bool, error) {
	resp := kmsg.MetadataResponse{Version: version}
	if err := resp.ReadFrom(body); err != nil {
		return nil, false, malformed(err)
	}
	if o, ok := m.(TopicObserver); ok {
		observeTopics(o, resp.Topics)
	}
	if o, ok := m.(LeaderObserver); ok {
		ObserveLeaders(o, resp.Topics)
	}
	changed := false
	kept := resp.Brokers[:0]
	for i := range resp.Brokers {
		b := resp.Brokers[i]
		c, omit, err := mapAddr(m, b.NodeID, &b.Host, &b.Port)
		if err != nil {
			return nil, false, err
		}
		changed = changed || c
		if omit {
			if b.NodeID == resp.ControllerID {
				resp.ControllerID = -1
			}
			continue
		}
		kept = append(kept, b)
	}
	resp.Brokers = kept
	if !changed {
		return body, false, nil
	}
	return resp.AppendTo(dst[:0]), true, nil
}

// observeTopics hands o the topics of a Metadata response that carry no
// error and a name (Metadata v12+ may answer a topic requested by ID with a
// null name on error).
func observeTopics(o TopicObserver, topics []kmsg.MetadataResponseTopic) {
	seen := make([]TopicInfo, 0, len(topics))
	for i := range topics {
		t := &topics[i]
		if t.ErrorCode != 0 || t.Topic == nil || *t.Topic == "" {
			continue
		}
		seen = append(seen, TopicInfo{Name: *t.Topic, ID: t.TopicID, Partitions: int32(len(t.Partitions))})
	}
	if len(seen) > 0 {
		o.ObserveTopics(seen)
	}
}

// ObserveLeaders hands o the partition leaders of the topics of a Metadata
// response that carry no error and a name.
func ObserveLeaders(o LeaderObserver, topics []kmsg.MetadataResponseTopic) {
	var leaders []PartitionLeader
	for i := range topics {
		t := &topics[i]
		if t.ErrorCode != 0 || t.Topic == nil || *t.Topic == "" {
			continue
		}
		leaders = leaders[:0]
		for _, p := range t.Partitions {
			leaders = append(leaders, PartitionLeader{Partition: p.Partition, Leader: p.Leader})
		}
		o.ObserveLeaders(*t.Topic, leaders)
	}
}

func rewriteFindCoordinator(dst, body []byte, version int16, m AddrMapper) ([]byte, bool, error) {
	resp := kmsg.FindCoordinatorResponse{Version: version}
	if err := resp.ReadFrom(body); err != nil {
		return nil, false, malformed(err)
	}
	changed := false
	if version < 4 {
		// v0-v3: one coordinator at the top level. On error Kafka sends
		// Node.noNode() (-1, "", -1); there is nothing to map.
		if resp.ErrorCode == 0 && resp.NodeID >= 0 {
			c, omit, err := mapAddr(m, resp.NodeID, &resp.Host, &resp.Port)
			if err != nil {
				return nil, false, err
			}
			changed = c
			if omit {
				resp.ErrorCode, resp.ErrorMessage = noCoordinator(&resp.NodeID, &resp.Host, &resp.Port)
			}
		}
	} else {
		// v4+ (KIP-699): one entry per requested key, each with its own
		// error; the top-level fields are gone.
		for i := range resp.Coordinators {
			co := &resp.Coordinators[i]
			if co.ErrorCode != 0 || co.NodeID < 0 {
				continue
			}
			c, omit, err := mapAddr(m, co.NodeID, &co.Host, &co.Port)
			if err != nil {
				return nil, false, err
			}
			changed = changed || c
			if omit {
				co.ErrorCode, co.ErrorMessage = noCoordinator(&co.NodeID, &co.Host, &co.Port)
			}
		}
	}
	if !changed {
		return body, false, nil
	}
	return resp.AppendTo(dst[:0]), true, nil
}

// noCoordinator turns a coordinator whose broker is left out into Kafka's
// answer for a coordinator that is not available: COORDINATOR_NOT_AVAILABLE
// and the Node.noNode() placeholder, which clients retry.
func noCoordinator(id *int32, host *string, port *int32) (int16, *string) {
	*id, *host, *port = -1, "", -1
	msg := omittedCoordinatorMessage
	return kerr.CoordinatorNotAvailable.Code, &msg
}

func rewriteDescribeCluster(dst, body []byte, version int16, m AddrMapper) ([]byte, bool, error) {
	resp := kmsg.DescribeClusterResponse{Version: version}
	if err := resp.ReadFrom(body); err != nil {
		return nil, false, malformed(err)
	}
	var changed bool
	var err error
	resp.Brokers, changed, err = mapEach(m, resp.Brokers, func(b *kmsg.DescribeClusterResponseBroker) (int32, *string, *int32) {
		return b.NodeID, &b.Host, &b.Port
	})
	if err != nil || !changed {
		return body, false, err
	}
	return resp.AppendTo(dst[:0]), true, nil
}

func rewriteShareAcknowledge(dst, body []byte, version int16, m AddrMapper) ([]byte, bool, error) {
	resp := kmsg.ShareAcknowledgeResponse{Version: version}
	if err := resp.ReadFrom(body); err != nil {
		return nil, false, malformed(err)
	}
	var changed bool
	var err error
	resp.NodeEndpoints, changed, err = mapEach(m, resp.NodeEndpoints, func(n *kmsg.ShareAcknowledgeResponseNodeEndpoint) (int32, *string, *int32) {
		return n.NodeID, &n.Host, &n.Port
	})
	if err != nil || !changed {
		return body, false, err
	}
	return resp.AppendTo(dst[:0]), true, nil
}

// mapEach maps the address of every element of a decoded broker list and
// returns the list without the brokers left out.
func mapEach[T any](m AddrMapper, items []T, addr func(*T) (int32, *string, *int32)) (kept []T, changed bool, err error) {
	kept = items[:0]
	for i := range items {
		id, host, port := addr(&items[i])
		c, omit, err := mapAddr(m, id, host, port)
		if err != nil {
			return nil, false, err
		}
		changed = changed || c
		if !omit {
			kept = append(kept, items[i])
		}
	}
	return kept, changed, nil
}

// rewriteTaggedNodes handles Produce v10+ and Fetch v16+, whose broker
// addresses live in the top-level tagged field NodeEndpoints (KIP-951) at the
// very end of the body, after every topic, partition and record batch.
//
// Pass one walks the body exactly as kmsg would decode it, but only skips:
// no allocation, no copy. It records where the top-level tag section starts
// and whether any tag-0 value holds a node. Brokers send NodeEndpoints only
// with NOT_LEADER_OR_FOLLOWER, so nearly always there is none and body is
// returned as is. Otherwise pass two walks just the tag section, calling the
// mapper and splicing: bytes up to each tag-0 size prefix are copied, the
// value is re-emitted with new hosts and ports (everything else in it, and
// every other tag, byte for byte), and the size prefix recomputed.
func rewriteTaggedNodes(dst, body []byte, key kmsg.Key, version int16, m AddrMapper) ([]byte, bool, error) {
	w := newRespWalker(body)
	// A switch, not a func value: an indirect call would move w to the heap.
	if key == kmsg.Produce {
		w.walkProduce(version)
	} else {
		w.walkFetch(version)
	}
	tagsAt := w.pos()
	hasNodes := w.walkTopTags()
	if !w.Ok() {
		return nil, false, ErrMalformedResponse
	}
	if !hasNodes {
		return body, false, nil
	}

	return rewriteTopTags(dst, body, tagsAt, m)
}

// rewriteTopTags is pass two of rewriteTaggedNodes: body[tagsAt:] is a
// top-level tag section that pass one validated and found to hold nodes.
func rewriteTopTags(dst, body []byte, tagsAt int, m AddrMapper) ([]byte, bool, error) {
	s := addrSplice{src: body, dst: dst}
	w := respWalker{Reader: kbin.Reader{Src: body[tagsAt:]}, end: len(body)}
	for n := w.Uvarint(); n > 0 && w.Ok(); n-- {
		key := w.Uvarint()
		sizeAt := w.pos()
		size := int(w.Uvarint())
		if key != 0 {
			w.Span(size)
			continue
		}
		v := w.sub(size)
		s.openTag(sizeAt, v.pos())
		if err := s.nodes(&v, true /* flexible */, m); err != nil {
			return nil, false, err
		}
		s.closeTag(v.end)
	}
	if !w.Ok() {
		// Pass one accepted these bytes; this is unreachable.
		return nil, false, ErrMalformedResponse
	}
	out, changed := s.finish()
	return out, changed, nil
}

// rewriteShareFetch handles ShareFetch (KIP-932): like Fetch it carries
// records, so it is walked, not decoded; its NodeEndpoints is a plain array
// after the topics rather than a tagged field.
func rewriteShareFetch(dst, body []byte, version int16, m AddrMapper) ([]byte, bool, error) {
	w := newRespWalker(body)
	w.walkShareFetchTopics(version)
	nodesAt := w.pos()
	n := w.walkNodes(true /* flexible */)
	w.skipTags()
	if !w.Ok() {
		return nil, false, ErrMalformedResponse
	}
	if n <= 0 {
		return body, false, nil
	}
	s := addrSplice{src: body, dst: dst}
	w = respWalker{Reader: kbin.Reader{Src: body[nodesAt:]}, end: len(body)}
	if err := s.nodes(&w, true /* flexible */, m); err != nil {
		return nil, false, err
	}
	out, changed := s.finish()
	return out, changed, nil
}

// respWalker is a kbin.Reader that also knows its offset in the body, so the
// rewriter can splice around the fields it changes. Its methods skip fields
// with the same reads, and the same array-length sanity checks, as kmsg's
// generated readFrom, so a body passes the walk exactly when kmsg decodes it;
// the differential tests and FuzzRewriteResponse hold it to that.
type respWalker struct {
	kbin.Reader
	end int // body offset just past Reader.Src
}

func newRespWalker(body []byte) respWalker {
	return respWalker{Reader: kbin.Reader{Src: body}, end: len(body)}
}

// pos is the body offset of the next unread byte.
func (w *respWalker) pos() int { return w.end - len(w.Src) }

// fail marks the walker bad; kbin.Reader does this for a negative span.
func (w *respWalker) fail() { w.Span(-1) }

// sub returns a walker over the next n bytes (a tagged field's value, which
// kmsg decodes with its own reader) and advances w past them.
func (w *respWalker) sub(n int) respWalker {
	start := w.pos()
	v := w.Span(n)
	return respWalker{Reader: kbin.Reader{Src: v}, end: start + len(v)}
}

// arrayLen reads an array length. Like kmsg, a negative (null) length means
// no elements, and a length that cannot fit in what is left, at minSize
// bytes per element, fails early instead of looping.
func (w *respWalker) arrayLen(flexible bool, minSize int64) int32 {
	var l int32
	if flexible {
		l = w.CompactArrayLen()
	} else {
		l = w.ArrayLen()
	}
	if !w.Ok() || int64(l)*minSize > int64(len(w.Src)) {
		w.fail()
		return 0
	}
	return l
}

// strLen reads a string length prefix; -1 means null.
func (w *respWalker) strLen(flexible bool) int {
	if flexible {
		return int(w.Uvarint()) - 1
	}
	return int(w.Int16())
}

func (w *respWalker) skipString(flexible bool) { w.Span(w.strLen(flexible)) }

func (w *respWalker) skipNullableString(flexible bool) {
	if l := w.strLen(flexible); l >= 0 {
		w.Span(l)
	}
}

func (w *respWalker) skipNullableBytes(flexible bool) {
	var l int
	if flexible {
		l = int(w.Uvarint()) - 1
	} else {
		l = int(w.Int32())
	}
	if l >= 0 {
		w.Span(l)
	}
}

// tagShapes describes the tagged structs kmsg decodes inside one tag
// section: for tags 0, 1 and 2, the size of the struct's fixed fields, which
// are followed by the struct's own tag section; 0 means kmsg keeps the tag
// as unknown bytes. kmsg decodes a known tagged struct from its own reader,
// so a value too short for it fails the decode.
type tagShapes [3]int

var (
	// ProduceResponse partition: tag 0 CurrentLeader (LeaderID, LeaderEpoch).
	produceTags = tagShapes{8}
	// FetchResponse partition: tag 0 DivergingEpoch (Epoch, EndOffset), tag 1
	// CurrentLeader (LeaderID, LeaderEpoch), tag 2 SnapshotID (EndOffset, Epoch).
	fetchTags = tagShapes{12, 8, 12}
)

// skipTags skips a tag section kmsg keeps as unknown bytes.
func (w *respWalker) skipTags() {
	for n := w.Uvarint(); n > 0 && w.Ok(); n-- {
		w.Uvarint() // key
		w.Span(int(w.Uvarint()))
	}
}

// skipTagsShaped skips a tag section holding the tagged structs in shapes.
// (Separate from skipTags so that neither recurses: a recursive method
// would move the sub-walker to the heap, one allocation per partition.)
func (w *respWalker) skipTagsShaped(shapes *tagShapes) {
	for n := w.Uvarint(); n > 0 && w.Ok(); n-- {
		key := w.Uvarint()
		size := int(w.Uvarint())
		if key >= uint32(len(shapes)) || shapes[key] == 0 {
			w.Span(size)
			continue
		}
		v := w.sub(size)
		v.Span(shapes[key])
		v.skipTags()
		if !v.Ok() {
			w.fail()
		}
	}
}

// walkTopTags skips the top-level tag section of a Produce or Fetch
// response, validating each tag 0 (NodeEndpoints) as kmsg would, and reports
// whether any of them holds a node.
func (w *respWalker) walkTopTags() (hasNodes bool) {
	for n := w.Uvarint(); n > 0 && w.Ok(); n-- {
		key := w.Uvarint()
		size := int(w.Uvarint())
		if key != 0 {
			w.Span(size)
			continue
		}
		v := w.sub(size)
		if v.walkNodes(true /* flexible */) > 0 {
			hasNodes = true
		}
		if !v.Ok() {
			w.fail()
		}
	}
	return hasNodes
}

// walkNodes skips a NodeEndpoints array (NodeID, Host, Port, Rack, tags) and
// returns its length.
func (w *respWalker) walkNodes(flexible bool) int32 {
	n := w.arrayLen(flexible, 11)
	for i := int32(0); i < n && w.Ok(); i++ {
		w.Span(4) // NodeID
		w.skipString(flexible)
		w.Span(4) // Port
		w.skipNullableString(flexible)
		if flexible {
			w.skipTags()
		}
	}
	return n
}

// walkProduce skips a ProduceResponse up to its top-level tag section.
func (w *respWalker) walkProduce(version int16) {
	flexible := version >= 9
	topicMin, partMin := int64(2), int64(14)
	if version >= 13 {
		topicMin = 18 // topic ID instead of name
	}
	if version >= 8 {
		partMin = 33
	}
	nt := w.arrayLen(flexible, topicMin)
	for i := int32(0); i < nt && w.Ok(); i++ {
		if version <= 12 {
			w.skipString(flexible)
		} else {
			w.Span(16)
		}
		np := w.arrayLen(flexible, partMin)
		for j := int32(0); j < np && w.Ok(); j++ {
			w.Span(4 + 2 + 8) // Partition, ErrorCode, BaseOffset
			if version >= 2 {
				w.Span(8) // LogAppendTime
			}
			if version >= 5 {
				w.Span(8) // LogStartOffset
			}
			if version >= 8 {
				ne := w.arrayLen(flexible, 6)
				for k := int32(0); k < ne && w.Ok(); k++ {
					w.Span(4) // RelativeOffset
					w.skipNullableString(flexible)
					if flexible {
						w.skipTags()
					}
				}
				w.skipNullableString(flexible) // ErrorMessage
			}
			if flexible {
				w.skipTagsShaped(&produceTags)
			}
		}
		if flexible {
			w.skipTags()
		}
	}
	if version >= 1 {
		w.Span(4) // ThrottleMillis
	}
}

// walkFetch skips a FetchResponse up to its top-level tag section; record
// batches are skipped by their length prefix, never read.
func (w *respWalker) walkFetch(version int16) {
	flexible := version >= 12
	if version >= 1 {
		w.Span(4) // ThrottleMillis
	}
	if version >= 7 {
		w.Span(2 + 4) // ErrorCode, SessionID
	}
	topicMin, partMin := int64(2), int64(16)
	if version >= 13 {
		topicMin = 18
	}
	if version >= 11 {
		partMin = 37
	}
	nt := w.arrayLen(flexible, topicMin)
	for i := int32(0); i < nt && w.Ok(); i++ {
		if version <= 12 {
			w.skipString(flexible)
		} else {
			w.Span(16)
		}
		np := w.arrayLen(flexible, partMin)
		for j := int32(0); j < np && w.Ok(); j++ {
			w.Span(4 + 2 + 8) // Partition, ErrorCode, HighWatermark
			if version >= 4 {
				w.Span(8) // LastStableOffset
			}
			if version >= 5 {
				w.Span(8) // LogStartOffset
			}
			if version >= 4 {
				na := w.arrayLen(flexible, 16)
				for k := int32(0); k < na && w.Ok(); k++ {
					w.Span(8 + 8) // ProducerID, FirstOffset
					if flexible {
						w.skipTags()
					}
				}
			}
			if version >= 11 {
				w.Span(4) // PreferredReadReplica
			}
			w.skipNullableBytes(flexible) // RecordBatches
			if flexible {
				w.skipTagsShaped(&fetchTags)
			}
		}
		if flexible {
			w.skipTags()
		}
	}
}

// walkShareFetchTopics skips a ShareFetchResponse (always flexible) up to
// its NodeEndpoints array.
func (w *respWalker) walkShareFetchTopics(version int16) {
	w.Span(4 + 2) // ThrottleMillis, ErrorCode
	w.skipNullableString(true)
	if version >= 1 {
		w.Span(4) // AcquisitionLockTimeoutMillis
	}
	nt := w.arrayLen(true, 18)
	for i := int32(0); i < nt && w.Ok(); i++ {
		w.Span(16) // TopicID
		np := w.arrayLen(true, 22)
		for j := int32(0); j < np && w.Ok(); j++ {
			w.Span(4 + 2) // Partition, ErrorCode
			w.skipNullableString(true)
			w.Span(2) // AcknowledgeErrorCode
			w.skipNullableString(true)
			w.Span(4 + 4) // CurrentLeader: LeaderID, LeaderEpoch
			w.skipTags()
			w.skipNullableBytes(true) // Records
			na := w.arrayLen(true, 18)
			for k := int32(0); k < na && w.Ok(); k++ {
				w.Span(8 + 8 + 2) // FirstOffset, LastOffset, DeliveryCount
				w.skipTags()
			}
			w.skipTags()
		}
		w.skipTags()
	}
}

// addrSplice builds a rewritten body lazily: until the first address
// changes, nothing is copied, and if none does, finish returns src itself.
// Once active, dst holds src[:last] with the changes made so far.
type addrSplice struct {
	src, dst []byte
	last     int
	active   bool

	// Set while walking a tagged field's value, whose size prefix (at
	// src offset sizeAt) must be recomputed if the value changes.
	inTag    bool
	sizeAt   int
	valAt    int
	dstValAt int // dst offset of the value; valid when active
}

func (s *addrSplice) activate() {
	s.active = true
	if s.inTag {
		s.dst = append(s.dst[:0], s.src[:s.sizeAt]...)
		s.dstValAt = len(s.dst)
		s.last = s.valAt
		return
	}
	s.dst = s.dst[:0]
	s.last = 0
}

func (s *addrSplice) openTag(sizeAt, valAt int) {
	s.inTag, s.sizeAt, s.valAt = true, sizeAt, valAt
	if s.active {
		s.dst = append(s.dst, s.src[s.last:sizeAt]...)
		s.dstValAt = len(s.dst)
		s.last = valAt
	}
}

// closeTag ends the value opened by openTag at src offset valEnd and, if
// output is being built, writes the value's new size prefix in front of it.
func (s *addrSplice) closeTag(valEnd int) {
	s.inTag = false
	if !s.active {
		return
	}
	s.dst = append(s.dst, s.src[s.last:valEnd]...)
	s.last = valEnd
	n := len(s.dst) - s.dstValAt
	k := kbin.UvarintLen(uint32(n))
	s.dst = append(s.dst, make([]byte, k)...)
	copy(s.dst[s.dstValAt+k:], s.dst[s.dstValAt:s.dstValAt+n])
	kbin.AppendUvarint(s.dst[:s.dstValAt], uint32(n)) // writes in place
}

// cut drops src[from:to] from the output; the caller appends what replaces
// it to s.dst.
func (s *addrSplice) cut(from, to int) {
	if !s.active {
		s.activate()
	}
	s.dst = append(s.dst, s.src[s.last:from]...)
	s.last = to
}

// replace swaps the Host and Port at src[hostAt:end] for host and port.
func (s *addrSplice) replace(hostAt, end int, host string, port int32, flexible bool) {
	s.cut(hostAt, end)
	if flexible {
		s.dst = kbin.AppendCompactString(s.dst, host)
	} else {
		s.dst = kbin.AppendString(s.dst, host)
	}
	s.dst = kbin.AppendInt32(s.dst, port)
}

func (s *addrSplice) finish() ([]byte, bool) {
	if !s.active {
		return s.src, false
	}
	return append(s.dst, s.src[s.last:]...), true
}

// nodeEntry is one element of a NodeEndpoints array as splice sees it.
type nodeEntry struct {
	start, hostAt, end, stop int // the element, its Host, past its Port, past the element
	host                     string
	port                     int32
	changed, omit            bool
}

// nodes walks a NodeEndpoints array that pass one already validated,
// mapping each node and splicing in the addresses that change. Nodes the
// mapper omits are cut out and the array's length rewritten; since the
// length comes first, every node is mapped before anything is spliced.
// Brokers send NodeEndpoints only with NOT_LEADER_OR_FOLLOWER, so the slice
// this allocates is off the hot path.
func (s *addrSplice) nodes(w *respWalker, flexible bool, m AddrMapper) error {
	lenAt := w.pos()
	n := w.arrayLen(flexible, 11)
	lenEnd := w.pos()
	var entries []nodeEntry
	kept := n
	for i := int32(0); i < n && w.Ok(); i++ {
		e := nodeEntry{start: w.pos()}
		id := w.Int32()
		e.hostAt = w.pos()
		host := string(w.Span(w.strLen(flexible)))
		port := w.Int32()
		e.end = w.pos()
		w.skipNullableString(flexible) // Rack
		if flexible {
			w.skipTags()
		}
		e.stop = w.pos()
		if !w.Ok() {
			break
		}
		e.host, e.port = host, port
		c, omit, err := mapAddr(m, id, &e.host, &e.port)
		if err != nil {
			return err
		}
		e.changed, e.omit = c, omit
		if omit {
			kept--
		}
		entries = append(entries, e)
	}
	if !w.Ok() {
		return ErrMalformedResponse // unreachable after pass one
	}
	if kept != n {
		s.cut(lenAt, lenEnd)
		if flexible {
			s.dst = kbin.AppendCompactArrayLen(s.dst, int(kept))
		} else {
			s.dst = kbin.AppendArrayLen(s.dst, int(kept))
		}
	}
	for _, e := range entries {
		switch {
		case e.omit:
			s.cut(e.start, e.stop)
		case e.changed:
			s.replace(e.hostAt, e.end, e.host, e.port, flexible)
		}
	}
	return nil
}
