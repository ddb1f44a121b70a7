package proxy

import (
	"bytes"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/protocol"
)

// A client connection is authenticated once the broker has said so, as the
// mechanism defines it (docs/security.md, "When a connection counts as
// authenticated"). Until then the proxy decides nothing for it: no table
// entry, no in-flight registration, no warm-up, no answer of its own. The
// SASL exchange itself is relayed untouched on the connection's own broker
// connection; the proxy only reads it.
//
//   - PLAIN: the broker's one SaslAuthenticate answer, error 0.
//   - SCRAM-SHA-256/512: the second answer (server-final), error 0. The first
//     (server-first) has error 0 too, before the client proved anything.
//   - OAUTHBEARER: an answer with error 0 and no challenge (KIP-255: an
//     invalid token is answered error 0 with a JSON error challenge).
//   - Any other mechanism (GSSAPI, custom): never. Its connections are
//     relayed and counted, and the proxy says so once per mechanism.
//
// The principal is who the broker authenticated: the PLAIN or SCRAM user
// name, the OAUTHBEARER token's subject claim, else the TLS client
// certificate's subject, else ANONYMOUS (a cluster that needs no
// authentication). All state is scoped by it.

// Mechanism names as SaslHandshake carries them.
const (
	mechPlain       = "PLAIN"
	mechScram256    = "SCRAM-SHA-256"
	mechScram512    = "SCRAM-SHA-512"
	mechOAuthBearer = "OAUTHBEARER"
)

// anonymous is Kafka's principal for a connection that did not authenticate
// (KafkaPrincipal.ANONYMOUS).
const anonymous = "User:ANONYMOUS"

// principalID is a principal's dense number in the server's principals.
// 0 is ANONYMOUS.
type principalID = uint32

// authState follows one connection's SASL exchange. readLoop reports the
// client's messages, responseLoop the broker's answers; the exchange is
// lockstep, but a client may pipeline, so both take mu.
type authState struct {
	mu        sync.Mutex
	mech      string // the exchange's mechanism (SaslHandshake); "" before one
	requests  int    // SaslAuthenticate requests of this exchange
	answers   int    // of them answered error 0
	candidate string // the principal the client's first message names
	failed    bool   // this exchange cannot authenticate (as far as the proxy can tell)

	started atomic.Bool // the client began SASL: it is not anonymous
	// principal is set when an exchange ends authenticated; nil before.
	// A re-authentication (KIP-368) keeps it until it ends: Kafka keeps the
	// connection's principal meanwhile.
	principal atomic.Pointer[principalRef]
}

type principalRef struct {
	name string
	id   principalID
}

// handshake notes a SaslHandshake request: a new exchange begins.
func (a *authState) handshake(body []byte, version int16) string {
	req := kmsg.NewPtrSASLHandshakeRequest()
	req.SetVersion(version)
	mech := ""
	if req.ReadFrom(body) == nil {
		mech = strings.ToUpper(req.Mechanism)
	}
	a.mu.Lock()
	a.mech, a.requests, a.answers, a.candidate, a.failed = mech, 0, 0, "", false
	a.mu.Unlock()
	a.started.Store(true)
	return mech
}

// request notes a SaslAuthenticate request; its first message names the
// principal the broker will authenticate, if any.
func (a *authState) request(body []byte, version int16, oauthClaim string) {
	a.started.Store(true)
	req := kmsg.NewPtrSASLAuthenticateRequest()
	req.SetVersion(version)
	ok := req.ReadFrom(body) == nil
	a.mu.Lock()
	defer a.mu.Unlock()
	a.requests++
	if a.requests != 1 {
		return
	}
	if !ok {
		a.failed = true
		return
	}
	name, ok := saslPrincipal(a.mech, req.SASLAuthBytes, oauthClaim)
	if !ok {
		a.failed = true
		return
	}
	a.candidate = name
}

