package proxy

import (
	"time"

	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// Idempotency keys (docs/legacy.md): on topics that opt in, a record header
// names the logical operation a record carries. A legacy record whose key
// was written to its topic within dedup.keys.ttl is dropped before it goes
// upstream; in an idempotent batch a repeated key is only counted, since
// dropping a record would break its producer's sequence numbers.

// keyHeaderFor returns the idempotency key header of an interned topic.
func (pn *planner) keyHeaderFor(topic seqstate.TopicID) (string, bool) {
	ds := pn.settings.Load()
	if pn.keys == nil || len(ds.keyHeader) == 0 {
		return "", false
	}
	name, ok := pn.table.TopicName(topic)
	if !ok {
		return "", false
	}
	h, ok := ds.keyHeader[name]
	return h, ok
}

// topicKey mixes the topic and the principal into a record key: the same
// key on two topics, or from two principals, is two keys.
func topicKey(k protocol.RecordKey, key seqstate.Key) (lo, hi uint64) {
	return k.Lo ^ (uint64(key.Topic)+1)*0x9e3779b97f4a7c15, k.Hi ^ (uint64(key.Principal)+1)*0xbf58476d1ce4e5b9
}

// applyKeys reads the idempotency keys of decision i's batch, headed for
// upstream, and drops (legacy, drop true) or counts (idempotent) the records
// whose key was written within the TTL. A legacy batch left with no record
// is answered with the first record's original offset; one left with some
// is rebuilt without the others (actRebatch, answered with offset -1).
func (pn *planner) applyKeys(pl *producePlan, i int, part *protocol.ProducePartition, bh *protocol.BatchHeader, header string, drop bool, now time.Time) {
	d := &pl.decisions[i]
	start := len(pl.keys)
	keys, err := protocol.RecordKeys(pl.keys, part.Records, bh, header)
	if err != nil {
		// Compressed (or malformed: the broker will say so): the keys
		// cannot be read without decompressing the records.
		pn.metrics.passthrough[passKeysCompressed].Inc()
		return
	}
	pl.keys = keys
	for range keys[start:] {
		pl.drops = append(pl.drops, false)
	}
	d.keysAt, d.keysEnd = start, len(keys)
	known, firstOff := 0, int64(-1)
	for j := start; j < len(keys); j++ {
		if !keys[j].Present {
			continue
		}
		lo, hi := topicKey(keys[j], d.key)
		off, ok := pn.keys.Lookup(lo, hi, now)
		if !ok {
			continue
		}
		known++
		pl.drops[j] = drop
		if j == start {
			firstOff = off
		}
	}
	if known == 0 {
		return
	}
	if !drop {
		pn.metrics.keysObserved.Add(float64(known))
		return
	}
	pn.metrics.keysDropped.Add(float64(known))
	if known == len(keys)-start {
		// Nothing left to write: answered like a duplicate, and the
		// batch's own registration is released.
		if d.pending {
			pn.legacy.Release(d.ident, pl.conn)
			pn.pending.Add(-1)
		}
		d.pending, d.commit, d.keysEnd = false, false, d.keysAt
		d.act = actAnswer
		d.local = protocol.LocalPartitionResult{BaseOffset: firstOff, LogAppendTime: -1, LogStartOffset: pn.logStart.get(d.key)}
		return
	}
	at := len(pl.rebuilt)
	out, err := protocol.DropRecords(pl.rebuilt, part.Records, bh, pl.drops[start:])
	if err != nil {
		for j := start; j < len(keys); j++ {
			pl.drops[j] = false
		}
		return
	}
	pl.rebuilt = out
	d.act, d.keyDrop = actRebatch, true
	d.rebuiltAt, d.rebuiltEnd = at, len(out)
}

// commitKeys remembers the keys of decision d's records the broker appended
// at base (-1 if unknown); dropped records are skipped, so the others are
// numbered as in the batch that went upstream.
func (pn *planner) commitKeys(pl *producePlan, d *produceDecision, base int64, now time.Time) {
	delta := int64(0)
	for j := d.keysAt; j < d.keysEnd; j++ {
		if pl.drops[j] {
			continue
		}
		if k := pl.keys[j]; k.Present {
			off := int64(-1)
			if base >= 0 {
				off = base + delta
			}
			lo, hi := topicKey(k, d.key)
			pn.keys.Commit(lo, hi, off, now)
		}
		delta++
	}
}
