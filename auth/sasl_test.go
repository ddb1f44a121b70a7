package auth

import (
	"encoding/base64"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestOAuthBearerSubject: the principal of an OAUTHBEARER client is the
// token's subject claim (or the configured one); a message without a
// bearer token names none.
func TestOAuthBearerSubject(t *testing.T) {
	t.Parallel()
	tok := func(payload string) string {
		enc := base64.RawURLEncoding.EncodeToString
		return enc([]byte(`{"alg":"none"}`)) + "." + enc([]byte(payload)) + "."
	}
	msg := func(token string) []byte { return []byte("n,,\x01auth=Bearer " + token + "\x01\x01") }
	for _, c := range []struct {
		msg   []byte
		claim string
		want  string
		ok    bool
	}{
		{msg(tok(`{"sub":"svc-a","cid":"x"}`)), "sub", "User:svc-a", true},
		{msg(tok(`{"sub":"svc-a","cid":"x"}`)), "cid", "User:x", true},
		{msg(tok(`{"cid":"x"}`)), "sub", "", false},
		{msg("not-a-jwt"), "sub", "", false},
		{[]byte("n,,\x01auth=Basic abc\x01\x01"), "sub", "", false},
	} {
		got, ok := saslPrincipal(mechOAuthBearer, c.msg, c.claim)
		if got != c.want || ok != c.ok {
			t.Errorf("%q claim %s: %q %v, want %q %v", c.msg, c.claim, got, ok, c.want, c.ok)
		}
	}
	for _, c := range []struct {
		mech, msg, want string
		ok              bool
	}{
		{mechPlain, "\x00alice\x00pw", "User:alice", true},
		{mechPlain, "alice\x00alice\x00pw", "User:alice", true},
		{mechPlain, "bob\x00alice\x00pw", "", false},
		{mechScram256, "n,,n=al=2Cice,r=abc", "User:al,ice", true},
		{mechScram512, "n,,r=abc", "", false},
		{"GSSAPI", "anything", "", false},
	} {
		got, ok := saslPrincipal(c.mech, []byte(c.msg), "sub")
		if got != c.want || ok != c.ok {
			t.Errorf("%s %q: %q %v, want %q %v", c.mech, c.msg, got, ok, c.want, c.ok)
		}
	}
}

// authScript drives an State as readLoop and responseLoop do: each
// request returns what it means, and an answer is paired with one.
type authScript struct {
	t *testing.T
	a State
}

func (sc *authScript) handshake(mech string) (*Step, string) {
	req := kmsg.NewPtrSASLHandshakeRequest()
	req.SetVersion(1)
	req.Mechanism = mech
	return sc.a.Request(int16(kmsg.SASLHandshake), req.AppendTo(nil), 1, "sub")
}

func (sc *authScript) request(msg string) (*Step, string) {
	req := kmsg.NewPtrSASLAuthenticateRequest()
	req.SetVersion(1)
	req.SASLAuthBytes = []byte(msg)
	return sc.a.Request(int16(kmsg.SASLAuthenticate), req.AppendTo(nil), 1, "sub")
}

// answer pairs the broker's answer with st and returns the principal it
// authenticates, "" if none.
func (sc *authScript) answer(st *Step, code int16, challenge string) string {
	defer sc.a.Answered.Add(1)
	var body []byte
	if st.Handshake {
		resp := kmsg.NewPtrSASLHandshakeResponse()
		resp.SetVersion(1)
		resp.ErrorCode = code
		body = resp.AppendTo(nil)
	} else {
		resp := kmsg.NewPtrSASLAuthenticateResponse()
		resp.SetVersion(1)
		resp.ErrorCode, resp.SASLAuthBytes = code, []byte(challenge)
		body = resp.AppendTo(nil)
	}
	name, done := sc.a.Answer(st, body, 1)
	if !done {
		return ""
	}
	sc.a.Principal.Store(&Principal{Name: name})
	return name
}

// exchange runs one exchange in lockstep, each answer error 0 with the
// challenges given, and returns what the last answer authenticated.
func (sc *authScript) exchange(mech string, msgs []string, challenges []string) string {
	hs, _ := sc.handshake(mech)
	sc.answer(hs, 0, "")
	got := ""
	for i, m := range msgs {
		st, _ := sc.request(m)
		got = sc.answer(st, 0, challenges[i])
	}
	return got
}

// TestAuthStateByMechanism: the answers that end an exchange, per
// mechanism, as the broker sends them.
func TestAuthStateByMechanism(t *testing.T) {
	t.Parallel()
	const oauthAlice = "n,,\x01auth=Bearer e30.eyJzdWIiOiJhbGljZSJ9.\x01\x01" // {"sub":"alice"}
	for _, c := range []struct {
		name       string
		mech       string
		msgs       []string
		challenges []string
		codes      []int16 // per SaslAuthenticate answer; 0 when short
		want       string
	}{
		{"PLAIN", "PLAIN", []string{"\x00alice\x00pw"}, []string{""}, nil, "User:alice"},
		{"PLAIN wrong password", "PLAIN", []string{"\x00alice\x00pw"}, []string{""}, []int16{kerr.SaslAuthenticationFailed.Code}, ""},
		{"SCRAM server-first only", "SCRAM-SHA-512", []string{"n,,n=alice,r=abc"}, []string{"r=abcdef,s=salt,i=4096"}, nil, ""},
		{"SCRAM", "SCRAM-SHA-512", []string{"n,,n=alice,r=abc", "c=biws,r=abcdef,p=proof"}, []string{"r=abcdef,s=salt,i=4096", "v=signature"}, nil, "User:alice"},
		{"SCRAM failed proof", "SCRAM-SHA-256", []string{"n,,n=alice,r=abc", "c=biws,r=abcdef,p=wrong"}, []string{"r=abcdef,s=salt,i=4096", ""}, []int16{0, kerr.SaslAuthenticationFailed.Code}, ""},
		{"OAUTHBEARER invalid token", "OAUTHBEARER", []string{oauthAlice}, []string{`{"status":"invalid_token"}`}, nil, ""},
		{"OAUTHBEARER", "OAUTHBEARER", []string{oauthAlice}, []string{""}, nil, "User:alice"},
		{"GSSAPI", "GSSAPI", []string{"token", "token"}, []string{"", ""}, nil, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			sc := &authScript{t: t}
			hs, _ := sc.handshake(c.mech)
			sc.answer(hs, 0, "")
			got := ""
			for i, m := range c.msgs {
				st, _ := sc.request(m)
				code := int16(0)
				if i < len(c.codes) {
					code = c.codes[i]
				}
				if g := sc.answer(st, code, c.challenges[i]); g != "" {
					got = g
				}
			}
			if got != c.want {
				t.Errorf("authenticated %q, want %q", got, c.want)
			}
		})
	}
}

