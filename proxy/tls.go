package proxy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dedupproxy/dedupproxy/certprincipal"
	"github.com/dedupproxy/dedupproxy/config"
)

// TLS on both legs (docs/reference.md, "TLS and SASL"):
//
//   - to clients, every listener wraps its accepted connections in
//     crypto/tls (tlsListener); the handshake runs in Server.handle before
//     the broker is dialled, so a client that fails it costs no broker
//     connection. The certificate comes from a certFiles whose content is
//     swapped atomically when the files change or on SIGHUP
//     (GetConfigForClient reads the current one), so open connections keep
//     theirs and new ones get the new one;
//   - to brokers, dialUpstream runs a TLS client handshake after the TCP
//     dial, verifying each broker's certificate for its own host (the
//     address the cluster's metadata gives it) or a configured name.

// certFiles is one certificate and key (and, for a listener that verifies
// clients, a CA bundle) read from PEM files, re-read when their content
// changes. What it loaded is published with an atomic pointer: handshakes
// never wait for a reload.
type certFiles struct {
	what              string // config section, for log lines: tls, admin_tls, upstream_tls
	cert, key, ca     string // paths; ca may be empty
	minVersion        uint16
	server            bool // a listener: build a *tls.Config per load
	log               *slog.Logger
	now               func() time.Time
	cur               atomic.Pointer[loadedCert]
	mu                sync.Mutex // serialises load
	loadedSum, badSum [sha256.Size]byte
}

// loadedCert is one load of a certFiles.
type loadedCert struct {
	cert    *tls.Certificate
	clients *x509.CertPool // client CAs, nil when clients are not verified
	srv     *tls.Config    // for a listener: what GetConfigForClient returns
}

// errUnchanged is load's answer when the files hold what is loaded already.
var errUnchanged = errors.New("unchanged")

// load reads the files and, when their content differs from what is
// loaded, parses and publishes it. A failure keeps what was loaded (a cert
// replaced before its key is the usual case: the next check finds both)
// and is logged once per distinct content, not at every check.
func (f *certFiles) load() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	raw := make([][]byte, 0, 3)
	h := sha256.New()
	for _, path := range []string{f.cert, f.key, f.ca} {
		if path == "" {
			raw = append(raw, nil)
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("%s: %w", f.what, err)
		}
		raw = append(raw, b)
		h.Write(b)
		h.Write([]byte{0})
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	if f.cur.Load() != nil && sum == f.loadedSum {
		return errUnchanged
	}
	lc, err := f.parse(raw[0], raw[1], raw[2])
	if err != nil {
		err = fmt.Errorf("%s: %w", f.what, err)
		if f.cur.Load() != nil && sum != f.badSum {
			f.badSum = sum
			f.log.Warn("cannot load the changed certificate files; keeping the previous certificate (checked again at the next interval or SIGHUP)",
				"tls", f.what, "cert", f.cert, "key", f.key, "err", err)
		}
		return err
	}
	first := f.cur.Load() == nil
	f.cur.Store(lc)
	f.loadedSum = sum
	leaf := lc.cert.Leaf
	msg := "TLS certificate reloaded: new connections get it, open ones keep theirs"
	if first {
		msg = "TLS certificate loaded"
	}
	f.log.Info(msg, "tls", f.what, "cert", f.cert, "subject", leaf.Subject.String(), "names", certNames(leaf), "not_after", leaf.NotAfter.UTC().Format(time.RFC3339))
	if now := f.now(); now.After(leaf.NotAfter) || now.Before(leaf.NotBefore) {
		f.log.Warn("TLS certificate is not valid now: peers will refuse it", "tls", f.what, "cert", f.cert,
			"not_before", leaf.NotBefore.UTC().Format(time.RFC3339), "not_after", leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

func (f *certFiles) parse(certPEM, keyPEM, caPEM []byte) (*loadedCert, error) {
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("cert %s and key %s: %w", f.cert, f.key, err)
	}
	// X509KeyPair fills Leaf since Go 1.23; do not depend on it.
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("cert %s: %w", f.cert, err)
		}
	}
	lc := &loadedCert{cert: &cert}
	if caPEM != nil {
		lc.clients = x509.NewCertPool()
		if !lc.clients.AppendCertsFromPEM(caPEM) {
			return nil, fmt.Errorf("client_ca %s: no PEM certificate in it", f.ca)
		}
	}
	if f.server {
		lc.srv = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: f.minVersion}
		if lc.clients != nil {
			lc.srv.ClientAuth = tls.RequireAndVerifyClientCert
			lc.srv.ClientCAs = lc.clients
		}
	}
	return lc, nil
}

