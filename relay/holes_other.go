//go:build !linux

package relay

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

const HolesSupported = false

type PipePool struct{}

func (pp *PipePool) get() *recordPipe          { return nil }
func (pp *PipePool) put(*recordPipe, bool)     {}
func (pp *PipePool) InUse() int                { return 0 }
func (pp *PipePool) Close()                    {}
func (pp *PipePool) mapping(int) ([]byte, int) { return nil, 0 }
func (pp *PipePool) keepMapping([]byte, int)   {}
