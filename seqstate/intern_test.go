package seqstate

import (
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"
)

// unsafeString aliases b, as a decoder that avoids copying names would.
func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

func uuidOf(i int) [16]byte {
	return [16]byte{byte(i), byte(i >> 8), byte(i >> 16), byte(i >> 24), 15: 0x5a}
}

// TestTopicInterning pins the topic API: names and IDs interned from a
// Metadata response, one TopicID per topic, IDs mapped to their topic's
// TopicID, a topic recreated with a new ID given a new TopicID (so no state
// of the old one applies), partition counts kept, and nothing found that
// was never interned.
func TestTopicInterning(t *testing.T) {
	t.Parallel()
	tab, _ := New(Config{})
	orders, payments := uuidOf(1), uuidOf(2)
	if n := tab.InternTopics([]TopicRef{{Name: "orders", ID: orders, Partitions: 3}, {Name: "payments", ID: payments}, {Name: "logs"}}); n != 3 {
		t.Fatalf("InternTopics added %d, want 3", n)
	}
	a, ok1 := tab.LookupTopic([]byte("orders"))
	b, ok2 := tab.LookupTopic([]byte("payments"))
	c, ok3 := tab.LookupTopic([]byte("logs"))
	if !ok1 || !ok2 || !ok3 || a == b || a == c || b == c {
		t.Fatalf("lookups: %d %v, %d %v, %d %v", a, ok1, b, ok2, c, ok3)
	}
	if id, ok := tab.LookupTopicID(orders); !ok || id != a {
		t.Errorf("LookupTopicID(orders) = %d, %v; want %d", id, ok, a)
	}
	if id, ok := tab.LookupTopicID(payments); !ok || id != b {
		t.Errorf("LookupTopicID(payments) = %d, %v; want %d", id, ok, b)
	}
	for _, name := range []string{"order", "orders2", "", "Orders"} {
		if id, ok := tab.LookupTopic([]byte(name)); ok {
			t.Errorf("LookupTopic(%q) = %d, found", name, id)
		}
	}
	if _, ok := tab.LookupTopicID([16]byte{}); ok {
		t.Error("the zero topic ID was found")
	}
	if _, ok := tab.LookupTopicID(uuidOf(3)); ok {
		t.Error("an unknown topic ID was found")
	}

	if n := tab.TopicPartitions(a); n != 3 {
		t.Errorf("TopicPartitions(orders) = %d, want 3", n)
	}
	if n := tab.TopicPartitions(b); n != 0 {
		t.Errorf("TopicPartitions(payments) = %d, want 0 (none given)", n)
	}

	// A second Metadata response: known topics add nothing and keep their
	// TopicIDs; "orders" was deleted and recreated with a new ID, which
	// gets a new TopicID that the name now maps to, while the old ID keeps
	// the old one; "logs" now has its ID.
	recreated, logs := uuidOf(4), uuidOf(5)
	if n := tab.InternTopics([]TopicRef{{Name: "payments", ID: payments}, {Name: "orders", ID: recreated, Partitions: 6}, {Name: "logs", ID: logs}}); n != 2 {
		t.Fatalf("second InternTopics added %d, want 2", n)
	}
	d, ok := tab.LookupTopic([]byte("orders"))
	if !ok || d == a || d == b || d == c {
		t.Fatalf("LookupTopic(orders) after it was recreated = %d, %v; want a new TopicID", d, ok)
	}
	if name, _ := tab.TopicName(d); name != "orders" {
		t.Errorf("TopicName(%d) = %q", d, name)
	}
	if tab.TopicPartitions(d) != 6 || tab.TopicPartitions(a) != 3 {
		t.Errorf("TopicPartitions: recreated %d, old %d; want 6, 3", tab.TopicPartitions(d), tab.TopicPartitions(a))
	}
	// A broker that lags still names the old ID: nothing changes.
	if n := tab.InternTopics([]TopicRef{{Name: "orders", ID: orders, Partitions: 3}}); n != 0 {
		t.Fatalf("the old ID again added %d, want 0", n)
	}
	if id, _ := tab.LookupTopic([]byte("orders")); id != d || tab.TopicPartitions(d) != 6 {
		t.Errorf("after the old ID again: orders = %d with %d partitions; want %d with 6", id, tab.TopicPartitions(d), d)
	}
	for _, c := range []struct {
		uuid [16]byte
		want TopicID
	}{{orders, a}, {recreated, d}, {payments, b}, {logs, c}} {
		if id, ok := tab.LookupTopicID(c.uuid); !ok || id != c.want {
			t.Errorf("LookupTopicID(%x) = %d, %v; want %d", c.uuid, id, ok, c.want)
		}
	}
	// An ID keeps the name it was first interned with; an empty name is
	// ignored.
	if n := tab.InternTopics([]TopicRef{{Name: "other", ID: orders}, {ID: uuidOf(6)}}); n != 1 {
		t.Fatalf("third InternTopics added %d, want 1 (the name other)", n)
	}
	if id, ok := tab.LookupTopicID(orders); !ok || id != a {
		t.Errorf("LookupTopicID(orders) = %d, %v after reuse; want %d", id, ok, a)
	}
	if _, ok := tab.LookupTopicID(uuidOf(6)); ok {
		t.Error("the ID of a nameless ref was interned")
	}
	if tab.Topics() != 5 || tab.TopicsRefused() != 0 {
		t.Errorf("Topics = %d, TopicsRefused = %d; want 5, 0", tab.Topics(), tab.TopicsRefused())
	}
	if name, ok := tab.TopicName(b); !ok || name != "payments" {
		t.Errorf("TopicName(%d) = %q, %v", b, name, ok)
	}
	if _, ok := tab.TopicName(99); ok {
		t.Error("TopicName of an unknown id")
	}
}

