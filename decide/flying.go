package decide

import (
	"time"

	"github.com/dedupproxy/dedupproxy/decide/internal/lockcheck"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// flyingBatch is an idempotent batch still on its way to the broker that
// the table does not hold as pending: its registration went with a refused
// earlier batch of its producer, or with a producer the table forgot
// (seqstate.Table.SettleBatchesDropped), or it was forwarded without one
// (flyUnregistered). The broker may still append it, so until its own
// answer a resend of it waits, as a resend of any batch in flight does
// (docs/produce-path.md, "Idempotent batches"). Two copies of one batch
// flying at once are kept as one: the first answer lands it.
type flyingBatch struct {
	key   seqstate.Key
	batch seqstate.Batch
	until int64 // ns: past it, its answer is taken as never coming
}

// maxFlying bounds the flying batches a partition keeps; past it one is
// not kept, and a resend of it goes to the broker, which decides.
const maxFlying = 64

// flyingFor is how long a flying batch is kept at most: the longest wait
// for an outcome (its request's timeout is not known here).
const flyingFor = maxWaitTimeout + waitMargin

// settleTable applies outs to the table, keeps as flying the pending
// batches an abort took with it, and forgets as flying the batches of
// outs (their outcome is known, or they never went upstream), but for a
// resend's own registration aborted while it waits for its original.
// The caller wakes the partitions of outs afterwards.
func (c *Core) settleTable(pl *Plan, outs []seqstate.Outcome, now time.Time) {
	if len(outs) == 0 {
		return
	}
	lockcheck.Take("producer table")
	pl.dropped = c.table.SettleBatchesDropped(outs, now, pl.dropped[:0])
	lockcheck.Drop()
	for _, d := range pl.dropped {
		c.fly(d.Key, d.Batch, now)
	}
	pl.dropped = pl.dropped[:0]
	if c.flying.Load() == 0 {
		return
	}
	for i := range outs {
		if !pl.resendOf(outs[i].Key, outs[i].Batch) {
			c.land(outs[i].Key, outs[i].Batch, now)
		}
	}
}

// resendOf reports whether b of key k is a part of pl that waits for a
// flying batch, its own registration aborted: the original is still
// flying.
func (pl *Plan) resendOf(k seqstate.Key, b seqstate.Batch) bool {
	for i := range pl.st {
		if st := &pl.st[i]; st.flying && st.key == k && st.batch == b {
			return true
		}
	}
	return false
}

// fly keeps b of key k as flying.
func (c *Core) fly(k seqstate.Key, b seqstate.Batch, now time.Time) {
	p, sh := c.parts.get(partKeyOf(k.Topic, k.Partition))
	defer sh.unlock()
	c.pruneFlying(p, now)
	for i := range p.flying {
		if f := &p.flying[i]; f.key == k && f.batch == b {
			f.until = now.UnixNano() + int64(flyingFor)
			return
		}
	}
	if len(p.flying) >= maxFlying {
		return
	}
	p.flying = append(p.flying, flyingBatch{key: k, batch: b, until: now.UnixNano() + int64(flyingFor)})
	c.flying.Add(1)
}

// land forgets b of key k as flying: its outcome is settled.
func (c *Core) land(k seqstate.Key, b seqstate.Batch, now time.Time) {
	p, sh := c.parts.get(partKeyOf(k.Topic, k.Partition))
	defer sh.unlock()
	c.pruneFlying(p, now)
	for i := range p.flying {
		if f := &p.flying[i]; f.key == k && f.batch == b {
			p.flying = append(p.flying[:i], p.flying[i+1:]...)
			c.flying.Add(-1)
			return
		}
	}
}

// pruneFlying drops p's flying batches past their time; call with p's
// shard locked.
func (c *Core) pruneFlying(p *partition, now time.Time) {
	ns := now.UnixNano()
	kept := p.flying[:0]
	for _, f := range p.flying {
		if f.until > ns {
			kept = append(kept, f)
		}
	}
	if n := len(p.flying) - len(kept); n > 0 {
		clear(p.flying[len(kept):])
		c.flying.Add(int64(-n))
	}
	p.flying = kept
}

// awaitFlying reports whether b of key k is flying, and if so registers
// conn as waiting on its partition, under the same lock: its answer,
// settled after this, wakes conn. Records of other bytes under the same
// sequences (a fingerprint that differs) are not the flying batch.
func (c *Core) awaitFlying(k seqstate.Key, b seqstate.Batch, conn ConnID, now time.Time) bool {
	if c.flying.Load() == 0 {
		return false
	}
	p, sh := c.parts.get(partKeyOf(k.Topic, k.Partition))
	defer sh.unlock()
	c.pruneFlying(p, now)
	for _, f := range p.flying {
		if f.key == k && f.batch.Epoch == b.Epoch && f.batch.FirstSeq == b.FirstSeq && f.batch.Count == b.Count &&
			(f.batch.Fingerprint == 0 || b.Fingerprint == 0 || f.batch.Fingerprint == b.Fingerprint) {
			p.await(conn)
			return true
		}
	}
	return false
}

// flyUnregistered keeps as flying the idempotent batches of a decided
// request that go upstream without a registration in the table (decided
// out of order or fenced, where the table's view may be behind the
// broker's, or an acks=1 resend of a batch in flight): the broker may
// append them, so a resend of one waits for its answer too. Their answer,
// a lost connection or an unsent request lands them (settleIdempotent).
func (c *Core) flyUnregistered(req *Request, pl *Plan, now time.Time) {
	if req.Acks == 0 {
		return
	}
	for i := range pl.st {
		st := &pl.st[i]
		if !st.legacy && st.pass < 0 && st.commit && !st.pending && pl.Parts[i].Act == Forward {
			c.fly(st.key, st.batch, now)
			st.flew = true
		}
	}
}

// landFlown lands the batches of pl that flyUnregistered kept flying.
func (c *Core) landFlown(pl *Plan, now time.Time) {
	for i := range pl.st {
		if st := &pl.st[i]; st.flew {
			c.land(st.key, st.batch, now)
			st.flew = false
		}
	}
}
