package auth

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strings"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// Mechanism names as SaslHandshake carries them.
const (
	mechPlain       = "PLAIN"
	mechScram256    = "SCRAM-SHA-256"
	mechScram512    = "SCRAM-SHA-512"
	mechOAuthBearer = "OAUTHBEARER"
)

// State follows one connection's SASL exchanges. The meaning of each
// SASL request (its exchange, mechanism, step and the principal it names)
// is fixed when readLoop reads it and travels with it on its pending entry
// (Step); responseLoop pairs it with the broker's answer to that very
// request, which arrives in request order. So a later exchange, pipelined
// behind an earlier one, can never change what an earlier answer means
// (docs/security.md, "Answers paired with requests").
type State struct {
	// readLoop's: the client's side as sent.
	exchanges uint32 // SaslHandshake requests read: exchange n begins with the n-th
	mech      string // the mechanism the last SaslHandshake named
	steps     int    // SaslAuthenticate requests read since it
	sent      uint64 // SASL requests forwarded

	// Answered counts the SASL answers responseLoop has read, each after
	// what it means is stored: readLoop compares it with sent to tell a
	// pipelined exchange.
	Answered atomic.Uint64

	// responseLoop's: the exchange its answers have reached.
	cur answeredExchange

	Started atomic.Bool // the client began SASL: it is not anonymous
	// Principal is set when an exchange ends authenticated; nil before.
	// A re-authentication (KIP-368) keeps it until it ends: Kafka keeps the
	// connection's principal meanwhile.
	Principal atomic.Pointer[Principal]
	// BrokerAuthenticated is set once the broker has authenticated the
	// connection as far as the proxy can tell, whether or not the proxy
	// decides for it: a followed exchange that ended authenticated, or an
	// unfollowed one the broker answered with success and then served
	// (docs/security.md, "Mechanisms the proxy cannot follow"). It lifts
	// the pre-authentication frame limit.
	BrokerAuthenticated atomic.Bool
	// RelayOnly is set once the connection sent a second exchange the
	// proxy does not follow (pipelined, or a re-authentication as another
	// principal): counted and logged once.
	RelayOnly atomic.Bool
}

// Principal is an authenticated principal and its number in [Principals].
type Principal struct {
	Name string
	ID   PrincipalID
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

// Step is what one SASL request means, decided when readLoop reads it.
type Step struct {
	exchange  uint32 // the exchange it belongs to (0: none began)
	Handshake bool   // a SaslHandshake: it begins the exchange
	Mech      string // the exchange's mechanism
	step      int    // SaslAuthenticate: its place in the exchange, from 1
	Name      string // step 1: the principal its message names; "" if none
}

// Followed reports whether the proxy can tell how an exchange of mech ends.
func Followed(mech string) bool {
	switch mech {
	case mechPlain, mechScram256, mechScram512, mechOAuthBearer:
		return true
	}
	return false
}

// Why a connection is relayed only after a second exchange (the reason
// label of dedupproxy_client_auth_relayed_only_total).
const (
	RelayPipelined = "pipelined"      // an exchange began while a SASL request was unanswered
	RelayReauth    = "reauth_changed" // a re-authentication as another principal, or by a mechanism the proxy cannot follow
)

// Request notes a SaslHandshake or SaslAuthenticate request (readLoop) and
// returns what it means; relay is non-empty when, with it, the connection
// must be decided for nothing more.
func (a *State) Request(key int16, body []byte, version int16, oauthClaim string) (st *Step, relay string) {
	a.Started.Store(true)
	unanswered := a.sent > a.Answered.Load()
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
			relay = RelayPipelined
		case a.Principal.Load() != nil && !Followed(mech):
			relay = RelayReauth
		}
		return &Step{exchange: a.exchanges, Handshake: true, Mech: mech}, relay
	}
	a.steps++
	st = &Step{exchange: a.exchanges, Mech: a.mech, step: a.steps}
	if st.step != 1 || st.exchange == 0 {
		return st, ""
	}
	req := kmsg.NewPtrSASLAuthenticateRequest()
	req.SetVersion(version)
	if req.ReadFrom(body) == nil {
		st.Name, _ = saslPrincipal(st.Mech, req.SASLAuthBytes, oauthClaim)
	}
	// A re-authentication (KIP-368) must name the principal the
	// connection has: Kafka refuses another.
	if p := a.Principal.Load(); p != nil && st.Name != p.Name && Followed(st.Mech) {
		relay = RelayReauth
	}
	return st, relay
}

// Answer notes the broker's answer to the SASL request st (responseLoop):
// body is the response after its header. It returns the principal
// authenticated by it, if the exchange ended so.
func (a *State) Answer(st *Step, body []byte, version int16) (name string, done bool) {
	cur := &a.cur
	if st.Handshake {
		resp := kmsg.NewPtrSASLHandshakeResponse()
		resp.SetVersion(version)
		ok := resp.ReadFrom(body) == nil && resp.ErrorCode == 0
		*cur = answeredExchange{exchange: st.exchange, mech: st.Mech, failed: !ok || !Followed(st.Mech),
			unfollowedOK: ok && !Followed(st.Mech)}
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
		cur.candidate = st.Name
	}
	if cur.candidate == "" {
		cur.failed = true
		return "", false
	}
	switch st.Mech {
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

// Served notes the broker's answer to an ordinary request (responseLoop):
// after an exchange the proxy cannot follow whose answers were all error 0,
// it means the broker authenticated the connection (Kafka closes one that
// sends such a request before its exchange ended).
func (a *State) Served() {
	if a.cur.unfollowedOK && a.cur.answers > 0 && !a.BrokerAuthenticated.Load() {
		a.BrokerAuthenticated.Store(true)
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
