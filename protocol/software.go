package protocol

import (
	"strings"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ClientSoftware returns the client software name an ApiVersions request
// carries (v3+, KIP-511), "" when it carries none or cannot be read. body
// is the request after its size prefix, h its parsed header.
func ClientSoftware(body []byte, h RequestHeader) string {
	if h.APIKey != int16(kmsg.ApiVersions) || h.APIVersion < 3 || h.BodyOffset <= 0 || h.BodyOffset > len(body) {
		return ""
	}
	r := kbin.Reader{Src: body[h.BodyOffset:]}
	name := r.UnsafeCompactString()
	if !r.Ok() || len(name) > maxSoftwareName {
		return ""
	}
	return strings.Clone(name)
}

// maxSoftwareName bounds the software name kept per connection.
const maxSoftwareName = 128
