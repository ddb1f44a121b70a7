package proxy

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// gaugeValue reads the gauge name from reg; ok false when it is not
// registered.
func gaugeValue(t testing.TB, reg prometheus.Gatherer, name string) (v float64, ok bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// publishedLayout is what GET /replica says of the replicas' configuration.
type publishedLayout struct {
	Replicas []string `json:"replicas"`
	Layout   string   `json:"layout"`
}

// getStatus reads a replica's GET /replica on its admin address.
func getStatus(t testing.TB, admin string) publishedLayout {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/replica")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st publishedLayout
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestReplicasDisagreeingListsReported: replica 2 is restarted with
// another replica list than its peers' (a fourth replica). Each publishes
// its list and a digest of its layout at GET /replica; every replica that
// reads a peer publishing another one logs it and counts it
// (dedupproxy_replica_peers_disagreeing), and the one whose list no other
// replica shares is not ready, while the two that agree stay ready: one
// replica configured wrongly stops a rolling update at itself without
// taking its peers out of service.
func TestReplicasDisagreeingListsReported(t *testing.T) {
	c := newCluster(t)
	odd := false
	f := newFleet(t, c, 3, 3, func(i int, cfg *Config) {
		if i == 2 && odd {
			cfg.Replicas = append(slices.Clone(cfg.Replicas), "127.0.0.1:1")
			cfg.ReplicaAdmin = append(slices.Clone(cfg.ReplicaAdmin), "127.0.0.1:2")
		}
	})
	if st := getStatus(t, f.admin[0]); !slices.Equal(st.Replicas, f.listen) || st.Layout == "" {
		t.Fatalf("replica 0 publishes replicas %v, layout %q; want %v and a digest", st.Replicas, st.Layout, f.listen)
	}
	for i := range 3 {
		if v, ok := gaugeValue(t, f.replica(i).reg, "dedupproxy_replica_peers_disagreeing"); !ok || v != 0 {
			t.Fatalf("replica %d: peers_disagreeing %v (registered %v), want 0 while the lists agree", i, v, ok)
		}
	}
	if err := f.stop(2); err != nil {
		t.Fatal(err)
	}
	odd = true
	r2 := f.start(2)
	if st0, st2 := getStatus(t, f.admin[0]), getStatus(t, f.admin[2]); len(st2.Replicas) != 4 || st2.Layout == st0.Layout {
		t.Fatalf("replica 2 publishes replicas %v, layout %q (replica 0's %q); want its four and another digest", st2.Replicas, st2.Layout, st0.Layout)
	}
	for i, want := range []float64{1, 1, 2} {
		waitFor(t, 10*time.Second, "the disagreement counted", func() bool {
			v, _ := gaugeValue(t, f.replica(i).reg, "dedupproxy_replica_peers_disagreeing")
			return v == want
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r2.Ready(ctx); err == nil || !strings.Contains(err.Error(), "replica list or layout differs") {
		t.Errorf("replica 2 /readyz: %v; want not ready, naming the disagreement", err)
	}
	for i := range 2 {
		r := f.replica(i)
		if err := r.Ready(ctx); err != nil {
			t.Errorf("replica %d /readyz: %v; want ready (its list is shared by replicas 0 and 1)", i, err)
		}
		if !strings.Contains(r.logs.String(), "replica peer publishes another replica list or layout") {
			t.Errorf("replica %d did not log the disagreement", i)
		}
	}
	// Fixed and restarted, replica 2 agrees again.
	if err := f.stop(2); err != nil {
		t.Fatal(err)
	}
	odd = false
	f.start(2)
	f.waitReady(2)
	waitFor(t, 10*time.Second, "the disagreement gone", func() bool {
		v, _ := gaugeValue(t, f.replica(0).reg, "dedupproxy_replica_peers_disagreeing")
		return v == 0
	})
}

// TestReplicaHandedOverStopsAtOnce: a replica stopping as SIGTERM does
// hands every node over; a client of it still waits for an answer the
// broker holds (a request that is not a Produce: a consumer group's join
// is held that way for minutes). Having handed everything over, the
// replica decides nothing that request could change, so its Shutdown
// closes that connection and returns at once rather than at the drain
// limit.
func TestReplicaHandedOverStopsAtOnce(t *testing.T) {
	c := newCluster(t)
	const drain = 5 * time.Second
	f := newFleet(t, c, 3, 3, func(_ int, cfg *Config) { cfg.DrainTimeout = drain })
	held, release := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(release) })
	c.ControlKey(int16(kmsg.ListGroups), func(kmsg.Request) (kmsg.Response, error, bool) {
		close(held)
		c.SleepControl(func() { <-release }) // the broker holds the request until the test ends
		return nil, nil, false
	})
	raw := dialRaw(t, f.listen[0])
	raw.send(kmsg.NewPtrListGroupsRequest())
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the broker never received the request")
	}
	r := f.replica(0)
	ctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	err := r.Shutdown(ctx)
	f.finish(r)
	if err != nil || ctx.Err() != nil {
		t.Fatalf("Shutdown: %v (context %v); want it to return before the drain limit of %v", err, ctx.Err(), drain)
	}
	if !strings.Contains(r.logs.String(), "all=true") {
		t.Errorf("the replica did not report every node handed over:\n%s", r.logs.String())
	}
	if _, err := readFrame(raw.conn); err == nil {
		t.Error("the held client's connection stayed open")
	}
}
