// Package protocol reads and writes the parts of the Kafka wire protocol that
// dedupproxy needs: size-prefixed frames, request and response headers,
// a zero-allocation scan of Produce requests, and the rewriting of every
// response that carries a broker address.
//
// It has no sockets, no metrics and no logging: callers hand it bytes and get
// bytes or typed errors back. Bad input never panics; it yields an error
// wrapping one of the package's sentinels.
//
// Everything that is not rewritten is relayed as raw bytes. Produce requests
// are scanned without decoding records ([ProduceScanner]); only the
// address-bearing responses ([RewriteAddresses]) and ApiVersions are decoded.
// ApiVersions is capped ([CapAPIVersions]) to what kmsg knows for every API,
// because whether a request header is flexible depends on its key and
// version: a newer broker then degrades gracefully instead of breaking
// clients.
package protocol
