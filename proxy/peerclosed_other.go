//go:build !linux

package proxy

import "net"

// peerClosed cannot tell without Linux's non-blocking peek: false.
func peerClosed(net.Conn) bool { return false }
