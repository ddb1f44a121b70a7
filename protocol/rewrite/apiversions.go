package rewrite

import (
	"encoding/binary"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// maxVersions[k] is the highest version of API key k that kmsg can decode,
// or -1 for a key kmsg does not know. Built once: kmsg.RequestForKey
// allocates, and MaxVersion may be asked for every request.
var maxVersions = func() (t [kmsg.MaxKey + 1]int16) {
	for k := range t {
		req, resp := kmsg.RequestForKey(int16(k)), kmsg.ResponseForKey(int16(k))
		if req == nil || resp == nil {
			t[k] = -1
			continue
		}
		// The proxy parses the request and may decode the response, so
		// it needs both; kmsg keeps the two equal today.
		t[k] = min(req.MaxVersion(), resp.MaxVersion())
	}
	return t
}()

// MaxVersion returns the highest version of key the proxy can decode, and false for a key it doesn't know.
func MaxVersion(key int16) (int16, bool) {
	if key < 0 || int(key) >= len(maxVersions) || maxVersions[key] < 0 {
		return 0, false
	}
	return maxVersions[key], true
}

// CapAPIVersions rewrites an ApiVersions response body (for request version `version`) so that
// every API's MaxVersion is at most what kmsg can decode (kmsg.RequestForKey(k).MaxVersion()),
// API keys unknown to kmsg are removed, and an API whose MinVersion exceeds what kmsg knows is removed.
//
// Why every API and not only the rewritten ones: the proxy parses the header
// of every request, and whether that header is flexible depends on the key
// and version (KIP-482), so a version kmsg does not know could not even be
// framed correctly. A newer broker thus degrades to what the proxy knows
// instead of breaking clients (kafka-proxy issues 177, 213).
//
// Everything else (error code, throttle, supported and finalized features,
// unknown tags) is preserved. A response already within the caps is returned
// as body itself with changed false; otherwise the new body is appended to
// dst[:0], which must not overlap body.
//
// KIP-511 quirk: a broker that does not support the requested ApiVersions
// version answers UNSUPPORTED_VERSION in a v0 body listing (at least) its
// ApiVersions range, so that the client retries lower. Such a body is
// decoded, capped and re-encoded as v0; see [decodeAPIVersions].
//
// The response header of ApiVersions is always v0, even for a flexible body
// (KIP-511); the caller strips it before calling.
func CapAPIVersions(dst []byte, version int16, body []byte) (out []byte, changed bool, err error) {
	resp, err := decodeAPIVersions(version, body)
	if err != nil {
		return nil, false, fmt.Errorf("cap ApiVersions v%d: %w", version, err)
	}
	keep := resp.ApiKeys[:0]
	for _, k := range resp.ApiKeys {
		mv, ok := MaxVersion(k.ApiKey)
		if !ok || k.MinVersion > mv {
			changed = true
			continue
		}
		if k.MaxVersion > mv {
			k.MaxVersion = mv
			changed = true
		}
		keep = append(keep, k)
	}
	if !changed {
		return body, false, nil
	}
	resp.ApiKeys = keep
	return resp.AppendTo(dst[:0]), true, nil
}

// decodeAPIVersions decodes an ApiVersions response body for a request of
// the given version, falling back to the v0 layout of a KIP-511 downgrade.
//
// The error code leads every version, so it can be read first. When it is
// UNSUPPORTED_VERSION the broker did not understand our version and answered
// in v0: kgo reads such a body as v0 unconditionally (broker.go, "Kafka
// replies with Version 0"), Kafka's own client tries the requested version and
// falls back to v0 (ApiVersionsResponse.parse). A v0 body has an exact length,
// 2 + 4 + 6*n bytes, which settles the rare body that would decode both ways.
// A body that does not decode at version but has that error code is also
// read as v0, since kmsg, like Kafka, tolerates trailing bytes.
func decodeAPIVersions(version int16, body []byte) (*kmsg.ApiVersionsResponse, error) {
	if mv, _ := MaxVersion(kmsg.ApiVersions.Int16()); version > mv {
		return nil, ErrUndecodableVersion
	}
	downgraded := version > 0 && len(body) >= 2 &&
		int16(binary.BigEndian.Uint16(body)) == kerr.UnsupportedVersion.Code
	if downgraded && isExactV0APIVersions(body) {
		resp := &kmsg.ApiVersionsResponse{Version: 0}
		if err := resp.ReadFrom(body); err != nil {
			return nil, malformed(err)
		}
		return resp, nil
	}
	resp := &kmsg.ApiVersionsResponse{Version: version}
	err := resp.ReadFrom(body)
	if err != nil && downgraded {
		resp = &kmsg.ApiVersionsResponse{Version: 0}
		err = resp.ReadFrom(body)
	}
	if err != nil {
		return nil, malformed(err)
	}
	return resp, nil
}

// isExactV0APIVersions reports whether body is exactly one v0 ApiVersions
// response: ErrorCode int16, then an int32 count of (ApiKey, MinVersion,
// MaxVersion) int16 triples.
func isExactV0APIVersions(body []byte) bool {
	if len(body) < 6 {
		return false
	}
	n := int64(int32(binary.BigEndian.Uint32(body[2:])))
	if n < 0 {
		n = 0 // a null array, which kmsg reads as empty
	}
	return int64(len(body)) == 6+6*n
}