// TestAuthPipelinedExchanges: a second exchange read before the broker
// answered the first cannot change what the first's answers mean, for
// every mechanism the proxy follows; it makes the connection relayed
// only. The broker authenticates the first exchange's user and answers the
// second ILLEGAL_SASL_STATE (34).
func TestAuthPipelinedExchanges(t *testing.T) {
	t.Parallel()
	illegal := kerr.IllegalSaslState.Code
	tok := func(sub string) string {
		enc := base64.RawURLEncoding.EncodeToString
		return "n,,\x01auth=Bearer " + enc([]byte(`{"alg":"none"}`)) + "." + enc([]byte(`{"sub":"`+sub+`"}`)) + ".\x01\x01"
	}
	for _, c := range []struct {
		name          string
		mech          string
		first, second string // the first messages naming reader, then writer
		challenge     string // the broker's answer to reader's first message
		final         string // reader's second message, SCRAM only
	}{
		{name: "PLAIN", mech: "PLAIN", first: "\x00reader\x00pw", second: "\x00writer\x00wrong"},
		{name: "SCRAM-SHA-256", mech: "SCRAM-SHA-256", first: "n,,n=reader,r=abc", second: "n,,n=writer,r=abc", challenge: "r=abcdef,s=c2FsdA==,i=4096", final: "c=biws,r=abcdef,p=proof"},
		{name: "SCRAM-SHA-512", mech: "SCRAM-SHA-512", first: "n,,n=reader,r=abc", second: "n,,n=writer,r=abc", challenge: "r=abcdef,s=c2FsdA==,i=4096", final: "c=biws,r=abcdef,p=proof"},
		{name: "OAUTHBEARER", mech: "OAUTHBEARER", first: tok("reader"), second: tok("writer")},
	} {
		t.Run(c.name, func(t *testing.T) {
			sc := &authScript{t: t}
			hs1, r1 := sc.handshake(c.mech)
			a1, r2 := sc.request(c.first)
			var fin *Step
			if c.final != "" {
				// SCRAM's client-final needs the server-first answer.
				if got := sc.answer(hs1, 0, ""); got != "" {
					t.Fatalf("handshake authenticated %q", got)
				}
				sc.answer(a1, 0, c.challenge)
				fin, _ = sc.request(c.final)
			}
			hs2, relay := sc.handshake(c.mech)
			a2, _ := sc.request(c.second)
			if r1 != "" || r2 != "" || relay != RelayPipelined {
				t.Fatalf("relay verdicts %q %q %q, want only the second handshake %q", r1, r2, relay, RelayPipelined)
			}
			var got string
			if fin == nil {
				sc.answer(hs1, 0, "")
				got = sc.answer(a1, 0, "")
			} else {
				got = sc.answer(fin, 0, "v=signature")
			}
			if got != "User:reader" {
				t.Fatalf("the first exchange's answer authenticated %q, want User:reader", got)
			}
			if g := sc.answer(hs2, illegal, ""); g != "" {
				t.Fatalf("the second handshake's answer authenticated %q", g)
			}
			if g := sc.answer(a2, illegal, ""); g != "" {
				t.Fatalf("the second exchange's answer authenticated %q", g)
			}
			// Even were the broker to answer the second exchange with
			// success, it could only ever mean its own user.
			sc2 := &authScript{t: t}
			h1, _ := sc2.handshake(c.mech)
			b1, _ := sc2.request(c.first)
			h2, _ := sc2.handshake(c.mech)
			b2, _ := sc2.request(c.second)
			sc2.answer(h1, 0, "")
			sc2.answer(b1, kerr.SaslAuthenticationFailed.Code, "")
			sc2.answer(h2, 0, "")
			if g := sc2.answer(b2, 0, ""); c.mech != "SCRAM-SHA-256" && c.mech != "SCRAM-SHA-512" && g != "User:writer" {
				t.Fatalf("the second exchange's own success authenticated %q, want User:writer", g)
			}
		})
	}
}

