//go:build !unix

package relay

// newLarge returns the start of a large request buffer; readLarge grows it
// as bytes arrive.
func newLarge(size int) []byte { return make([]byte, min(size, 4*SmallRequest)) }

// freeLarge leaves b to the garbage collector.
func freeLarge(b []byte) {}
