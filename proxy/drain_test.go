package proxy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/metrics"
)

// idleConsumer starts a franz-go consumer through p on an empty topic and
// returns once its first long-poll Fetch (fetch.max.wait 5s) was relayed.
func idleConsumer(t *testing.T, c *kfake.Cluster, p *testProxy, topic string) *kgo.Client {
	t.Helper()
	reached := make(chan struct{})
	var once sync.Once
	c.ControlKey(int16(kmsg.Fetch), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		once.Do(func() { close(reached) })
		return nil, nil, false
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(p.addr()), kgo.ConsumeTopics(topic), kgo.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			if fs := cl.PollFetches(context.Background()); fs.IsClientClosed() {
				return
			}
		}
	}()
	select {
	case <-reached: // a long poll is at the broker
	case <-time.After(30 * time.Second):
		t.Fatal("no Fetch reached the broker")
	}
	return cl
}

// TestShutdownCutsIdleConsumer: a consumer's long-poll Fetch does not hold
// the drain (it used to, for fetch.max.wait: 5s with franz-go).
func TestShutdownCutsIdleConsumer(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(1, "idle"))
	p := startProxy(t, c, nil)
	cl := idleConsumer(t, c, p, "idle")
	defer cl.Close()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if took > 500*time.Millisecond {
		t.Fatalf("shutdown with an idle consumer took %v; want it cut at once", took)
	}
	t.Logf("shutdown with an idle consumer: %v; broker_errors_total{reason=read} %v", took,
		testutil.ToFloat64(p.Metrics.BrokerErrors.WithLabelValues(metrics.BrokerRead)))
	if !strings.Contains(p.logs.String(), "in-flight requests are only Fetch") {
		t.Errorf("no log line for the cut consumer:\n%s", p.logs.String())
	}
}

// TestReadyDuringDrain: /readyz (Server.Ready) fails as soon as draining
// starts, while a Produce is still in flight.
func TestReadyDuringDrain(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(1, "ready"))
	p := startProxy(t, c, nil)
	ctx := context.Background()
	if err := p.Ready(ctx); err != nil {
		t.Fatalf("ready before drain: %v", err)
	}
	go p.Shutdown(ctx)
	waitFor(t, 5*time.Second, "Ready to fail", func() bool { return p.Ready(ctx) != nil })
	if err := p.Ready(ctx); err != ErrDraining {
		t.Fatalf("Ready during drain: %v, want ErrDraining", err)
	}
}

// TestReadyNodeUnbound: a node listener that cannot bind makes the proxy
// unready until it binds.
func TestReadyNodeUnbound(t *testing.T) {
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, "unbound"))
	blocker := httptest.NewServer(http.NotFoundHandler())
	defer blocker.Close()
	port := blocker.Listener.Addr().(interface{ String() string }).String()
	p := startProxy(t, c, func(cfg *Config) {
		cfg.Nodes = map[int32]NodeConfig{0: {Listen: port}}
	})
	err := p.Ready(context.Background())
	if err == nil || !strings.Contains(err.Error(), "not bound") {
		t.Fatalf("Ready with node 0's port taken: %v", err)
	}
}

// TestConsumerCloseIsNoError: a consumer that closes normally, with long
// polls still in flight, is not a client error. The first response written
// after the close makes the client's kernel answer RST; the next write fails.
func TestConsumerCloseIsNoError(t *testing.T) {
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, "bye"))
	p := startProxy(t, c, nil)
	r := dialRaw(t, p.addr())
	r.learnTopics("bye")
	for range 3 {
		req := kmsg.NewPtrFetchRequest()
		req.SetVersion(12)
		req.MaxWaitMillis, req.MinBytes, req.MaxBytes = 300, 1, 1<<20
		ft := kmsg.NewFetchRequestTopic()
		ft.Topic = "bye"
		fp := kmsg.NewFetchRequestTopicPartition()
		fp.PartitionMaxBytes = 1 << 20
		ft.Partitions = append(ft.Partitions, fp)
		req.Topics = append(req.Topics, ft)
		r.send(req)
	}
	r.conn.Close()
	waitFor(t, 10*time.Second, "the connection to end", func() bool { return testutil.ToFloat64(p.Metrics.ClientConnections) == 0 })
	if n := testutil.ToFloat64(p.Metrics.ClientErrors.WithLabelValues(metrics.ClientWrite)); n != 0 {
		t.Fatalf("client_errors_total{reason=write} = %v after a normal close; logs:\n%s", n, p.logs.String())
	}
}

// TestShutdownCutsConsumerOnceItsProduceIsAnswered: a connection with a
// Produce and a long-poll Fetch in flight is drained until the Produce is
// answered, then cut at once, without waiting for the Fetch (fetch.max.wait
// 5s): the drain is told when a response is written (relay.Tracker.Kick).
func TestShutdownCutsConsumerOnceItsProduceIsAnswered(t *testing.T) {
	const topic = "mixed"
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(2, topic))
	entered, release := make(chan struct{}), make(chan struct{})
	var enterOnce, releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	defer free()
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		enterOnce.Do(func() {
			close(entered)
			c.SleepControl(func() { <-release }) // the broker holds the Produce
		})
		return nil, nil, false
	})
	p := startProxy(t, c, nil)
	r := dialRaw(t, p.addr())
	r.learnTopics(topic)
	r.send(produceRequest(topic, -1, recordBatch(t, -1, -1, -1, 1, "held")))
	fetch := kmsg.NewPtrFetchRequest()
	fetch.SetVersion(12)
	fetch.MaxWaitMillis, fetch.MinBytes, fetch.MaxBytes = 5000, 1, 1<<20
	ft := kmsg.NewFetchRequestTopic()
	ft.Topic = topic
	fp := kmsg.NewFetchRequestTopicPartition()
	fp.Partition, fp.PartitionMaxBytes = 1, 1<<20 // not the Produce's partition: nothing ends the poll
	ft.Partitions = append(ft.Partitions, fp)
	fetch.Topics = append(fetch.Topics, ft)
	r.send(fetch)
	// The broker takes a connection's requests one at a time: the Fetch
	// waits behind the Produce, and polls once the Produce is answered.
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the Produce never reached the broker")
	}
	waitFor(t, 5*time.Second, "the Fetch to be read", func() bool { return testutil.ToFloat64(p.Metrics.Requests.WithLabelValues("Fetch")) > 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- p.Shutdown(ctx) }()
	waitFor(t, 5*time.Second, "the drain to start", func() bool { return p.Ready(ctx) != nil })
	select {
	case err := <-stopped:
		t.Fatalf("shutdown ended with a Produce in flight: %v", err)
	default:
	}
	start := time.Now()
	free()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("shutdown still draining 15 s after the Produce was answered")
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("shutdown took %v after the Produce was answered; want the Fetch-only connection cut at once, not its 5 s poll", took)
	}
}
