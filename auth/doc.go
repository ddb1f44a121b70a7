// Package auth is who a connection is, and how the proxy's own connections
// prove who they are: following clients' SASL exchanges to the principal
// the broker authenticated, numbering principals, TLS on both legs, and the
// proxy's own SASL credentials (upstream_sasl).
//
// A client connection is authenticated once the broker has said so, as the
// mechanism defines it (docs/security.md, "When a connection counts as
// authenticated"). Until then the proxy decides nothing for it: no table
// entry, no in-flight registration, no warm-up, no answer of its own. The
// SASL exchange itself is relayed untouched on the connection's own broker
// connection; the proxy only reads it ([State]). A session follows its
// connection with a [Client] (the exchanges, the certificate's principal,
// whether its state can be scoped), sharing an [Env] with the others.
//
//   - PLAIN: the broker's one SaslAuthenticate answer, error 0.
//   - SCRAM-SHA-256/512: the second answer (server-final), error 0. The first
//     (server-first) has error 0 too, before the client proved anything.
//   - OAUTHBEARER: an answer with error 0 and no challenge (KIP-255: an
//     invalid token is answered error 0 with a JSON error challenge).
//   - Any other mechanism (GSSAPI, custom): never. Its connections are
//     relayed and counted, and the proxy says so once per mechanism; only
//     the pre-authentication request limit ends once the broker accepted
//     the exchange and served the next request ([State.Served]).
//
// The principal is who the broker authenticated: the PLAIN or SCRAM user
// name, the OAUTHBEARER token's subject claim, else the principal Kafka
// derives from the TLS client certificate (package certprincipal), else
// ANONYMOUS (a cluster that needs no authentication). All state is scoped
// by it.
//
// TLS ([CertFiles], [UpstreamTLS], [Listener]): to clients, every listener
// wraps its accepted connections in crypto/tls, and the caller runs the
// handshake before it dials the broker, so a client that fails it costs no
// broker connection. A certificate comes from a [CertFiles] whose content
// is swapped atomically when the files change (the proxy checks them
// every cert_reload_interval and on SIGHUP), so open connections keep
// theirs and new ones get the new one. To brokers, [UpstreamTLS.Client]
// runs a TLS client handshake after the TCP dial, verifying each broker's
// certificate for its own host (the address the cluster's metadata gives
// it) or a configured name (docs/reference.md, "TLS and SASL").
// [LoadTLS] loads all of it from a configuration into a [TLS].
//
// Nothing here reads the clock but through the now function it is given,
// logs but through the logger it is given, or dials.
package auth
