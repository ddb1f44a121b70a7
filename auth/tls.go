package auth

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dedupproxy/dedupproxy/clock"
	"github.com/dedupproxy/dedupproxy/config"
)

// CertFiles is one certificate and key (and, for a listener that verifies
// clients, a CA bundle) read from PEM files, re-read when their content
// changes. What it loaded is published with an atomic pointer: handshakes
// never wait for a reload.
type CertFiles struct {
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

// loadedCert is one load of a CertFiles.
type loadedCert struct {
	cert    *tls.Certificate
	clients *x509.CertPool // client CAs, nil when clients are not verified
	srv     *tls.Config    // for a listener: what GetConfigForClient returns
}

// ErrUnchanged is Load's answer when the files hold what is loaded already.
var ErrUnchanged = errors.New("unchanged")

// Load reads the files and, when their content differs from what is
// loaded, parses and publishes it. A failure keeps what was loaded (a cert
// replaced before its key is the usual case: the next check finds both)
// and is logged once per distinct content, not at every check.
func (f *CertFiles) Load() error {
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
		return ErrUnchanged
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

func (f *CertFiles) parse(certPEM, keyPEM, caPEM []byte) (*loadedCert, error) {
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

// ServerConfig is the listener's tls.Config: every handshake takes the
// certificate loaded last.
func (f *CertFiles) ServerConfig() *tls.Config {
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

// LoadServerCert loads a listener's certificate files (what names its
// configuration section in log lines and errors); now is the clock that
// judges whether the certificate is valid.
func LoadServerCert(what string, c config.TLSConfig, log *slog.Logger, now func() time.Time) (*CertFiles, error) {
	f := &CertFiles{what: what, cert: c.Cert, key: c.Key, ca: c.ClientCA, minVersion: tlsVersion(c.MinVersion),
		server: true, log: log, now: now}
	if err := f.Load(); err != nil {
		return nil, err
	}
	return f, nil
}

// UpstreamTLS is the proxy as a TLS client of the brokers: every broker
// connection, clients' and the proxy's own, is verified for its broker's
// host (or upstream_tls.server_name) and presents the client certificate,
// if one is configured.
type UpstreamTLS struct {
	base       *tls.Config
	cert       *CertFiles // client certificate, or nil
	sessions   tls.ClientSessionCache
	mu         sync.Mutex
	byAddr     map[string]*tls.Config // base with ServerName and a session cache, per broker address
	maxKept    int
	serverName string // upstream_tls.server_name
}

// NewUpstreamTLS builds the brokers' TLS client configuration of u (which
// must be enabled), loading its client certificate if it names one.
func NewUpstreamTLS(u config.UpstreamTLSConfig, log *slog.Logger, now func() time.Time) (*UpstreamTLS, error) {
	base, err := upstreamBaseConfig(u)
	if err != nil {
		return nil, err
	}
	ut := &UpstreamTLS{base: base, byAddr: map[string]*tls.Config{}, maxKept: 1024, serverName: u.ServerName,
		// Every client connection costs a broker connection: resume
		// TLS sessions rather than verify the chain each time.
		sessions: tls.NewLRUClientSessionCache(0)}
	if u.Cert != "" {
		f := &CertFiles{what: "upstream_tls", cert: u.Cert, key: u.Key, log: log, now: now}
		if err := f.Load(); err != nil {
			return nil, err
		}
		ut.cert = f
		base.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return f.cur.Load().cert, nil
		}
	}
	return ut, nil
}

// ClientCert is the client certificate's files, to reload; nil when there
// is none.
func (u *UpstreamTLS) ClientCert() *CertFiles { return u.cert }

// upstreamBaseConfig is the TLS client configuration of every broker
// connection, before a client certificate and a server name.
func upstreamBaseConfig(u config.UpstreamTLSConfig) (*tls.Config, error) {
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
func UpstreamClientConfig(u config.UpstreamTLSConfig) (*tls.Config, error) {
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
func (u *UpstreamTLS) forAddr(addr, override string) (*tls.Config, error) {
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

// Client runs a TLS client handshake on conn, a connection to the broker
// at addr, verifying the broker's certificate for its host (or
// upstream_tls.server_name); ctx bounds it. conn is closed when it fails.
func (u *UpstreamTLS) Client(ctx context.Context, conn net.Conn, addr string) (net.Conn, error) {
	cfg, err := u.forAddr(addr, u.serverName)
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
		return nil, fmt.Errorf("%w%s: %w", ErrBrokerTLS, hint, err)
	}
	return &Conn{tc}, nil
}

// ErrBrokerTLS marks a failed TLS handshake with a broker.
var ErrBrokerTLS = errors.New("TLS handshake with the broker failed")

// Conn is a TLS connection whose Close never waits long. crypto/tls
// sends close_notify on Close with its own 5 s write deadline: a peer that
// stopped reading would hold up every caller of Close (Shutdown closes
// connections under a lock). The alert is still attempted.
type Conn struct{ *tls.Conn }

// closeNotifyWait bounds the close_notify alert of tlsConn.Close.
const closeNotifyWait = 50 * time.Millisecond

func (c *Conn) Close() error {
	t := clock.Real.AfterFunc(closeNotifyWait, func() { c.NetConn().Close() })
	err := c.Conn.Close()
	t.Stop()
	return err
}

// Listener serves TLS on ln with config: Accept returns connections (a
// *Conn) whose handshake has not run yet, so the caller runs it where it
// chooses (the proxy: before dialling the broker).
func Listener(ln net.Listener, config *tls.Config) net.Listener {
	return &tlsListener{ln, config}
}

type tlsListener struct {
	net.Listener
	config *tls.Config
}

func (l *tlsListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &Conn{tls.Server(c, l.config)}, nil
}

// ReadPassword reads a password file; a trailing newline is not part of
// the password.
func ReadPassword(path string) (string, error) {
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
