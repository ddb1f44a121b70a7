package relay

import (
	"encoding/binary"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupproxy/dedupproxy/internal/testfetch"
	"github.com/dedupproxy/dedupproxy/internal/testskip"
)

// fetchBody is testfetch.Body.
var fetchBody = testfetch.Body

// TestSpliceOnlyPlainTCP: the splice path is taken only between two plain
// TCP connections.
func TestSpliceOnlyPlainTCP(t *testing.T) {
	t.Parallel()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if _, _, ok := RawConns(a, b); ok {
		t.Fatal("net.Pipe connections taken for splicing")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, _, ok := RawConns(c, c); ok != SpliceSupported {
		t.Fatalf("plain TCP: splicing %v, want %v", ok, SpliceSupported)
	}
}

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t testing.TB) (a, b *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	d, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	acc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close(); acc.Close() })
	return d.(*net.TCPConn), acc.(*net.TCPConn)
}

// TestRelayLargeNoAllocs pins zero allocations per large Fetch response
// relayed on the splice path, whole (v15) and walked (v16), in steady
// state: a broker goroutine writes one prebuilt frame per run, a client
// goroutine drains what the Fetch relays.
func TestRelayLargeNoAllocs(t *testing.T) {
	for _, v := range []int16{15, 16} {
		t.Run(fmt.Sprintf("v%d", v), func(t *testing.T) {
			if !SpliceSupported {
				testskip.Skip(t, "no splice here")
			}
			body := fetchBody(v, 64<<10)
			frame := binary.BigEndian.AppendUint32(nil, 0)
			frame = binary.BigEndian.AppendUint32(frame, 7) // correlation id
			if v >= 12 {
				frame = append(frame, 0)
			}
			frame = append(frame, body...)
			binary.BigEndian.PutUint32(frame, uint32(len(frame)-4))

			brokerSide, upSide := tcpPair(t)
			clientSide, peer := tcpPair(t)
			f := &Fetch{Client: clientSide, MaxFrame: 100 << 20,
				Metrics: FetchMetrics{BrokerRead: prometheus.NewCounter(prometheus.CounterOpts{Name: "r"}), ClientWritten: prometheus.NewCounter(prometheus.CounterOpts{Name: "w"})},
				Now:     time.Now, ExtendWrite: func() {}, WriteFailed: func(err error) { t.Errorf("write failed: %v", err) }}
			f.RawClient, f.RawUp, _ = RawConns(clientSide, upSide)
			up := NewConnReader(upSide, TCPRawConn(upSide), nil, nil)

			next := make(chan struct{})
			go func() {
				for range next {
					if _, err := brokerSide.Write(frame); err != nil {
						return
					}
				}
			}()
			defer close(next)
			go func() {
				buf := make([]byte, 64<<10)
				for {
					if _, err := peer.Read(buf); err != nil {
						return
					}
				}
			}()
			duration := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "d"})
			run := func() {
				next <- struct{}{}
				handled, alive, err := f.Relay(up, v, 7, time.Now(), duration)
				if !handled || !alive || err != nil {
					t.Fatalf("handled %v alive %v err %v", handled, alive, err)
				}
			}
			run()
			if allocs := testing.AllocsPerRun(200, run); allocs != 0 && !raceEnabled {
				t.Fatalf("%v allocations per relayed frame", allocs)
			}
		})
	}
}
