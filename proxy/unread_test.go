package proxy

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// TestUnreadStore: refs keep their order and their disowned marks across
// updates, a batch is disowned once whichever list finds it, a partition's
// tail is appended to and trimmed to the last legacyRingSize, and the store
// is bounded in connections.
func TestUnreadStore(t *testing.T) {
	var u unreadStore
	until := time.Now().Add(time.Minute).UnixNano()
	k := seqstate.Key{Topic: 1, Partition: 0}
	ref := func(id uint64) legacyRef {
		return legacyRef{id: id, topic: k.Topic, partition: k.Partition, count: 1, first: id * 7}
	}
	ids := func(refs []legacyRef) (out []uint64) {
		for _, r := range refs {
			out = append(out, r.id)
		}
		return out
	}
	u.add(1, []legacyRef{ref(10), ref(11), ref(12), ref(13)}, until)
	if got := ids(u.unreadFrom(1, 11, false, nil)); len(got) != 2 || got[0] != 12 || got[1] != 13 {
		t.Fatalf("after 11: %v, want [12 13]", got)
	}
	// The session hands its refs over again, moved along its ring.
	u.add(1, []legacyRef{ref(11), ref(12), ref(13), ref(14)}, until)
	if got := ids(u.unreadFrom(1, 11, true, nil)); len(got) != 2 || got[0] != 11 || got[1] != 14 {
		t.Fatalf("from 11 after the update: %v, want [11 14]", got)
	}
	// The same batches read from the log are not disowned twice.
	u.addLog(k, []legacyRef{ref(12), ref(13)}, until)
	u.addLog(k, []legacyRef{ref(13), ref(15)}, until)
	if got := ids(u.unreadFrom(logConn(k), 12, true, nil)); len(got) != 1 || got[0] != 15 {
		t.Fatalf("tail from 12: %v, want [15]", got)
	}
	if c := u.candidates(nil, k, ref(15).first, time.Now().UnixNano()); len(c) != 1 || c[0].conn != logConn(k) {
		t.Fatalf("candidates for 15: %+v, want the partition's tail", c)
	}
	if c := u.candidates(nil, k, ref(12).first, time.Now().UnixNano()); len(c) != 2 {
		t.Fatalf("candidates for 12: %+v, want connection 1 and the tail", c)
	}
	if c := u.candidates(nil, seqstate.Key{Topic: 1, Partition: 1}, ref(12).first, time.Now().UnixNano()); len(c) != 0 {
		t.Fatalf("candidates for 12 in another partition: %+v, want none", c)
	}

	long := make([]legacyRef, 0, 2*legacyRingSize)
	for i := range 2 * legacyRingSize {
		long = append(long, ref(uint64(1000+i)))
	}
	u.addLog(seqstate.Key{Topic: 2}, long, until)
	if uc := u.conns[logConn(seqstate.Key{Topic: 2})]; len(uc.refs) != legacyRingSize || uc.refs[0].id != 1000+legacyRingSize {
		t.Fatalf("a long tail keeps %d refs from %d, want the last %d", len(uc.refs), uc.refs[0].id, legacyRingSize)
	}
	// A busy partition read again and again: what is trimmed is no longer
	// indexed either.
	indexed := len(u.byFirstLog)
	for round := range 10 {
		more := make([]legacyRef, legacyRingSize)
		for i := range more {
			more[i] = ref(uint64(5000 + round*legacyRingSize + i))
		}
		u.addLog(seqstate.Key{Topic: 2}, more, until)
	}
	if n := len(u.byFirstLog); n != indexed {
		t.Fatalf("%d first records indexed after ten more reads of one partition, want %d", n, indexed)
	}

	for c := uint64(2); c < 2+2*maxUnreadConns; c++ {
		u.add(c, []legacyRef{ref(c << 20)}, until)
	}
	if n := u.n.Load(); n != maxUnreadConns || len(u.conns) != maxUnreadConns {
		t.Fatalf("%d connections kept (map %d), want %d", n, len(u.conns), maxUnreadConns)
	}
	if _, ok := u.conns[1]; ok {
		t.Fatal("the oldest connection is still kept")
	}
	if len(u.byFirst) > maxUnreadConns*legacyRingSize || len(u.byFirstLog) != 0 {
		t.Fatalf("index sizes %d and %d after eviction", len(u.byFirst), len(u.byFirstLog))
	}
	if u.live(time.Now().Add(2 * time.Minute)) {
		t.Fatal("live after every expiry")
	}
}

// BenchmarkNoteRetries measures what the lost-answer check adds to a
// legacy Produce request (4 partitions of 10 records) while the store
// holds other connections' batches, none of them resent: the common case
// after any connection closed or partition was read.
func BenchmarkNoteRetries(b *testing.B) {
	c := newDecisionSession(b)
	pn := c.s.planner
	topic, _ := pn.table.LookupTopic([]byte("steady"))
	until := time.Now().Add(time.Hour).UnixNano()
	for conn := uint64(1); conn <= maxUnreadConns; conn++ {
		refs := make([]legacyRef, legacyRingSize)
		for i := range refs {
			id := conn<<20 | uint64(i)
			refs[i] = legacyRef{id: id, topic: topic, partition: int32(i % 4), count: 10, first: id * 0x9e3779b97f4a7c15}
		}
		pn.unread.add(conn, refs, until)
	}
	var parts []part
	for p := int32(0); p < 4; p++ {
		parts = append(parts, part{p, recordBatch(b, -1, -1, -1, 10, "legacy record value")})
	}
	body := kmsg.NewRequestFormatter().AppendRequest(nil, produceParts("steady", -1, parts...), 1)[4:]
	h, err := protocol.ParseRequestHeader(body)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := c.scan.Reset(body[h.BodyOffset:], h.APIVersion); err != nil {
			b.Fatal(err)
		}
		if n := c.noteRetries(h, &c.scan); n != 0 {
			b.Fatalf("%d batches found unread", n)
		}
	}
	b.ReportMetric(4, "batches/op")
}
