package auth

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/dedupproxy/dedupproxy/config"
)

// The proxy's own connections (the readiness probe, broker and topic
// discovery, partition tails) authenticate with upstream_sasl. Clients'
// connections never do: their SASL exchange is relayed untouched on their
// own broker connection, and the proxy decides their batches only after
// the broker accepted it ([State]).

// ErrUpstreamAuth wraps a failed authentication of the proxy's own
// connection.
var ErrUpstreamAuth = errors.New("proxy: upstream SASL authentication failed")

// SASLMechanism returns the franz-go mechanism for sa, nil when it names
// none: what the proxy's own connections authenticate with, for a client
// that must reach the cluster as the proxy does (dedupproxy audit). The
// password file is read for every authentication, so it can be rotated in
// place.
func SASLMechanism(sa config.SASLConfig) sasl.Mechanism {
	switch sa.Mechanism {
	case config.SASLPlain:
		return plain.Plain(func(context.Context) (plain.Auth, error) {
			pass, err := ReadPassword(sa.PasswordFile)
			return plain.Auth{User: sa.User, Pass: pass}, err
		})
	case config.SASLScramSHA256, config.SASLScramSHA512:
		fn := func(context.Context) (scram.Auth, error) {
			pass, err := ReadPassword(sa.PasswordFile)
			return scram.Auth{User: sa.User, Pass: pass}, err
		}
		if sa.Mechanism == config.SASLScramSHA256 {
			return scram.Sha256(fn)
		}
		return scram.Sha512(fn)
	}
	return nil
}

// Authenticate runs a SASL exchange on conn (KIP-152: SaslHandshake v1,
// then SaslAuthenticate requests carrying the mechanism's messages), the
// way franz-go's client does, with correlation ids from corrID up. It
// returns the next free correlation id.
func Authenticate(ctx context.Context, conn net.Conn, mech sasl.Mechanism, host string, corrID int32, rt RoundTripper) (int32, error) {
	hs := kmsg.NewPtrSASLHandshakeRequest()
	hs.SetVersion(1)
	hs.Mechanism = mech.Name()
	hsResp := kmsg.NewPtrSASLHandshakeResponse()
	hsResp.SetVersion(1)
	if err := rt(conn, hs, hsResp, corrID); err != nil {
		return 0, fmt.Errorf("sasl handshake: %w", err)
	}
	corrID++
	if err := kerr.ErrorForCode(hsResp.ErrorCode); err != nil {
		return 0, fmt.Errorf("%w: mechanism %s: %w (the broker offers %v)", ErrUpstreamAuth, mech.Name(), err, hsResp.SupportedMechanisms)
	}
	session, msg, err := mech.Authenticate(ctx, host)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrUpstreamAuth, err)
	}
	// Until the mechanism is done and has nothing left to send: a final
	// message (SCRAM's has none; others may) still gets a response, which
	// must be read (KIP-152: one response per SaslAuthenticate).
	for done := false; !done || len(msg) > 0; {
		req := kmsg.NewPtrSASLAuthenticateRequest()
		req.SetVersion(1)
		req.SASLAuthBytes = msg
		resp := kmsg.NewPtrSASLAuthenticateResponse()
		resp.SetVersion(1)
		if err := rt(conn, req, resp, corrID); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				// kfake, and brokers before KIP-152's error codes, just
				// close the connection on bad credentials.
				return 0, fmt.Errorf("%w: %s: the broker closed the connection (wrong user or password?): %w", ErrUpstreamAuth, mech.Name(), err)
			}
			return 0, fmt.Errorf("sasl authenticate: %w", err)
		}
		corrID++
		if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
			detail := ""
			if resp.ErrorMessage != nil {
				detail = ": " + *resp.ErrorMessage
			}
			return 0, fmt.Errorf("%w: %s: %w%s", ErrUpstreamAuth, mech.Name(), err, detail)
		}
		msg = nil
		if !done {
			if done, msg, err = session.Challenge(resp.SASLAuthBytes); err != nil {
				return 0, fmt.Errorf("%w: %w", ErrUpstreamAuth, err)
			}
		}
	}
	return corrID, nil
}

// RoundTripper writes req with corrID on conn and decodes its response.
type RoundTripper func(conn net.Conn, req kmsg.Request, resp kmsg.Response, corrID int32) error
