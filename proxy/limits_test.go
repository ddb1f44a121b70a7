package proxy

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/metrics"
	"github.com/dedupproxy/dedupproxy/protocol"
)

// memSample is the process's Go heap in use (after a GC) and resident set.
type memSample struct{ heapInuse, rss uint64 }

func sampleMem() memSample {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return memSample{heapInuse: ms.HeapInuse, rss: rssBytes()}
}

// rssBytes is VmRSS from /proc/self/status, or 0 where there is none.
func rssBytes() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseUint(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

func mib(n uint64) float64 { return float64(n) / (1 << 20) }

// produceConsume has a fresh franz-go client produce n records to topic
// through addr and read them back.
func produceConsume(t *testing.T, addr, topic string, n int, during func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DefaultProduceTopic(topic),
		kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Value: []byte(strconv.Itoa(i))}
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("healthy client: produce: %v", err)
	}
	got := 0
	for polls := 0; got < n && polls < 1000; polls++ {
		if during != nil {
			during()
		}
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("healthy client: consumed %d of %d: %v", got, n, err)
		}
		fs.EachError(func(_ string, _ int32, err error) { t.Errorf("healthy client: fetch: %v", err) })
		got += fs.NumRecords()
	}
	if got < n {
		t.Fatalf("healthy client: consumed %d of %d", got, n)
	}
}

