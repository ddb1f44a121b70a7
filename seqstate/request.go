package seqstate

import "time"

// A Produce request carries one batch per partition, all from one producer
// (the producer id is per client), so all of its batches live in one shard.
// CheckBatches and SettleBatches decide, then settle, a request's batches
// under one acquisition of that shard's lock instead of one per batch: the
// lock pair is most of a single batch's cost (BenchmarkShardLockFloor).
// Each is one locked section over a caller-owned slice; no lock is held
// between them, so the caller does its I/O (forwarding, waiting for the
// broker) with no lock held.

// Op is one batch of a Produce request for CheckBatches and DecideBatches:
// the caller fills Key and Batch, the table sets Result.
type Op struct {
	Key    Key
	Batch  Batch
	Result Result
}

// Outcome is the broker's answer to one forwarded batch, for SettleBatches.
type Outcome struct {
	Key   Key
	Batch Batch
	// Appended: the broker appended the batch (see Commit for the errors
	// that count as appended), at BaseOffset with MaxTimestamp. Otherwise
	// the batch is aborted (see Abort) and the two values are unused.
	Appended     bool
	BaseOffset   int64
	MaxTimestamp int64
}

// CheckBatches sets ops[i].Result to Check(ops[i].Key, ops[i].Batch, now),
// in order, so a later op sees what an earlier one registered. Consecutive
// ops whose producer ids share a shard are decided under one acquisition of
// its lock, so a request whose batches share a producer id takes it once.
// Ops of other producer ids are allowed and only cost more acquisitions. It
// allocates only as Check does.
func (t *Table) CheckBatches(ops []Op, now time.Time) { t.checkBatches(ops, now.UnixNano(), true) }

// DecideBatches is CheckBatches with Decide: nothing is registered.
func (t *Table) DecideBatches(ops []Op, now time.Time) { t.checkBatches(ops, now.UnixNano(), false) }

func (t *Table) checkBatches(ops []Op, now int64, register bool) {
	for i := 0; i < len(ops); {
		s, pid, si := (*shard)(nil), int64(0), -1
		for ; i < len(ops); i++ {
			op := &ops[i]
			switch {
			case op.Key.ProducerID < 0:
				op.Result = result(Accept)
				continue
			case !op.Batch.valid():
				op.Result = result(Invalid)
				continue
			}
			if s == nil || op.Key.ProducerID != pid {
				j := t.shardIndex(op.Key.ProducerID)
				if s != nil && j != si {
					break // the next run locks its own shard
				}
				if s == nil {
					s, si = &t.shards[j].shard, j
					s.mu.Lock()
				}
				pid = op.Key.ProducerID
			}
			op.Result = s.check(op.Key, op.Batch, now, register)
		}
		if s != nil {
			s.mu.Unlock()
		}
	}
}

// SettleBatches applies each outcome in order: Commit for an appended
// batch, Abort for the others. Consecutive outcomes whose producer ids
// share a shard are applied under one acquisition of its lock, as in
// CheckBatches.
func (t *Table) SettleBatches(outs []Outcome, now time.Time) { t.settleBatches(outs, now, nil) }

// SettleBatchesDropped is SettleBatches that also appends to dropped the
// pending batches an abort took with the batch it aborted (see
// Abort), or an entry forgotten took with it, and returns it: they may
// still be on their way to the broker, which may append them (a batch
// registered after an aborted one is refused as out of order unless a
// resend of the aborted batch reaches the log first). Their outcome is unknown until their own answer, which
// the caller still settles. dropped grows only when an abort drops
// something.
func (t *Table) SettleBatchesDropped(outs []Outcome, now time.Time, dropped []Op) []Op {
	t.settleBatches(outs, now, &dropped)
	return dropped
}

func (t *Table) settleBatches(outs []Outcome, now time.Time, dropped *[]Op) {
	ns := now.UnixNano()
	for i := 0; i < len(outs); {
		s, pid, si := (*shard)(nil), int64(0), -1
		for ; i < len(outs); i++ {
			o := &outs[i]
			if o.Key.ProducerID < 0 || !o.Batch.valid() {
				continue
			}
			if s == nil || o.Key.ProducerID != pid {
				j := t.shardIndex(o.Key.ProducerID)
				if s != nil && j != si {
					break
				}
				if s == nil {
					s, si = &t.shards[j].shard, j
					s.mu.Lock()
				}
				pid = o.Key.ProducerID
			}
			if o.Appended {
				s.commit(o.Key, o.Batch, o.BaseOffset, o.MaxTimestamp, ns, dropped)
			} else {
				s.abort(o.Key, o.Batch, dropped)
			}
		}
		if s != nil {
			s.mu.Unlock()
		}
	}
}
