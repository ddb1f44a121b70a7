package sent

import (
	"fmt"
	"net/netip"
	"testing"
)

// TestEvictionSparesInstancesInUse fills the store past its bound on client
// instances: the longest idle instance without users goes first, never one
// with an open connection, however long ago it was seen.
func TestEvictionSparesInstancesInUse(t *testing.T) {
	var ls Store
	ls.Init(false, int64(60e9), 1<<20)
	host := netip.MustParseAddr("10.0.0.1")
	now := int64(1)
	kept := ls.Connect(1, 7, "kept", host, false, false, now) // seen first, and stays open
	idle := ls.Connect(2, 7, "idle", host, false, false, now)
	ls.Close(idle, true, now)
	// New clients into the shards of both until each is past its bound
	// (only those shards: an eviction scans its shard).
	shardOf := func(id string) *legacyShard { return ls.shardOf(instKey{principal: 7, id: id}) }
	added := map[*legacyShard]int{shardOf("kept"): 0, shardOf("idle"): 0}
	full := func() bool {
		for _, n := range added {
			if n <= maxInstancesPerShard {
				return false
			}
		}
		return true
	}
	for i := 0; !full(); i++ {
		if i == 1<<24 {
			t.Fatal("no client ids hash into the shards under test")
		}
		id := fmt.Sprintf("client %d", i)
		sh := shardOf(id)
		n, ok := added[sh]
		if !ok {
			continue
		}
		added[sh] = n + 1
		now++
		c := ls.Connect(ConnID(10+i), 7, id, host, false, false, now)
		ls.Close(c, true, now)
	}
	if again := ls.Connect(3, 7, "kept", host, false, false, now); again.Inst != kept.Inst {
		t.Fatal("an instance with an open connection was evicted")
	}
	if again := ls.Connect(4, 7, "idle", host, false, false, now); again.Inst == idle.Inst {
		t.Fatal("the instance idle longest was kept past the bound")
	}
	n := 0
	for _, in := range ls.Instances() {
		n++
		if in.users.Load() < 0 {
			t.Fatalf("instance %q has %d users", in.key.id, in.users.Load())
		}
	}
	if n > legacyShards*maxInstancesPerShard {
		t.Fatalf("%d instances kept, bound %d", n, legacyShards*maxInstancesPerShard)
	}
}

// TestDeliverKeepsFirstAnswer: a batch's Answer is set once, late or not,
// and it leaves the batches not yet answered then.
func TestDeliverKeepsFirstAnswer(t *testing.T) {
	var ls Store
	ls.Init(true, int64(60e9), 1<<20)
	conn := ls.Connect(1, 0, "c", netip.MustParseAddr("10.0.0.1"), false, false, 1)
	in := conn.Inst
	in.Lock()
	defer in.Unlock()
	for _, late := range []bool{false, true} {
		b := in.NewBatch(conn, 0, 0, false, true, 1)
		b.Recs = append(b.Recs, Rec{Hash: 42, Off: OffPending})
		in.Keep(b)
		if in.liveRecs != 1 {
			t.Fatalf("late=%v: %d records not yet answered, want the batch's 1", late, in.liveRecs)
		}
		in.Deliver(b, late, 5)
		in.Deliver(b, !late, 9)
		want := Answered
		if late {
			want = AnsweredLate
		}
		if b.Answer != want || b.hold != 5 {
			t.Fatalf("late=%v: answer %d hold %d, want %d and the first hold", late, b.Answer, b.hold, want)
		}
		if in.liveRecs != 0 {
			t.Fatalf("late=%v: %d records not yet answered after the answer", late, in.liveRecs)
		}
		if err := in.Check(); err != nil {
			t.Fatal(err)
		}
	}
}
