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

	"github.com/dedupproxy/dedupproxy/certprincipal"
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
//     relayed and counted, and the proxy says so once per mechanism; only
//     the pre-authentication request limit ends once the broker accepted
//     the exchange and served the next request (authState.served).
//
// The principal is who the broker authenticated: the PLAIN or SCRAM user
// name, the OAUTHBEARER token's subject claim, else the principal Kafka
// derives from the TLS client certificate (package certprincipal), else
// ANONYMOUS (a cluster that needs no authentication). All state is scoped
// by it.

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

// authState follows one connection's SASL exchanges. The meaning of each
// SASL request (its exchange, mechanism, step and the principal it names)
// is fixed when readLoop reads it and travels with it on its pending entry
// (saslStep); responseLoop pairs it with the broker's answer to that very
// request, which arrives in request order. So a later exchange, pipelined
// behind an earlier one, can never change what an earlier answer means
// (docs/security.md, "Answers paired with requests").
type authState struct {
	// readLoop's: the client's side as sent.
	exchanges uint32 // SaslHandshake requests read: exchange n begins with the n-th
	mech      string // the mechanism the last SaslHandshake named
	steps     int    // SaslAuthenticate requests read since it
	sent      uint64 // SASL requests forwarded

	// answered counts the SASL answers responseLoop has read, each after
	// what it means is stored: readLoop compares it with sent to tell a
	// pipelined exchange.
	answered atomic.Uint64

	// responseLoop's: the exchange its answers have reached.
	cur answeredExchange

	started atomic.Bool // the client began SASL: it is not anonymous
	// principal is set when an exchange ends authenticated; nil before.
	// A re-authentication (KIP-368) keeps it until it ends: Kafka keeps the
	// connection's principal meanwhile.
	principal atomic.Pointer[principalRef]
	// brokerAuthenticated is set once the broker has authenticated the
	// connection as far as the proxy can tell, whether or not the proxy
	// decides for it: a followed exchange that ended authenticated, or an
	// unfollowed one the broker answered with success and then served
	// (docs/security.md, "Mechanisms the proxy cannot follow"). It lifts
	// the pre-authentication frame limit.
	brokerAuthenticated atomic.Bool
	// relayOnly is set once the connection sent a second exchange the
	// proxy does not follow (pipelined, or a re-authentication as another
	// principal): counted and logged once.
	relayOnly atomic.Bool
}

type principalRef struct {
	name string
	id   principalID
}

// answeredExchange is what the broker's answers have said so far of one
// exchange.
type answeredExchange struct {
	exchange  uint32
	mech      string
	candidate string // the principal its first message names
	failed    bool   // it cannot authenticate (any more), as far as the proxy can tell
	answers   int    // SaslAuthenticate answers with error 0
	// unfollowedOK: a mechanism the proxy cannot follow whose answers were
	// all error 0 so far; the broker's answer to a later ordinary request
	// then says the exchange succeeded.
	unfollowedOK bool
}

// saslStep is what one SASL request means, decided when readLoop reads it.
type saslStep struct {
	exchange  uint32 // the exchange it belongs to (0: none began)
	handshake bool   // a SaslHandshake: it begins the exchange
	mech      string // the exchange's mechanism
	step      int    // SaslAuthenticate: its place in the exchange, from 1
	name      string // step 1: the principal its message names; "" if none
}

// followed reports whether the proxy can tell how an exchange of mech ends.
func followed(mech string) bool {
	switch mech {
	case mechPlain, mechScram256, mechScram512, mechOAuthBearer:
		return true
	}
	return false
}

// Why a connection is relayed only after a second exchange (the reason
// label of dedupproxy_client_auth_relayed_only_total).
const (
	relayPipelined = "pipelined"      // an exchange began while a SASL request was unanswered
	relayReauth    = "reauth_changed" // a re-authentication as another principal, or by a mechanism the proxy cannot follow
)

// request notes a SaslHandshake or SaslAuthenticate request (readLoop) and
// returns what it means; relay is non-empty when, with it, the connection
// must be decided for nothing more.
func (a *authState) request(key int16, body []byte, version int16, oauthClaim string) (st *saslStep, relay string) {
	a.started.Store(true)
	unanswered := a.sent > a.answered.Load()
	a.sent++
	if key == int16(kmsg.SASLHandshake) {
		req := kmsg.NewPtrSASLHandshakeRequest()
		req.SetVersion(version)
		mech := ""
		if req.ReadFrom(body) == nil {
			mech = strings.ToUpper(req.Mechanism)
		}
		a.exchanges++
		a.mech, a.steps = mech, 0
		switch {
		case unanswered:
			// Kafka answers an exchange begun before the last one ended
			// ILLEGAL_SASL_STATE; no honest client does it, and what it
			// means depends on answers not yet read.
			relay = relayPipelined
		case a.principal.Load() != nil && !followed(mech):
			relay = relayReauth
		}
		return &saslStep{exchange: a.exchanges, handshake: true, mech: mech}, relay
	}
	a.steps++
	st = &saslStep{exchange: a.exchanges, mech: a.mech, step: a.steps}
	if st.step != 1 || st.exchange == 0 {
		return st, ""
	}
	req := kmsg.NewPtrSASLAuthenticateRequest()
	req.SetVersion(version)
	if req.ReadFrom(body) == nil {
		st.name, _ = saslPrincipal(st.mech, req.SASLAuthBytes, oauthClaim)
	}
	// A re-authentication (KIP-368) must name the principal the
	// connection has: Kafka refuses another.
	if p := a.principal.Load(); p != nil && st.name != p.name && followed(st.mech) {
		relay = relayReauth
	}
	return st, relay
}

