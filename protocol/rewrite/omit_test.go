package rewrite

import (
	"bytes"
	"fmt"
	"reflect"
	"slices"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// omitMapper leaves out the nodes in omit and advertises the others as
// nodeMapper does, recording every call.
type omitMapper struct {
	omit map[int32]bool
	seen []int32
}

func (m *omitMapper) MapBroker(id int32, _ string, _ int32) (string, int32) {
	m.seen = append(m.seen, id)
	if m.omit[id] {
		return "", OmitBroker
	}
	return advertised(id)
}

// omitOracle applies to a decoded response what leaving out the nodes in
// omit means (see OmitBroker), written from the schemas independently of
// rewrite.go, and advertises the other nodes.
func omitOracle(r kmsg.Response, omit map[int32]bool) {
	adv := func(id int32, host *string, port *int32) bool {
		if omit[id] {
			return false
		}
		*host, *port = advertised(id)
		return true
	}
	noNode := func(id *int32, host *string, port *int32, code *int16, msg **string) {
		*id, *host, *port, *code = -1, "", -1, kerr.CoordinatorNotAvailable.Code
		m := omittedCoordinatorMessage
		*msg = &m
	}
	switch r := r.(type) {
	case *kmsg.MetadataResponse:
		r.Brokers = slices.DeleteFunc(r.Brokers, func(b kmsg.MetadataResponseBroker) bool { return omit[b.NodeID] })
		for i := range r.Brokers {
			adv(r.Brokers[i].NodeID, &r.Brokers[i].Host, &r.Brokers[i].Port)
		}
		if omit[r.ControllerID] {
			r.ControllerID = -1
		}
	case *kmsg.DescribeClusterResponse:
		r.Brokers = slices.DeleteFunc(r.Brokers, func(b kmsg.DescribeClusterResponseBroker) bool { return omit[b.NodeID] })
		for i := range r.Brokers {
			adv(r.Brokers[i].NodeID, &r.Brokers[i].Host, &r.Brokers[i].Port)
		}
	case *kmsg.FindCoordinatorResponse:
		if r.Version < 4 {
			if r.ErrorCode == 0 && r.NodeID >= 0 && !adv(r.NodeID, &r.Host, &r.Port) {
				noNode(&r.NodeID, &r.Host, &r.Port, &r.ErrorCode, &r.ErrorMessage)
			}
			break
		}
		for i := range r.Coordinators {
			c := &r.Coordinators[i]
			if c.ErrorCode == 0 && c.NodeID >= 0 && !adv(c.NodeID, &c.Host, &c.Port) {
				noNode(&c.NodeID, &c.Host, &c.Port, &c.ErrorCode, &c.ErrorMessage)
			}
		}
	case *kmsg.ProduceResponse:
		if r.Version >= 10 {
			r.Brokers = slices.DeleteFunc(r.Brokers, func(b kmsg.ProduceResponseBroker) bool { return omit[b.NodeID] })
			for i := range r.Brokers {
				adv(r.Brokers[i].NodeID, &r.Brokers[i].Host, &r.Brokers[i].Port)
			}
		}
	case *kmsg.FetchResponse:
		if r.Version >= 16 {
			r.Brokers = slices.DeleteFunc(r.Brokers, func(b kmsg.FetchResponseBroker) bool { return omit[b.NodeID] })
			for i := range r.Brokers {
				adv(r.Brokers[i].NodeID, &r.Brokers[i].Host, &r.Brokers[i].Port)
			}
		}
	case *kmsg.ShareFetchResponse:
		r.NodeEndpoints = slices.DeleteFunc(r.NodeEndpoints, func(n kmsg.ShareFetchResponseNodeEndpoint) bool { return omit[n.NodeID] })
		for i := range r.NodeEndpoints {
			adv(r.NodeEndpoints[i].NodeID, &r.NodeEndpoints[i].Host, &r.NodeEndpoints[i].Port)
		}
	case *kmsg.ShareAcknowledgeResponse:
		r.NodeEndpoints = slices.DeleteFunc(r.NodeEndpoints, func(n kmsg.ShareAcknowledgeResponseNodeEndpoint) bool { return omit[n.NodeID] })
		for i := range r.NodeEndpoints {
			adv(r.NodeEndpoints[i].NodeID, &r.NodeEndpoints[i].Host, &r.NodeEndpoints[i].Port)
		}
	}
}

// TestRewriteOmitsBrokers: a mapper answering OmitBroker leaves that node
// out of every address-bearing response, at every version, for every
// subset of the fixtures' nodes: the output is kmsg's encoding of the
// oracle's response (brokers dropped, coordinator not available, KIP-951
// NodeEndpoints entries spliced out with the array length rewritten), the
// mapper is asked once per address, and the omitted brokers' real
// addresses appear nowhere in the output.
func TestRewriteOmitsBrokers(t *testing.T) {
	t.Parallel()
	for _, tc := range rewriteCases {
		mv, _ := MaxVersion(tc.key.Int16())
		for v := int16(0); v <= mv; v++ {
			if !CarriesAddresses(tc.key.Int16(), v) {
				continue
			}
			body := tc.fixture(v).AppendTo(nil)
			var ids []int32
			for _, ref := range addrsOf(decode(t, tc.key.Int16(), v, body)) {
				ids = append(ids, ref.node)
			}
			// Every subset of the nodes (at most 3 in a fixture).
			for mask := 1; mask < 1<<len(ids); mask++ {
				omit := map[int32]bool{}
				var omitted []int32
				for i, id := range ids {
					if mask&(1<<i) != 0 {
						omit[id] = true
						omitted = append(omitted, id)
					}
				}
				t.Run(fmt.Sprintf("%s/v%d/omit%v", tc.name, v, omitted), func(t *testing.T) {
					m := &omitMapper{omit: omit}
					out, changed, err := Addresses(nil, tc.key.Int16(), v, body, m)
					if err != nil {
						t.Fatal(err)
					}
					if !changed {
						t.Fatal("changed = false with brokers omitted")
					}
					if !slices.Equal(m.seen, ids) {
						t.Errorf("mapper asked for %v, want %v", m.seen, ids)
					}
					want := decode(t, tc.key.Int16(), v, body)
					omitOracle(want, omit)
					wantBytes := want.AppendTo(nil)
					got, norm := decode(t, tc.key.Int16(), v, out), decode(t, tc.key.Int16(), v, wantBytes)
					if !reflect.DeepEqual(got, norm) {
						t.Fatalf("decoded output differs from the oracle:\n got %+v\nwant %+v", got, norm)
					}
					// The bytes are kmsg's too, but for one case: when every
					// entry of a tagged NodeEndpoints is left out, the tag
					// stays with an empty array, where kmsg would not write
					// the tag at all. Both decode alike (checked above).
					allTaggedOmitted := (tc.key == kmsg.Produce || tc.key == kmsg.Fetch) && len(omit) == len(ids)
					if !allTaggedOmitted && !bytes.Equal(out, wantBytes) {
						t.Fatalf("output is not kmsg's encoding of the oracle's response:\n got %x\nwant %x", out, wantBytes)
					}
					for id := range omit {
						h, _ := realHost(id)
						if bytes.Contains(out, []byte(h)) {
							t.Errorf("omitted node %d's real host %s is still in the output", id, h)
						}
					}
				})
			}
		}
	}
}

// FuzzRewriteOmit is FuzzRewriteResponse with a mapper that leaves out
// every odd node id. Invariants: never panics; fails exactly when kmsg
// cannot decode the body; on success the output decodes with kmsg to the
// oracle's response (omitOracle), so no omitted node keeps an address.
func FuzzRewriteOmit(f *testing.F) {
	for sel, tg := range fuzzTargets {
		mv, _ := MaxVersion(tg.key.Int16())
		for _, v := range []int16{tg.minVer, mv} {
			for _, s := range fuzzSeeds(tg.key, v) {
				f.Add(uint8(sel), uint8(v-tg.minVer), s)
			}
		}
	}
	f.Fuzz(func(t *testing.T, sel, ver uint8, body []byte) {
		tg, v := pick(sel, ver)
		if tg.key == kmsg.ApiVersions {
			return
		}
		key := tg.key.Int16()
		resp := kmsg.ResponseForKey(key)
		resp.SetVersion(v)
		decodeErr := resp.ReadFrom(body)
		omit := map[int32]bool{}
		if decodeErr == nil {
			for _, ref := range addrsOf(resp) {
				if ref.node%2 != 0 {
					omit[ref.node] = true
				}
			}
		}
		out, _, err := Addresses(nil, key, v, body, &omitMapper{omit: omit})
		if (err != nil) != (decodeErr != nil) {
			t.Fatalf("rewrite err %v, kmsg decode err %v", err, decodeErr)
		}
		if err != nil {
			return
		}
		omitOracle(resp, omit)
		want := resp.AppendTo(nil)
		if got, norm := decode(t, key, v, out), decode(t, key, v, want); !reflect.DeepEqual(got, norm) {
			t.Fatalf("decoded output differs from the oracle:\n got %+v\nwant %+v", got, norm)
		}
	})
}