func certNames(c *x509.Certificate) []string {
	names := append([]string{}, c.DNSNames...)
	for _, ip := range c.IPAddresses {
		names = append(names, ip.String())
	}
	return names
}

// serverConfig is the listener's tls.Config: every handshake takes the
// certificate loaded last.
func (f *certFiles) serverConfig() *tls.Config {
	return &tls.Config{
		MinVersion: f.minVersion,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return f.cur.Load().srv, nil
		},
	}
}

func tlsVersion(v string) uint16 {
	if v == config.TLS13 {
		return tls.VersionTLS13
	}
	return tls.VersionTLS12
}

// newServerCert loads a listener's certificate files.
func (s *Server) newServerCert(what string, c TLSConfig) (*certFiles, error) {
	f := &certFiles{what: what, cert: c.Cert, key: c.Key, ca: c.ClientCA, minVersion: tlsVersion(c.MinVersion),
		server: true, log: s.Logger, now: s.now}
	if err := f.load(); err != nil {
		return nil, err
	}
	return f, nil
}

// upstreamTLS is the proxy as a TLS client of the brokers.
type upstreamTLS struct {
	base     *tls.Config
	cert     *certFiles // client certificate, or nil
	sessions tls.ClientSessionCache
	mu       sync.Mutex
	byAddr   map[string]*tls.Config // base with ServerName and a session cache, per broker address
	maxKept  int
}

// setupTLS loads every certificate the configuration names. Called by Start.
func (s *Server) setupTLS() error {
	cfg := &s.Config
	m, err := certprincipal.ParseRules(cfg.TLS.PrincipalMappingRules)
	if err != nil {
		return fmt.Errorf("tls.principal_mapping_rules: %w", err)
	}
	s.certPrincipals = m
	if cfg.TLS.Enabled() {
		f, err := s.newServerCert("tls", cfg.TLS)
		if err != nil {
			return err
		}
		s.clientTLS = f
		s.certs = append(s.certs, f)
	}
	if cfg.AdminTLS.Enabled() {
		f, err := s.newServerCert("admin_tls", cfg.AdminTLS)
		if err != nil {
			return err
		}
		s.adminTLS = f
		s.certs = append(s.certs, f)
	}
	if u := cfg.UpstreamTLS; u.Enabled {
		base, err := upstreamBaseConfig(u)
		if err != nil {
			return err
		}
		ut := &upstreamTLS{base: base, byAddr: map[string]*tls.Config{}, maxKept: 1024,
			// Every client connection costs a broker connection: resume
			// TLS sessions rather than verify the chain each time.
			sessions: tls.NewLRUClientSessionCache(0)}
		if u.Cert != "" {
			f := &certFiles{what: "upstream_tls", cert: u.Cert, key: u.Key, log: s.Logger, now: s.now}
			if err := f.load(); err != nil {
				return err
			}
			ut.cert = f
			s.certs = append(s.certs, f)
			base.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
				return f.cur.Load().cert, nil
			}
		}
		s.upTLS = ut
		if u.InsecureSkipVerify {
			s.Logger.Warn("INSECURE: upstream_tls.insecure_skip_verify is set: broker certificates are NOT verified, so anyone on the network path to the brokers can read and change every record and every SASL exchange. Use upstream_tls.ca instead outside tests.")
		}
	}
	if sa := cfg.UpstreamSASL; sa.Mechanism != "" {
		if _, err := readPassword(sa.PasswordFile); err != nil {
			return fmt.Errorf("upstream_sasl: %w", err)
		}
		if !cfg.UpstreamTLS.Enabled {
			s.Logger.Warn("upstream_sasl without upstream_tls: the proxy's own credentials cross the network unencrypted (SASL_PLAINTEXT)", "mechanism", sa.Mechanism)
		}
	}
	return nil
}

