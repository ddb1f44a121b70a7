package proxy

import (
	"io"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// recordPipe holds one hole's record bytes in the kernel (holes.go): they go
// socket to pipe with splice(2) as the request is read, and pipe to socket
// when it is forwarded, never through the proxy's memory.
type recordPipe struct{ r, w int }

// pipePool holds a server's pipes: made on demand, a few kept idle, and
// bounded in number so that clients cannot run the process out of file
// descriptors (a request that finds none reads its bytes instead).
type pipePool struct {
	mu    sync.Mutex
	idle  []*recordPipe
	inUse int
}

const (
	maxIdlePipes  = 16
	maxPipesInUse = 256
)

func (pp *pipePool) get() *recordPipe {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	if pp.inUse >= maxPipesInUse {
		return nil
	}
	var p *recordPipe
	if n := len(pp.idle); n > 0 {
		p = pp.idle[n-1]
		pp.idle = pp.idle[:n-1]
	} else {
		var fds [2]int
		if syscall.Pipe2(fds[:], syscall.O_CLOEXEC|syscall.O_NONBLOCK) != nil {
			return nil
		}
		p = &recordPipe{r: fds[0], w: fds[1]}
		// 1 MiB (the default pipe-max-size), so that a batch of the
		// default max.message.bytes fits; the kernel may give less, and
		// what does not fit is read instead.
		unix.FcntlInt(uintptr(p.w), unix.F_SETPIPE_SZ, splicePipeSize)
	}
	pp.inUse++
	return p
}

// put gives p back: kept when empty and there is room, else closed
// (closing drops any bytes left in it).
func (pp *pipePool) put(p *recordPipe, empty bool) {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	pp.inUse--
	if empty && len(pp.idle) < maxIdlePipes {
		pp.idle = append(pp.idle, p)
		return
	}
	syscall.Close(p.r)
	syscall.Close(p.w)
}

// inUseNow is how many pipes hold holes now (tests).
func (pp *pipePool) inUseNow() int {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	return pp.inUse
}

// close closes the idle pipes (Server.Close).
func (pp *pipePool) close() {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	for _, p := range pp.idle {
		syscall.Close(p.r)
		syscall.Close(p.w)
	}
	pp.idle = nil
}

// holeMover moves a hole's bytes; one per connection, so that the callbacks
// given to RawConn.Read and Write are made once.
type holeMover struct {
	p         *recordPipe
	want, got int
	full      bool // the pipe took no more while the socket had bytes
	err       error
	fill      func(fd uintptr) bool
	drain     func(fd uintptr) bool
}

func newHoleMover() *holeMover {
	m := &holeMover{}
	const flags = spliceMove | spliceNonblock
	m.fill = func(fd uintptr) bool {
		n, err := splice(int(fd), m.p.w, m.want, flags)
		switch {
		case err == syscall.EAGAIN:
			// Nothing to read, or the pipe is full: the socket's queue
			// tells them apart. Waiting for the socket to be readable
			// would spin on a full pipe.
			if q, e := unix.IoctlGetInt(int(fd), unix.SIOCINQ); e == nil && q > 0 {
				m.full = true
				return true
			}
			return false
		case err != nil:
			m.err = err
		case n == 0:
			m.err = io.ErrUnexpectedEOF // the client closed inside the request
		}
		m.got = n
		return true
	}
	m.drain = func(fd uintptr) bool {
		n, err := splice(m.p.r, int(fd), m.want, flags)
		if err == syscall.EAGAIN {
			return false // the socket's send buffer is full: wait
		}
		if err == nil && n == 0 {
			err = io.ErrShortWrite // bytes are in the pipe; never loop on it
		}
		m.got, m.err = n, err
		return true
	}
	return m
}

// in splices up to n bytes from the socket src into p. It stops short, with
// no error, when the pipe is full; progress is called after each move.
func (m *holeMover) in(src syscall.RawConn, p *recordPipe, n int, progress func()) (moved int, err error) {
	m.p, m.full = p, false
	defer func() { m.p = nil }()
	for moved < n && !m.full {
		m.want, m.got, m.err = min(n-moved, splicePipeSize), 0, nil
		if err := src.Read(m.fill); err != nil {
			return moved, err
		}
		if m.err != nil {
			return moved, m.err
		}
		moved += m.got
		progress()
	}
	return moved, nil
}

// out splices n bytes from p into the socket dst.
func (m *holeMover) out(dst syscall.RawConn, p *recordPipe, n int) error {
	m.p = p
	defer func() { m.p = nil }()
	for n > 0 {
		m.want, m.got, m.err = n, 0, nil
		if err := dst.Write(m.drain); err != nil {
			return err
		}
		if m.err != nil {
			return m.err
		}
		n -= m.got
	}
	return nil
}

// readPipe reads exactly len(b) bytes that are in p.
func readPipe(p *recordPipe, b []byte) error {
	for len(b) > 0 {
		n, err := syscall.Read(p.r, b)
		switch {
		case err == syscall.EINTR:
			continue
		case err != nil:
			return err
		case n == 0:
			return io.ErrUnexpectedEOF
		}
		b = b[n:]
	}
	return nil
}

// mapRequest returns a private anonymous mapping of n bytes for a request
// with holes, or nil: the hole pages are never written, so they take no
// memory.
func mapRequest(n int) []byte {
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil
	}
	return b
}

const holesSupported = true
