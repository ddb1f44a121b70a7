package relay

import (
	"crypto/tls"
	"net"

	"golang.org/x/sys/unix"
)

// Unacked returns how many bytes written to conn its peer's TCP stack has
// not yet acknowledged (SIOCOUTQ), and false when it cannot tell (a
// connection that is not TCP, an error).
func Unacked(conn net.Conn) (int, bool) {
	n, got := 0, false
	withFD(conn, func(fd int) {
		v, err := unix.IoctlGetInt(fd, unix.SIOCOUTQ)
		n, got = v, err == nil
	})
	return n, got
}

// PeerReset reports whether the peer of conn reset it: the connection's
// TCP state is closed (a received end of stream leaves it in CLOSE_WAIT).
// Read from TCP_INFO, not by a read: a read reports a reset once, and the
// reader of the connection must see it too.
func PeerReset(conn net.Conn) bool {
	reset := false
	withFD(conn, func(fd int) {
		info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
		reset = err == nil && info.State == tcpClose
	})
	return reset
}

// PeerGone reports whether the peer of conn has closed or reset it,
// whatever it sent before is still unread: the connection's TCP state is
// CLOSE_WAIT (its end of stream received) or CLOSE (reset). Read from
// TCP_INFO, which a peek cannot see past unread data.
func PeerGone(conn net.Conn) bool {
	gone := false
	withFD(conn, func(fd int) {
		info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
		gone = err == nil && (info.State == tcpCloseWait || info.State == tcpClose)
	})
	return gone
}

// Linux's TCP_CLOSE and TCP_CLOSE_WAIT states (include/net/tcp_states.h).
const (
	tcpClose     = 7
	tcpCloseWait = 8
)

// withFD runs fn with the descriptor of the TCP connection under conn's
// wrappers, if there is one. Control, not Read: it takes no read lock, so
// it never waits behind a read in progress.
func withFD(conn net.Conn, fn func(fd int)) {
	tc, ok := tcpOf(conn)
	if !ok {
		return
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return
	}
	raw.Control(func(fd uintptr) { fn(int(fd)) })
}

// tcpOf returns the TCP connection under conn's wrappers.
func tcpOf(conn net.Conn) (*net.TCPConn, bool) {
	for {
		switch c := conn.(type) {
		case *Tracker:
			conn = c.Conn
			continue
		case *tls.Conn:
			conn = c.NetConn()
			continue
		}
		break
	}
	tc, ok := conn.(*net.TCPConn)
	return tc, ok
}
