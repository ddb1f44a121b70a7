package auth

import (
	"crypto/tls"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/dedupproxy/dedupproxy/certprincipal"
)

// Client is a client connection's authentication as its session follows
// it: the SASL exchanges ([State]), the principal of its TLS certificate,
// and whether the proxy can scope its state at all. Its state is scoped by
// the principal (docs/security.md); a connection the proxy cannot scope is
// relayed undecided. The zero Client is a connection that has not
// authenticated.
type Client struct {
	SASL     State
	tlsName  string
	tlsID    PrincipalID
	unscoped atomic.Bool
}

// Env is what every client connection's authentication shares: the
// principals' numbers, the certificate principal rules, the OAUTHBEARER
// claim, and the counters of what the proxy cannot follow. Set its fields
// before the first connection and do not copy it after.
type Env struct {
	Principals *Principals
	// Certs maps client certificate subjects to principals
	// (tls.principal_mapping_rules).
	Certs *certprincipal.Mapper
	// OAuthClaim is oauthbearer_principal_claim.
	OAuthClaim string
	// Unfollowed counts an exchange of a mechanism the proxy cannot follow.
	Unfollowed func()
	// RelayedOnly counts a connection relayed undecided from a second
	// exchange on, by reason (RelayPipelined, RelayReauth).
	RelayedOnly func(reason string)

	mechs sync.Map // mechanisms the proxy cannot follow, said once each
}

// NoteRequest follows the client's side of a SASL exchange (the session's
// read loop): key, version and body are the request's, body after its
// header. It returns what the request means, for its pending entry.
func (a *Client) NoteRequest(key int16, body []byte, version int16, env *Env, log *slog.Logger) *Step {
	st, relay := a.SASL.Request(key, body, version, env.OAuthClaim)
	if st.Handshake && !Followed(st.Mech) {
		env.Unfollowed()
		if _, seen := env.mechs.LoadOrStore(st.Mech, true); !seen {
			log.Warn("SASL mechanism the proxy cannot follow: its connections are relayed and never deduplicated (docs/security.md)", "mechanism", st.Mech)
		}
	}
	if relay != "" {
		a.relayOnly(relay, st.Name, env, log)
	}
	return st
}

// relayOnly makes the proxy decide nothing more for the connection, after
// a second SASL exchange it does not follow; counted and logged once.
func (a *Client) relayOnly(reason, principal string, env *Env, log *slog.Logger) {
	a.unscoped.Store(true)
	if a.SASL.RelayOnly.Swap(true) {
		return
	}
	env.RelayedOnly(reason)
	was := ""
	if p := a.SASL.Principal.Load(); p != nil {
		was = p.Name
	}
	switch reason {
	case RelayPipelined:
		log.Warn("client began a SASL exchange before the broker answered the last one: its requests are relayed undecided from now on (docs/security.md)", "principal", was)
	default:
		log.Warn("client re-authenticated as another principal or by a mechanism the proxy cannot follow: its requests are relayed undecided from now on (docs/security.md)", "principal", principal, "was", was)
	}
}

// NoteAnswer follows the broker's side (the session's response loop):
// body is the answer to the SASL request st after its header, at version.
func (a *Client) NoteAnswer(st *Step, body []byte, version int16, env *Env, log *slog.Logger) {
	defer a.SASL.Answered.Add(1) // after the answer's meaning is stored
	if st == nil {
		return
	}
	name, done := a.SASL.Answer(st, body, version)
	if !done {
		return
	}
	a.SASL.BrokerAuthenticated.Store(true)
	if old := a.SASL.Principal.Load(); old != nil && old.Name != name {
		// Kafka refuses a re-authentication as another principal; the
		// proxy stops deciding for a connection whose principal moved.
		a.relayOnly(RelayReauth, name, env, log)
		a.SASL.Principal.Store(&Principal{Name: name, ID: 0})
		return
	}
	id, ok := env.Principals.ID(name)
	if !ok {
		a.unscoped.Store(true)
	}
	a.SASL.Principal.Store(&Principal{Name: name, ID: id})
}

// Authenticated returns the connection's principal once the broker has
// authenticated it; ok is false before, and for a connection the proxy
// cannot scope. open: a broker answered a request without authentication,
// so the cluster requires none.
func (a *Client) Authenticated(open bool) (Principal, bool) {
	if a.unscoped.Load() {
		return Principal{}, false
	}
	if p := a.SASL.Principal.Load(); p != nil {
		return *p, true
	}
	if a.SASL.Started.Load() || !open {
		// Began SASL and did not finish it, or the cluster requires
		// authentication (the proxy authenticates itself with
		// upstream_sasl, or has not yet seen a broker answer anyone
		// without it).
		return Principal{}, false
	}
	if a.tlsName != "" {
		return Principal{Name: a.tlsName, ID: a.tlsID}, true
	}
	return Principal{Name: Anonymous}, true
}

// PreAuthentication reports whether the broker has not yet authenticated
// the connection, as far as the proxy can tell: Kafka's limit on request
// size applies until it has.
func (a *Client) PreAuthentication(open bool) bool {
	if a.SASL.BrokerAuthenticated.Load() {
		return false
	}
	_, ok := a.Authenticated(open)
	return !ok
}

// NoteTLS scopes a connection whose client presented a certificate
// (tls.client_ca) by the principal Kafka would derive from its subject
// (package certprincipal), unless SASL names another. A subject that does
// not parse, or that no mapping rule applies to (Kafka refuses such a
// connection), leaves the connection relayed undecided.
func (a *Client) NoteTLS(st tls.ConnectionState, env *Env, log *slog.Logger) {
	if len(st.PeerCertificates) == 0 {
		return
	}
	dn, err := certprincipal.Subject(st.PeerCertificates[0].RawSubject)
	name, ok := "", false
	if err == nil {
		name, ok = env.Certs.Name(dn)
	}
	if !ok {
		a.unscoped.Store(true)
		log.Warn("no principal for the client certificate (no tls.principal_mapping_rules rule applies, or its subject does not parse): its requests are relayed undecided", "subject", dn, "err", err)
		return
	}
	a.tlsName = "User:" + name
	if a.tlsID, ok = env.Principals.ID(a.tlsName); !ok {
		a.unscoped.Store(true)
	}
}
