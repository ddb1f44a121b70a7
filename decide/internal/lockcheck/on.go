//go:build lockcheck

package lockcheck

import (
	"bytes"
	"fmt"
	"runtime"
	"strconv"
	"sync"
)

// On reports whether this build checks.
const On = true

var (
	mu   sync.Mutex
	held = map[uint64][]string{} // by goroutine
)

// goid returns the calling goroutine's number, from its stack's first
// line ("goroutine N [running]:"): slow, and only in this build.
func goid() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i > 0 {
		b = b[:i]
	}
	id, err := strconv.ParseUint(string(b), 10, 64)
	if err != nil {
		panic("lockcheck: no goroutine number in the stack")
	}
	return id
}

// Take records that the calling goroutine takes lock what, and panics if
// it holds another.
func Take(what string) {
	g := goid()
	mu.Lock()
	defer mu.Unlock()
	if h := held[g]; len(h) > 0 {
		panic(fmt.Sprintf("lockcheck: %s taken while %s is held", what, h[len(h)-1]))
	}
	held[g] = append(held[g], what)
}

// Drop records that the calling goroutine let go of the lock it took last.
func Drop() {
	g := goid()
	mu.Lock()
	defer mu.Unlock()
	h := held[g]
	if len(h) == 0 {
		panic("lockcheck: a lock let go that was not taken")
	}
	if len(h) == 1 {
		delete(held, g)
		return
	}
	held[g] = h[:len(h)-1]
}
