package seqstate

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// TestBatchesMatchSingle drives two tables with the same Produce requests
// of 1 to 8 batches, one through CheckBatches, DecideBatches and
// SettleBatches, the other batch by batch through Check, Decide, Commit and
// Abort: every result and the final state must be the same. Requests are
// mostly of one producer, as clients send them, sometimes of several (in
// one shard or not), with invalid and non-idempotent batches among them.
func TestBatchesMatchSingle(t *testing.T) {
	for _, cfg := range []Config{
		{MaxEntries: 8, Shards: 2, RetainedBatches: 5, ProducerIDExpiration: time.Hour},
		{MaxEntries: 1000, Shards: 4, RetainedBatches: 1, ProducerIDExpiration: time.Hour},
		{MaxEntries: 30, Shards: 1, RetainedBatches: 3, ProducerIDExpiration: time.Hour},
	} {
		t.Run(fmt.Sprintf("shards=%d/retained=%d", cfg.Shards, cfg.RetainedBatches), func(t *testing.T) {
			batched, _ := New(cfg)
			single, _ := New(cfg)
			rng := rand.New(rand.NewPCG(uint64(cfg.MaxEntries), 7))
			now := time.Unix(1_700_000_000, 0)
			next := map[Key]int32{}
			var inFlight [][]Outcome // forwarded requests awaiting their response
			for step := range 20_000 {
				switch rng.IntN(10) {
				case 0, 1, 2, 3, 4: // a request
					ops := make([]Op, 1+rng.IntN(8))
					pid := int64(rng.IntN(6)) - 1
					for i := range ops {
						p := pid
						if rng.IntN(8) == 0 {
							p = int64(rng.IntN(6)) - 1
						}
						k := Key{ProducerID: p, Topic: TopicID(rng.IntN(2)), Partition: int32(rng.IntN(4))}
						b := Batch{FirstSeq: next[k], Count: 1 + int32(rng.IntN(3)), Fingerprint: uint32(rng.IntN(3))}
						switch rng.IntN(8) {
						case 0: // a retry or a gap
							b.FirstSeq = max(0, b.FirstSeq+int32(rng.IntN(9))-6)
						case 1:
							b.Count = 0 // invalid
						default:
							next[k] = b.FirstSeq + b.Count
						}
						ops[i] = Op{Key: k, Batch: b}
					}
					register := rng.IntN(6) != 0
					if register {
						batched.CheckBatches(ops, now)
					} else {
						batched.DecideBatches(ops, now)
					}
					var outs []Outcome
					for i, op := range ops {
						var want Result
						if register {
							want = single.Check(op.Key, op.Batch, now)
						} else {
							want = single.Decide(op.Key, op.Batch, now)
						}
						if op.Result != want {
							t.Fatalf("step %d op %d %+v: batched %+v, single %+v", step, i, op, op.Result, want)
						}
						if register && op.Result.Decision == Accept || rng.IntN(4) == 0 {
							outs = append(outs, Outcome{Key: op.Key, Batch: op.Batch})
						}
					}
					inFlight = append(inFlight, outs)
				case 5, 6, 7, 8: // a response, not necessarily the oldest's
					if len(inFlight) == 0 {
						continue
					}
					j := 0
					if rng.IntN(3) == 0 {
						j = rng.IntN(len(inFlight))
					}
					outs := inFlight[j]
					inFlight = append(inFlight[:j], inFlight[j+1:]...)
					for i := range outs {
						o := &outs[i]
						o.Appended = rng.IntN(5) != 0
						o.BaseOffset, o.MaxTimestamp = int64(rng.IntN(1000))-1, int64(step)
					}
					batched.SettleBatches(outs, now)
					for _, o := range outs {
						if o.Appended {
							single.Commit(o.Key, o.Batch, o.BaseOffset, o.MaxTimestamp, now)
						} else {
							single.Abort(o.Key, o.Batch)
						}
					}
				case 9:
					now = now.Add(time.Duration(rng.IntN(20)) * time.Minute)
				}
				if step%500 == 0 {
					if got, want := batched.dumpAll(t), single.dumpAll(t); got != want {
						t.Fatalf("step %d: state differs:\nbatched:\n%s\nsingle:\n%s", step, got, want)
					}
				}
			}
			if got, want := batched.dumpAll(t), single.dumpAll(t); got != want {
				t.Fatalf("state differs:\nbatched:\n%s\nsingle:\n%s", got, want)
			}
			if batched.Evictions() != single.Evictions() || batched.Expirations() != single.Expirations() {
				t.Fatalf("evictions %d/%d, expirations %d/%d", batched.Evictions(), single.Evictions(), batched.Expirations(), single.Expirations())
			}
		})
	}
}

// TestBatchesAllocs pins the per-request path for known keys at zero
// allocations: a request of 8 batches checked, then settled.
func TestBatchesAllocs(t *testing.T) {
	tab, _ := New(Config{})
	topic := tab.topic("orders")
	ops := make([]Op, 8)
	outs := make([]Outcome, 8)
	seq := int32(0)
	request := func() {
		for i := range ops {
			ops[i] = Op{Key: Key{ProducerID: 42, Topic: topic, Partition: int32(i)}, Batch: Batch{FirstSeq: seq, Count: 10, Fingerprint: 7}}
		}
		tab.CheckBatches(ops, benchNow)
		for i, op := range ops {
			if op.Result.Decision != Accept {
				t.Fatalf("op %d: %v", i, op.Result.Decision)
			}
			outs[i] = Outcome{Key: op.Key, Batch: op.Batch, Appended: true, BaseOffset: int64(seq), MaxTimestamp: 1}
		}
		tab.SettleBatches(outs, benchNow)
		seq += 10
	}
	request() // creates the entries
	if n := testing.AllocsPerRun(1000, request); n != 0 {
		t.Fatalf("%v allocations per request", n)
	}
}