// answer notes the broker's answer to the SASL request st (responseLoop):
// body is the response after its header. It returns the principal
// authenticated by it, if the exchange ended so.
func (a *authState) answer(st *saslStep, body []byte, version int16) (name string, done bool) {
	cur := &a.cur
	if st.handshake {
		resp := kmsg.NewPtrSASLHandshakeResponse()
		resp.SetVersion(version)
		ok := resp.ReadFrom(body) == nil && resp.ErrorCode == 0
		*cur = answeredExchange{exchange: st.exchange, mech: st.mech, failed: !ok || !followed(st.mech),
			unfollowedOK: ok && !followed(st.mech)}
		return "", false
	}
	resp := kmsg.NewPtrSASLAuthenticateResponse()
	resp.SetVersion(version)
	ok := resp.ReadFrom(body) == nil && resp.ErrorCode == 0
	if st.exchange == 0 || st.exchange != cur.exchange || !ok {
		// No handshake of its own was answered first, or a failure.
		cur.failed, cur.unfollowedOK = true, false
		return "", false
	}
	cur.answers++
	if cur.failed {
		return "", false
	}
	if st.step == 1 {
		cur.candidate = st.name
	}
	if cur.candidate == "" {
		cur.failed = true
		return "", false
	}
	switch st.mech {
	case mechPlain:
		done = st.step == 1
	case mechScram256, mechScram512:
		done = st.step == 2
	case mechOAuthBearer:
		// Error 0 with a challenge is KIP-255's failure: the client must
		// answer it with %x01 and the broker then fails the exchange.
		done = st.step == 1 && len(resp.SASLAuthBytes) == 0
		if !done {
			cur.failed = true
		}
	}
	if done {
		cur.failed = true // the exchange is over: nothing more authenticates
	}
	return cur.candidate, done
}

// served notes the broker's answer to an ordinary request (responseLoop):
// after an exchange the proxy cannot follow whose answers were all error 0,
// it means the broker authenticated the connection (Kafka closes one that
// sends such a request before its exchange ended).
func (a *authState) served() {
	if a.cur.unfollowedOK && a.cur.answers > 0 && !a.brokerAuthenticated.Load() {
		a.brokerAuthenticated.Store(true)
	}
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

// noteAuthRequest follows the client's side of a SASL exchange (readLoop)
// and returns what the request means, for its pending entry.
func (c *session) noteAuthRequest(h protocol.RequestHeader, body []byte) *saslStep {
	st, relay := c.auth.request(h.APIKey, body[h.BodyOffset:], h.APIVersion, c.s.Config.OAuthBearerPrincipalClaim)
	if st.handshake && !followed(st.mech) {
		c.s.Metrics.authUnfollowed.Inc()
		if _, seen := c.s.unfollowedMechs.LoadOrStore(st.mech, true); !seen {
			c.log.Warn("SASL mechanism the proxy cannot follow: its connections are relayed and never deduplicated (docs/security.md)", "mechanism", st.mech)
		}
	}
	if relay != "" {
		c.relayOnly(relay, st.name)
	}
	return st
}

// relayOnly makes the proxy decide nothing more for the connection, after
// a second SASL exchange it does not follow; counted and logged once.
func (c *session) relayOnly(reason, principal string) {
	c.unscoped.Store(true)
	if c.auth.relayOnly.Swap(true) {
		return
	}
	c.s.Metrics.authRelayedOnly.WithLabelValues(reason).Inc()
	was := ""
	if p := c.auth.principal.Load(); p != nil {
		was = p.name
	}
	switch reason {
	case relayPipelined:
		c.log.Warn("client began a SASL exchange before the broker answered the last one: its requests are relayed undecided from now on (docs/security.md)", "principal", was)
	default:
		c.log.Warn("client re-authenticated as another principal or by a mechanism the proxy cannot follow: its requests are relayed undecided from now on (docs/security.md)", "principal", principal, "was", was)
	}
}

// noteAuthAnswer follows the broker's side (responseLoop): body is the
// answer to the SASL request p after its header.
func (c *session) noteAuthAnswer(p *pending, body []byte) {
	defer c.auth.answered.Add(1) // after the answer's meaning is stored
	if p.sasl == nil {
		return
	}
	name, done := c.auth.answer(p.sasl, body, p.version)
	if !done {
		return
	}
	c.auth.brokerAuthenticated.Store(true)
	if old := c.auth.principal.Load(); old != nil && old.name != name {
		// Kafka refuses a re-authentication as another principal; the
		// proxy stops deciding for a connection whose principal moved.
		c.relayOnly(relayReauth, name)
		c.auth.principal.Store(&principalRef{name: name, id: 0})
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

// preAuthentication reports whether the broker has not yet authenticated
// the connection, as far as the proxy can tell: Kafka's limit on request
// size applies until it has.
func (c *session) preAuthentication() bool {
	return !c.auth.brokerAuthenticated.Load() && !c.isAuthenticated()
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
		name, ok = c.s.certPrincipals.Name(dn)
	}
	if !ok {
		c.unscoped.Store(true)
		c.log.Warn("no principal for the client certificate (no tls.principal_mapping_rules rule applies, or its subject does not parse): its requests are relayed undecided", "subject", dn, "err", err)
		return
	}
	c.tlsName = "User:" + name
	if c.tlsID, ok = c.s.principals.id(c.tlsName); !ok {
		c.unscoped.Store(true)
	}
}
