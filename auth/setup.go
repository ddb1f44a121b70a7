package auth

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/dedupproxy/dedupproxy/certprincipal"
	"github.com/dedupproxy/dedupproxy/config"
)

// TLS is the proxy's TLS on both legs (docs/reference.md, "TLS and SASL"),
// as a configuration names it: the client listeners' and the admin
// listener's certificates, TLS to brokers, and the rules that give a client
// certificate its principal. The zero TLS is TLS off everywhere.
type TLS struct {
	// Client is the client listeners' certificate; nil without tls.
	Client *CertFiles
	// Admin is the admin listener's certificate; nil without admin_tls.
	Admin *CertFiles
	// Upstream is TLS to brokers; nil without upstream_tls.
	Upstream *UpstreamTLS
	// Principals maps client certificate subjects to principals
	// (tls.principal_mapping_rules, package certprincipal).
	Principals *certprincipal.Mapper
	// certs are the certificate files Reload reads again.
	certs []*CertFiles
}

// LoadTLS loads every certificate cfg names, checks upstream_sasl's
// password file, and warns of settings that expose traffic or
// credentials. now is the clock that certificates' validity is read on.
func LoadTLS(cfg *config.Config, log *slog.Logger, now func() time.Time) (TLS, error) {
	var t TLS
	m, err := certprincipal.ParseRules(cfg.TLS.PrincipalMappingRules)
	if err != nil {
		return TLS{}, fmt.Errorf("tls.principal_mapping_rules: %w", err)
	}
	t.Principals = m
	if cfg.TLS.Enabled() {
		f, err := LoadServerCert("tls", cfg.TLS, log, now)
		if err != nil {
			return TLS{}, err
		}
		t.Client = f
		t.certs = append(t.certs, f)
	}
	if cfg.AdminTLS.Enabled() {
		f, err := LoadServerCert("admin_tls", cfg.AdminTLS, log, now)
		if err != nil {
			return TLS{}, err
		}
		t.Admin = f
		t.certs = append(t.certs, f)
	}
	if u := cfg.UpstreamTLS; u.Enabled {
		ut, err := NewUpstreamTLS(u, log, now)
		if err != nil {
			return TLS{}, err
		}
		if f := ut.ClientCert(); f != nil {
			t.certs = append(t.certs, f)
		}
		t.Upstream = ut
		if u.InsecureSkipVerify {
			log.Warn("INSECURE: upstream_tls.insecure_skip_verify is set: broker certificates are NOT verified, so anyone on the network path to the brokers can read and change every record and every SASL exchange. Use upstream_tls.ca instead outside tests.")
		}
	}
	if sa := cfg.UpstreamSASL; sa.Mechanism != "" {
		if _, err := ReadPassword(sa.PasswordFile); err != nil {
			return TLS{}, fmt.Errorf("upstream_sasl: %w", err)
		}
		if !cfg.UpstreamTLS.Enabled {
			log.Warn("upstream_sasl without upstream_tls: the proxy's own credentials cross the network unencrypted (SASL_PLAINTEXT)", "mechanism", sa.Mechanism)
		}
	}
	return t, nil
}

// Files reports whether t has certificate files to reload.
func (t *TLS) Files() bool { return len(t.certs) > 0 }

// Reload reads every certificate, key and CA file again and loads those
// that changed: new connections get them, open ones keep theirs. A file
// that does not load keeps the previous certificate; the error says which.
func (t *TLS) Reload() error {
	var errs []error
	for _, f := range t.certs {
		if err := f.Load(); err != nil && !errors.Is(err, ErrUnchanged) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// AdminConfig is the admin listener's TLS configuration, or nil without
// admin_tls.
func (t *TLS) AdminConfig() *tls.Config {
	if t.Admin == nil {
		return nil
	}
	return t.Admin.ServerConfig()
}
