package relay

import (
	"bytes"
	"io"
	"math/rand/v2"
	"testing"
	"testing/iotest"
)

// TestConnReaderMatchesStream: whatever the mix of Read, Peek and Discard
// and however the source splits its bytes, a ConnReader returns the
// stream's bytes in order, and holds no buffer once it has handed out all
// it read.
func TestConnReaderMatchesStream(t *testing.T) {
	data := make([]byte, 300<<10)
	for i := range data {
		data[i] = byte(i * 7)
	}
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 1))
		var src io.Reader = bytes.NewReader(data)
		if seed%2 == 1 {
			src = iotest.HalfReader(src)
		}
		cr := NewConnReader(src, nil, nil, nil)
		pos := 0
		for pos < len(data) {
			n := 1 + rng.IntN(40<<10)
			switch rng.IntN(3) {
			case 0:
				buf := make([]byte, n)
				k, err := io.ReadFull(cr, buf[:min(n, len(data)-pos)])
				if err != nil || !bytes.Equal(buf[:k], data[pos:pos+k]) {
					t.Fatalf("seed %d: read at %d: %v", seed, pos, err)
				}
				pos += k
			case 1:
				n = min(n, readBufferSize, len(data)-pos)
				b, err := cr.Peek(n)
				if err != nil || !bytes.Equal(b, data[pos:pos+n]) {
					t.Fatalf("seed %d: peek %d at %d: %v", seed, n, pos, err)
				}
			case 2:
				n = min(n, len(data)-pos)
				if k, err := cr.Discard(n); err != nil || k != n {
					t.Fatalf("seed %d: discard %d at %d: %d, %v", seed, n, pos, k, err)
				}
				pos += n
			}
			if cr.Buffered() == 0 && cr.buf != nil {
				t.Fatalf("seed %d: an empty reader holds its buffer", seed)
			}
		}
		if _, err := cr.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("seed %d: read at the end: %v, want EOF", seed, err)
		}
	}
}
