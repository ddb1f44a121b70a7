package proxy

import (
	"crypto/tls"
	"errors"
	"net"
	"syscall"
)

// peerClosed reports whether the client behind conn has closed (or reset)
// its connection with nothing of it left unread in the kernel: a one-byte
// peek that does not wait returns end of stream. False when it cannot
// tell (data waiting, a connection that is not TCP, an error).
func peerClosed(conn net.Conn) bool {
	for {
		switch c := conn.(type) {
		case *requestTracker:
			conn = c.Conn
			continue
		case *tls.Conn:
			conn = c.NetConn()
			continue
		}
		break
	}
	tc, ok := conn.(*net.TCPConn)
	if !ok {
		return false
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	var b [1]byte
	// Control, not Read: it takes no read lock, so it never waits behind
	// a read in progress.
	raw.Control(func(fd uintptr) {
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		closed = n == 0 && err == nil || errors.Is(err, syscall.ECONNRESET)
	})
	return closed
}