// answer notes the broker's answer to a SaslAuthenticate request and
// returns the principal authenticated by it, if the exchange ended so.
func (a *authState) answer(body []byte, version int16) (name string, done bool) {
	resp := kmsg.NewPtrSASLAuthenticateResponse()
	resp.SetVersion(version)
	ok := resp.ReadFrom(body) == nil
	a.mu.Lock()
	defer a.mu.Unlock()
	if !ok || resp.ErrorCode != 0 {
		a.failed = true
		return "", false
	}
	a.answers++
	if a.failed || a.candidate == "" {
		return "", false
	}
	switch a.mech {
	case mechPlain:
		done = a.answers == 1
	case mechScram256, mechScram512:
		done = a.answers == 2
	case mechOAuthBearer:
		// Error 0 with a challenge is KIP-255's failure: the client must
		// answer it with %x01 and the broker then fails the exchange.
		done = a.answers == 1 && len(resp.SASLAuthBytes) == 0
		if !done {
			a.failed = true
		}
	}
	if done {
		a.failed = true // the exchange is over: nothing more authenticates
	}
	return a.candidate, done
}

// saslPrincipal returns the principal a mechanism's first client message
// names: ok is false when the message cannot be read or the mechanism is
// one the proxy cannot follow.
func saslPrincipal(mech string, msg []byte, oauthClaim string) (string, bool) {
	switch mech {
	case mechPlain:
		// RFC 4616: [authzid] NUL authcid NUL passwd. Kafka's principal is
		// authcid, and it refuses an authzid that differs from it.
		parts := bytes.Split(msg, []byte{0})
		if len(parts) != 3 || len(parts[1]) == 0 {
			return "", false
		}
		if len(parts[0]) > 0 && !bytes.Equal(parts[0], parts[1]) {
			return "", false
		}
		return "User:" + string(parts[1]), true
	case mechScram256, mechScram512:
		// RFC 5802 client-first-message: gs2-header "n=" saslname ",r=" nonce,
		// with "," and "=" in the name escaped as =2C and =3D.
		_, rest, ok := strings.Cut(string(msg), ",")
		if !ok {
			return "", false
		}
		if _, rest, ok = strings.Cut(rest, ","); !ok { // authzid field
			return "", false
		}
		user, _, _ := strings.Cut(rest, ",")
		user, ok = strings.CutPrefix(user, "n=")
		if !ok || user == "" {
			return "", false
		}
		user = strings.NewReplacer("=2C", ",", "=3D", "=").Replace(user)
		return "User:" + user, true
	case mechOAuthBearer:
		return oauthSubject(msg, oauthClaim)
	}
	return "", false
}

// oauthSubject reads the claim naming the principal (Kafka's
// sasl.oauthbearer.sub.claim.name, "sub" by default) from the token of an
// OAUTHBEARER client-first message (RFC 7628: gs2-header %x01
// "auth=Bearer " token %x01 ... %x01%x01). The token is not verified here:
// the broker does that, and the proxy counts the connection authenticated
// only once the broker accepted it.
func oauthSubject(msg []byte, claim string) (string, bool) {
	var token string
	for _, kv := range strings.Split(string(msg), "\x01") {
		if v, ok := strings.CutPrefix(kv, "auth="); ok {
			scheme, t, ok := strings.Cut(v, " ")
			if !ok || !strings.EqualFold(scheme, "Bearer") {
				return "", false
			}
			token = strings.TrimSpace(t)
		}
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return "", false
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return "", false
	}
	var claims map[string]any
	if json.Unmarshal(payload, &claims) != nil {
		return "", false
	}
	sub, ok := claims[claim].(string)
	if !ok || sub == "" {
		return "", false
	}
	return "User:" + sub, true
}

// tlsPrincipal is Kafka's default principal for a TLS client certificate:
// its subject's distinguished name (ssl.principal.mapping.rules DEFAULT).
func tlsPrincipal(st tls.ConnectionState) (string, bool) {
	if len(st.PeerCertificates) == 0 {
		return "", false
	}
	return "User:" + st.PeerCertificates[0].Subject.String(), true
}