// TestInternTopicsCopiesNames interns names that alias a buffer which is
// then overwritten, as a proxy decoding Metadata into a reused buffer would.
func TestInternTopicsCopiesNames(t *testing.T) {
	t.Parallel()
	tab, _ := New(Config{})
	buf := []byte("orders")
	tab.InternTopics([]TopicRef{{Name: unsafeString(buf)}})
	copy(buf, "xxxxxx")
	if _, ok := tab.LookupTopic([]byte("orders")); !ok {
		t.Error("orders not found after its buffer was reused")
	}
	if _, ok := tab.LookupTopic([]byte("xxxxxx")); ok {
		t.Error("the reused buffer's content was found")
	}
	if name, _ := tab.TopicName(0); name != "orders" {
		t.Errorf("TopicName(0) = %q", name)
	}
}

// TestTopicsCap: beyond MaxTopics names (or IDs) nothing new is interned,
// refusals are counted, and what was interned stays.
func TestTopicsCap(t *testing.T) {
	t.Parallel()
	tab, _ := New(Config{MaxTopics: 3})
	refs := []TopicRef{{Name: "a", ID: uuidOf(1)}, {Name: "b", ID: uuidOf(2)}, {Name: "c"}, {Name: "d", ID: uuidOf(4)}, {Name: "e"}}
	if n := tab.InternTopics(refs); n != 3 {
		t.Fatalf("added %d, want 3", n)
	}
	if tab.Topics() != 3 || tab.TopicsRefused() != 2 {
		t.Fatalf("Topics %d, TopicsRefused %d; want 3, 2", tab.Topics(), tab.TopicsRefused())
	}
	for _, name := range []string{"d", "e"} {
		if _, ok := tab.LookupTopic([]byte(name)); ok {
			t.Errorf("refused topic %s found", name)
		}
	}
	if _, ok := tab.LookupTopicID(uuidOf(4)); ok {
		t.Error("the ID of a refused topic was interned")
	}
	// Known names still gain IDs, up to MaxTopics IDs: "c" gets the third,
	// a recreated "a" is refused; the same response again counts again.
	for range 2 {
		tab.InternTopics([]TopicRef{{Name: "c", ID: uuidOf(3)}, {Name: "a", ID: uuidOf(11)}, {Name: "b", ID: uuidOf(2)}})
	}
	if id, ok := tab.LookupTopicID(uuidOf(3)); !ok || id != 2 {
		t.Errorf("LookupTopicID(c) = %d, %v", id, ok)
	}
	if _, ok := tab.LookupTopicID(uuidOf(11)); ok {
		t.Error("an ID beyond MaxTopics IDs was interned")
	}
	if got := tab.TopicsRefused(); got != 4 {
		t.Errorf("TopicsRefused = %d, want 4", got)
	}
}

