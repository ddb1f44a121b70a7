// Package testports finds blocks of consecutive free TCP ports on loopback
// for tests that must know a proxy's ports before it starts: replicas
// advertise each other's addresses, and a replica restarted must come back
// on the same ones. Nothing here is for production.
//
// It lives under internal/ because three packages use it in their tests:
// proxy, e2e and cmd/dedupproxy.
package testports

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// Block returns a port P such that P..P+n-1 were all free on 127.0.0.1 a
// moment ago and none is in taken; it adds them to taken. Another process
// may take one before the caller binds it: callers that can, bind them at
// once and hand the listeners over.
//
// The block is taken below the kernel's ephemeral range when there is room
// there: every listener on port 0 and every outgoing connection of every
// test running beside this one takes its port from that range, so a block
// inside it can be taken between this call and the bind (a replica test
// once failed with "address already in use" so). Below it only other
// callers of Block compete, and they start at random places.
func Block(t testing.TB, n int, taken map[int]bool) int {
	t.Helper()
	if lo := ephemeralLow(); lo-lowest > 4*n {
		for range 100 {
			p := lowest + rand.IntN(lo-lowest-n)
			if tryBlock(p, n, taken) {
				return p
			}
		}
	}
	for range 100 {
		first, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := first.Addr().(*net.TCPAddr).Port
		first.Close()
		if tryBlock(p, n, taken) {
			return p
		}
	}
	t.Fatalf("no %d consecutive free ports in 100 tries", n)
	return 0
}

// lowest is the lowest port Block hands out below the ephemeral range:
// well above the ports of services a test machine may run.
const lowest = 20000

// tryBlock binds p..p+n-1 on 127.0.0.1 and lets them go; if every bind
// succeeded and none is in taken, it adds them to taken.
func tryBlock(p, n int, taken map[int]bool) bool {
	if p <= 0 || p+n > 65536 {
		return false
	}
	var held []net.Listener
	defer func() {
		for _, ln := range held {
			ln.Close()
		}
	}()
	for k := range n {
		if taken[p+k] {
			return false
		}
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+k))
		if err != nil {
			return false
		}
		held = append(held, ln)
	}
	for k := range n {
		taken[p+k] = true
	}
	return true
}

// ephemeralLow is the first port of the kernel's ephemeral range (Linux;
// 0 where it cannot be read, which keeps Block inside the range).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil {
		return 0
	}
	return lo
}
