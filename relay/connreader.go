package relay

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
)

// ConnReader is a buffered reader of one connection, like bufio.Reader,
// whose buffer is taken from a pool shared by every connection when bytes
// arrive and given back whenever it holds none. An idle connection — most
// of a proxy's connections, most of the time — then holds no read buffer:
// a bufio.Reader of readBufferSize on each leg cost 64 KiB of address space
// per connection and most of the RSS of an idle one (docs/performance.md,
// "Idle connections").
//
// On a plain TCP connection (raw set) the bytes are read from the
// poller's callback: the buffer is taken just before the read and given
// back when the read finds nothing, so a goroutine parked waiting for
// bytes holds none. It costs the syscalls a net.Conn read costs (a read
// that finds nothing, the wait, the read). Other connections (TLS, a
// test's wrapper) read through conn, holding the buffer while they wait.
//
// Slices from Peek are valid until the next Read, Discard or Peek, as with
// bufio.
type ConnReader struct {
	conn    io.Reader       // a net.Conn, or in tests any reader
	raw     syscall.RawConn // nil: read through conn
	tracker *Tracker        // told of bytes read raw; nil on the broker leg

	buf  *[]byte // nil while empty
	r, w int     // buffered bytes are (*buf)[r:w]
	err  error   // sticky read error, returned once the buffer is drained
	// limit caps how many bytes one fill asks for; 0 is the whole buffer.
	// The Fetch walk sets it between record sets, which it splices, so a
	// fill does not pull a record set's first bytes through user space.
	limit int

	readFn func(fd uintptr) bool // made once: a closure per read would allocate
	held   *atomic.Int64         // the server's count of read buffers held; nil in tests
	got    int
	rerr   error
}

// readBufferSize is the buffer of each leg's reader while bytes are read.
const readBufferSize = 32 << 10

// readBufPool holds the connection read buffers, all of readBufferSize.
var readBufPool = sync.Pool{New: func() any {
	b := make([]byte, readBufferSize)
	return &b
}}

// NewConnReader reads conn; raw is conn's RawConn when it is plain TCP,
// else nil. tracker, if not nil, is what conn wraps and is told of the
// bytes read raw; held, if not nil, counts the read buffers held.
func NewConnReader(conn io.Reader, raw syscall.RawConn, tracker *Tracker, held *atomic.Int64) *ConnReader {
	cr := &ConnReader{conn: conn, raw: raw, tracker: tracker, held: held}
	if raw != nil {
		cr.readFn = cr.rawRead
	}
	return cr
}

// rawRead is the poller's callback: one read(2) into the buffer. It
// reports false (wait, then call again) when there is nothing to read, and
// gives the buffer back meanwhile if it holds nothing.
func (cr *ConnReader) rawRead(fd uintptr) bool {
	cr.take()
	b := (*cr.buf)[cr.w:]
	if cr.limit > 0 && len(b) > cr.limit {
		b = b[:cr.limit]
	}
	n, wait, err := readFD(fd, b)
	if wait {
		cr.releaseIfEmpty()
		return false
	}
	cr.got, cr.rerr = n, err
	return true
}

// take makes sure the reader has a buffer.
func (cr *ConnReader) take() {
	if cr.buf == nil {
		cr.buf = readBufPool.Get().(*[]byte)
		if cr.held != nil {
			cr.held.Add(1)
		}
	}
}

// releaseIfEmpty gives the buffer back when it holds no bytes.
func (cr *ConnReader) releaseIfEmpty() {
	if cr.buf != nil && cr.r == cr.w {
		cr.Close()
	}
}

