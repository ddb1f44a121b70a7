package rewrite

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// fuzzTarget is one response the fuzzers feed: an API key and the version
// range in which its responses are rewritten.
type fuzzTarget struct {
	key    kmsg.Key
	minVer int16
}

// fuzzTargets are the rewritten responses plus ApiVersions (capped, not
// rewritten). NOTE: keep in sync with CarriesAddresses.
var fuzzTargets = []fuzzTarget{
	{kmsg.Metadata, 0},
	{kmsg.FindCoordinator, 0},
	{kmsg.DescribeCluster, 0},
	{kmsg.Produce, 10},
	{kmsg.Fetch, 16},
	{kmsg.ShareFetch, 0},
	{kmsg.ShareAcknowledge, 0},
	{kmsg.ApiVersions, 0},
}

// pick maps fuzzer bytes to a target and a version in its range.
func pick(sel, ver uint8) (fuzzTarget, int16) {
	tg := fuzzTargets[int(sel)%len(fuzzTargets)]
	mv, _ := MaxVersion(tg.key.Int16())
	return tg, tg.minVer + int16(int(ver)%int(mv-tg.minVer+1))
}

// fuzzSeeds returns edge-case bodies for key at version v: a valid one,
// empty, truncated, trailing garbage, and huge array lengths in both the
// classic (int32) and compact (uvarint) encodings.
func fuzzSeeds(key kmsg.Key, v int16) [][]byte {
	var valid []byte
	for _, tc := range rewriteCases {
		if tc.key == key {
			valid = tc.fixture(v).AppendTo(nil)
			break
		}
	}
	if key == kmsg.ApiVersions {
		valid = newerBrokerResponse(v).AppendTo(nil)
	}
	seeds := [][]byte{
		valid,
		nil,
		valid[:len(valid)/2],
		valid[:len(valid)-1],
		append(bytes.Clone(valid), 0xde, 0xad, 0xbe, 0xef),
		binary.BigEndian.AppendUint32(make([]byte, 8), 0x7fffffff),
		append(make([]byte, 8), 0xff, 0xff, 0xff, 0xff, 0x0f),
		bytes.Repeat([]byte{0xff}, 64),
	}
	if key == kmsg.ApiVersions {
		// KIP-511 downgrade answer: UNSUPPORTED_VERSION in a v0 body.
		r := kmsg.NewPtrApiVersionsResponse()
		r.ErrorCode = kerr.UnsupportedVersion.Code
		r.ApiKeys = []kmsg.ApiVersionsResponseApiKey{apiKey(kmsg.ApiVersions.Int16(), 0, 9)}
		seeds = append(seeds, r.AppendTo(nil))
	}
	return seeds
}

// FuzzRewriteMetadata feeds arbitrary bytes to Addresses as a
// Metadata response body of any version kmsg knows. Invariants (see
// checkRewriteInvariants): never panics; fails, with ErrMalformedResponse,
// exactly when kmsg cannot decode the body, without calling the mapper; on
// success the output decodes with kmsg at that version to the input with only
// the addresses replaced, and is the input slice itself when unchanged;
// rewriting the output again with the same mapper is a fixed point.
func FuzzRewriteMetadata(f *testing.F) {
	for _, v := range []int16{0, 1, 9, 12, 13} {
		for _, s := range fuzzSeeds(kmsg.Metadata, v) {
			f.Add(uint8(v), s)
		}
	}
	f.Fuzz(func(t *testing.T, ver uint8, body []byte) {
		mv, _ := MaxVersion(kmsg.Metadata.Int16())
		checkRewriteInvariants(t, kmsg.Metadata.Int16(), int16(int(ver)%int(mv+1)), body)
	})
}

// FuzzRewriteResponse is FuzzRewriteMetadata for every rewritten response
// (Metadata, FindCoordinator, DescribeCluster, Produce v10+, Fetch v16+,
// ShareFetch, ShareAcknowledge) and for CapAPIVersions. It is the
// differential test of the Produce/Fetch/ShareFetch walkers against kmsg.
// CapAPIVersions invariants: never panics; errors wrap ErrMalformedResponse;
// on success the output decodes with kmsg (at the version, or at v0 for a
// KIP-511 UNSUPPORTED_VERSION answer), lists no API beyond kmsg's versions,
// and capping it again is a fixed point.
func FuzzRewriteResponse(f *testing.F) {
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
			checkCapInvariants(t, v, body)
			return
		}
		checkRewriteInvariants(t, tg.key.Int16(), v, body)
	})
}