// upstreamBaseConfig is the TLS client configuration of every broker
// connection, before a client certificate and a server name.
func upstreamBaseConfig(u UpstreamTLSConfig) (*tls.Config, error) {
	base := &tls.Config{
		MinVersion:         tlsVersion(u.MinVersion),
		InsecureSkipVerify: u.InsecureSkipVerify,
	}
	if u.CA != "" {
		b, err := os.ReadFile(u.CA)
		if err != nil {
			return nil, fmt.Errorf("upstream_tls.ca: %w", err)
		}
		base.RootCAs = x509.NewCertPool()
		if !base.RootCAs.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("upstream_tls.ca %s: no PEM certificate in it", u.CA)
		}
	}
	return base, nil
}

// UpstreamClientConfig is the TLS configuration the proxy's broker connections
// use, for a client that must reach the cluster as the proxy does
// (dedupproxy audit): the CA, the client certificate (read once, not
// reloaded), the server name override, the minimum version. Nil when u is
// not enabled. Without ServerName, the caller verifies each broker for its
// own host (franz-go's DialTLSConfig does).
func UpstreamClientConfig(u UpstreamTLSConfig) (*tls.Config, error) {
	if !u.Enabled {
		return nil, nil
	}
	c, err := upstreamBaseConfig(u)
	if err != nil {
		return nil, err
	}
	c.ServerName = u.ServerName
	if u.Cert != "" {
		cert, err := tls.LoadX509KeyPair(u.Cert, u.Key)
		if err != nil {
			return nil, fmt.Errorf("upstream_tls.cert: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// forAddr returns the client config for the broker at addr: verifying it
// for its host (or override).
func (u *upstreamTLS) forAddr(addr, override string) (*tls.Config, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	c, ok := u.byAddr[addr]
	if !ok {
		if len(u.byAddr) >= u.maxKept { // a bound, should brokers come and go for ever
			clear(u.byAddr)
		}
		c = u.base.Clone()
		c.ServerName = host
		if override != "" {
			c.ServerName = override
		}
		c.ClientSessionCache = addrSessions{u.sessions, addr}
		u.byAddr[addr] = c
	}
	return c, nil
}

// addrSessions keys TLS sessions by broker address. crypto/tls keys them
// by server name, which brokers share when server_name is set or several
// run on one host: a session resumed with another broker's ticket would
// skip verifying this broker's certificate.
type addrSessions struct {
	tls.ClientSessionCache
	addr string
}

func (a addrSessions) Get(key string) (*tls.ClientSessionState, bool) {
	return a.ClientSessionCache.Get(a.addr + "|" + key)
}

func (a addrSessions) Put(key string, cs *tls.ClientSessionState) {
	a.ClientSessionCache.Put(a.addr+"|"+key, cs)
}

// errBrokerTLS marks a failed TLS handshake with a broker.
var errBrokerTLS = errors.New("TLS handshake with the broker failed")

// dialUpstream connects to the broker at addr: a TCP connection through
// s.Dial and, with upstream TLS, a handshake that verifies the broker's
// certificate for its host (or upstream_tls.server_name). ctx bounds both.
func (s *Server) dialUpstream(ctx context.Context, addr string) (net.Conn, error) {
	conn, err := s.Dial(ctx, "tcp", addr)
	if err != nil || s.upTLS == nil {
		return conn, err
	}
	cfg, err := s.upTLS.forAddr(addr, s.Config.UpstreamTLS.ServerName)
	if err != nil {
		conn.Close()
		return nil, err
	}
	tc := tls.Client(conn, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		conn.Close()
		hint := ""
		var rh tls.RecordHeaderError
		if errors.As(err, &rh) {
			hint = " (the broker does not speak TLS on this port: is upstream_tls meant for another listener?)"
		}
		return nil, fmt.Errorf("%w%s: %w", errBrokerTLS, hint, err)
	}
	return &tlsConn{tc}, nil
}

// tlsConn is a TLS connection whose Close never waits long. crypto/tls
// sends close_notify on Close with its own 5 s write deadline: a peer that
// stopped reading would hold up every caller of Close (Shutdown closes
// connections under a lock). The alert is still attempted.
type tlsConn struct{ *tls.Conn }

// closeNotifyWait bounds the close_notify alert of tlsConn.Close.
const closeNotifyWait = 50 * time.Millisecond

func (c *tlsConn) Close() error {
	t := time.AfterFunc(closeNotifyWait, func() { c.NetConn().Close() })
	err := c.Conn.Close()
	t.Stop()
	return err
}

// tlsListener serves TLS on ln: Accept returns connections whose handshake
// has not run yet (Server.handle runs it).
type tlsListener struct {
	net.Listener
	config *tls.Config
}

func (l *tlsListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &tlsConn{tls.Server(c, l.config)}, nil
}

// clientHandshake runs the TLS handshake of a client connection, bounded by
// DialTimeout, and says in one log line why it failed.
func (s *Server) clientHandshake(c *tlsConn, log *slog.Logger) bool {
	ctx, cancel := context.WithTimeout(s.dialCtx, s.Config.DialTimeout)
	defer cancel()
	err := c.HandshakeContext(ctx)
	if err == nil {
		return true
	}
	var rh tls.RecordHeaderError
	switch {
	case errors.As(err, &rh):
		s.Metrics.clientError(clientPlaintext)
		log.Warn("closing client connection: client sent plaintext to a TLS listener (configure it for TLS: security.protocol=SSL or SASL_SSL)", "err", err)
	case errors.Is(err, io.EOF):
		// A TCP health check, usually: a client that rejects the
		// proxy's certificate sends an alert (the default case).
		log.Debug("client closed the connection before the TLS handshake ended")
	case s.closing.Load():
		log.Debug("TLS handshake abandoned for shutdown")
	default:
		s.Metrics.clientError(clientHandshake)
		log.Warn("closing client connection: TLS handshake failed", "err", err)
	}
	return false
}

// ReloadTLS reads every certificate, key and CA file again and loads those
// that changed: new connections get them, open ones keep theirs. A file
// that does not load keeps the previous certificate; the error says which.
// The command calls it on SIGHUP; the files are also checked every
// CertReloadInterval.
func (s *Server) ReloadTLS() error {
	var errs []error
	for _, f := range s.certs {
		if err := f.load(); err != nil && !errors.Is(err, errUnchanged) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// certReloadLoop checks the certificate files every CertReloadInterval.
func (s *Server) certReloadLoop() {
	t := time.NewTicker(max(s.Config.CertReloadInterval, 10*time.Millisecond))
	defer t.Stop()
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
func (s *Server) AdminTLSConfig() *tls.Config {
	if s.adminTLS == nil {
		return nil
	}
	return s.adminTLS.serverConfig()
}

// readPassword reads a password file; a trailing newline is not part of
// the password.
func readPassword(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	b = bytes.TrimRight(b, "\r\n")
	if len(b) == 0 {
		return "", fmt.Errorf("password file %s is empty", path)
	}
	return string(b), nil
}
