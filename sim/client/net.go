package client

import (
	"fmt"
	"time"

	"github.com/dedupproxy/dedupproxy/sim/kafka"
)

// Conn is one client connection through the proxy: a FIFO of requests
// from the client and one of answers back, each hop taking the network's
// latency, and the faults that end it.
type Conn struct {
	env     Env
	ID      int
	Client  *Client
	Node    int // the broker node the client addressed
	Replica int // the replica whose listener it reached
	// Proxy is the proxy's end: the session that reads it.
	Proxy Proxy

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

	// What the proxy's end recorded, for the checks.
	//
	// FinAt: when its end (the client's, or a reset) reached the proxy.
	FinAt time.Duration
	// ToldAt: when the core was told it ended (0: not yet).
	ToldAt time.Duration
	// Answers the proxy wrote, and those the client's TCP stack received
	// before it closed (a clean close has them equal).
	Written, Received int
}

// Proxy is the proxy's end of a connection, as the network reaches it.
type Proxy interface {
	// Arrive hands the proxy a request that reached it; false if the
	// proxy reads no more (its process is gone, the connection reset, or
	// its reader returned): the request is lost.
	Arrive(req *Request) bool
	// Fin: the client's end of stream reached the proxy.
	Fin()
	// Reset: a reset reached the proxy.
	Reset()
}

// NewConn is a new connection of c to node, reaching replica's listener;
// the replica's session sets its Proxy.
func NewConn(c *Client, id, node, replica int) *Conn {
	return &Conn{env: c.env, ID: id, Client: c, Node: node, Replica: replica}
}

// Up reports whether the connection is whole and neither end closed it.
func (cn *Conn) Up() bool { return cn.cutAt == 0 && !cn.clientClosed && !cn.broken }

// Busy reports whether the client has requests in flight on it.
func (cn *Conn) Busy() bool { return len(cn.inflight) > 0 }

func (cn *Conn) isCut(at time.Duration) bool { return cn.cutAt > 0 && at >= cn.cutAt }

// usable reports whether the client may still send on cn.
func (cn *Conn) usable() bool { return !cn.clientClosed && !cn.broken }

// send carries a request to the proxy.
func (cn *Conn) send(req *Request) {
	env := cn.env
	cn.lastUse = env.Now()
	arrive := max(env.Now()+env.Latency(), cn.toProxy)
	cn.toProxy = arrive
	env.At(arrive, func() {
		if cn.isCut(arrive) || cn.Proxy == nil || !cn.Proxy.Arrive(req) {
			cn.Client.led.LostAcks0(req, "lost with its connection")
			return // lost on the way: the proxy never reads it
		}
	})
}

// close is the client closing cn: its FIN reaches the proxy behind the
// requests it sent.
func (cn *Conn) close() {
	if cn.clientClosed || cn.broken {
		return
	}
	env := cn.env
	cn.clientClosed, cn.closedAt = true, env.Now()
	arrive := max(env.Now()+env.Latency(), cn.toProxy)
	cn.toProxy = arrive
	env.At(arrive, func() {
		if cn.isCut(arrive) || cn.Proxy == nil {
			return
		}
		cn.Proxy.Fin()
	})
}

// Cut breaks cn: nothing more gets through either way. The proxy sees a
// reset at once unless the cut is silent; the client notices at once
// (reset) or only by its request timeouts (silent).
func (cn *Conn) Cut(silent bool) {
	env := cn.env
	if cn.cutAt > 0 {
		return
	}
	cn.cutAt, cn.Silent = env.Now(), silent
	if cn.Proxy != nil && !silent {
		env.After(env.Latency(), cn.Proxy.Reset)
	}
	if !silent {
		env.After(env.Latency(), func() { cn.Client.connBroken(cn) })
	}
}

// Answer carries an answer the proxy wrote to the client.
func (cn *Conn) Answer(req *Request, res []kafka.PartResult) {
	env := cn.env
	cn.Written++
	arrive := max(env.Now()+env.Latency(), cn.toClient)
	cn.toClient = arrive
	if cn.loseNext {
		cn.loseNext = false
		cn.Cut(false)
	}
	env.At(arrive, func() {
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
	env := cn.env
	arrive := max(env.Now()+env.Latency(), cn.toClient)
	cn.toClient = arrive
	env.At(arrive, func() {
		if cn.isCut(arrive) || cn.clientClosed || cn.broken {
			return
		}
		cn.Client.connBroken(cn)
	})
}

// LoseNextAnswer: the next answer written on cn is lost, and the
// connection with it (a lost acknowledgement).
func (cn *Conn) LoseNextAnswer() { cn.loseNext = true }

// MiddleboxCloses: something between client and proxy acknowledges the
// answers of cn and passes none on, then closes it: to the proxy a clean
// close, to the client a reset.
func (cn *Conn) MiddleboxCloses() {
	env := cn.env
	cn.Middlebox = true
	env.After(env.Between(time.Millisecond, 50*time.Millisecond), func() {
		if cn.Proxy != nil {
			cn.Proxy.Fin()
		}
		cn.cutAt = env.Now()
		env.After(env.Latency(), func() { cn.Client.connBroken(cn) })
	})
}

// ProxyCrashed: the proxy's process died; the client sees a reset.
func (cn *Conn) ProxyCrashed() {
	env := cn.env
	if cn.cutAt == 0 {
		cn.cutAt = env.Now()
		env.After(env.Latency(), func() { cn.Client.connBroken(cn) })
	}
}

// Describe names cn in a failure's account.
func (cn *Conn) Describe() string {
	return fmt.Sprintf("conn %d to node %d via replica %d", cn.ID, cn.Node, cn.Replica)
}
