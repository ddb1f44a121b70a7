package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kmsg"
)

var (
	// ErrUnknownAPI is returned for a request whose API key kmsg does not know.
	ErrUnknownAPI = errors.New("protocol: unknown api key")
	// ErrUnsupportedVersion is returned for a request version above what the
	// proxy can decode. ApiVersions responses are capped (see [CapAPIVersions])
	// so a well-behaved client never sends one.
	ErrUnsupportedVersion = errors.New("protocol: unsupported api version")
	// ErrMalformedHeader is returned for a request header that does not parse.
	ErrMalformedHeader = errors.New("protocol: malformed request header")
)

// apiTable holds, for each API key kmsg knows, the highest version and the
// first flexible version, computed once so the hot path never allocates a
// kmsg request to ask.
var apiTable = func() (t [kmsg.MaxKey + 1]struct {
	known         bool
	max           int16
	flexibleSince int16 // -1: never flexible
}) {
	for k := int16(0); k <= kmsg.MaxKey; k++ {
		req := kmsg.RequestForKey(k)
		if req == nil {
			continue
		}
		e := &t[k]
		e.known = true
		e.max = req.MaxVersion()
		e.flexibleSince = -1
		for v := int16(0); v <= e.max; v++ {
			req.SetVersion(v)
			if req.IsFlexible() {
				e.flexibleSince = v
				break
			}
		}
	}
	return t
}()

// KnownAPI reports whether kmsg knows key, and its highest version.
func KnownAPI(key int16) (maxVersion int16, ok bool) {
	if key < 0 || int(key) >= len(apiTable) || !apiTable[key].known {
		return 0, false
	}
	return apiTable[key].max, true
}

// IsFlexible reports whether version of key uses KIP-482 flexible encoding,
// which also selects request header v2 and response header v1.
func IsFlexible(key, version int16) bool {
	if key < 0 || int(key) >= len(apiTable) {
		return false
	}
	f := apiTable[key].flexibleSince
	return f >= 0 && version >= f
}

// RequestHeader is the part of a request header the proxy uses.
type RequestHeader struct {
	APIKey        int16
	APIVersion    int16
	CorrelationID int32
	// BodyOffset is where the request body starts in the frame. It is 0 when
	// the header could not be fully parsed because the version is newer than
	// the proxy knows; such a request can still be relayed as raw bytes.
	BodyOffset int
}

// ParseRequestHeader parses the request header at the start of frame (the
// bytes after the size prefix).
//
// A request for an unknown API key or an unsupported version is an error,
// with one exception: ApiVersions of any version is relayed, because clients
// open with the newest ApiVersions they know and Kafka answers a too-new one
// with UNSUPPORTED_VERSION in a v0 body listing what it supports (KIP-511), so
// the client can retry lower. For it, BodyOffset is 0 when the version is newer
// than kmsg knows.
func ParseRequestHeader(frame []byte) (RequestHeader, error) {
	var h RequestHeader
	if len(frame) < 8 {
		return h, fmt.Errorf("%w: %d bytes", ErrMalformedHeader, len(frame))
	}
	h.APIKey = int16(binary.BigEndian.Uint16(frame))
	h.APIVersion = int16(binary.BigEndian.Uint16(frame[2:]))
	h.CorrelationID = int32(binary.BigEndian.Uint32(frame[4:]))
	maxV, ok := KnownAPI(h.APIKey)
	if !ok {
		return h, fmt.Errorf("%w: %d", ErrUnknownAPI, h.APIKey)
	}
	if h.APIVersion < 0 || h.APIVersion > maxV {
		if h.APIKey == int16(kmsg.ApiVersions) && h.APIVersion > maxV {
			return h, nil
		}
		return h, fmt.Errorf("%w: %s v%d (highest known v%d)", ErrUnsupportedVersion, kmsg.NameForKey(h.APIKey), h.APIVersion, maxV)
	}
	off := 8
	// ControlledShutdown v0 is the one request whose header has no client id.
	if !(h.APIKey == int16(kmsg.ControlledShutdown) && h.APIVersion == 0) {
		if len(frame) < off+2 {
			return h, fmt.Errorf("%w: no client id", ErrMalformedHeader)
		}
		// The client id stays a non-compact nullable string even in v2
		// headers, so old brokers can read ApiVersions (KIP-482).
		n := int(int16(binary.BigEndian.Uint16(frame[off:])))
		off += 2
		if n > 0 {
			if len(frame) < off+n {
				return h, fmt.Errorf("%w: client id of %d bytes truncated", ErrMalformedHeader, n)
			}
			off += n
		} else if n < -1 {
			return h, fmt.Errorf("%w: client id length %d", ErrMalformedHeader, n)
		}
	}
	if IsFlexible(h.APIKey, h.APIVersion) {
		end, err := skipTags(frame, off)
		if err != nil {
			return h, fmt.Errorf("%w: header tags: %v", ErrMalformedHeader, err)
		}
		off = end
	}
	h.BodyOffset = off
	return h, nil
}

// ClientID returns the client id of a request frame whose header parsed, or
// "" when it is null or absent. It allocates; keep it off the hot path.
func ClientID(frame []byte, h RequestHeader) string {
	if h.BodyOffset < 10 {
		return ""
	}
	n := int(int16(binary.BigEndian.Uint16(frame[8:])))
	if n <= 0 || 10+n > len(frame) {
		return ""
	}
	return string(frame[10 : 10+n])
}

var errShortTags = errors.New("truncated tagged fields")

// skipTags skips a KIP-482 tagged-field section starting at off and returns
// the offset after it.
func skipTags(b []byte, off int) (int, error) {
	n, off, err := uvarint(b, off)
	if err != nil {
		return 0, err
	}
	for i := uint64(0); i < n; i++ {
		if _, off, err = uvarint(b, off); err != nil { // tag
			return 0, err
		}
		var size uint64
		if size, off, err = uvarint(b, off); err != nil {
			return 0, err
		}
		if size > uint64(len(b)-off) {
			return 0, errShortTags
		}
		off += int(size)
	}
	return off, nil
}

func uvarint(b []byte, off int) (uint64, int, error) {
	if off > len(b) {
		return 0, 0, errShortTags
	}
	v, n := binary.Uvarint(b[off:])
	if n <= 0 || v > 1<<31 {
		return 0, 0, errShortTags
	}
	return v, off + n, nil
}

// ResponseBodyOffset returns where the body of a response frame starts, for
// the request key and version it answers: after the correlation id, and for
// flexible versions after the header's tagged fields, except ApiVersions,
// whose response header is always v0 so that a client that does not yet know
// the broker's versions can read it (KIP-511).
func ResponseBodyOffset(frame []byte, key, version int16) (int, error) {
	if len(frame) < 4 {
		return 0, fmt.Errorf("%w: response of %d bytes", ErrMalformedHeader, len(frame))
	}
	if key == int16(kmsg.ApiVersions) || !IsFlexible(key, version) {
		return 4, nil
	}
	end, err := skipTags(frame, 4)
	if err != nil {
		return 0, fmt.Errorf("%w: response header tags: %v", ErrMalformedHeader, err)
	}
	return end, nil
}

// ResponseCorrelationID returns the correlation id of a response frame.
func ResponseCorrelationID(frame []byte) int32 {
	return int32(binary.BigEndian.Uint32(frame))
}
