package rewrite

import (
	"github.com/twmb/franz-go/pkg/kbin"
)

// TopTagsSameSize rewrites the broker addresses in the top-level tag
// section of a Produce v10+ or Fetch v16+ response body (the KIP-951
// NodeEndpoints, tag 0), keeping the section exactly len(tags) bytes long.
// tags must be the whole section, from its count to the end of the body.
//
// It exists for a response relayed while it arrives: the frame's size
// prefix has already gone to the client when the section, the last bytes
// of the body, is read. To keep the size:
//   - a shorter rewrite is padded with one extra tagged field of a tag
//     number the response does not define (padTag); clients keep or skip
//     unknown tags, as KIP-482 requires;
//   - a rewrite that cannot be padded to the size (it is longer, or one
//     or two bytes shorter) has every node left out instead, as for a
//     broker the mapper omits (see [OmitBroker]): the partition's
//     CurrentLeader still names the leader, and the client falls back to
//     a Metadata request. That section is at least 10 bytes shorter per
//     node, so it always pads.
//
// The result is checked by walking it as pass one walks a response; no
// broker address leaves unmapped. A section without nodes is returned as
// is, unchanged.
func TopTagsSameSize(dst, tags []byte, m AddrMapper) (out []byte, changed bool, err error) {
	w := newRespWalker(tags)
	hasNodes := w.walkTopTags()
	if !w.Ok() || len(w.Src) != 0 {
		return nil, false, ErrMalformedResponse
	}
	if !hasNodes {
		return tags, false, nil
	}
	out, _, err = rewriteTopTags(dst, tags, 0, m)
	if err != nil {
		return nil, false, err
	}
	if fitted, ok := padTags(out, len(tags)); ok {
		out = fitted
	} else if out, ok = padTags(emptyNodes(tags), len(tags)); !ok {
		return nil, false, ErrMalformedResponse // cannot happen: see above
	}
	v := newRespWalker(out)
	v.walkTopTags()
	if !v.Ok() || len(v.Src) != 0 || len(out) != len(tags) {
		return nil, false, ErrMalformedResponse
	}
	return out, true, nil
}

// padTag is the tag number of the filler field. Fetch and Produce
// responses define only tag 0 at the top level.
const padTag = 127

// padTags grows the tag section sec to exactly size bytes with one filler
// field, or reports false when it cannot (sec is longer, or 1-2 bytes
// short). It may reuse sec's array.
func padTags(sec []byte, size int) ([]byte, bool) {
	d := size - len(sec)
	if d == 0 {
		return sec, true
	}
	if d < 0 {
		return nil, false
	}
	r := kbin.Reader{Src: sec}
	count := r.Uvarint()
	entries := r.Src
	head := kbin.AppendUvarint(nil, count+1)
	// head + entries + [padTag, len(v), v...] == size
	e := size - len(head) - len(entries) - 1 // bytes for len(v) and v
	for k := 1; k <= 5; k++ {
		v := e - k
		if v >= 0 && kbin.UvarintLen(uint32(v)) == k {
			out := make([]byte, 0, size)
			out = append(out, head...)
			out = append(out, entries...)
			out = append(out, padTag)
			out = kbin.AppendUvarint(out, uint32(v))
			out = append(out, make([]byte, v)...)
			return out, true
		}
	}
	return nil, false
}

// emptyNodes returns tags (a validated top-level tag section) with every
// NodeEndpoints array emptied; other tags are kept.
func emptyNodes(tags []byte) []byte {
	r := kbin.Reader{Src: tags}
	n := r.Uvarint()
	out := kbin.AppendUvarint(nil, n)
	for ; n > 0; n-- {
		key := r.Uvarint()
		val := r.Span(int(r.Uvarint()))
		out = kbin.AppendUvarint(out, key)
		if key == 0 {
			out = kbin.AppendUvarint(out, 1)
			out = kbin.AppendCompactArrayLen(out, 0)
			continue
		}
		out = kbin.AppendUvarint(out, uint32(len(val)))
		out = append(out, val...)
	}
	return out
}
