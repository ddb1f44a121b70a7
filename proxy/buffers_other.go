//go:build !unix

package proxy

// newLarge returns the start of a large request buffer; readLarge grows it
// as bytes arrive.
func newLarge(size int) []byte { return make([]byte, min(size, 4*smallRequest)) }

// freeLarge leaves b to the garbage collector.
func freeLarge(b []byte) {}
