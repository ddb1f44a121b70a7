package relay

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
//
// It also keeps the mappings of requests with holes for reuse: a fresh
// mapping per request cost a page fault for every page written into it and,
// when it was unmapped, a TLB flush on every thread, together a fifth of the
// proxy's CPU with produce_splice (docs/performance.md).
type PipePool struct {
	mu    sync.Mutex
	idle  []*recordPipe
	inUse int
	maps  []requestMapping // idle
}

// requestMapping is a kept mapping and how many of its pages were written
// since it was last emptied: its hole pages never were, so it holds about
// that much memory.
type requestMapping struct {
	b     []byte
	dirty int
}

const (
	maxIdlePipes  = 16
	maxPipesInUse = 256
	// maxIdleMappings and keptDirtyPages bound what idle mappings hold:
	// at most 4 × 256 KiB.
	maxIdleMappings = 4
	keptDirtyPages  = 64
)

func (pp *PipePool) get() *recordPipe {
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
func (pp *PipePool) put(p *recordPipe, empty bool) {
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

// InUse is how many pipes hold holes now.
func (pp *PipePool) InUse() int {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	return pp.inUse
}

// Close closes the idle pipes and unmaps the idle mappings, once every
// connection ended.
func (pp *PipePool) Close() {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	for _, p := range pp.idle {
		syscall.Close(p.r)
		syscall.Close(p.w)
	}
	pp.idle = nil
	for _, m := range pp.maps {
		syscall.Munmap(m.b)
	}
	pp.maps = nil
}

// mapping returns a private anonymous mapping of at least n bytes for a
// request with holes, and how many of its pages hold bytes, or nil. An idle
// one is reused; a new one is sized to n's class (largeClass), so that
// requests of about the same size share it. Unwritten pages take no memory.
// A reused mapping's hole pages hold whatever an earlier request left: they
// are only ever read after being filled.
func (pp *PipePool) mapping(n int) (b []byte, dirty int) {
	pp.mu.Lock()
	for i := len(pp.maps) - 1; i >= 0; i-- {
		if m := pp.maps[i]; len(m.b) >= n {
			pp.maps = append(pp.maps[:i], pp.maps[i+1:]...)
			pp.mu.Unlock()
			return m.b, m.dirty
		}
	}
	pp.mu.Unlock()
	b, err := syscall.Mmap(-1, 0, largeClass(n), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil, 0
	}
	return b, 0
}

// keepMapping takes back a mapping from mapping, dirty pages of it written.
// One that holds more than keptDirtyPages is emptied first (MADV_DONTNEED:
// its pages go back to the system and read as zeros); beyond
// maxIdleMappings it is unmapped.
func (pp *PipePool) keepMapping(b []byte, dirty int) {
	if dirty > keptDirtyPages {
		if unix.Madvise(b, unix.MADV_DONTNEED) != nil {
			syscall.Munmap(b)
			return
		}
		dirty = 0
	}
	pp.mu.Lock()
	if len(pp.maps) < maxIdleMappings {
		pp.maps = append(pp.maps, requestMapping{b: b, dirty: dirty})
		pp.mu.Unlock()
		return
	}
	pp.mu.Unlock()
	syscall.Munmap(b)
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

const HolesSupported = true
