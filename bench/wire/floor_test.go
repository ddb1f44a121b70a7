package wire

import (
	"bytes"
	"encoding/binary"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/protocol"
)

// fakeBroker answers every request on its connections in order: Metadata
// with a response naming itself as node 0 and other as node 1, anything
// else by echoing the request's bytes after its header. It keeps every
// request frame it received.
type fakeBroker struct {
	ln    net.Listener
	other func() string // node 1's host:port
	wg    sync.WaitGroup

	mu   sync.Mutex
	got  [][][]byte // per accepted connection, the request frames
	conn []net.Conn
}

func startFakeBroker(t *testing.T, other func() string) *fakeBroker {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &fakeBroker{ln: ln, other: other}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.mu.Lock()
			b.conn = append(b.conn, c)
			b.got = append(b.got, nil)
			i := len(b.got) - 1
			b.mu.Unlock()
			b.wg.Add(1)
			go b.serve(c, i)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		b.mu.Lock()
		for _, c := range b.conn {
			c.Close()
		}
		b.mu.Unlock()
		b.wg.Wait()
	})
	return b
}

func (b *fakeBroker) addr() string { return b.ln.Addr().String() }

func (b *fakeBroker) serve(c net.Conn, i int) {
	defer b.wg.Done()
	defer c.Close()
	for {
		var size [4]byte
		if _, err := io.ReadFull(c, size[:]); err != nil {
			return
		}
		frame := make([]byte, 4+binary.BigEndian.Uint32(size[:]))
		copy(frame, size[:])
		if _, err := io.ReadFull(c, frame[4:]); err != nil {
			return
		}
		b.mu.Lock()
		b.got[i] = append(b.got[i], frame)
		b.mu.Unlock()
		key, version := int16(binary.BigEndian.Uint16(frame[4:])), int16(binary.BigEndian.Uint16(frame[6:]))
		corr := int32(binary.BigEndian.Uint32(frame[8:]))
		var resp []byte
		if key == int16(kmsg.Metadata) {
			m := kmsg.NewPtrMetadataResponse()
			m.Version = version
			for id, hp := range []string{b.addr(), b.other()} {
				h, p, _ := net.SplitHostPort(hp)
				n, _ := strconv.Atoi(p)
				m.Brokers = append(m.Brokers, kmsg.MetadataResponseBroker{NodeID: int32(id), Host: h, Port: int32(n)})
			}
			resp = m.AppendTo(protocol.AppendResponseHeader(nil, key, version, corr))
		} else {
			resp = append(binary.BigEndian.AppendUint32(nil, uint32(corr)), frame[12:]...)
		}
		if _, err := c.Write(protocol.AppendFrame(nil, resp)); err != nil {
			return
		}
	}
}

// TestFloorRelaysFramesAndRewritesMetadata sends pipelined requests of
// sizes on both sides of floorSmall (copied through the buffer below it,
// spliced above it) through the floor relay and checks that the broker
// receives each byte-exact and that each response comes back byte-exact,
// except Metadata, whose broker addresses must name floor listeners — one
// per upstream broker, each in front of its own broker.
func TestFloorRelaysFramesAndRewritesMetadata(t *testing.T) {
	var b1 *fakeBroker
	b0 := startFakeBroker(t, func() string { return b1.addr() })
	b1 = startFakeBroker(t, func() string { return b0.addr() })
	f, err := StartFloor(b0.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	c, err := net.Dial("tcp", f.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))

	rng := rand.New(rand.NewPCG(1, 2))
	request := func(key, version int16, corr int32, n int) []byte {
		body := binary.BigEndian.AppendUint16(nil, uint16(key))
		body = binary.BigEndian.AppendUint16(body, uint16(version))
		body = binary.BigEndian.AppendUint32(body, uint32(corr))
		for range n {
			body = append(body, byte(rng.Uint32()))
		}
		return protocol.AppendFrame(nil, body)
	}
	sizes := []int{0, 100, floorSmall - 12, floorSmall - 8, floorSmall + 1, 20 << 10, 1 << 20, 37, 3 << 20, 5}
	var reqs [][]byte
	const metadataCorr = 4
	for i, n := range sizes {
		if i == metadataCorr {
			reqs = append(reqs, request(int16(kmsg.Metadata), 12, int32(i), 20))
		}
		reqs = append(reqs, request(int16(kmsg.Produce), 9, int32(len(reqs)), n))
	}
	go func() {
		// Pipelined: one write for everything, so frames of every size
		// arrive several to a read.
		var all []byte
		for _, r := range reqs {
			all = append(all, r...)
		}
		c.Write(all)
	}()
	for i, req := range reqs {
		resp, _, err := protocol.ReadFrame(c, nil, 1<<30, 4)
		if err != nil {
			t.Fatalf("response %d: %v", i, err)
		}
		if corr := protocol.ResponseCorrelationID(resp); corr != int32(i) {
			t.Fatalf("response %d has correlation id %d", i, corr)
		}
		if i == metadataCorr {
			checkRewrittenMetadata(t, resp, f, b0, b1)
			continue
		}
		if !bytes.Equal(resp[4:], req[12:]) {
			t.Errorf("response %d (%d bytes): not byte-exact", i, len(resp))
		}
	}
	b0.mu.Lock()
	defer b0.mu.Unlock()
	if len(b0.got) == 0 || len(b0.got[0]) != len(reqs) {
		t.Fatalf("broker got %d connections, want the first with %d requests", len(b0.got), len(reqs))
	}
	for i, req := range reqs {
		if !bytes.Equal(b0.got[0][i], req) {
			t.Errorf("request %d (%d bytes): not byte-exact at the broker", i, len(req))
		}
	}
}

func checkRewrittenMetadata(t *testing.T, resp []byte, f *Floor, b0, b1 *fakeBroker) {
	t.Helper()
	off, err := protocol.ResponseBodyOffset(resp, int16(kmsg.Metadata), 12)
	if err != nil {
		t.Fatal(err)
	}
	m := kmsg.NewPtrMetadataResponse()
	m.Version = 12
	if err := m.ReadFrom(resp[off:]); err != nil {
		t.Fatalf("rewritten Metadata: %v", err)
	}
	if len(m.Brokers) != 2 {
		t.Fatalf("brokers %+v", m.Brokers)
	}
	for _, br := range m.Brokers {
		addr := net.JoinHostPort(br.Host, strconv.Itoa(int(br.Port)))
		if addr == b0.addr() || addr == b1.addr() {
			t.Errorf("node %d: real address %s leaked", br.NodeID, addr)
		}
		if br.NodeID == 0 && addr != f.Addr() {
			t.Errorf("node 0 at %s, want the bootstrap listener %s", addr, f.Addr())
		}
		// The advertised listener reaches that node: its echo answers.
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("node %d at %s: %v", br.NodeID, addr, err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		req := protocol.AppendFrame(nil, []byte{0, 0, 0, 9, 0, 0, 0, 7, 'n', 'o', 'd', 'e'})
		if _, err := c.Write(req); err != nil {
			t.Fatal(err)
		}
		if _, _, err := protocol.ReadFrame(c, nil, 1<<20, 4); err != nil {
			t.Fatalf("node %d: %v", br.NodeID, err)
		}
		c.Close()
		want := []*fakeBroker{b0, b1}[br.NodeID]
		want.mu.Lock()
		conns := want.got
		last := conns[len(conns)-1]
		want.mu.Unlock()
		if len(last) != 1 || !bytes.Equal(last[0], req) {
			t.Errorf("node %d's listener did not reach node %d", br.NodeID, br.NodeID)
		}
	}
}
