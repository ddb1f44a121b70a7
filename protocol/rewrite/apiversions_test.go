package rewrite

import (
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestMaxVersion: the table agrees with kmsg for every key it knows and
// rejects the rest.
func TestMaxVersion(t *testing.T) {
	t.Parallel()
	for k := int16(-1); k <= kmsg.MaxKey+2; k++ {
		got, ok := MaxVersion(k)
		req := kmsg.RequestForKey(k)
		if (req != nil) != ok {
			t.Fatalf("MaxVersion(%d) ok = %v, kmsg knows it: %v", k, ok, req != nil)
		}
		if ok && got != req.MaxVersion() {
			t.Errorf("MaxVersion(%d) = %d, kmsg says %d", k, got, req.MaxVersion())
		}
	}
	for _, k := range []int16{-32768, 1000, 32767} {
		if _, ok := MaxVersion(k); ok {
			t.Errorf("MaxVersion(%d) ok for an unknown key", k)
		}
	}
}

func apiKey(key, minV, maxV int16) kmsg.ApiVersionsResponseApiKey {
	k := kmsg.NewApiVersionsResponseApiKey()
	k.ApiKey, k.MinVersion, k.MaxVersion = key, minV, maxV
	return k
}

func mustMax(k kmsg.Key) int16 {
	v, ok := MaxVersion(k.Int16())
	if !ok {
		panic(k)
	}
	return v
}

// newerBrokerResponse is what a broker newer than kmsg might answer: some
// APIs above kmsg's versions, an API kmsg has never heard of, and one whose
// minimum kmsg cannot reach.
func newerBrokerResponse(v int16) *kmsg.ApiVersionsResponse {
	r := kmsg.NewPtrApiVersionsResponse()
	r.Version = v
	r.ThrottleMillis = 12
	r.ApiKeys = []kmsg.ApiVersionsResponseApiKey{
		apiKey(kmsg.Produce.Int16(), 3, mustMax(kmsg.Produce)+2),
		apiKey(kmsg.Fetch.Int16(), 4, mustMax(kmsg.Fetch)),
		apiKey(kmsg.Metadata.Int16(), mustMax(kmsg.Metadata)+1, mustMax(kmsg.Metadata)+3),
		apiKey(kmsg.ApiVersions.Int16(), 0, mustMax(kmsg.ApiVersions)+1),
		apiKey(kmsg.MaxKey+7, 0, 3),
		apiKey(-4, 0, 1),
	}
	f := kmsg.NewApiVersionsResponseSupportedFeature()
	f.Name, f.MinVersion, f.MaxVersion = "metadata.version", 1, 27
	r.SupportedFeatures = append(r.SupportedFeatures, f)
	ff := kmsg.NewApiVersionsResponseFinalizedFeature()
	ff.Name, ff.MinVersionLevel, ff.MaxVersionLevel = "metadata.version", 27, 27
	r.FinalizedFeatures = append(r.FinalizedFeatures, ff)
	r.FinalizedFeaturesEpoch = 99
	r.ZkMigrationReady = true
	r.UnknownTags.Set(17, []byte("future"))
	return r
}

func decodeAPIVersionsAt(t *testing.T, v int16, body []byte) *kmsg.ApiVersionsResponse {
	t.Helper()
	r := &kmsg.ApiVersionsResponse{Version: v}
	if err := r.ReadFrom(body); err != nil {
		t.Fatalf("kmsg cannot decode ApiVersions v%d: %v", v, err)
	}
	return r
}

// TestCapAPIVersionsNewerBroker caps every version of ApiVersions: newer
// maxima are lowered to kmsg's, keys kmsg does not know and keys whose
// minimum is beyond kmsg are dropped, and every other field survives.
func TestCapAPIVersionsNewerBroker(t *testing.T) {
	t.Parallel()
	for v := int16(0); v <= mustMax(kmsg.ApiVersions); v++ {
		t.Run(fmt.Sprintf("v%d", v), func(t *testing.T) {
			t.Parallel()
			body := newerBrokerResponse(v).AppendTo(nil)
			out, changed, err := CapAPIVersions(nil, v, body)
			if err != nil || !changed {
				t.Fatalf("changed=%v err=%v", changed, err)
			}
			got := decodeAPIVersionsAt(t, v, out)
			want := decodeAPIVersionsAt(t, v, body)
			want.ApiKeys = []kmsg.ApiVersionsResponseApiKey{
				apiKey(kmsg.Produce.Int16(), 3, mustMax(kmsg.Produce)),
				apiKey(kmsg.Fetch.Int16(), 4, mustMax(kmsg.Fetch)),
				apiKey(kmsg.ApiVersions.Int16(), 0, mustMax(kmsg.ApiVersions)),
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got  %+v\nwant %+v", got, want)
			}
			again, changedAgain, err := CapAPIVersions(nil, v, out)
			if err != nil || changedAgain || !sameSlice(again, out) {
				t.Errorf("capping twice: changed=%v err=%v", changedAgain, err)
			}
		})
	}
}

// TestCapAPIVersionsWithinCapsUnchanged: a broker no newer than kmsg (here,
// exactly kmsg's versions for every key) is passed through as the same slice.
func TestCapAPIVersionsWithinCapsUnchanged(t *testing.T) {
	t.Parallel()
	r := kmsg.NewPtrApiVersionsResponse()
	r.Version = 3
	for k := int16(0); k <= kmsg.MaxKey; k++ {
		if mv, ok := MaxVersion(k); ok {
			r.ApiKeys = append(r.ApiKeys, apiKey(k, 0, mv))
		}
	}
	body := r.AppendTo(nil)
	out, changed, err := CapAPIVersions(make([]byte, 0, 64), 3, body)
	if err != nil || changed || !sameSlice(out, body) {
		t.Fatalf("changed=%v err=%v sameSlice=%v", changed, err, sameSlice(out, body))
	}
}

// TestCapAPIVersionsUnsupportedVersionV0Body pins the KIP-511 downgrade:
// asked for an ApiVersions version it does not support, a broker answers
// UNSUPPORTED_VERSION in a *v0* body (Kafka's ApiVersionsResponse.parse
// falls back to v0; kgo reads it as v0 whenever the error is 35; kfake's
// 18_api_versions.go answers the same way). The body must be read, capped
// and written back as v0, or the client misreads it.
func TestCapAPIVersionsUnsupportedVersionV0Body(t *testing.T) {
	t.Parallel()
	downgrade := func(keys ...kmsg.ApiVersionsResponseApiKey) []byte {
		r := kmsg.NewPtrApiVersionsResponse()
		r.Version = 0
		r.ErrorCode = kerr.UnsupportedVersion.Code
		r.ApiKeys = keys
		return r.AppendTo(nil)
	}
	t.Run("within caps passes through", func(t *testing.T) {
		t.Parallel()
		body := downgrade(apiKey(kmsg.ApiVersions.Int16(), 0, 3))
		for v := int16(1); v <= mustMax(kmsg.ApiVersions); v++ {
			out, changed, err := CapAPIVersions(nil, v, body)
			if err != nil || changed || !sameSlice(out, body) {
				t.Errorf("v%d: changed=%v err=%v", v, changed, err)
			}
		}
	})
	t.Run("capped and kept v0", func(t *testing.T) {
		t.Parallel()
		// An older broker answering a pre-KIP-511 client lists every key.
		body := downgrade(
			apiKey(kmsg.ApiVersions.Int16(), 0, mustMax(kmsg.ApiVersions)+4),
			apiKey(kmsg.Produce.Int16(), 0, mustMax(kmsg.Produce)+1),
			apiKey(kmsg.MaxKey+1, 0, 0),
		)
		out, changed, err := CapAPIVersions(nil, 4, body)
		if err != nil || !changed {
			t.Fatalf("changed=%v err=%v", changed, err)
		}
		got := decodeAPIVersionsAt(t, 0, out)
		if len(out) != 2+4+6*2 {
			t.Errorf("output is %d bytes, not a v0 body with 2 keys", len(out))
		}
		want := []kmsg.ApiVersionsResponseApiKey{
			apiKey(kmsg.ApiVersions.Int16(), 0, mustMax(kmsg.ApiVersions)),
			apiKey(kmsg.Produce.Int16(), 0, mustMax(kmsg.Produce)),
		}
		if got.ErrorCode != kerr.UnsupportedVersion.Code || !reflect.DeepEqual(got.ApiKeys, want) {
			t.Errorf("got error %d keys %+v, want UNSUPPORTED_VERSION and %+v", got.ErrorCode, got.ApiKeys, want)
		}
	})
	t.Run("v0 request reads v0", func(t *testing.T) {
		t.Parallel()
		body := downgrade(apiKey(kmsg.ApiVersions.Int16(), 0, mustMax(kmsg.ApiVersions)+1))
		out, changed, err := CapAPIVersions(nil, 0, body)
		if err != nil || !changed {
			t.Fatalf("changed=%v err=%v", changed, err)
		}
		if got := decodeAPIVersionsAt(t, 0, out); got.ApiKeys[0].MaxVersion != mustMax(kmsg.ApiVersions) {
			t.Errorf("got %+v", got.ApiKeys)
		}
	})
	t.Run("v0 body with trailing bytes", func(t *testing.T) {
		t.Parallel()
		// Not the exact v0 length, and not a valid v3 body either: the
		// fallback still reads it as v0, as kmsg and Kafka tolerate
		// trailing bytes.
		body := append(downgrade(apiKey(kmsg.ApiVersions.Int16(), 0, 9)), 0xff, 0xff, 0xff)
		out, changed, err := CapAPIVersions(nil, 3, body)
		if err != nil || !changed {
			t.Fatalf("changed=%v err=%v", changed, err)
		}
		if got := decodeAPIVersionsAt(t, 0, out); got.ApiKeys[0].MaxVersion != mustMax(kmsg.ApiVersions) {
			t.Errorf("got %+v", got.ApiKeys)
		}
	})
}

// TestCapAPIVersionsErrors: garbage is ErrMalformedResponse, an ApiVersions
// version kmsg does not know is ErrUndecodableVersion.
func TestCapAPIVersionsErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		version int16
		body    []byte
		want    error
	}{
		{"empty", 3, nil, ErrMalformedResponse},
		{"truncated v3", 3, newerBrokerResponse(3).AppendTo(nil)[:9], ErrMalformedResponse},
		{"truncated v0", 0, []byte{0, 0, 0, 0, 0, 2, 0, 0}, ErrMalformedResponse},
		{"huge array", 1, kbin.AppendInt32([]byte{0, 0}, 1<<30), ErrMalformedResponse},
		{"version too new", mustMax(kmsg.ApiVersions) + 1, newerBrokerResponse(3).AppendTo(nil), ErrUndecodableVersion},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, _, err := CapAPIVersions(nil, tc.version, tc.body)
			if !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
		})
	}
}

// BenchmarkCapAPIVersions measures capping a full response from a newer
// broker (once per client connection).
func BenchmarkCapAPIVersions(b *testing.B) {
	body := newerBrokerResponse(3).AppendTo(nil)
	dst := make([]byte, 0, 2*len(body))
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		sinkBytes, sinkChanged, _ = CapAPIVersions(dst, 3, body)
	}
}
