package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ErrProduceResponse is returned by [MergeProduceResponse] when the upstream
// response does not decode or does not answer a partition sent upstream.
var ErrProduceResponse = errors.New("protocol: produce response does not match request")

// ReduceProduce appends to dst a Produce request body at the same version,
// with the same request-level fields, holding only the partitions for which
// keep(topicIndex, partitionIndex) is true, in their original order; topics
// left with no partition are dropped. It returns dst and the number of
// partitions kept. keep is called once per partition, in request order.
//
// Kept entries are copied as bytes, tagged fields included (KIP-482), so
// nothing the proxy does not understand is lost and no kmsg decode runs: this
// happens for every request mixing new batches with ones the proxy answers
// itself. With enough capacity in dst it does not allocate. On error dst is
// returned unchanged and the error wraps [ErrMalformedProduce].
func ReduceProduce(dst, body []byte, version int16, keep func(topicIndex, partitionIndex int) bool) ([]byte, int, error) {
	return RewriteProduce(dst, body, version, func(ti, pi int) (bool, []byte) { return keep(ti, pi), nil })
}

// RewriteProduce is ReduceProduce where decide may also replace a kept
// partition's records: a non-nil records is written instead of the
// partition's own (the proxy's rebuilt batch of a re-batched retry, see
// DropLeadingRecords), its other fields and tags copied as they came.
func RewriteProduce(dst, body []byte, version int16, decide func(topicIndex, partitionIndex int) (keep bool, records []byte)) ([]byte, int, error) {
	var s ProduceScanner
	if err := s.Reset(body, version); err != nil {
		return dst, 0, err
	}
	start := len(dst)
	dst = append(dst, body[:s.topicsOff]...)
	topicsCountAt := len(dst)
	dst = reserveCount(dst, s.flexible)
	var (
		nTopics, kept int
		curTopic      = -1
		open          bool // the current topic's entry is started in dst
		partsCountAt  int
		nParts        int
		lastEnd       int // end in body of the current topic's latest partition
	)
	for s.Next() {
		p := s.Partition()
		if p.TopicIndex != curTopic {
			if open {
				dst = closeTopic(dst, body, partsCountAt, nParts, lastEnd, s.flexible)
			}
			curTopic, open = p.TopicIndex, false
		}
		lastEnd = p.end
		keep, records := decide(p.TopicIndex, p.PartitionIndex)
		if !keep {
			continue
		}
		if !open {
			dst = append(dst, body[p.topicStart:p.partsOff]...) // name or ID
			partsCountAt = len(dst)
			dst = reserveCount(dst, s.flexible)
			open, nParts = true, 0
			nTopics++
		}
		if records == nil {
			dst = append(dst, body[p.start:p.end]...)
		} else {
			dst = append(dst, body[p.start:p.start+4]...) // partition index
			if s.flexible {
				dst = kbin.AppendUvarint(dst, uint32(len(records)+1))
			} else {
				dst = binary.BigEndian.AppendUint32(dst, uint32(len(records)))
			}
			dst = append(dst, records...)
			dst = append(dst, body[p.recordsEnd:p.end]...) // tags
		}
		nParts++
		kept++
	}
	if err := s.Err(); err != nil {
		return dst[:start], 0, err
	}
	if open {
		dst = closeTopic(dst, body, partsCountAt, nParts, lastEnd, s.flexible)
	}
	if s.flexible {
		dst = append(dst, body[s.tagsOff:]...)
	}
	dst = putCount(dst, topicsCountAt, nTopics, s.flexible)
	return dst, kept, nil
}

// closeTopic fills in a topic's partition count and copies its tagged fields,
// which follow its last partition (lastEnd) in body.
func closeTopic(dst, body []byte, countAt, n, lastEnd int, flexible bool) []byte {
	if flexible {
		end, _ := skipTags(body, lastEnd) // the scanner already walked it
		dst = append(dst, body[lastEnd:end]...)
	}
	return putCount(dst, countAt, n, flexible)
}

// reserveCount appends room for an array length: an int32, or one byte of
// compact (uvarint length+1) length, which putCount widens if needed.
func reserveCount(dst []byte, flexible bool) []byte {
	if flexible {
		return append(dst, 0)
	}
	return append(dst, 0, 0, 0, 0)
}

// putCount writes array length n at at, where reserveCount left room. A
// compact length above 126 needs more than the one reserved byte, so the bytes
// after it are shifted; that is rare (127+ partitions of one topic in one
// request) and cheaper than a counting pre-pass on every request.
func putCount(dst []byte, at, n int, flexible bool) []byte {
	if !flexible {
		binary.BigEndian.PutUint32(dst[at:], uint32(n))
		return dst
	}
	var tmp [5]byte
	enc := kbin.AppendUvarint(tmp[:0], uint32(n+1))
	if len(enc) == 1 {
		dst[at] = enc[0]
		return dst
	}
	old := len(dst)
	dst = append(dst, enc[1:]...)
	copy(dst[at+len(enc):], dst[at+1:old])
	copy(dst[at:], enc)
	return dst
}

