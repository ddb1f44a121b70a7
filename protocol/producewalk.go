package protocol

import (
	"encoding/binary"
	"math"
)

// ProduceWalker finds, while a Produce request is still arriving, the record
// bytes a relay does not need in memory: the records of a partition whose
// records field is exactly one v2 batch of an idempotent producer (producer
// id >= 0), from the end of its 61-byte header, when at least minHole bytes
// of them are still to come. The decision core decides such a batch from its
// header alone (RecordsFingerprint derives the records' CRC from the
// header's), so the proxy can move those bytes socket to socket and read
// them only when it must answer the batch itself (docs/produce-path.md,
// "Record bytes that never enter the proxy").
//
// It only finds bytes; it validates nothing. Anything it does not expect (not
// a Produce, an unknown version, a length that does not fit) ends the walk,
// and the caller reads the rest of the request into memory, where the
// scanner judges it as usual. Offsets are in the frame's body: the bytes
// after its 4-byte size, request header included.
type ProduceWalker struct {
	size, minHole int
	flexible      bool
	topicIDs      bool
	stage         walkStage
	off           int // where the current stage's bytes start
	topics, parts int // left to walk
	recStart      int // the current records field
	recEnd        int
}

type walkStage uint8

const (
	walkHeader    walkStage = iota // request header
	walkRequest                    // transactional id, acks, timeout, topic count
	walkTopic                      // name or ID, partition count
	walkPartition                  // index, records length
	walkRecords                    // the records: a hole, or bytes to read
	walkPartTags
	walkTopicTags
	walkReqTags
	walkDone
)

// Reset starts a walk of a request body of size bytes.
func (w *ProduceWalker) Reset(size, minHole int) {
	*w = ProduceWalker{size: size, minHole: max(minHole, 1)}
}

// Next tells the caller what to do with the body, given b, the first len(b)
// bytes of it (the bytes of earlier holes are never read, and may be
// anything). Exactly one of its results is set:
//   - need > len(b): read the body up to offset need, then call Next again;
//   - hole > 0: the hole body[len(b):len(b)+hole] may be kept out of memory;
//     call Next again once len(b) has moved past it, whether the caller kept
//     it out or read it;
//   - done: nothing more will be found; read the rest of the body.
func (w *ProduceWalker) Next(b []byte) (need, hole int, done bool) {
	for w.stage != walkDone {
		if w.stage == walkRecords {
			if need, hole, ok := w.records(b); !ok {
				return need, hole, false
			}
			continue
		}
		// A stage reads its fields whole or not at all: on a short read
		// it starts again from w.off with more bytes.
		c := walkCursor{b: b, off: w.off}
		next, topics, parts := w.stage, w.topics, w.parts
		switch w.stage {
		case walkHeader:
			h := c.fixed(8)
			if h == nil {
				break
			}
			maxV, _ := KnownAPI(0)
			v := int16(binary.BigEndian.Uint16(h[2:]))
			if binary.BigEndian.Uint16(h) != 0 || v < ProduceMinVersion || v > maxV {
				return w.end()
			}
			w.flexible, w.topicIDs = v >= produceFirstFlexible, v >= produceFirstTopicID
			c.bytes(false, 2) // client id: never compact (KIP-482)
			if w.flexible {
				c.tags()
			}
			next = walkRequest
		case walkRequest:
			c.bytes(w.flexible, 2) // transactional id
			c.fixed(6)             // acks, timeout
			topics = c.count(w.flexible)
			next = walkTopic
		case walkTopic:
			if topics == 0 {
				if !w.flexible {
					return w.end()
				}
				next = walkReqTags
				break
			}
			if w.topicIDs {
				c.fixed(16)
			} else {
				c.bytes(w.flexible, 2)
			}
			parts = c.count(w.flexible)
			topics--
			next = walkPartition
		case walkPartition:
			if parts == 0 {
				next = walkTopic
				if w.flexible {
					next = walkTopicTags
				}
				break
			}
			c.fixed(4) // index
			n := c.length(w.flexible, 4)
			parts--
			w.recStart, w.recEnd = c.off, c.off+max(n, 0)
			next = walkRecords
		case walkPartTags, walkTopicTags, walkReqTags:
			c.tags()
			switch w.stage {
			case walkPartTags:
				next = walkPartition
			case walkTopicTags:
				next = walkTopic
			default:
				next = walkDone
			}
		}
		if c.bad || c.short > w.size {
			return w.end()
		}
		if c.short > 0 {
			return c.short, 0, false
		}
		w.off, w.stage, w.topics, w.parts = c.off, next, topics, parts
	}
	return 0, 0, true
}