// fill reads once into the buffer, after what it holds.
func (cr *ConnReader) fill() {
	if cr.buf != nil && cr.r > 0 && cr.r == cr.w {
		cr.r, cr.w = 0, 0
	}
	if cr.buf != nil && cr.w == len(*cr.buf) && cr.r > 0 {
		cr.w = copy(*cr.buf, (*cr.buf)[cr.r:cr.w])
		cr.r = 0
	}
	var n int
	var err error
	if cr.raw != nil {
		cr.got, cr.rerr = 0, nil
		err = cr.raw.Read(cr.readFn)
		if err == nil {
			n, err = cr.got, cr.rerr
			if err != nil {
				err = cr.opError(err)
			} else if n == 0 {
				err = io.EOF
			}
			if cr.tracker != nil {
				cr.tracker.sawRead((*cr.buf)[cr.w:cr.w+n], err)
			}
		}
	} else {
		cr.take()
		b := (*cr.buf)[cr.w:]
		if cr.limit > 0 && len(b) > cr.limit {
			b = b[:cr.limit]
		}
		n, err = cr.conn.Read(b)
	}
	cr.w += n
	if err != nil {
		cr.err = err
	}
	cr.releaseIfEmpty()
}

// opError wraps a read(2) error as net.Conn's Read would.
func (cr *ConnReader) opError(err error) error {
	op := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", err)}
	if c, ok := cr.conn.(net.Conn); ok {
		op.Source, op.Addr = c.LocalAddr(), c.RemoteAddr()
	}
	return op
}

// readErr returns and clears the sticky error.
func (cr *ConnReader) readErr() error {
	err := cr.err
	cr.err = nil
	return err
}

// Buffered is how many bytes can be read without a syscall.
func (cr *ConnReader) Buffered() int { return cr.w - cr.r }

// Read reads into p: what is buffered, or, with nothing buffered, one read
// (straight into p when p is at least as large as the buffer).
func (cr *ConnReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if cr.r == cr.w {
		if cr.err != nil {
			return 0, cr.readErr()
		}
		if len(p) >= readBufferSize && cr.limit == 0 {
			// Large reads bypass the buffer, as with bufio.
			cr.releaseIfEmpty()
			n, err := cr.conn.Read(p)
			return n, err
		}
		cr.fill()
		if cr.r == cr.w {
			return 0, cr.readErr()
		}
	}
	n := copy(p, (*cr.buf)[cr.r:cr.w])
	cr.r += n
	cr.releaseIfEmpty()
	return n, nil
}

// errPeekTooLarge is a Peek of more than the buffer holds.
var errPeekTooLarge = errors.New("proxy: peek larger than the read buffer")

// Peek returns the next n bytes without consuming them, reading as needed.
// Fewer come back only with an error.
func (cr *ConnReader) Peek(n int) ([]byte, error) {
	if n > readBufferSize {
		return nil, errPeekTooLarge
	}
	for cr.w-cr.r < n && cr.err == nil {
		if cr.buf != nil && len(*cr.buf)-cr.r < n {
			cr.w = copy(*cr.buf, (*cr.buf)[cr.r:cr.w])
			cr.r = 0
		}
		cr.fill()
	}
	if cr.w-cr.r < n {
		var b []byte
		if cr.buf != nil {
			b = (*cr.buf)[cr.r:cr.w]
		}
		return b, cr.readErr()
	}
	return (*cr.buf)[cr.r : cr.r+n], nil
}

// Discard skips the next n bytes, reading as needed.
func (cr *ConnReader) Discard(n int) (int, error) {
	done := 0
	for done < n {
		if cr.r == cr.w {
			if cr.err != nil {
				return done, cr.readErr()
			}
			cr.fill()
			continue
		}
		k := min(n-done, cr.w-cr.r)
		cr.r += k
		done += k
		cr.releaseIfEmpty()
	}
	return done, nil
}

// Close gives the buffer back, whatever it holds: the reader is not used
// again, or holds nothing.
func (cr *ConnReader) Close() {
	if cr.buf != nil {
		readBufPool.Put(cr.buf)
		cr.buf, cr.r, cr.w = nil, 0, 0
		if cr.held != nil {
			cr.held.Add(-1)
		}
	}
}
