//go:build !linux

package relay

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

func RawConns(dst, src net.Conn) (d, s syscall.RawConn, ok bool) { return nil, nil, false }

func (sp *splicer) move(dst, src syscall.RawConn, n int64) (int64, error, error) {
	return 0, nil, errors.ErrUnsupported
}

const SpliceSupported = false

// TCPRawConn is nil here: ConnReader reads through the connection.
func TCPRawConn(net.Conn) syscall.RawConn { return nil }

func readFD(uintptr, []byte) (int, bool, error) { return 0, false, errors.ErrUnsupported }

// moreSender is Linux-only (MSG_MORE through a RawConn).
type MoreSender struct{}

func (sp *splicer) sendMore(syscall.RawConn, []byte) error { return errors.ErrUnsupported }

func (ms *MoreSender) sendMore(syscall.RawConn, []byte) error { return errors.ErrUnsupported }
