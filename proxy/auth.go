package proxy

import (
	"crypto/tls"

	"github.com/dedupproxy/dedupproxy/auth"
	"github.com/dedupproxy/dedupproxy/certprincipal"
	"github.com/dedupproxy/dedupproxy/protocol"
)

// A client connection's authentication, as the session follows it: package
// auth reads what each SASL request and answer means; the session counts
// and logs, and scopes the connection's state by the principal
// (docs/security.md).

// noteAuthRequest follows the client's side of a SASL exchange (readLoop)
// and returns what the request means, for its pending entry.
func (c *session) noteAuthRequest(h protocol.RequestHeader, body []byte) *auth.Step {
	st, relay := c.auth.Request(h.APIKey, body[h.BodyOffset:], h.APIVersion, c.s.Config.OAuthBearerPrincipalClaim)
	if st.Handshake && !auth.Followed(st.Mech) {
		c.s.Metrics.AuthUnfollowed.Inc()
		if _, seen := c.s.unfollowedMechs.LoadOrStore(st.Mech, true); !seen {
			c.log.Warn("SASL mechanism the proxy cannot follow: its connections are relayed and never deduplicated (docs/security.md)", "mechanism", st.Mech)
		}
	}
	if relay != "" {
		c.relayOnly(relay, st.Name)
	}
	return st
}

// relayOnly makes the proxy decide nothing more for the connection, after
// a second SASL exchange it does not follow; counted and logged once.
func (c *session) relayOnly(reason, principal string) {
	c.unscoped.Store(true)
	if c.auth.RelayOnly.Swap(true) {
		return
	}
	c.s.Metrics.AuthRelayedOnly.WithLabelValues(reason).Inc()
	was := ""
	if p := c.auth.Principal.Load(); p != nil {
		was = p.Name
	}
	switch reason {
	case auth.RelayPipelined:
		c.log.Warn("client began a SASL exchange before the broker answered the last one: its requests are relayed undecided from now on (docs/security.md)", "principal", was)
	default:
		c.log.Warn("client re-authenticated as another principal or by a mechanism the proxy cannot follow: its requests are relayed undecided from now on (docs/security.md)", "principal", principal, "was", was)
	}
}

// noteAuthAnswer follows the broker's side (responseLoop): body is the
// answer to the SASL request p after its header.
func (c *session) noteAuthAnswer(p *pending, body []byte) {
	defer c.auth.Answered.Add(1) // after the answer's meaning is stored
	if p.sasl == nil {
		return
	}
	name, done := c.auth.Answer(p.sasl, body, p.version)
	if !done {
		return
	}
	c.auth.BrokerAuthenticated.Store(true)
	if old := c.auth.Principal.Load(); old != nil && old.Name != name {
		// Kafka refuses a re-authentication as another principal; the
		// proxy stops deciding for a connection whose principal moved.
		c.relayOnly(auth.RelayReauth, name)
		c.auth.Principal.Store(&auth.Principal{Name: name, ID: 0})
		return
	}
	id, ok := c.s.principals.ID(name)
	if !ok {
		c.unscoped.Store(true)
	}
	c.auth.Principal.Store(&auth.Principal{Name: name, ID: id})
}

// authenticated returns the connection's principal once the broker has
// authenticated it (see the top of this file); ok is false before, and
// for a connection the proxy cannot scope.
func (c *session) authenticated() (auth.Principal, bool) {
	if c.unscoped.Load() {
		return auth.Principal{}, false
	}
	if p := c.auth.Principal.Load(); p != nil {
		return *p, true
	}
	if c.auth.Started.Load() || !c.s.openUpstream.Load() {
		// Began SASL and did not finish it, or the cluster requires
		// authentication (the proxy authenticates itself with
		// upstream_sasl, or has not yet seen a broker answer anyone
		// without it).
		return auth.Principal{}, false
	}
	if c.tlsName != "" {
		return auth.Principal{Name: c.tlsName, ID: c.tlsID}, true
	}
	return auth.Principal{Name: auth.Anonymous}, true
}

func (c *session) isAuthenticated() bool {
	_, ok := c.authenticated()
	return ok
}

// preAuthentication reports whether the broker has not yet authenticated
// the connection, as far as the proxy can tell: Kafka's limit on request
// size applies until it has.
func (c *session) preAuthentication() bool {
	return !c.auth.BrokerAuthenticated.Load() && !c.isAuthenticated()
}

// noteTLSPrincipal scopes a connection whose client presented a
// certificate (tls.client_ca) by the principal Kafka would derive from its
// subject (package certprincipal), unless SASL names another. A subject that
// does not parse, or that no mapping rule applies to (Kafka refuses such a
// connection), leaves the connection relayed undecided.
func (c *session) noteTLSPrincipal(st tls.ConnectionState) {
	if len(st.PeerCertificates) == 0 {
		return
	}
	dn, err := certprincipal.Subject(st.PeerCertificates[0].RawSubject)
	name, ok := "", false
	if err == nil {
		name, ok = c.s.tls.Principals.Name(dn)
	}
	if !ok {
		c.unscoped.Store(true)
		c.log.Warn("no principal for the client certificate (no tls.principal_mapping_rules rule applies, or its subject does not parse): its requests are relayed undecided", "subject", dn, "err", err)
		return
	}
	c.tlsName = "User:" + name
	if c.tlsID, ok = c.s.principals.ID(c.tlsName); !ok {
		c.unscoped.Store(true)
	}
}
