// Package protocol reads and writes the parts of the Kafka wire protocol that
// dedupproxy needs: size-prefixed frames, request and response headers,
// and a zero-allocation scan of Produce requests and their responses. The
// rewriting of every response that carries a broker address, and the cap on
// ApiVersions, are its subpackage rewrite.
//
// It has no sockets, no metrics and no logging: callers hand it bytes and get
// bytes or typed errors back. Bad input never panics; it yields an error
// wrapping one of the package's sentinels.
//
// Everything that is not rewritten is relayed as raw bytes. Produce requests
// are scanned without decoding records ([ProduceScanner]).
package protocol