func checkRewriteInvariants(t *testing.T, key, v int16, body []byte) {
	body = body[:len(body):len(body)] // appends must not alias the input
	m := &nodeMapper{}
	out, changed, err := Addresses(nil, key, v, body, m)

	in := kmsg.ResponseForKey(key)
	in.SetVersion(v)
	derr := in.ReadFrom(body)
	if err != nil {
		if !errors.Is(err, ErrMalformedResponse) {
			t.Fatalf("error %v does not wrap ErrMalformedResponse", err)
		}
		if derr == nil {
			t.Fatalf("rewrite rejects what kmsg decodes: %v", err)
		}
		if len(m.seen) > 0 {
			t.Fatalf("mapper called for a rejected body: %v", m.seen)
		}
		return
	}
	if derr != nil {
		t.Fatalf("rewrite accepts what kmsg rejects (%v)", derr)
	}
	if !changed && !sameSlice(out, body) {
		t.Fatalf("unchanged output is not the input slice")
	}

	got := kmsg.ResponseForKey(key)
	got.SetVersion(v)
	if err := got.ReadFrom(out); err != nil {
		t.Fatalf("output does not decode: %v", err)
	}
	seen := make(map[addr]bool, len(m.seen))
	for _, a := range m.seen {
		seen[a] = true
	}
	for _, ref := range addrsOf(in) {
		if !seen[addr{ref.node, *ref.host, *ref.port}] {
			t.Fatalf("mapper never saw node %d at %s:%d", ref.node, *ref.host, *ref.port)
		}
		*ref.host, *ref.port = advertised(ref.node)
	}
	if a, b := got.AppendTo(nil), in.AppendTo(nil); !bytes.Equal(a, b) {
		t.Fatalf("output differs from the input beyond addresses:\n got %x\nwant %x", a, b)
	}

	again, changedAgain, err := Addresses(nil, key, v, out, &nodeMapper{})
	if err != nil || changedAgain || !bytes.Equal(again, out) {
		t.Fatalf("rewriting the output is not a fixed point: changed=%v err=%v", changedAgain, err)
	}
}

func checkCapInvariants(t *testing.T, v int16, body []byte) {
	body = body[:len(body):len(body)]
	out, changed, err := CapAPIVersions(nil, v, body)
	if err != nil {
		if !errors.Is(err, ErrMalformedResponse) {
			t.Fatalf("error %v does not wrap ErrMalformedResponse", err)
		}
		return
	}
	if !changed && !sameSlice(out, body) {
		t.Fatalf("unchanged output is not the input slice")
	}
	atV := &kmsg.ApiVersionsResponse{Version: v}
	atV0 := &kmsg.ApiVersionsResponse{Version: 0}
	if atV.ReadFrom(out) != nil && (atV0.ReadFrom(out) != nil || atV0.ErrorCode != kerr.UnsupportedVersion.Code) {
		t.Fatalf("output decodes neither at v%d nor as a v0 UNSUPPORTED_VERSION answer", v)
	}
	resp, err := decodeAPIVersions(v, out)
	if err != nil {
		t.Fatalf("output does not decode: %v", err)
	}
	for _, k := range resp.ApiKeys {
		if mv, ok := MaxVersion(k.ApiKey); !ok || k.MaxVersion > mv || k.MinVersion > mv {
			t.Fatalf("output lists key %d v%d-v%d beyond kmsg", k.ApiKey, k.MinVersion, k.MaxVersion)
		}
	}
	again, changedAgain, err := CapAPIVersions(nil, v, out)
	if err != nil || changedAgain || !bytes.Equal(again, out) {
		t.Fatalf("capping the output is not a fixed point: changed=%v err=%v", changedAgain, err)
	}
}
