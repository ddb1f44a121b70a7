package tail

import (
	"context"
	"fmt"
	"net"

	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl"

	"github.com/dedupproxy/dedupproxy/auth"
	"github.com/dedupproxy/dedupproxy/protocol"
)

// Conns opens connections of the proxy's own to brokers.
type Conns struct {
	// Dial connects to a broker: TCP and, with upstream_tls, the TLS
	// handshake.
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// SASL authenticates every connection (upstream_sasl); nil: none.
	SASL sasl.Mechanism
	// MaxFrame caps a response frame (max_frame_bytes).
	MaxFrame int32
	// TLS says whether Dial speaks TLS (upstream_tls), and User is
	// upstream_sasl.user: errors name them.
	TLS  bool
	User string
}

// Conn is one connection of the proxy's own: a request written, then its
// response read, one at a time.
type Conn struct {
	net.Conn
	next     int32 // the next correlation id
	maxFrame int32
}

// Open connects to the broker at addr and, with SASL, authenticates. The
// connection's deadline is ctx's, if it has one.
func (cs *Conns) Open(ctx context.Context, addr string) (*Conn, error) {
	nc, err := cs.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		nc.SetDeadline(dl)
	}
	c := &Conn{Conn: nc, next: 1, maxFrame: cs.MaxFrame}
	if err := c.Authenticate(ctx, cs.SASL, addr); err != nil {
		nc.Close()
		return nil, err
	}
	return c, nil
}

// Wrap makes nc, a connection the caller dialled, a Conn.
func (cs *Conns) Wrap(nc net.Conn) *Conn { return &Conn{Conn: nc, next: 1, maxFrame: cs.MaxFrame} }

// Authenticate runs mech's SASL exchange on c (none when mech is nil):
// addr is the broker's, whose host the mechanism may need.
func (c *Conn) Authenticate(ctx context.Context, mech sasl.Mechanism, addr string) error {
	if mech == nil {
		return nil
	}
	host, _, _ := net.SplitHostPort(addr)
	next, err := auth.Authenticate(ctx, c.Conn, mech, host, c.next, func(conn net.Conn, req kmsg.Request, resp kmsg.Response, corr int32) error {
		return RoundTrip(conn, req, resp, corr, c.maxFrame)
	})
	if err != nil {
		return err
	}
	c.next = next
	return nil
}

// RoundTrip writes req and decodes its response into resp.
func (c *Conn) RoundTrip(req kmsg.Request, resp kmsg.Response) error {
	corr := c.next
	c.next++
	return RoundTrip(c.Conn, req, resp, corr, c.maxFrame)
}

// RoundTrip writes req on conn with correlation id corr and decodes its
// response, at most maxFrame bytes, into resp.
func RoundTrip(conn net.Conn, req kmsg.Request, resp kmsg.Response, corr, maxFrame int32) error {
	frame := kmsg.NewRequestFormatter(kmsg.FormatterClientID("dedupproxy-probe")).AppendRequest(nil, req, corr)
	if _, err := conn.Write(frame); err != nil {
		return err
	}
	body, _, err := protocol.ReadFrame(conn, nil, maxFrame, protocol.ResponseMinSize)
	if err != nil {
		return err
	}
	if got := protocol.ResponseCorrelationID(body); got != corr {
		return fmt.Errorf("correlation id %d, want %d", got, corr)
	}
	off, err := protocol.ResponseBodyOffset(body, req.Key(), req.GetVersion())
	if err != nil {
		return err
	}
	return resp.ReadFrom(body[off:])
}

// MetadataVersion is the Metadata version of the proxy's own requests that
// need no topic IDs: old enough for every broker since Kafka 1.0 and still
// served by Kafka 4 (which dropped v0–v3, KIP-896).
const MetadataVersion = 4

// NewestMetadata asks the broker on c (ApiVersions v0, which every broker
// answers) for its newest Metadata version and returns the newest both
// sides know, capped at v12 (topic IDs come with v10).
func (c *Conn) NewestMetadata() (int16, error) {
	req := kmsg.NewPtrApiVersionsRequest()
	req.SetVersion(0)
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.SetVersion(0)
	if err := c.RoundTrip(req, resp); err != nil {
		return 0, fmt.Errorf("api versions: %w", err)
	}
	if resp.ErrorCode != 0 {
		return 0, fmt.Errorf("api versions: error %d", resp.ErrorCode)
	}
	for _, k := range resp.ApiKeys {
		if k.ApiKey == int16(kmsg.Metadata) {
			return max(min(k.MaxVersion, 12), min(k.MinVersion, MetadataVersion)), nil
		}
	}
	return MetadataVersion, nil
}
