package proxy

import (
	"context"
	"encoding/asn1"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/dedupproxy/dedupproxy/internal/testpki"
)

// subjectAttribute is one AttributeTypeAndValue of a subject, its value's
// string tag chosen by the test; subjectRDNSET is an RDN (encoding/asn1
// writes a type whose name ends in SET as an ASN.1 SET).
type subjectAttribute struct {
	Type  asn1.ObjectIdentifier
	Value asn1.RawValue
}

type subjectRDNSET []subjectAttribute

// rdnSubject encodes a subject of one attribute per RDN, in the order
// given (the encoded order: Kafka prints it reversed).
func rdnSubject(t *testing.T, rdns ...[]subjectAttribute) []byte {
	t.Helper()
	seq := make([]subjectRDNSET, len(rdns))
	for i, r := range rdns {
		seq[i] = r
	}
	der, err := asn1.Marshal(seq)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func attr(oid asn1.ObjectIdentifier, v string) subjectAttribute {
	return subjectAttribute{Type: oid, Value: asn1.RawValue{Class: asn1.ClassUniversal, Tag: asn1.TagUTF8String, Bytes: []byte(v)}}
}

// TestCertificatePrincipalsKeptApart: clients whose certificates' subjects
// Go's pkix.Name.String() collapses into one (CN=alice and
// CN=alice,CN=mallory; CN=alice,O=x and O=x,CN=alice) are different
// principals, as in Kafka: a copy of alice's legacy batch (her connection
// broke) from the other is not answered as her retry but written. With
// tls.principal_mapping_rules naming both subjects alice, they are one
// principal and the copy is answered as a retry.
func TestCertificatePrincipalsKeptApart(t *testing.T) {
	t.Parallel()
	cnOID, oOID := asn1.ObjectIdentifier{2, 5, 4, 3}, asn1.ObjectIdentifier{2, 5, 4, 10}
	cn := func(v string) []subjectAttribute { return []subjectAttribute{attr(cnOID, v)} }
	o := func(v string) []subjectAttribute { return []subjectAttribute{attr(oOID, v)} }
	for _, c := range []struct {
		name          string
		alice, other  []byte
		rules         string
		sameprincipal bool
	}{
		{name: "CN=alice and CN=alice,CN=mallory", alice: rdnSubject(t, cn("alice")), other: rdnSubject(t, cn("mallory"), cn("alice"))},
		{name: "CN=alice,O=x and O=x,CN=alice", alice: rdnSubject(t, o("x"), cn("alice")), other: rdnSubject(t, cn("alice"), o("x"))},
		{name: "mapped to one principal", alice: rdnSubject(t, o("a"), cn("alice")), other: rdnSubject(t, o("b"), cn("alice")),
			rules: `RULE:^CN=([^,]+),O=.*$/$1/, DEFAULT`, sameprincipal: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			const topic = "certs"
			certs := newTestCerts(t)
			cl := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
			p := startProxy(t, cl, both(withClientTLS(certs, certs.server("proxy"), "proxy"),
				func(cfg *Config) { cfg.TLS.ClientCA, cfg.TLS.PrincipalMappingRules = certs.caFile, c.rules }))
			if err := p.Probe(context.Background()); err != nil { // the cluster needs no SASL
				t.Fatal(err)
			}
			req := produceParts(topic, -1, part{0, recordBatch(t, -1, -1, -1, 3, "pay 100 to bob")})
			alice := dialRawTLS(t, p.addr(), certs.clientConfig(certs.issue("alice", testpki.Opts{Client: true, RawSubject: c.alice})))
			alice.learnTopics(topic)
			if r := onlyPartition(t, alice.roundTrip(req)); r.ErrorCode != 0 || r.BaseOffset != 0 {
				t.Fatalf("alice's original: %+v", r)
			}
			alice.abort()
			clientsGone(t, p) // a retry of hers could repeat her batch now

			other := dialRawTLS(t, p.addr(), certs.clientConfig(certs.issue("other", testpki.Opts{Client: true, RawSubject: c.other})))
			other.learnTopics(topic)
			r := onlyPartition(t, other.roundTrip(req))
			want := int64(3) // written after alice's three records
			if c.sameprincipal {
				want = 0 // her retry
			}
			if r.ErrorCode != 0 || r.BaseOffset != want {
				t.Fatalf("the other certificate's copy of alice's batch: %+v, want written at offset %d", r, want)
			}
		})
	}
}
