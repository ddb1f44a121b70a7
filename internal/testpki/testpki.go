// Package testpki makes certificates at run time for the tests and the
// benchmark: a certificate authority, server and client certificates issued
// by it (optionally through an intermediate, so a PEM chain is exercised),
// expired ones and ones for the wrong host. Nothing here is for production:
// keys are ECDSA P-256, generated in memory, and written only where the
// caller says.
//
// It lives under internal/ because three packages use it: proxy and
// cmd/dedupproxy in their tests, and bench at run time.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"
)

// CA is a certificate authority.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	PEM  []byte // the CA certificate, PEM
	Pool *x509.CertPool
	// chain is the issuing CA's own chain above Cert, PEM (empty for a root).
	chain []byte
}

var serial atomic.Int64

func nextSerial() *big.Int { return big.NewInt(time.Now().UnixNano() + serial.Add(1)) }

// NewCA makes a self-signed root CA valid from an hour ago for a day.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          nextSerial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	return newCA(der, key, nil)
}

func newCA(der []byte, key *ecdsa.PrivateKey, chain []byte) (*CA, error) {
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{Cert: cert, Key: key, PEM: pemBytes, Pool: pool, chain: chain}, nil
}

// Intermediate makes a CA issued by ca. Certificates it issues carry it in
// their chain (Leaf.ChainPEM), so a client that trusts only the root
// verifies them.
func (ca *CA) Intermediate(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          nextSerial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, err
	}
	own := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	return newCA(der, key, append(own, ca.chain...))
}

// Opts says what a leaf certificate is for.
type Opts struct {
	// Hosts are DNS names and IP addresses the certificate is valid for.
	Hosts []string
	// Client makes a client-authentication certificate; otherwise it is a
	// server certificate.
	Client bool
	// NotBefore and NotAfter default to an hour ago and a day from now.
	NotBefore, NotAfter time.Time
	// RawSubject, when set, is the DER subject, in place of the common
	// name alone.
	RawSubject []byte
}

// Leaf is an issued certificate and its key.
type Leaf struct {
	Cert     *x509.Certificate
	CertPEM  []byte // the certificate alone
	ChainPEM []byte // the certificate, then its intermediates: what a cert file holds
	KeyPEM   []byte
}

// Issue makes a leaf certificate with common name cn.
func (ca *CA) Issue(cn string, o Opts) (*Leaf, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	if o.NotBefore.IsZero() {
		o.NotBefore = time.Now().Add(-time.Hour)
	}
	if o.NotAfter.IsZero() {
		o.NotAfter = time.Now().Add(24 * time.Hour)
	}
	tmpl := &x509.Certificate{
		SerialNumber: nextSerial(),
		Subject:      pkix.Name{CommonName: cn},
		RawSubject:   o.RawSubject,
		NotBefore:    o.NotBefore,
		NotAfter:     o.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if o.Client {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	for _, h := range o.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	return &Leaf{
		Cert:     cert,
		CertPEM:  certPEM,
		ChainPEM: append(append([]byte{}, certPEM...), ca.chain...),
		KeyPEM:   pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
	}, nil
}

// TLS returns the leaf as a tls.Certificate with its chain.
func (l *Leaf) TLS() tls.Certificate {
	c, err := tls.X509KeyPair(l.ChainPEM, l.KeyPEM)
	if err != nil {
		panic(fmt.Sprintf("testpki: own key pair does not load: %v", err)) // cannot happen: made above
	}
	return c
}

// Write writes the chain and key to dir/name.crt and dir/name.key (mode
// 0600), replacing them atomically (a rename), and returns their paths.
func (l *Leaf) Write(dir, name string) (certFile, keyFile string, err error) {
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := WriteFile(certFile, l.ChainPEM); err != nil {
		return "", "", err
	}
	if err := WriteFile(keyFile, l.KeyPEM); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// WriteFile replaces path with b atomically: a reader sees the old or the
// new content, never half of it.
func WriteFile(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), path)
}