// TestAuthReauthentication: KIP-368 re-authentication as the same
// principal keeps the connection decided; as another principal, or by a
// mechanism the proxy cannot follow, it makes it relayed only.
func TestAuthReauthentication(t *testing.T) {
	t.Parallel()
	sc := &authScript{t: t}
	if got := sc.exchange("PLAIN", []string{"\x00alice\x00pw"}, []string{""}); got != "User:alice" {
		t.Fatalf("first exchange: %q", got)
	}
	hs, relay := sc.handshake("SCRAM-SHA-256")
	if relay != "" {
		t.Fatalf("a re-authentication's handshake: relay %q", relay)
	}
	sc.answer(hs, 0, "")
	st, relay := sc.request("n,,n=alice,r=abc")
	if relay != "" {
		t.Fatalf("a re-authentication as the same principal: relay %q", relay)
	}
	sc.answer(st, 0, "r=abcdef,s=c2FsdA==,i=4096")
	st, _ = sc.request("c=biws,r=abcdef,p=proof")
	if got := sc.answer(st, 0, "v=sig"); got != "User:alice" {
		t.Fatalf("re-authentication: %q", got)
	}
	hs, _ = sc.handshake("PLAIN")
	sc.answer(hs, 0, "")
	st, relay = sc.request("\x00mallory\x00pw")
	if relay != RelayReauth {
		t.Fatalf("a re-authentication as another principal: relay %q, want %q", relay, RelayReauth)
	}
	sc.answer(st, kerr.SaslAuthenticationFailed.Code, "") // as Kafka does
	if _, relay := sc.handshake("GSSAPI"); relay != RelayReauth {
		t.Fatalf("a re-authentication by GSSAPI: relay %q, want %q", relay, RelayReauth)
	}
}
