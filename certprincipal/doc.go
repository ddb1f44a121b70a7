// Package certprincipal derives the principal Kafka gives a TLS client
// certificate (docs/security.md, "The certificate principal"): its default
// principal builder takes the subject as Java's X500Principal.getName()
// prints it (RFC 2253: the relative distinguished names in reverse of their
// encoded order, multi-valued ones joined by "+" in encoded order, values
// escaped) and passes it through ssl.principal.mapping.rules. Behind a proxy
// that ends TLS, the broker never sees the client's certificate, so this
// string is what keeps certificate-only clients' state apart: it must not
// merge two subjects Kafka tells apart.
//
// [Subject] prints a DER subject; [ParseRules] reads a rules value and
// [Mapper.Name] applies it. Pure: no I/O, standard library only.
package certprincipal