// TestInternManyTopics interns 100,000 distinct topics, in Metadata-sized
// groups and one at a time, and finds every one by name and by ID.
func TestInternManyTopics(t *testing.T) {
	t.Parallel()
	const n = 100_000
	tab, _ := New(Config{MaxEntries: 1})
	refs := make([]TopicRef, n)
	for i := range refs {
		refs[i] = TopicRef{Name: "topic-" + strconv.Itoa(i), ID: uuidOf(i)}
	}
	added := 0
	for i := 0; i < n; {
		size := 1 + i%300 // groups of 1 to 300 topics
		if i < 1000 {
			size = 1
		}
		j := min(i+size, n)
		added += tab.InternTopics(refs[i:j])
		i = j
	}
	if added != n || tab.Topics() != n || tab.TopicsRefused() != 0 {
		t.Fatalf("added %d, Topics %d, TopicsRefused %d", added, tab.Topics(), tab.TopicsRefused())
	}
	if tab.InternTopics(refs) != 0 {
		t.Fatal("re-interning known topics added some")
	}
	for i, r := range refs {
		id, ok := tab.LookupTopic([]byte(r.Name))
		if !ok || id != TopicID(i) {
			t.Fatalf("LookupTopic(%s) = %d, %v; want %d", r.Name, id, ok, i)
		}
		if id2, ok := tab.LookupTopicID(r.ID); !ok || id2 != id {
			t.Fatalf("LookupTopicID(%s) = %d, %v; want %d", r.Name, id2, ok, id)
		}
		if name, ok := tab.TopicName(id); !ok || name != r.Name {
			t.Fatalf("TopicName(%d) = %q, %v", id, name, ok)
		}
	}
	for i := n; i < n+1000; i++ {
		if _, ok := tab.LookupTopic([]byte("topic-" + strconv.Itoa(i))); ok {
			t.Fatalf("topic-%d found", i)
		}
		if _, ok := tab.LookupTopicID(uuidOf(i)); ok {
			t.Fatalf("ID of topic-%d found", i)
		}
	}
}

// TestInternConcurrent interns topics from two goroutines while readers
// look them up without locks (run it with -race). A reader that finds a
// topic must find the same TopicID by name and by ID, always, and its name
// by TopicName.
func TestInternConcurrent(t *testing.T) {
	t.Parallel()
	const n = 20_000
	tab, _ := New(Config{MaxEntries: 1})
	refs := make([]TopicRef, n)
	for i := range refs {
		refs[i] = TopicRef{Name: "t" + strconv.Itoa(i), ID: uuidOf(i)}
	}
	var done atomic.Bool
	var wg sync.WaitGroup
	var writers sync.WaitGroup
	for w := range 2 {
		writers.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := 0; i < n; {
				j := min(i+1+rng.IntN(50), n)
				tab.InternTopics(refs[i:j]) // both writers intern everything
				i = j
			}
		})
	}
	for r := range 2 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(r), 9))
			seen := map[int]TopicID{}
			for !done.Load() {
				i := rng.IntN(n)
				id, ok := tab.LookupTopic([]byte(refs[i].Name))
				if !ok {
					if prev, had := seen[i]; had {
						t.Errorf("topic %d found as %d, then not found", i, prev)
						return
					}
					continue
				}
				if prev, had := seen[i]; had && prev != id {
					t.Errorf("topic %d found as %d, then as %d", i, prev, id)
					return
				}
				seen[i] = id
				if name, ok := tab.TopicName(id); !ok || name != refs[i].Name {
					t.Errorf("TopicName(%d) = %q, %v; want %s", id, name, ok, refs[i].Name)
					return
				}
				if id2, ok := tab.LookupTopicID(refs[i].ID); ok && id2 != id {
					t.Errorf("topic %d: ID maps to %d, name to %d", i, id2, id)
					return
				}
			}
		})
	}
	writers.Wait()
	done.Store(true)
	wg.Wait()
	if tab.Topics() != n {
		t.Errorf("Topics = %d, want %d", tab.Topics(), n)
	}
}
