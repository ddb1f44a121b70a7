package decide

import (
	"slices"
	"time"

	"github.com/dedupproxy/dedupproxy/decide/internal/lockcheck"
	"github.com/dedupproxy/dedupproxy/decide/sent"
	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// Kafka is the proxy's memory (docs/warm.md): a partition's tail holds what
// the tables would hold had the proxy seen its batches appended. TailRead
// applies one: idempotent batches fill the table, legacy records read on a
// partition's first read since start may answer for a resend after a
// restart, and batches whose outcome was unknown are looked for.

// logBatch is one legacy batch of a tail: its records' identities, which
// a batch looked for compares by its own identity (recHash with its
// exact).
type logBatch struct {
	base int64
	ids  []protocol.RecordID
}

// TailRead applies the tail of partition k, read from the log by the
// caller after Decide asked (ReadTails): records holds whole record
// batches in log order. It appends to wake the connections waiting on the
// partition.
func (c *Core) tailRead(k TailKey, records []byte, now time.Time, wake []ConnID) []ConnID {
	pk := partKeyOf(k.Topic, k.Partition)
	_, match, header := c.topicSettings(c.settings.Load(), k.Topic)
	ns := now.UnixNano()
	var (
		batches []logBatch
		logRecs []logRec
		ids     []protocol.RecordID
		keys    []protocol.RecordKey
	)
	first := false
	{
		p, sh := c.parts.get(pk)
		first = !p.warmed
		sh.unlock()
	}
	for len(records) > 0 {
		var bh protocol.BatchHeader
		if _, err := protocol.ReadBatch(records, &bh); err != nil {
			break
		}
		size := 12 + int(bh.Length)
		if size > len(records) {
			break // a partial batch at the end of the fetch
		}
		b := records[:size]
		records = records[size:]
		if bh.Magic < 2 || bh.IsControl() {
			continue
		}
		switch {
		case bh.ProducerID >= 0:
			// Fingerprint 0 (unknown) matches any retry: the broker may
			// have recompressed the batch, and then its records are not
			// the bytes the producer resends. The log cannot say which
			// principal wrote it: ANONYMOUS (docs/security.md).
			key := seqstate.Key{ProducerID: bh.ProducerID, Topic: k.Topic, Partition: k.Partition}
			batch := seqstate.Batch{Epoch: bh.ProducerEpoch, FirstSeq: bh.BaseSequence, Count: bh.LastOffsetDelta + 1}
			lockcheck.Take("producer table")
			c.table.CommitLogged(key, batch, bh.BaseOffset, bh.MaxTimestamp, now)
			lockcheck.Drop()
		case match != MatchOff:
			var err error
			ids = ids[:0]
			whole := false
			if ids, err = protocol.AppendRecordIDs(ids, b, &bh); err != nil {
				if err != protocol.ErrCompressed {
					break
				}
				ids, whole = append(ids, protocol.BatchID(b, &bh)), true
			}
			lb := logBatch{base: bh.BaseOffset, ids: slices.Clone(ids)}
			for j, id := range ids {
				if !first {
					continue
				}
				until := min(id.Timestamp*int64(time.Millisecond), ns) + c.legacy.Window
				if until > ns && (whole || len(ids) == int(bh.NumRecords)) {
					logRecs = append(logRecs, logRec{hash: mixTS(id.Hash, id.Timestamp), off: bh.BaseOffset + int64(j), until: until})
				}
			}
			batches = append(batches, lb)
		}
		if header != "" && c.keys != nil {
			var err error
			if keys, err = protocol.RecordKeys(keys[:0], b, &bh, header); err == nil {
				for j, rk := range keys {
					if rk.Present {
						lo, hi := keyOf(rk, seqstate.Key{Topic: k.Topic})
						lockcheck.Take("key table")
						c.keys.Commit(lo, hi, bh.BaseOffset+int64(j), now)
						lockcheck.Drop()
					}
				}
			}
		}
	}
	// Every record the read brought back within the window is kept (the
	// read is bounded by dedup.warm.max_bytes): a client whose connection
	// broke resends everything it had in flight, which against a slow
	// broker is thousands of records, and one cut from the history is
	// written again. max_records bounds one partition's history.
	if n := int(c.legacy.MaxRecords); len(logRecs) > n {
		logRecs = logRecs[len(logRecs)-n:]
	}
	p, sh := c.parts.get(pk)
	if first {
		p.log = logRecs
		p.logIdx = nil
		p.logUntil = 0
		for _, r := range logRecs {
			p.logUntil = max(p.logUntil, r.until)
		}
		if len(logRecs) > 0 {
			// Built backwards, so that each chain lists its records in log
			// order: identical records of a resend match theirs in order.
			p.logIdx = make(map[uint64]int32, len(logRecs))
			for j := len(logRecs) - 1; j >= 0; j-- {
				r := &logRecs[j]
				r.next = p.logIdx[r.hash]
				p.logIdx[r.hash] = int32(j + 1)
			}
		}
	}
	p.warmed = true
	unknowns := p.unknown
	p.unknown = nil
	sh.unlock()
	for _, ref := range unknowns {
		c.settleFromLog(ref, batches, true, ns)
	}
	return c.tailDone(pk, wake)
}

// tailDone marks partition k read and wakes its waiters, once the batches
// its read settles are settled.
func (c *Core) tailDone(k seqstate.Key, wake []ConnID) []ConnID {
	p, sh := c.parts.get(k)
	p.warm = warm
	wake = p.event(wake)
	sh.unlock()
	return wake
}

// TailFailed records that partition k's tail could not be read: its
// batches are decided without it, and batches whose outcome only it could
// tell are taken as not written (a retry of them is forwarded: at worst a
// duplicate, as without the proxy).
func (c *Core) tailFailed(k TailKey, now time.Time, wake []ConnID) []ConnID {
	pk := partKeyOf(k.Topic, k.Partition)
	p, sh := c.parts.get(pk)
	p.warmed = true
	unknowns := p.unknown
	p.unknown = nil
	sh.unlock()
	for _, ref := range unknowns {
		c.settleFromLog(ref, nil, false, now.UnixNano())
	}
	return c.tailDone(pk, wake)
}

// settleFromLog looks for batch ref's records sent upstream in the tail's
// batches: found, they were appended there; not found (or read is false),
// an unknown batch is taken as not written, and an appended one keeps its
// unknown offsets.
func (c *Core) settleFromLog(ref sent.Ref, batches []logBatch, read bool, ns int64) {
	b := ref.B
	in := b.Inst
	in.Lock()
	defer in.Unlock()
	if ref.Live() {
		c.settleLocked(b, batches, read, ns)
	}
}

// settleLocked is settleFromLog with b's instance locked.
func (c *Core) settleLocked(b *sent.Batch, batches []logBatch, read bool, ns int64) {
	want := func(r sent.Rec) bool {
		if b.Phase == sent.Unknown {
			return r.Off == sent.OffPending
		}
		return r.Off == sent.OffUnknown
	}
	var found *logBatch
	if read {
	search:
		for bi := range batches {
			lb := &batches[bi]
			if lb.base <= b.After {
				continue // appended before b was sent: another's
			}
			k := 0
			for _, r := range b.Recs {
				if !want(r) {
					continue
				}
				if k >= len(lb.ids) || recHash(lb.ids[k], b.Exact) != r.Hash {
					continue search
				}
				k++
			}
			if k == len(lb.ids) && k > 0 {
				found = lb
				break
			}
		}
	}
	k := int64(0)
	for j := range b.Recs {
		r := &b.Recs[j]
		if !want(*r) {
			continue
		}
		switch {
		case found != nil:
			r.Off = found.base + k
		case b.Phase == sent.Unknown:
			r.Hash = 0 // not written
		}
		k++
	}
	switch b.Phase {
	case sent.Unknown:
		b.Phase = sent.Appended
		b.Until = ns + c.legacy.Window
	case sent.Resolving:
		b.Phase = sent.Appended // its offsets found, or never to be
	}
}
