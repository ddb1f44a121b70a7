//go:build !linux

package proxy

import (
	"errors"
	"net"
	"syscall"
)

// splicer is Linux-only (splice(2)); elsewhere large responses take the
// copy path.
type splicer struct{}

func newSplicer() *splicer      { return &splicer{} }
func (sp *splicer) close()      {}
func (sp *splicer) open() error { return errors.ErrUnsupported }

func rawConns(dst, src net.Conn) (d, s syscall.RawConn, ok bool) { return nil, nil, false }

func (sp *splicer) move(dst, src syscall.RawConn, n int64) (int64, error, error) {
	return 0, nil, errors.ErrUnsupported
}

const spliceSupported = false

// tcpRawConn is nil here: connReader reads through the connection.
func tcpRawConn(net.Conn) syscall.RawConn { return nil }

func readFD(uintptr, []byte) (int, bool, error) { return 0, false, errors.ErrUnsupported }

// moreSender is Linux-only (MSG_MORE through a RawConn).
type moreSender struct{}

func (sp *splicer) sendMore(syscall.RawConn, []byte) error { return errors.ErrUnsupported }

func (ms *moreSender) sendMore(syscall.RawConn, []byte) error { return errors.ErrUnsupported }
