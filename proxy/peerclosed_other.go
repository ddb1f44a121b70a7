//go:build !linux

package proxy

import "net"

// unacked cannot tell without Linux's SIOCOUTQ: false.
func unacked(net.Conn) (int, bool) { return 0, false }

// peerReset cannot tell without Linux's non-blocking peek: false.
func peerReset(net.Conn) bool { return false }

// peerGone cannot tell without Linux's TCP_INFO: false.
func peerGone(net.Conn) bool { return false }