// records handles the records field [recStart, recEnd): a hole when it is
// one idempotent batch with enough bytes still to come, else bytes to read.
// ok is false when the caller has something to do.
func (w *ProduceWalker) records(b []byte) (need, hole int, ok bool) {
	have, n := len(b), w.recEnd-w.recStart
	if w.recEnd > w.size {
		w.stage = walkDone
		return 0, 0, true
	}
	if n >= batchHeaderSize+w.minHole && have < w.recEnd {
		if have < w.recStart+batchHeaderSize {
			return w.recStart + batchHeaderSize, 0, false // its header first
		}
		h := b[w.recStart : w.recStart+batchHeaderSize]
		if h[batchMagicOffset] == 2 &&
			int(int32(binary.BigEndian.Uint32(h[batchLengthOffset:])))+batchLogOverhead == n &&
			int64(binary.BigEndian.Uint64(h[batchProducerIDOffset:])) >= 0 &&
			w.recEnd-have >= w.minHole {
			w.off, w.stage = w.recEnd, w.afterRecords()
			return 0, w.recEnd - have, false
		}
	}
	w.off, w.stage = w.recEnd, w.afterRecords()
	if have < w.recEnd {
		return w.recEnd, 0, false
	}
	return 0, 0, true
}

func (w *ProduceWalker) end() (need, hole int, done bool) {
	w.stage = walkDone
	return 0, 0, true
}

func (w *ProduceWalker) afterRecords() walkStage {
	if w.flexible {
		return walkPartTags
	}
	return walkPartition
}

// walkCursor reads fields from the bytes at hand. short is the body length
// the field it stopped at needs (0 when none did); bad marks a field that no
// request can hold.
type walkCursor struct {
	b     []byte
	off   int
	short int
	bad   bool
}

func (c *walkCursor) stopped() bool { return c.short > 0 || c.bad }

func (c *walkCursor) fixed(n int) []byte {
	if c.stopped() {
		return nil
	}
	if len(c.b)-c.off < n {
		c.short = c.off + n
		return nil
	}
	c.off += n
	return c.b[c.off-n : c.off]
}

func (c *walkCursor) uvarint() int {
	if c.stopped() {
		return 0
	}
	v, n := binary.Uvarint(c.b[min(c.off, len(c.b)):])
	switch {
	case n == 0:
		c.short = len(c.b) + 1
		return 0
	case n < 0 || v > math.MaxInt32:
		c.bad = true
		return 0
	}
	c.off += n
	return int(v)
}

// length reads a nullable length: an int16 or int32 (width), or when flexible
// a uvarint of length+1. It returns -1 for null.
func (c *walkCursor) length(flexible bool, width int) int {
	var n int
	if flexible {
		n = c.uvarint() - 1
	} else if b := c.fixed(width); b != nil {
		if width == 2 {
			n = int(int16(binary.BigEndian.Uint16(b)))
		} else {
			n = int(int32(binary.BigEndian.Uint32(b)))
		}
	}
	if c.stopped() {
		return 0
	}
	if n < -1 {
		c.bad = true
	}
	return n
}

// bytes skips a nullable string or bytes field.
func (c *walkCursor) bytes(flexible bool, width int) {
	if n := c.length(flexible, width); n > 0 {
		c.fixed(n)
	}
}

// count reads an array length; null counts as empty.
func (c *walkCursor) count(flexible bool) int {
	return max(c.length(flexible, 4), 0)
}

// tags skips a KIP-482 tagged-field section.
func (c *walkCursor) tags() {
	for n := c.uvarint(); n > 0 && !c.stopped(); n-- {
		c.uvarint() // tag
		if size := c.uvarint(); size > 0 {
			c.fixed(size)
		}
	}
}
