package e2e

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
)

// heldProduce is the Produce request the broker held (holdProduce), as it
// arrived, so the abort mode can send it again.
type heldProduce struct {
	mu      sync.Mutex
	encoded []byte
	version int16
}

func (h *heldProduce) request() (*kmsg.ProduceRequest, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.encoded == nil {
		return nil, false
	}
	req := kmsg.NewPtrProduceRequest()
	req.SetVersion(h.version)
	if err := req.ReadFrom(h.encoded); err != nil {
		return nil, false
	}
	return req, true
}

// holdProduce makes the broker hold the n-th Produce request that expects
// a response (counted from 1 as it reaches kfake) while during runs, then
// handle it as usual: append it and answer. kfake's SleepControl lets the
// cluster serve every other request meanwhile. fired counts the holds.
func holdProduce(c *kfake.Cluster, n int64, fired *atomic.Int64, during func()) *heldProduce {
	held := &heldProduce{}
	var seen atomic.Int64
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		preq := req.(*kmsg.ProduceRequest)
		if preq.Acks == 0 || seen.Add(1) != n {
			return nil, nil, false
		}
		held.mu.Lock()
		held.encoded, held.version = preq.AppendTo(nil), preq.GetVersion()
		held.mu.Unlock()
		fired.Add(1)
		c.SleepControl(during)
		return nil, nil, false
	})
	return held
}

// holdProduces makes the broker hold each Produce request that expects a
// response (counted from 1 as they reach kfake) that plan hits for hold,
// then append it and answer: a broker slower than its clients' timeouts.
// One request is held at a time: a hit while one is held is not. fired
// counts the holds; the returned function reports whether every held
// request has been let go (the caller waits for that before reading the
// log: its client may be done long before). The hold is the fault under
// test, not a wait for an event.
func holdProduces(c *kfake.Cluster, plan faultPlan, hold time.Duration, fired *atomic.Int64) (released func() bool) {
	var seen, done atomic.Int64
	var holding atomic.Bool
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if req.(*kmsg.ProduceRequest).Acks == 0 || !plan.hits(seen.Add(1)) || !holding.CompareAndSwap(false, true) {
			return nil, nil, false
		}
		fired.Add(1)
		c.SleepControl(func() {
			t := time.NewTimer(hold)
			defer t.Stop()
			<-t.C
		})
		done.Add(1)
		holding.Store(false)
		return nil, nil, false
	})
	return func() bool { return done.Load() == fired.Load() }
}

// eventually polls cond until it holds or d passes, and reports which.
func eventually(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}

// replayHeld sends the held request again, as it was, on a new connection
// to the proxy, as the killed client would once restarted (its client id,
// from its host), once the proxy has settled what it left in flight. The
// broker appended the original and the client never got the answer, so
// the copy is a retry: it must be answered without error and without being
// written again (the caller counts the log after this). software: the
// name the killed client gives itself in ApiVersions ("" for none), which
// the replay gives too, so that the proxy sees the same client
// (docs/legacy.md, "What a record is").
func replayHeld(t *testing.T, px *testProxy, held *heldProduce, idempotent bool, clientID, software string) {
	t.Helper()
	if !eventually(15*time.Second, func() bool { return px.metric("dedupproxy_produce_pending_batches", "") == 0 }) {
		t.Errorf("the proxy still holds %v batches pending 15 s after its client was killed",
			px.metric("dedupproxy_produce_pending_batches", ""))
	}
	req, ok := held.request()
	if !ok {
		t.Fatal("the held Produce request was not captured")
	}
	// At the held request's own version: kgo would otherwise send it at
	// the newest the broker supports, where topics go by id (v13).
	versions := kversion.Stable()
	versions.SetMaxKeyVersion(int16(kmsg.Produce), req.GetVersion())
	opts := []kgo.Opt{kgo.SeedBrokers(px.addr()), kgo.ClientID(clientID)}
	if software == "" {
		versions.SetMaxKeyVersion(int16(kmsg.ApiVersions), 2) // before KIP-511's software name
	} else {
		opts = append(opts, kgo.SoftwareNameAndVersion(software, "replay"))
	}
	cl, err := kgo.NewClient(append(opts, kgo.MaxVersions(versions))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	before := px.metric("dedupproxy_produce_duplicates_total", "answered_by=proxy")
	kresp, err := cl.Request(ctx, req)
	if err != nil {
		t.Fatalf("sending the killed client's in-flight request again: %v", err)
	}
	for _, tr := range kresp.(*kmsg.ProduceResponse).Topics {
		for _, pr := range tr.Partitions {
			if pr.ErrorCode != 0 {
				t.Errorf("the killed client's in-flight request, sent again: %s[%d] answered error %d", tr.Topic, pr.Partition, pr.ErrorCode)
			}
		}
	}
	byProxy := px.metric("dedupproxy_produce_duplicates_total", "answered_by=proxy") - before
	t.Logf("the killed client's in-flight request sent again: the proxy answered %v of its batches itself", byProxy)
	if !idempotent && byProxy < 1 {
		// Legacy batches only the proxy can recognise: the broker would
		// append them again (the log count says so too).
		t.Errorf("the proxy answered %v legacy batches of the replayed request itself, want at least 1", byProxy)
	}
}
