package protocol

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestClientSoftware: the software name of ApiVersions v3+ (KIP-511), as
// franz-go writes it, and nothing for older versions, other keys or a
// truncated body.
func TestClientSoftware(t *testing.T) {
	for _, tc := range []struct {
		version int16
		name    string
		want    string
	}{{3, "librdkafka", "librdkafka"}, {4, "kgo", "kgo"}, {2, "", ""}, {0, "", ""}, {3, "", ""}} {
		req := kmsg.NewPtrApiVersionsRequest()
		req.SetVersion(tc.version)
		req.ClientSoftwareName, req.ClientSoftwareVersion = tc.name, "1.0"
		frame := kmsg.NewRequestFormatter(kmsg.FormatterClientID("c")).AppendRequest(nil, req, 7)
		body := frame[4:]
		h, err := ParseRequestHeader(body)
		if err != nil {
			t.Fatal(err)
		}
		if got := ClientSoftware(body, h); got != tc.want {
			t.Errorf("v%d %q: got %q, want %q", tc.version, tc.name, got, tc.want)
		}
		if tc.want != "" {
			if got := ClientSoftware(body[:h.BodyOffset+1], h); got != "" {
				t.Errorf("v%d truncated: got %q, want none", tc.version, got)
			}
		}
	}
}
