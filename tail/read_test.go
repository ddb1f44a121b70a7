package tail

import (
	"bytes"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// batch encodes a record batch of n records from base, as a Fetch answer
// carries it.
func batch(base int64, n int32) []byte {
	b := kmsg.RecordBatch{FirstOffset: base, LastOffsetDelta: n - 1, Magic: 2, ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1, NumRecords: n,
		Records: bytes.Repeat([]byte{0}, int(n))}
	raw := b.AppendTo(nil)
	// Length counts the bytes after the offset and the length fields.
	l := int32(len(raw) - 12)
	raw[8], raw[9], raw[10], raw[11] = byte(l>>24), byte(l>>16), byte(l>>8), byte(l)
	return raw
}

// TestWholeBatches: a fetch that ends inside a batch yields the whole
// batches before it, their number, and the offset after the last; nothing
// whole yields -1.
func TestWholeBatches(t *testing.T) {
	t.Parallel()
	a, b, c := batch(10, 3), batch(13, 2), batch(15, 4)
	fetched := append(append(append([]byte{}, a...), b...), c[:len(c)-1]...)
	whole, n, next := wholeBatches(fetched)
	if n != 2 || next != 15 || !bytes.Equal(whole, fetched[:len(a)+len(b)]) {
		t.Fatalf("got %d batches, next %d, %d bytes; want 2, 15, %d", n, next, len(whole), len(a)+len(b))
	}
	if whole, n, next := wholeBatches(c[:20]); n != 0 || next != -1 || len(whole) != 0 {
		t.Fatalf("a partial batch alone: %d batches, next %d, %d bytes", n, next, len(whole))
	}
}
