package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"

	"github.com/dedupproxy/dedupproxy/auth"
	"github.com/dedupproxy/dedupproxy/clock"
	"github.com/dedupproxy/dedupproxy/metrics"
)

// TLS on both legs (docs/reference.md, "TLS and SASL"): package auth builds
// the configurations; the server loads them at Start, wraps its listeners,
// runs each client's handshake before dialling its broker, and reloads the
// certificate files every cert_reload_interval and on SIGHUP.

// setupTLS loads every certificate the configuration names. Called by Start.
func (s *Server) setupTLS() error {
	t, err := auth.LoadTLS(&s.Config, s.Logger, s.now)
	s.tls = t
	return err
}

// setupAuth readies what client connections' authentication shares
// (package auth). Called by Start, after setupTLS.
func (s *Server) setupAuth() {
	e := &s.authEnv
	e.Principals, e.Certs = &s.principals, s.tls.Principals
	e.OAuthClaim = s.Config.OAuthBearerPrincipalClaim
	e.Unfollowed = s.Metrics.AuthUnfollowed.Inc
	e.RelayedOnly = func(reason string) { s.Metrics.AuthRelayedOnly.WithLabelValues(reason).Inc() }
}

// dialUpstream connects to the broker at addr: a TCP connection through
// s.Dial and, with upstream TLS, a handshake that verifies the broker's
// certificate for its host (or upstream_tls.server_name). ctx bounds both.
func (s *Server) dialUpstream(ctx context.Context, addr string) (net.Conn, error) {
	conn, err := s.Dial(ctx, "tcp", addr)
	if err != nil || s.tls.Upstream == nil {
		return conn, err
	}
	return s.tls.Upstream.Client(ctx, conn, addr)
}

// clientHandshake runs the TLS handshake of a client connection, bounded by
// DialTimeout, and says in one log line why it failed.
func (s *Server) clientHandshake(c *auth.Conn, log *slog.Logger) bool {
	ctx, cancel := context.WithTimeout(s.dialCtx, s.Config.DialTimeout)
	defer cancel()
	err := c.HandshakeContext(ctx)
	if err == nil {
		return true
	}
	var rh tls.RecordHeaderError
	switch {
	case errors.As(err, &rh):
		s.Metrics.ClientError(metrics.ClientPlaintext)
		log.Warn("closing client connection: client sent plaintext to a TLS listener (configure it for TLS: security.protocol=SSL or SASL_SSL)", "err", err)
	case errors.Is(err, io.EOF):
		// A TCP health check, usually: a client that rejects the
		// proxy's certificate sends an alert (the default case).
		log.Debug("client closed the connection before the TLS handshake ended")
	case s.closing.Load():
		log.Debug("TLS handshake abandoned for shutdown")
	default:
		s.Metrics.ClientError(metrics.ClientHandshake)
		log.Warn("closing client connection: TLS handshake failed", "err", err)
	}
	return false
}

// ReloadTLS reads every certificate, key and CA file again and loads those
// that changed: new connections get them, open ones keep theirs. A file
// that does not load keeps the previous certificate; the error says which.
// The command calls it on SIGHUP; the files are also checked every
// CertReloadInterval.
func (s *Server) ReloadTLS() error { return s.tls.Reload() }

// certReloadLoop checks the certificate files every CertReloadInterval.
func (s *Server) certReloadLoop(t *clock.Ticker) {
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.ReloadTLS() // failures are logged once by load
		}
	}
}

// AdminTLSConfig is the admin listener's TLS configuration (its
// certificate reloaded like the others), or nil when admin_tls is not set.
// Valid after Start.
func (s *Server) AdminTLSConfig() *tls.Config { return s.tls.AdminConfig() }
