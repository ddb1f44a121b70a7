package protocol

import (
	"encoding/binary"
	"fmt"
)

// ProduceResponseScanner walks a Produce response body (v3 and up) partition
// by partition without allocating, so the proxy can commit or release each
// batch it forwarded without decoding the whole response with kmsg on every
// Produce. Topics and partitions come in the broker's order.
type ProduceResponseScanner struct {
	b        []byte
	off      int
	version  int16
	flexible bool

	topicsLeft, partsLeft int
	inTopic               bool // the current topic's trailing tags are unread
	topic                 []byte
	topicID               [16]byte
	p                     ProduceResponsePartition
	err                   error
}

// ProduceResponsePartition is one partition's answer.
type ProduceResponsePartition struct {
	Topic          []byte   // v3–12; aliases the body
	TopicID        [16]byte // v13+
	Partition      int32
	ErrorCode      int16
	BaseOffset     int64
	LogAppendTime  int64
	LogStartOffset int64 // -1 before v5
}

// Reset starts a walk over body at version.
func (s *ProduceResponseScanner) Reset(body []byte, version int16) error {
	*s = ProduceResponseScanner{b: body, version: version, flexible: IsFlexible(0, version)}
	if version < 3 {
		s.err = fmt.Errorf("%w: produce response v%d", ErrUnsupportedVersion, version)
		return s.err
	}
	n, off, ok := readArrayLen(body, 0, s.flexible, 2)
	if !ok {
		return s.fail("topics")
	}
	s.topicsLeft, s.off = n, off
	return nil
}

func (s *ProduceResponseScanner) fail(what string) error {
	s.err = fmt.Errorf("%w: produce response v%d: %s at byte %d", ErrMalformedResponse, s.version, what, s.off)
	s.topicsLeft, s.partsLeft, s.inTopic = 0, 0, false
	return s.err
}

// Next advances to the next partition; false at the end or on error.
func (s *ProduceResponseScanner) Next() bool {
	if s.err != nil {
		return false
	}
	for {
		if s.partsLeft > 0 {
			return s.readPartition()
		}
		if s.inTopic { // the topic's partitions are done: its tags
			if !s.skipTags() {
				return false
			}
			s.inTopic = false
		}
		if s.topicsLeft == 0 {
			return false
		}
		s.topicsLeft--
		if !s.readTopic() {
			return false
		}
	}
}

func (s *ProduceResponseScanner) readTopic() bool {
	if s.version >= 13 {
		if len(s.b)-s.off < 16 {
			s.fail("topic id")
			return false
		}
		copy(s.topicID[:], s.b[s.off:])
		s.off += 16
		s.topic = nil
	} else {
		name, off, ok := readNullable(s.b, s.off, s.flexible, 2)
		if !ok {
			s.fail("topic name")
			return false
		}
		s.topic, s.off = name, off
	}
	n, off, ok := readArrayLen(s.b, s.off, s.flexible, 14)
	if !ok {
		s.fail("partitions")
		return false
	}
	s.off, s.partsLeft, s.inTopic = off, n, true
	return true
}

func (s *ProduceResponseScanner) readPartition() bool {
	b, off := s.b, s.off
	need := 4 + 2 + 8 + 8
	if s.version >= 5 {
		need += 8
	}
	if len(b)-off < need {
		s.fail("partition")
		return false
	}
	p := &s.p
	p.Topic, p.TopicID = s.topic, s.topicID
	p.Partition = int32(binary.BigEndian.Uint32(b[off:]))
	p.ErrorCode = int16(binary.BigEndian.Uint16(b[off+4:]))
	p.BaseOffset = int64(binary.BigEndian.Uint64(b[off+6:]))
	p.LogAppendTime = int64(binary.BigEndian.Uint64(b[off+14:]))
	p.LogStartOffset = -1
	off += 22
	if s.version >= 5 {
		p.LogStartOffset = int64(binary.BigEndian.Uint64(b[off:]))
		off += 8
	}
	s.off = off
	if s.version >= 8 {
		n, off, ok := readArrayLen(b, s.off, s.flexible, 4)
		if !ok {
			s.fail("record errors")
			return false
		}
		s.off = off
		for range n {
			if len(b)-s.off < 4 {
				s.fail("record error")
				return false
			}
			s.off += 4 // batch index
			if _, off, ok := readNullable(b, s.off, s.flexible, 2); !ok {
				s.fail("record error message")
				return false
			} else {
				s.off = off
			}
			if s.flexible && !s.skipTags() {
				return false
			}
		}
		if _, off, ok := readNullable(b, s.off, s.flexible, 2); !ok {
			s.fail("error message")
			return false
		} else {
			s.off = off
		}
	}
	if s.flexible && !s.skipTags() {
		return false
	}
	s.partsLeft--
	return true
}

func (s *ProduceResponseScanner) skipTags() bool {
	if !s.flexible {
		return true
	}
	off, err := skipTags(s.b, s.off)
	if err != nil {
		s.fail("tagged fields")
		return false
	}
	s.off = off
	return true
}

// Partition returns the current partition; valid until the next call to Next.
func (s *ProduceResponseScanner) Partition() *ProduceResponsePartition { return &s.p }

// Err returns the error that stopped the walk, if any.
func (s *ProduceResponseScanner) Err() error { return s.err }