// TestHostileFrameSizesBounded: a size prefix costs a client 4 bytes, so
// it must not cost the proxy the size it declares. 50 connections each
// declare a 100 MiB request (the largest allowed) and send 1 KiB of it,
// then sit there; the proxy's heap grows by well under 64 MiB (it used to
// be 50 × 100 MiB), and a healthy franz-go client produces and consumes
// through the proxy meanwhile. Not parallel: it measures the process.
func TestHostileFrameSizesBounded(t *testing.T) {
	const topic, conns = "hostile", 50
	c := newCluster(t, kfake.SeedTopics(1, topic))
	p := startProxy(t, c, nil)
	before := sampleMem()

	connected := testutil.ToFloat64(p.Metrics.ClientConnectionsTotal)
	for range conns {
		conn, err := net.DialTimeout("tcp", p.addr(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		msg := binary.BigEndian.AppendUint32(nil, protocol.DefaultMaxFrameSize)
		msg = append(msg, make([]byte, 1<<10)...)
		conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Write(msg); err != nil {
			t.Fatal(err)
		}
	}
	// Every hostile connection has its session (its read loop reads the
	// prefix right away); the healthy client's work is the window.
	waitFor(t, 20*time.Second, "the hostile connections' sessions", func() bool {
		return testutil.ToFloat64(p.Metrics.ClientConnectionsTotal) >= connected+conns
	})
	peak := before
	sample := func() {
		if m := sampleMem(); m.heapInuse > peak.heapInuse {
			peak.heapInuse, peak.rss = m.heapInuse, max(peak.rss, m.rss)
		}
	}
	produceConsume(t, p.addr(), topic, 200, sample)
	sample()
	grew := int64(peak.heapInuse) - int64(before.heapInuse)
	t.Logf("%d connections declaring 100 MiB frames and sending 1 KiB: heap in use %.1f MiB before, %.1f MiB peak (%+.1f MiB); RSS %.1f MiB peak",
		conns, mib(before.heapInuse), mib(peak.heapInuse), float64(grew)/(1<<20), mib(peak.rss))
	if grew > 64<<20 {
		t.Fatalf("the proxy's heap grew by %.1f MiB for %d connections that sent 1 KiB each; want under 64 MiB", float64(grew)/(1<<20), conns)
	}
}

// refusedConn reports whether the proxy closed conn without a word: the
// first read gives EOF or a reset.
func refusedConn(conn net.Conn) (bool, error) {
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	var b [1]byte
	_, err := conn.Read(b[:])
	switch {
	case errors.Is(err, io.EOF), isReset(err):
		return true, nil
	case err == nil:
		return false, errors.New("the proxy sent bytes unasked")
	}
	return false, err
}

// TestMaxConnections: with max_connections 100, 100 connections are
// served; 10,000 more (5,000 under the race detector), opened and closed
// in a bounded loop, are each closed at once, counted under
// reason="max_connections", and logged in a handful of rate-limited lines;
// memory stays bounded; the 100 keep working, and once they close a
// healthy client works. Not parallel: it measures the process.
func TestMaxConnections(t *testing.T) {
	const topic, limit = "limited", 100
	flood := 10000
	if raceEnabled {
		flood = 5000
	}
	c := newCluster(t, kfake.SeedTopics(1, topic))
	p := startProxy(t, c, func(cfg *Config) { cfg.MaxConnections = limit })
	before := sampleMem()

	held := make([]*rawConn, limit)
	for i := range held {
		held[i] = dialRaw(t, p.addr())
		if r := held[i].roundTrip(kmsg.NewPtrApiVersionsRequest()).(*kmsg.ApiVersionsResponse); r.ErrorCode != 0 {
			t.Fatalf("connection %d within the limit: ApiVersions error %d", i, r.ErrorCode)
		}
	}

	start := time.Now()
	const workers = 4
	var (
		next, refused atomic.Int64
		wg            sync.WaitGroup
		errMu         sync.Mutex
		firstErr      error
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(flood) {
				conn, err := net.DialTimeout("tcp", p.addr(), 5*time.Second)
				if err == nil {
					var ok bool
					ok, err = refusedConn(conn)
					conn.Close()
					if ok {
						refused.Add(1)
						continue
					}
				}
				errMu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				errMu.Unlock()
				return
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		t.Fatalf("after %d refused connections: %v", refused.Load(), firstErr)
	}
	if got := refused.Load(); got != int64(flood) {
		t.Fatalf("%d of %d connections beyond the limit were refused", got, flood)
	}
	waitFor(t, 10*time.Second, "the refusals to be counted", func() bool {
		return testutil.ToFloat64(p.Metrics.RefusedConns.WithLabelValues(metrics.RefusedMaxConns)) == float64(flood)
	})
	after := sampleMem()
	t.Logf("%d connections refused in %s (%.0f/s); heap in use %.1f MiB before, %.1f MiB after (%+.1f MiB); RSS %.1f MiB before, %.1f MiB after",
		flood, elapsed.Round(time.Millisecond), float64(flood)/elapsed.Seconds(),
		mib(before.heapInuse), mib(after.heapInuse), (float64(after.heapInuse)-float64(before.heapInuse))/(1<<20), mib(before.rss), mib(after.rss))
	if grew := int64(after.heapInuse) - int64(before.heapInuse); grew > 64<<20 {
		t.Errorf("heap grew by %.1f MiB", float64(grew)/(1<<20))
	}
	if lines := strings.Count(p.logs.String(), "refusing client connections"); lines < 1 || lines > 1+int(elapsed/refusalLogEvery) {
		t.Errorf("%d log lines about refusals in %s; want one per %s at most", lines, elapsed, refusalLogEvery)
	}
	if n := testutil.ToFloat64(p.Metrics.RefusedConns.WithLabelValues(metrics.RefusedMaxPerIP)); n != 0 {
		t.Errorf("refused for max_connections_per_ip: %v, want 0", n)
	}

	for _, i := range []int{0, limit / 2, limit - 1} {
		if r := held[i].roundTrip(kmsg.NewPtrApiVersionsRequest()).(*kmsg.ApiVersionsResponse); r.ErrorCode != 0 {
			t.Fatalf("held connection %d after the flood: error %d", i, r.ErrorCode)
		}
	}
	for _, h := range held {
		h.conn.Close()
	}
	waitFor(t, 10*time.Second, "the held connections to close", func() bool {
		return testutil.ToFloat64(p.Metrics.ClientConnections) == 0
	})
	produceConsume(t, p.addr(), topic, 100, nil)
}

// TestMaxConnectionsPerIP: one address gets max_connections_per_ip
// connections; the next is refused under reason="max_connections_per_ip"
// while another address is still served, and a slot freed by a close is
// reusable.
func TestMaxConnectionsPerIP(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	p := startProxy(t, c, func(cfg *Config) { cfg.MaxConnectionsPerIP = 3 })
	var held []*rawConn
	for range 3 {
		r := dialRaw(t, p.addr())
		r.roundTrip(kmsg.NewPtrApiVersionsRequest())
		held = append(held, r)
	}
	extra, err := net.DialTimeout("tcp", p.addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := refusedConn(extra); !ok {
		t.Fatalf("the 4th connection from one address was not refused: %v", err)
	}
	extra.Close()
	if n := testutil.ToFloat64(p.Metrics.RefusedConns.WithLabelValues(metrics.RefusedMaxPerIP)); n != 1 {
		t.Fatalf("refused for max_connections_per_ip: %v, want 1", n)
	}

	// Another address on the loopback network is not affected.
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	if other, err := d.Dial("tcp", p.addr()); err != nil {
		t.Logf("cannot dial from 127.0.0.2 (%v); skipping the other-address check", err)
	} else {
		o := &rawConn{t: t, conn: other}
		t.Cleanup(func() { other.Close() })
		other.SetDeadline(time.Now().Add(20 * time.Second))
		o.roundTrip(kmsg.NewPtrApiVersionsRequest())
	}

	held[0].conn.Close()
	waitFor(t, 10*time.Second, "the freed slot", func() bool {
		r, err := net.DialTimeout("tcp", p.addr(), 5*time.Second)
		if err != nil {
			return false
		}
		defer r.Close()
		rc := &rawConn{t: t, conn: r}
		r.SetDeadline(time.Now().Add(5 * time.Second))
		corr := rc.send(kmsg.NewPtrApiVersionsRequest())
		body, err := readFrame(r)
		return err == nil && int32(binary.BigEndian.Uint32(body)) == corr
	})
}
