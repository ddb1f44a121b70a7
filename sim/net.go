package sim

import (
	"time"

	"github.com/dedupproxy/dedupproxy/decide"
)

// Conn is one client connection through the proxy: a FIFO of requests
// from the client and one of answers back, each hop taking the network's
// latency, and the faults that end it.
type Conn struct {
	w      *world
	ID     decide.ConnID
	Client *Client
	Node   int      // the broker node the client addressed
	r      *replica // the replica whose listener it reached
	s      *session

	// The client's side.
	inflight     []*Request // sent, not answered, in order
	closedAt     time.Duration
	clientClosed bool // the client closed it (its FIN follows its last request)
	broken       bool // the client saw it break
	// lastUse: when the client last sent on it.
	lastUse time.Duration

	// The network.
	cutAt     time.Duration // from then on nothing gets through; 0: never
	Silent    bool          // the cut sends no reset: the proxy never hears of it
	Middlebox bool          // answers are acknowledged to the proxy but never reach the client
	loseNext  bool          // the next answer is lost, and the connection with it
	toProxy   time.Duration // FIFO: the last arrival scheduled at the proxy
	toClient  time.Duration
	// FinAt: when its end (the client's, or a reset) reached the proxy.
	FinAt time.Duration
	// ToldAt: when the core was told it ended (0: not yet).
	ToldAt time.Duration
	// Answers the proxy wrote, and those the client's TCP stack Received
	// before it closed (a clean close has them equal).
	Written, Received int
}

func (cn *Conn) isCut(at time.Duration) bool { return cn.cutAt > 0 && at >= cn.cutAt }

// usable reports whether the client may still send on cn.
func (cn *Conn) usable() bool { return !cn.clientClosed && !cn.broken }

// send carries a request to the proxy.
func (cn *Conn) send(req *Request) {
	w := cn.w
	cn.lastUse = w.now
	arrive := max(w.now+w.latency(), cn.toProxy)
	cn.toProxy = arrive
	w.at(arrive, func() {
		if cn.isCut(arrive) || cn.s == nil || cn.s.gone || cn.s.rstIn || cn.s.readEnded {
			w.lostAcks0(req, "lost with its connection")
			return // lost on the way: the proxy never reads it
		}
		cn.s.arrive(req)
	})
}

// close is the client closing cn: its FIN reaches the proxy behind the
// requests it sent.
func (cn *Conn) close() {
	if cn.clientClosed || cn.broken {
		return
	}
	w := cn.w
	cn.clientClosed, cn.closedAt = true, w.now
	arrive := max(w.now+w.latency(), cn.toProxy)
	cn.toProxy = arrive
	w.at(arrive, func() {
		if cn.isCut(arrive) || cn.s == nil || cn.s.gone {
			return
		}
		cn.s.fin()
	})
}

// Cut breaks cn: nothing more gets through either way. The proxy sees a
// reset at once unless the Cut is silent; the client notices at once
// (reset) or only by its request timeouts (silent).
func (cn *Conn) Cut(silent bool) {
	w := cn.w
	if cn.cutAt > 0 {
		return
	}
	cn.cutAt, cn.Silent = w.now, silent
	if s := cn.s; s != nil && !silent {
		w.after(w.latency(), s.reset)
	}
	if !silent {
		w.after(w.latency(), func() { cn.Client.connBroken(cn) })
	}
}

// Answer carries an Answer to the client. It reports whether the write
// succeeded at the proxy.
func (cn *Conn) Answer(req *Request, res []PartResult) {
	w := cn.w
	cn.Written++
	arrive := max(w.now+w.latency(), cn.toClient)
	cn.toClient = arrive
	if cn.loseNext {
		cn.loseNext = false
		cn.Cut(false)
	}
	w.at(arrive, func() {
		if cn.isCut(arrive) || cn.clientClosed || cn.broken {
			return // lost with the connection, or its client left
		}
		cn.Received++
		if cn.Middlebox {
			return // acknowledged, never passed on
		}
		cn.Client.onAnswer(cn, req, res)
	})
}

// ProxyClosed is the proxy closing cn (its session ended): the client
// reads the end after the answers before it.
func (cn *Conn) ProxyClosed() {
	w := cn.w
	arrive := max(w.now+w.latency(), cn.toClient)
	cn.toClient = arrive
	w.at(arrive, func() {
		if cn.isCut(arrive) || cn.clientClosed || cn.broken {
			return
		}
		cn.Client.connBroken(cn)
	})
}
