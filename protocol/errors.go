package protocol

import "errors"

// ErrMalformedResponse means a response body does not decode at the version
// it was requested with. kmsg's own error (usually kbin.ErrNotEnoughData) is
// wrapped alongside it. The response rewriter (package rewrite) and the
// Produce response scan return it.
var ErrMalformedResponse = errors.New("protocol: malformed response")
