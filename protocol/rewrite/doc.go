// Package rewrite changes the responses a client must not see as the broker
// sent them: every broker address becomes the proxy's listener for that
// node ([Addresses], or the node is left out, [OmitBroker]), and ApiVersions
// is capped ([CapAPIVersions]) to what kmsg can decode for every API,
// because whether a request header is flexible depends on its key and
// version: a broker newer than the proxy then degrades gracefully instead of
// breaking clients. Like package protocol it has no sockets, metrics or
// logging, and bad input yields an error, never a panic.
package rewrite
