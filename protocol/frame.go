package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// DefaultMaxFrameSize is Kafka's socket.request.max.bytes default (100 MiB).
const DefaultMaxFrameSize = 100 << 20

var (
	// ErrFrameTooLarge is returned for a size prefix above the configured maximum.
	ErrFrameTooLarge = errors.New("protocol: frame too large")
	// ErrFrameSize is returned for a size prefix that is negative or too small to hold a header.
	ErrFrameSize = errors.New("protocol: invalid frame size")
	// ErrLooksLikeTLS is returned when the first bytes of a connection are a TLS handshake:
	// the client speaks TLS to a plaintext listener.
	ErrLooksLikeTLS = errors.New("protocol: client sent a TLS handshake to a plaintext Kafka listener")
	// ErrLooksLikeHTTP is returned when the first bytes of a connection are an HTTP request.
	ErrLooksLikeHTTP = errors.New("protocol: client sent HTTP to a Kafka listener")
)

// minRequestSize is api key + api version + correlation id + client id length.
const minRequestSize = 2 + 2 + 4 + 2

// minResponseSize is the correlation id.
const minResponseSize = 4

// ReadFrame reads one size-prefixed frame from r into buf (grown when too
// small) and returns its body, which aliases buf[4:]: buf[:4+len(body)] is the
// whole frame with its size prefix, ready to forward as it came. The returned
// buffer (buf, possibly grown) should be reused for the next call.
//
// minSize is the smallest body accepted: use [RequestMinSize] for requests
// and [ResponseMinSize] for responses. A bad size prefix is diagnosed: the
// first bytes of a TLS handshake or of an HTTP request get an error saying so,
// like kgo's parseReadSize.
//
// The buffer grows only as bytes arrive, never to the declared size up
// front: a peer that declares a 100 MiB frame and sends 1 KiB pins a few KiB,
// not 100 MiB (the size prefix costs nothing to send). When buf is already
// large enough, as in the steady state of a reused buffer, ReadFrame does
// not allocate.
func ReadFrame(r io.Reader, buf []byte, maxSize int32, minSize int32) (body, newBuf []byte, err error) {
	if cap(buf) < 4 {
		buf = make([]byte, 4096)
	}
	buf = buf[:cap(buf)]
	if _, err := io.ReadFull(r, buf[:4]); err != nil {
		return nil, buf, err
	}
	size, err := CheckSize(buf[:4], maxSize, minSize)
	if err != nil {
		return nil, buf, err
	}
	frameLen := 4 + int(size)
	have := 4
	for {
		// Fill what the buffer holds, then grow it twofold (at most to
		// the largest frame) and go on: every allocation is backed by
		// bytes that arrived, and frames of slowly rising size do not
		// reallocate (and zero) a buffer each time.
		end := min(frameLen, len(buf))
		n, err := io.ReadFull(r, buf[have:end])
		have += n
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, buf, fmt.Errorf("read frame body of %d bytes (%d read): %w", size, have-4, err)
		}
		if have == frameLen {
			return buf[4:frameLen], buf, nil
		}
		grown := make([]byte, min(2*len(buf), 4+int(maxSize)))
		copy(grown, buf[:have])
		buf = grown
	}
}

// RequestMinSize and ResponseMinSize are the minSize arguments of [ReadFrame].
const (
	RequestMinSize  = minRequestSize
	ResponseMinSize = minResponseSize
)

// CheckSize validates a 4-byte size prefix and returns the size.
func CheckSize(head []byte, maxSize, minSize int32) (int32, error) {
	size := int32(binary.BigEndian.Uint32(head))
	switch {
	case looksLikeTLS(head):
		return 0, ErrLooksLikeTLS
	case looksLikeHTTP(head):
		return 0, ErrLooksLikeHTTP
	case size > maxSize:
		return 0, fmt.Errorf("%w: %d bytes, maximum %d", ErrFrameTooLarge, size, maxSize)
	case size < minSize:
		return 0, fmt.Errorf("%w: %d bytes", ErrFrameSize, size)
	}
	return size, nil
}

// looksLikeTLS matches a TLS record header: content type 22 (handshake)
// followed by protocol version 3.x.
func looksLikeTLS(head []byte) bool {
	return head[0] == 0x16 && head[1] == 0x03 && head[2] <= 0x04
}

// looksLikeHTTP matches the first four bytes of the common HTTP methods.
func looksLikeHTTP(head []byte) bool {
	switch string(head) {
	case "GET ", "POST", "PUT ", "HEAD", "DELE", "OPTI", "PATC", "CONN", "PRI ", "HTTP":
		return true
	}
	return false
}

// AppendFrame appends body with its 4-byte size prefix to dst.
func AppendFrame(dst, body []byte) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(body)))
	return append(dst, body...)
}
