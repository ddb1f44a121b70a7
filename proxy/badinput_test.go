package proxy

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestBadInputClosesOnlyThatConnection sends each kind of bad input on its
// own connection while a healthy franz-go client produces on another: the
// bad connection is closed with one clear log line, the healthy client is
// unaffected, and nothing panics (startProxy's cleanup checks the panic
// counter).
func TestBadInputClosesOnlyThatConnection(t *testing.T) {
	t.Parallel()
	const topic = "healthy"
	c := newCluster(t, kfake.SeedTopics(3, topic))
	p := startProxy(t, c, func(cfg *Config) { cfg.MaxFrameBytes = 1 << 20 })

	frame := func(body []byte) []byte {
		return binary.BigEndian.AppendUint32(nil, uint32(len(body))) // size prefix
	}
	header := func(key, version int16) []byte {
		b := binary.BigEndian.AppendUint16(nil, uint16(key))
		b = binary.BigEndian.AppendUint16(b, uint16(version))
		b = binary.BigEndian.AppendUint32(b, 7)         // correlation id
		return binary.BigEndian.AppendUint16(b, 0xffff) // null client id
	}
	whole := func(body []byte) []byte { return append(frame(body), body...) }

	cases := []struct {
		name  string
		bytes []byte
		log   string // what the log line must say
	}{
		{"frame over the limit", binary.BigEndian.AppendUint32(nil, 2<<20), "frame too large"},
		{"negative size", binary.BigEndian.AppendUint32(nil, 0xfffffff0), "invalid frame size"},
		{"truncated frame", append(binary.BigEndian.AppendUint32(nil, 100), header(18, 0)...), "truncated frame"},
		{"unknown api key", whole(header(9999, 0)), "unknown api key"},
		{"unsupported version", whole(header(int16(kmsg.Metadata), 999)), "unsupported api version"},
		{"malformed produce", whole(append(header(int16(kmsg.Produce), 7), 0x00)), "bad produce request"},
		{"garbage", []byte("\x00\x00\x00\x0c\xde\xad\xbe\xef\x01\x02\x03\x04\x05\x06\x07\x08"), "unknown api key"},
		{"TLS client hello", []byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03}, "TLS"},
		{"HTTP request", []byte("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), "HTTP"},
	}

	healthy, err := kgo.NewClient(kgo.SeedBrokers(p.addr()), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer healthy.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.DialTimeout("tcp", p.addr(), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(20 * time.Second))
			if _, err := conn.Write(tc.bytes); err != nil {
				t.Fatal(err)
			}
			if tc.name == "truncated frame" {
				conn.(*net.TCPConn).CloseWrite() // the rest of the frame never comes
			}
			// The proxy closes the connection: the read ends with EOF (or a
			// reset), not a response and not a timeout.
			n, err := io.Copy(io.Discard, conn)
			if err != nil && !isReset(err) {
				t.Fatalf("want the connection closed, got %v after %d bytes", err, n)
			}
			if n != 0 {
				t.Fatalf("got %d bytes of response to bad input", n)
			}
			// One log line names this connection and the mistake.
			client := "client=" + conn.LocalAddr().String()
			waitFor(t, 10*time.Second, "a log line with "+client+" and "+tc.log, func() bool {
				for _, line := range strings.Split(p.logs.String(), "\n") {
					if strings.Contains(line, client) && strings.Contains(line, tc.log) {
						return true
					}
				}
				return false
			})
			// Meanwhile, the healthy client works.
			if err := healthy.ProduceSync(ctx, &kgo.Record{Value: []byte(tc.name)}).FirstErr(); err != nil {
				t.Fatalf("healthy client failed after %s: %v", tc.name, err)
			}
		})
	}
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && strings.Contains(op.Err.Error(), "reset")
}
