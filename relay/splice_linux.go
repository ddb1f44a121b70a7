package relay

import (
	"errors"
	"io"
	"net"
	"syscall"
)

// splicer moves bytes from one TCP socket to another through a kernel pipe
// with splice(2), so record bytes of large responses never enter user
// space. It is what (*net.TCPConn).ReadFrom does with an io.LimitedReader,
// with one difference we need: when the write side fails, the caller learns
// exactly how many bytes were taken from the source, so it can skip the
// rest of the frame and keep reading the responses behind it (a client that
// left must not make the proxy lose its in-flight Produce outcomes).
//
// A splicer belongs to one goroutine (responseLoop). The pipe is made on
// first use and closed by close.
type splicer struct {
	r, w int // pipe ends; -1 until made

	// The callbacks given to RawConn.Read and Write, made once: a func
	// literal capturing locals would be allocated on every call.
	fill, drain func(fd uintptr) bool
	want        int   // bytes the next callback moves at most
	moved       int   // bytes it moved
	err         error // its error

	MoreSender
}

// moreSender writes with MSG_MORE (sendMore); one goroutine's.
type MoreSender struct {
	send func(fd uintptr) bool // made once: a closure per write would allocate
	out  []byte                // what send writes
	sent int
	serr error
}

// splicePipeSize asks for a pipe of 1 MiB (the default is 64 KiB, which
// would take 16 round trips per MiB); the kernel may refuse, which only
// costs syscalls.
const splicePipeSize = 1 << 20

func newSplicer() *splicer {
	sp := &splicer{r: -1, w: -1}
	const flags = spliceMove | spliceNonblock
	sp.fill = func(fd uintptr) bool {
		sp.moved, sp.err = splice(int(fd), sp.w, sp.want, flags)
		return sp.err != syscall.EAGAIN
	}
	sp.drain = func(fd uintptr) bool {
		sp.moved, sp.err = splice(sp.r, int(fd), sp.want, flags)
		return sp.err != syscall.EAGAIN
	}
	return sp
}

// sendMore writes b to dst with MSG_MORE: TCP keeps the bytes for the
// segment of what follows (a splice of records) instead of sending these
// few alone, each small segment a wake-up of the receiver on loopback.
// It honours dst's write deadline.
func (ms *MoreSender) sendMore(dst syscall.RawConn, b []byte) error {
	if ms.send == nil {
		ms.send = func(fd uintptr) bool {
			for {
				n, err := syscall.SendmsgN(int(fd), ms.out, nil, nil, syscall.MSG_MORE|syscall.MSG_DONTWAIT)
				switch err {
				case syscall.EINTR:
					continue
				case syscall.EAGAIN:
					return false
				}
				ms.sent, ms.serr = max(n, 0), err
				return true
			}
		}
	}
	for len(b) > 0 {
		ms.out, ms.sent, ms.serr = b, 0, nil
		err := dst.Write(ms.send)
		ms.out = nil
		if err == nil {
			err = ms.serr
		}
		if err != nil {
			return err
		}
		b = b[ms.sent:]
	}
	return nil
}

func (sp *splicer) open() error {
	// Made once per session that relays a large frame, kept until it ends.
	if sp.r >= 0 {
		return nil
	}
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC|syscall.O_NONBLOCK); err != nil {
		return err
	}
	sp.r, sp.w = p[0], p[1]
	const fSetPipeSz = 1031 // F_SETPIPE_SZ; not in package syscall
	syscall.Syscall(syscall.SYS_FCNTL, uintptr(sp.w), fSetPipeSz, splicePipeSize)
	return nil
}

func (sp *splicer) close() {
	if sp.r >= 0 {
		syscall.Close(sp.r)
		syscall.Close(sp.w)
		sp.r, sp.w = -1, -1
	}
}

// errSpliceEOF is the source closing inside a frame.
var errSpliceEOF = errors.New("connection closed inside a frame")

// rawConns returns the syscall.RawConn of two plain TCP connections, or
// ok false when either is something else (TLS, a test's wrapper): those
// take the copy path.
func RawConns(dst, src net.Conn) (d, s syscall.RawConn, ok bool) {
	dt, ok1 := dst.(*net.TCPConn)
	st, ok2 := src.(*net.TCPConn)
	if !ok1 || !ok2 {
		return nil, nil, false
	}
	d, err1 := dt.SyscallConn()
	s, err2 := st.SyscallConn()
	return d, s, err1 == nil && err2 == nil
}

// move splices n bytes from src to dst. taken is how many bytes were
// consumed from src; srcErr is set when src failed (the frame cannot be
// finished), dstErr when dst failed (taken bytes were dropped; the caller
// skips the rest of the frame on src). Both honour the connections'
// deadlines, since the waits go through Go's poller.
func (sp *splicer) move(dst, src syscall.RawConn, n int64) (taken int64, srcErr, dstErr error) {
	if err := sp.open(); err != nil {
		return 0, nil, err // nothing taken: the caller copies instead
	}
	for taken < n {
		sp.want = int(min(n-taken, splicePipeSize))
		err := src.Read(sp.fill)
		if err == nil {
			err = sp.err
		}
		if err == nil && sp.moved == 0 {
			err = errSpliceEOF
		}
		if err != nil {
			return taken, err, nil
		}
		got := sp.moved
		taken += int64(got)
		for got > 0 {
			sp.want = got
			err := dst.Write(sp.drain)
			if err == nil {
				err = sp.err
			}
			if err == nil && sp.moved == 0 {
				err = io.ErrShortWrite // cannot happen with bytes in the pipe; never loop on it
			}
			if err != nil {
				// What is left in the pipe is dropped with it; the
				// next move makes a fresh one.
				sp.close()
				return taken, nil, err
			}
			got -= sp.moved
		}
	}
	return taken, nil, nil
}

const (
	spliceMove     = 0x1 // SPLICE_F_MOVE
	spliceNonblock = 0x2 // SPLICE_F_NONBLOCK
)

func splice(in, out, n, flags int) (int, error) {
	for {
		m, err := syscall.Splice(in, nil, out, nil, n, flags)
		if err == syscall.EINTR {
			continue
		}
		return int(m), err
	}
}

const SpliceSupported = true

// tcpRawConn returns the syscall.RawConn of a plain TCP connection, or nil.
func TCPRawConn(c net.Conn) syscall.RawConn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// readFD is one read(2) for ConnReader's raw path: n bytes, or wait true
// when there is nothing to read yet.
func readFD(fd uintptr, b []byte) (n int, wait bool, err error) {
	for {
		n, err := syscall.Read(int(fd), b)
		switch err {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return 0, true, nil
		}
		return max(n, 0), false, err
	}
}
