package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrMalformedProduce is returned for a Produce request body that does not parse.
var ErrMalformedProduce = errors.New("protocol: malformed produce request")

// ProduceAcks returns the acks field of a Produce request frame whose header
// was parsed into h. acks=0 means the broker sends no response at all, so the
// proxy must not wait for one.
//
// Produce v0–v2 start the body with acks; v3+ put a transactional id before it,
// a compact nullable string from v9 (flexible) on.
func ProduceAcks(frame []byte, h RequestHeader) (int16, error) {
	off := h.BodyOffset
	if off == 0 || off > len(frame) {
		return 0, fmt.Errorf("%w: no body", ErrMalformedProduce)
	}
	if h.APIVersion >= 3 {
		if IsFlexible(h.APIKey, h.APIVersion) {
			n, next, err := uvarint(frame, off)
			if err != nil {
				return 0, fmt.Errorf("%w: transactional id: %v", ErrMalformedProduce, err)
			}
			off = next
			if n > 0 { // compact strings store length+1; 0 is null
				if n-1 > uint64(len(frame)-off) {
					return 0, fmt.Errorf("%w: transactional id truncated", ErrMalformedProduce)
				}
				off += int(n - 1)
			}
		} else {
			if len(frame)-off < 2 {
				return 0, fmt.Errorf("%w: transactional id truncated", ErrMalformedProduce)
			}
			n := int(int16(binary.BigEndian.Uint16(frame[off:])))
			off += 2
			if n > 0 {
				if n > len(frame)-off {
					return 0, fmt.Errorf("%w: transactional id truncated", ErrMalformedProduce)
				}
				off += n
			}
		}
	}
	if len(frame)-off < 2 {
		return 0, fmt.Errorf("%w: acks truncated", ErrMalformedProduce)
	}
	return int16(binary.BigEndian.Uint16(frame[off:])), nil
}
