package proxy

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestIdleConnectionsHoldNoReadBuffers: a client connection that has been
// answered and sends nothing more holds no read buffer on either leg (they
// go back to the pool while the connection waits), and one taken again
// when its next request arrives serves it. Idle connections are most of a
// proxy's connections; a buffer per leg made them cost 34 KiB each
// (docs/performance.md, "Idle connections").
func TestIdleConnectionsHoldNoReadBuffers(t *testing.T) {
	c := newCluster(t)
	p := startProxy(t, c, nil)
	const n = 20
	conns := make([]*rawConn, n)
	for i := range conns {
		conns[i] = dialRaw(t, p.addr())
		req := kmsg.NewPtrApiVersionsRequest()
		req.SetVersion(3)
		req.ClientSoftwareName, req.ClientSoftwareVersion = "idle-test", "1"
		if resp := conns[i].roundTrip(req).(*kmsg.ApiVersionsResponse); resp.ErrorCode != 0 {
			t.Fatalf("ApiVersions: error %d", resp.ErrorCode)
		}
	}
	waitFor(t, 5*time.Second, "idle connections to give their read buffers back", func() bool {
		return p.readBufs.Load() == 0
	})
	// Pipelined requests on every connection: buffers are taken again,
	// the answers come back in order, and given back once idle again.
	for _, rc := range conns {
		var corrs []int32
		for range 3 {
			corrs = append(corrs, rc.send(kmsg.NewPtrMetadataRequest()))
		}
		for _, corr := range corrs {
			rc.recv(kmsg.NewPtrMetadataRequest(), corr)
		}
	}
	waitFor(t, 5*time.Second, "read buffers back after the second round", func() bool {
		return p.readBufs.Load() == 0
	})
}
