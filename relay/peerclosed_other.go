//go:build !linux

package relay

import "net"

// Unacked cannot tell without Linux's SIOCOUTQ: false.
func Unacked(net.Conn) (int, bool) { return 0, false }

// PeerReset cannot tell without Linux's non-blocking peek: false.
func PeerReset(net.Conn) bool { return false }

// PeerGone cannot tell without Linux's TCP_INFO: false.
func PeerGone(net.Conn) bool { return false }
