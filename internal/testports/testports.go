// Package testports finds blocks of consecutive free TCP ports on loopback
// for tests that must know a proxy's ports before it starts: replicas
// advertise each other's addresses, and a replica restarted must come back
// on the same ones. Nothing here is for production.
//
// It lives under internal/ because three packages use it in their tests:
// proxy, e2e and cmd/dedupproxy.
package testports

import (
	"net"
	"strconv"
	"testing"
)

// Block returns a port P such that P..P+n-1 were all free on 127.0.0.1 a
// moment ago and none is in taken; it adds them to taken. Another process
// may take one before the caller binds it: callers that can, bind them at
// once and hand the listeners over.
func Block(t testing.TB, n int, taken map[int]bool) int {
	t.Helper()
	for range 100 {
		first, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := first.Addr().(*net.TCPAddr).Port
		held := []net.Listener{first}
		ok := !taken[p] && p+n <= 65536
		for k := 1; ok && k < n; k++ {
			if taken[p+k] {
				ok = false
				break
			}
			ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+k))
			if err != nil {
				ok = false
				break
			}
			held = append(held, ln)
		}
		for _, ln := range held {
			ln.Close()
		}
		if ok {
			for k := range n {
				taken[p+k] = true
			}
			return p
		}
	}
	t.Fatalf("no %d consecutive free ports in 100 tries", n)
	return 0
}
