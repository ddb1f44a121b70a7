package proxy

import (
	"time"

	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// Records of an unacknowledged append (docs/legacy.md). A legacy batch the
// broker appended but answered with an error (REQUEST_TIMED_OUT,
// NOT_ENOUGH_REPLICAS_AFTER_APPEND) leaves a client that holds no
// acknowledgement and resends the records. Most resend the same batch (rule
// 5), librdkafka a superset (rebatch.go); sarama puts them back in its queue
// behind newer records, so they come back in other batches, at other
// positions, and no batch identity matches. Their stamps (the record's
// timestamp, key, value and headers, not its position) are read back from
// the log when the partition is next touched (the error made it forget the
// partition, warm.go) and kept for the legacy window; a forwarded legacy
// batch is then checked record by record and the resent records are not
// written twice.

// maxUnackedRecords caps the stamps kept (40 bytes each): errors after an
// append are rare, and their records few.
const maxUnackedRecords = 1 << 16

// unackedLive reports whether some stamps may still be live.
func (pn *planner) unackedLive(now time.Time) bool {
	return now.UnixNano() < pn.unackedUntil.Load() && pn.unacked.Load() != nil
}

// unackedTable returns the stamps' table, made on first use: most proxies
// never need it.
func (pn *planner) unackedTable() *seqstate.KeyTable {
	pn.unackedOnce.Do(func() {
		t, err := seqstate.NewKeyTable(seqstate.KeyConfig{MaxKeys: maxUnackedRecords, TTL: pn.unackedTTL})
		if err == nil {
			pn.unacked.Store(t)
		}
	})
	return pn.unacked.Load()
}

// rememberUnacked keeps the stamps of the records of batch b, read from
// partition k's log at its base offset, for the window after now.
func (pn *planner) rememberUnacked(k seqstate.Key, b []byte, bh *protocol.BatchHeader, stamps []protocol.RecordKey, now time.Time) []protocol.RecordKey {
	table := pn.unackedTable()
	if table == nil {
		return stamps
	}
	stamps, err := protocol.RecordStamps(stamps[:0], b, bh)
	if err != nil {
		return stamps // compressed: its records cannot be read one by one
	}
	for i, st := range stamps {
		lo, hi := topicKey(st, k) // k.Principal 0: read from the log, only ANONYMOUS resends match
		table.Commit(lo, hi, bh.BaseOffset+int64(i), now)
	}
	until := now.Add(pn.legacyWindow).UnixNano()
	for {
		cur := pn.unackedUntil.Load()
		if cur >= until || pn.unackedUntil.CompareAndSwap(cur, until) {
			return stamps
		}
	}
}

// applyResent drops from decision i's legacy batch, headed upstream, the
// records of an unacknowledged append it carries again. A batch left with
// none is answered with the original offset of its first record when its
// records were written together in that order, -1 otherwise; one left with
// some is rebuilt without the others (actRebatch, answered with offset -1).
func (pn *planner) applyResent(pl *producePlan, i int, part *protocol.ProducePartition, bh *protocol.BatchHeader, now time.Time) {
	d := &pl.decisions[i]
	start := len(pl.keys)
	stamps, err := protocol.RecordStamps(pl.keys, part.Records, bh)
	if err != nil {
		return // compressed or malformed: forwarded whole, the broker decides
	}
	// The stamps borrow the plan's key buffers only for this decision: they
	// are not idempotency keys, and commitKeys must never see them.
	defer func() { pl.keys, pl.drops = pl.keys[:start], pl.drops[:start] }()
	pl.keys = stamps
	table := pn.unacked.Load() // not nil: unackedLive
	known, base, together := 0, int64(-1), true
	for j := start; j < len(stamps); j++ {
		lo, hi := topicKey(stamps[j], d.key)
		off, ok := table.Take(lo, hi, now) // each stamp answers for one resend
		pl.drops = append(pl.drops, ok)
		if !ok {
			continue
		}
		if known == 0 {
			base = off
		}
		together = together && off >= 0 && base >= 0 && off == base+int64(j-start)
		known++
	}
	if known == 0 {
		return
	}
	pn.metrics.resentDropped.Add(float64(known))
	pl.retried = true
	if known == len(stamps)-start {
		if d.pending {
			pn.legacy.Release(d.ident, pl.conn)
			pn.pending.Add(-1)
		}
		d.pending, d.commit = false, false
		if !together {
			base = -1
		}
		d.act = actAnswer
		d.local = protocol.LocalPartitionResult{BaseOffset: base, LogAppendTime: -1, LogStartOffset: pn.logStart.get(d.key)}
		pn.metrics.dupAnswered[dupByProxy].Inc()
		return
	}
	at := len(pl.rebuilt)
	out, err := protocol.DropRecords(pl.rebuilt, part.Records, bh, pl.drops[start:])
	if err != nil {
		return
	}
	pl.rebuilt = out
	d.act, d.keyDrop = actRebatch, true
	d.rebuiltAt, d.rebuiltEnd = at, len(out)
}
