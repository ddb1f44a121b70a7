//go:build !linux

package proxy

import (
	"errors"
	"syscall"
)

// Holes need splice(2): elsewhere every request is read whole.
type recordPipe struct{}

type holeMover struct{}

func newHoleMover() *holeMover                                   { return &holeMover{} }
func readPipe(*recordPipe, []byte) error                         { return errors.ErrUnsupported }
func (m *holeMover) out(syscall.RawConn, *recordPipe, int) error { return errors.ErrUnsupported }
func (m *holeMover) in(syscall.RawConn, *recordPipe, int, func()) (int, error) {
	return 0, errors.ErrUnsupported
}

const holesSupported = false

type pipePool struct{}

func (pp *pipePool) get() *recordPipe          { return nil }
func (pp *pipePool) put(*recordPipe, bool)     {}
func (pp *pipePool) inUseNow() int             { return 0 }
func (pp *pipePool) close()                    {}
func (pp *pipePool) mapping(int) ([]byte, int) { return nil, 0 }
func (pp *pipePool) keepMapping([]byte, int)   {}