// LocalPartitionResult is the proxy's own answer for one partition.
//
// For a duplicate Kafka answers error 0 with the original batch's base offset
// and, as log append time, the original batch's max timestamp (even on
// CreateTime topics), plus the current log start offset
// (UnifiedLog.analyzeAndValidateProducerState; docs/kafka-rules.md §4). For
// OUT_OF_ORDER_SEQUENCE_NUMBER and INVALID_PRODUCER_EPOCH it answers offsets
// -1 but the real log start offset, which franz-go uses to tell a reset from
// data loss.
type LocalPartitionResult struct {
	ErrorCode      int16
	BaseOffset     int64
	LogAppendTime  int64 // on the wire from v2
	LogStartOffset int64 // on the wire from v5
}

// MergeProduceResponse appends to dst the Produce response body (what follows
// the response header) answering the client's request body at version. For a
// partition the proxy answered, local(topicIndex, partitionIndex) returns its
// result and true; every other partition is taken from upstream, the
// upstream's response body to the [ReduceProduce] request (nil when nothing
// went upstream).
//
// Topics and partitions appear in the client's request order, so a client
// that matches answers by position still works; upstream answers are matched
// by topic (name, or ID from v13, KIP-516) and partition, taking repeats in
// order. Throttle time, the KIP-951 NodeEndpoints and unknown top-level tags
// come from upstream. A partition missing from upstream is an error wrapping
// [ErrProduceResponse]. This is the rare path, so it decodes and encodes with
// kmsg.
func MergeProduceResponse(dst []byte, version int16, body []byte, upstream []byte, local func(ti, pi int) (LocalPartitionResult, bool)) ([]byte, error) {
	type key struct {
		name string
		id   [16]byte
		part int32
	}
	up := kmsg.NewPtrProduceResponse()
	up.Version = version
	var fromUp map[key][]*kmsg.ProduceResponseTopicPartition
	if upstream != nil {
		if err := up.ReadFrom(upstream); err != nil {
			return dst, fmt.Errorf("%w: upstream v%d response: %v", ErrProduceResponse, version, err)
		}
		fromUp = make(map[key][]*kmsg.ProduceResponseTopicPartition)
		for i := range up.Topics {
			t := &up.Topics[i]
			for j := range t.Partitions {
				p := &t.Partitions[j]
				k := key{t.Topic, t.TopicID, p.Partition}
				if version >= produceFirstTopicID {
					k.name = ""
				} else {
					k.id = [16]byte{}
				}
				fromUp[k] = append(fromUp[k], p)
			}
		}
	}
	out := kmsg.NewPtrProduceResponse()
	out.Version = version
	out.ThrottleMillis = up.ThrottleMillis
	out.Brokers = up.Brokers
	out.UnknownTags = up.UnknownTags

	var s ProduceScanner
	if err := s.Reset(body, version); err != nil {
		return dst, err
	}
	curTopic := -1
	for s.Next() {
		p := s.Partition()
		if p.TopicIndex != curTopic {
			curTopic = p.TopicIndex
			t := kmsg.NewProduceResponseTopic()
			t.Topic = string(p.Topic)
			t.TopicID = p.TopicID
			out.Topics = append(out.Topics, t)
		}
		t := &out.Topics[len(out.Topics)-1]
		if r, ok := local(p.TopicIndex, p.PartitionIndex); ok {
			rp := kmsg.NewProduceResponseTopicPartition()
			rp.Partition = p.Partition
			rp.ErrorCode = r.ErrorCode
			rp.BaseOffset = r.BaseOffset
			rp.LogAppendTime = r.LogAppendTime
			rp.LogStartOffset = r.LogStartOffset
			t.Partitions = append(t.Partitions, rp)
			continue
		}
		k := key{id: p.TopicID, part: p.Partition}
		if version < produceFirstTopicID {
			k.name = string(p.Topic)
		}
		q := fromUp[k]
		if len(q) == 0 {
			return dst, fmt.Errorf("%w: v%d: upstream did not answer topic %d (%q / %x) partition %d", ErrProduceResponse, version, p.TopicIndex, p.Topic, p.TopicID, p.Partition)
		}
		t.Partitions = append(t.Partitions, *q[0])
		fromUp[k] = q[1:]
	}
	if err := s.Err(); err != nil {
		return dst, err
	}
	return out.AppendTo(dst), nil
}

// AppendResponseHeader appends a response header to dst so the proxy can frame
// a response it built: the correlation id and, for flexible versions (response
// header v1, KIP-482), an empty tagged-field section. ApiVersions responses
// always use header v0 so that a client that does not yet know the broker's
// versions can read them (KIP-511).
func AppendResponseHeader(dst []byte, key, version int16, correlationID int32) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(correlationID))
	if key != int16(kmsg.ApiVersions) && IsFlexible(key, version) {
		dst = append(dst, 0)
	}
	return dst
}