// principals numbers the principals seen, so that state keys hold a
// uint32. Bounded: principals come only from exchanges the broker accepted.
type principals struct {
	mu    sync.Mutex
	ids   map[string]principalID
	names []string // by id - 1
}

// maxPrincipals bounds the principals numbered; a connection past it is
// relayed undecided.
const maxPrincipals = 1 << 20

func (p *principals) id(name string) (principalID, bool) {
	if name == anonymous {
		return 0, true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ids == nil {
		p.ids = map[string]principalID{}
	}
	if id, ok := p.ids[name]; ok {
		return id, true
	}
	if len(p.ids) >= maxPrincipals {
		return 0, false
	}
	id := principalID(len(p.ids) + 1)
	p.ids[name] = id
	p.names = append(p.names, name)
	return id, true
}

// name returns the principal numbered id.
func (p *principals) name(id principalID) (string, bool) {
	if id == 0 {
		return anonymous, true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if int(id) > len(p.names) {
		return "", false
	}
	return p.names[id-1], true
}

// noteAuthRequest follows the client's side of a SASL exchange (readLoop).
func (c *session) noteAuthRequest(h protocol.RequestHeader, body []byte) {
	switch h.APIKey {
	case int16(kmsg.SASLHandshake):
		mech := c.auth.handshake(body[h.BodyOffset:], h.APIVersion)
		switch mech {
		case mechPlain, mechScram256, mechScram512, mechOAuthBearer:
		default:
			c.s.Metrics.authUnfollowed.Inc()
			if _, seen := c.s.unfollowedMechs.LoadOrStore(mech, true); !seen {
				c.log.Warn("SASL mechanism the proxy cannot follow: its connections are relayed and never deduplicated (docs/security.md)", "mechanism", mech)
			}
		}
	case int16(kmsg.SASLAuthenticate):
		c.auth.request(body[h.BodyOffset:], h.APIVersion, c.s.Config.OAuthBearerPrincipalClaim)
	}
}

// noteAuthAnswer follows the broker's side (responseLoop): body is the
// response after its header.
func (c *session) noteAuthAnswer(p *pending, body []byte) {
	name, done := c.auth.answer(body, p.version)
	if !done {
		return
	}
	if old := c.auth.principal.Load(); old != nil && old.name != name {
		// Kafka refuses a re-authentication as another principal; the
		// proxy stops deciding for a connection whose principal moved.
		c.auth.principal.Store(&principalRef{name: name, id: 0})
		c.unscoped.Store(true)
		c.log.Warn("client re-authenticated as another principal; its batches are relayed undecided from now on", "principal", name, "was", old.name)
		return
	}
	id, ok := c.s.principals.id(name)
	if !ok {
		c.unscoped.Store(true)
	}
	c.auth.principal.Store(&principalRef{name: name, id: id})
}

// authenticated returns the connection's principal once the broker has
// authenticated it (see the top of this file); ok is false before, and
// for a connection the proxy cannot scope.
func (c *session) authenticated() (principalRef, bool) {
	if c.unscoped.Load() {
		return principalRef{}, false
	}
	if p := c.auth.principal.Load(); p != nil {
		return *p, true
	}
	if c.auth.started.Load() || !c.s.openUpstream.Load() {
		// Began SASL and did not finish it, or the cluster requires
		// authentication (the proxy authenticates itself with
		// upstream_sasl, or has not yet seen a broker answer anyone
		// without it).
		return principalRef{}, false
	}
	if c.tlsName != "" {
		return principalRef{name: c.tlsName, id: c.tlsID}, true
	}
	return principalRef{name: anonymous}, true
}

func (c *session) isAuthenticated() bool {
	_, ok := c.authenticated()
	return ok
}

// noteTLSPrincipal scopes a connection whose client presented a
// certificate (tls.client_ca) by its subject, unless SASL names another.
func (c *session) noteTLSPrincipal(st tls.ConnectionState) {
	name, ok := tlsPrincipal(st)
	if !ok {
		return
	}
	c.tlsName = name
	if c.tlsID, ok = c.s.principals.id(name); !ok {
		c.unscoped.Store(true)
	}
}
