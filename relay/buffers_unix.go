//go:build unix

package relay

import "syscall"

// newLarge returns a large request buffer of capacity size: an anonymous
// private mapping, outside the Go heap (see RequestPool). Its pages are
// zero and take memory only once written, so it is made at full size and
// never grown. If the mapping fails it falls back to the heap.
func newLarge(size int) []byte {
	b, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return make([]byte, min(size, 4*SmallRequest))
	}
	return b
}

// freeLarge unmaps a buffer from newLarge; one from the heap is left to the
// garbage collector. Nothing may refer to b's bytes any more.
func freeLarge(b []byte) {
	if cap(b) > 0 {
		syscall.Munmap(b[:cap(b)]) // EINVAL for a heap buffer: not a mapping
	}
}
