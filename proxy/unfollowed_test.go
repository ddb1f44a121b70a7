package proxy

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/decide"
	"github.com/dedupproxy/dedupproxy/metrics"
	"github.com/dedupproxy/dedupproxy/protocol"
)

// gssapiBroker stands in front of a kfake broker for a mechanism kfake does
// not speak: it answers SaslHandshake (GSSAPI) and SaslAuthenticate
// itself, error 0, unless the token is "bad" (then
// SASL_AUTHENTICATION_FAILED), and relays every other request to kfake,
// one at a time, as the broker would serve an authenticated connection.
type gssapiBroker struct {
	ln      net.Listener
	backend string
	wg      sync.WaitGroup
}

func newGSSAPIBroker(t *testing.T, backend string) *gssapiBroker {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &gssapiBroker{ln: ln, backend: backend}
	b.wg.Add(1)
	go b.accept()
	t.Cleanup(func() { ln.Close(); b.wg.Wait() })
	return b
}

func (b *gssapiBroker) accept() {
	defer b.wg.Done()
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			defer c.Close()
			up, err := net.Dial("tcp", b.backend)
			if err != nil {
				return
			}
			defer up.Close()
			b.serve(c, up)
		}()
	}
}

func (b *gssapiBroker) serve(c, up net.Conn) {
	for {
		body, err := readFrame(c)
		if err != nil {
			return
		}
		h, err := protocol.ParseRequestHeader(body)
		if err != nil {
			return
		}
		var resp kmsg.Response
		switch h.APIKey {
		case int16(kmsg.SASLHandshake):
			r := kmsg.NewPtrSASLHandshakeResponse()
			r.SetVersion(h.APIVersion)
			r.SupportedMechanisms = []string{"GSSAPI"}
			resp = r
		case int16(kmsg.SASLAuthenticate):
			req := kmsg.NewPtrSASLAuthenticateRequest()
			req.SetVersion(h.APIVersion)
			if req.ReadFrom(body[h.BodyOffset:]) != nil {
				return
			}
			r := kmsg.NewPtrSASLAuthenticateResponse()
			r.SetVersion(h.APIVersion)
			r.SASLAuthBytes = []byte("server token")
			if string(req.SASLAuthBytes) == "bad" {
				r.ErrorCode = kerr.SaslAuthenticationFailed.Code
			}
			resp = r
		}
		if resp == nil {
			frame := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
			if _, err := up.Write(append(frame, body...)); err != nil {
				return
			}
			answer, err := readFrame(up)
			if err != nil {
				return
			}
			if _, err := c.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(answer))), answer...)); err != nil {
				return
			}
			continue
		}
		out := binary.BigEndian.AppendUint32(make([]byte, 4), uint32(h.CorrelationID))
		if resp.IsFlexible() {
			out = append(out, 0)
		}
		out = resp.AppendTo(out)
		binary.BigEndian.PutUint32(out, uint32(len(out)-4))
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

// TestUnfollowedMechanismLiftsFrameLimit: after an exchange by a mechanism
// the proxy cannot follow (GSSAPI) that the broker answered with success,
// and the client's next ordinary request answered, the broker has
// authenticated the connection: a 600 KiB Produce, above the 512 KiB
// pre-authentication limit and below the clients' default 1 MiB, is
// relayed and written, still decided by no one but the broker. After a
// failed exchange the limit stays.
func TestUnfollowedMechanismLiftsFrameLimit(t *testing.T) {
	t.Parallel()
	const topic = "kerberos"
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	b := newGSSAPIBroker(t, c.ListenAddrs()[0])
	p := startProxy(t, nil, func(cfg *Config) { cfg.Upstream = []string{b.ln.Addr().String()} })
	big := produceParts(topic, -1, part{0, recordBatch(t, -1, -1, -1, 1, strings.Repeat("v", 600<<10))})

	login := func(token string) *rawConn {
		r := dialRaw(t, p.addr())
		if resp := r.roundTrip(saslHandshake("GSSAPI")).(*kmsg.SASLHandshakeResponse); resp.ErrorCode != 0 {
			t.Fatalf("handshake: %d", resp.ErrorCode)
		}
		for range 2 { // GSSAPI takes rounds; the proxy cannot tell which ends it
			resp := r.roundTrip(saslAuth([]byte(token))).(*kmsg.SASLAuthenticateResponse)
			if token == "bad" {
				if resp.ErrorCode == 0 {
					t.Fatal("the stand-in accepted a bad token")
				}
				break
			}
			if resp.ErrorCode != 0 {
				t.Fatalf("authenticate: %d", resp.ErrorCode)
			}
		}
		r.learnTopics(topic) // the next ordinary request, answered
		return r
	}

	ok := login("kerberos ticket")
	if r := onlyPartition(t, ok.roundTrip(big)); r.ErrorCode != 0 || r.BaseOffset != 0 {
		t.Fatalf("600 KiB produce after a successful GSSAPI exchange: %+v, want written at 0", r)
	}
	if n := testutil.ToFloat64(p.Metrics.Passthrough[decide.PassUnauthenticated]); n != 1 {
		t.Fatalf("%v batches relayed undecided, want the one: the proxy decides nothing for GSSAPI", n)
	}
	if n := testutil.ToFloat64(p.Metrics.ClientErrors.WithLabelValues(metrics.ClientUnauth)); n != 0 {
		t.Fatalf("client_errors_total{reason=unauthenticated_frame} = %v", n)
	}

	failed := login("bad")
	failed.send(big)
	if _, err := readFrame(failed.conn); err == nil || !(errors.Is(err, io.EOF) || isReset(err)) {
		t.Fatalf("600 KiB produce after a failed exchange: read %v, want the connection closed", err)
	}
	if n := testutil.ToFloat64(p.Metrics.ClientErrors.WithLabelValues(metrics.ClientUnauth)); n != 1 {
		t.Fatalf("client_errors_total{reason=unauthenticated_frame} = %v, want 1", n)
	}
}
