package sim

import (
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/decide"
	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
	"github.com/dedupproxy/dedupproxy/sim/client"
	"github.com/dedupproxy/dedupproxy/sim/kafka"
)

// This file is the simulation's only caller of decide.Core: every event
// the proxy's session hands the core (docs/produce-path.md, "Events in,
// effects out") goes through one method here, so that a change to the
// core's signatures touches this file alone.

// core is one proxy process's decision core: a replica, or the proxy after
// a restart (a new core: memory lost, the log kept).
type core struct {
	name  string // in the script: the core=NAME of its connections
	c     *decide.Core
	table *seqstate.Table
	topic seqstate.TopicID
	sc    protocol.ProduceResponseScanner
}

// coreConfig is what every core of a run is built with.
type coreConfig struct {
	window time.Duration
	scope  decide.Scope
	match  decide.Match
}

func newCore(name string, cfg coreConfig) *core {
	tab, err := seqstate.New(seqstate.Config{})
	if err != nil {
		panic(err) // the default config is valid
	}
	tab.InternTopics([]seqstate.TopicRef{{Name: kafka.Topic, Partitions: kafka.MaxPartitions}})
	topic, _ := tab.LookupTopic([]byte(kafka.Topic))
	c := decide.New(decide.Config{Table: tab, Window: cfg.window, Scope: cfg.scope, Warm: true},
		&decide.Settings{Mode: decide.Enforce, Match: cfg.match})
	return &core{name: name, c: c, table: tab, topic: topic}
}

// step carries one event to the core (decide.Core.Step) and returns its
// effects.
func (k *core) step(ev decide.Event, now time.Time) decide.Effects {
	var fx decide.Effects
	k.c.Step(&ev, now, &fx)
	return fx
}

func (k *core) connect(id decide.ConnID, cl client.Info, now time.Time) *decide.Conn {
	return k.step(decide.Event{Kind: decide.EvConnect, ID: id,
		Client: decide.Client{Principal: cl.Principal, ID: cl.ID, Host: cl.Host, Software: cl.Software}}, now).Conn
}

// disconnect: the connection closed or broke. clean says whether its
// client closed it with every answer written on it received by its TCP
// stack (decide.Clean), as the proxy reads it from the socket.
func (k *core) disconnect(conn *decide.Conn, clean bool, now time.Time) {
	k.step(decide.Event{Kind: decide.EvClose, Conn: conn, How: closeOf(clean)}, now)
}

func closeOf(clean bool) decide.Close {
	if clean {
		return decide.Clean
	}
	return decide.Broken
}

func (k *core) gone(conn *decide.Conn) bool { return k.c.Gone(conn) }

func (k *core) siblings(conn *decide.Conn) []decide.ConnID { return k.c.Siblings(conn, nil) }

func (k *core) disconnectSibling(conn *decide.Conn, id decide.ConnID, clean bool, now time.Time) {
	k.step(decide.Event{Kind: decide.EvSiblingClosed, Conn: conn, ID: id, How: closeOf(clean)}, now)
}

// decide decides req into pl; it returns the connections to wake (its own,
// when what it is to wait for came as it registered).
func (k *core) decide(req *decide.Request, pl *decide.Plan, now time.Time) []decide.ConnID {
	return k.step(decide.Event{Kind: decide.EvRequest, Req: req, Plan: pl}, now).Wake
}

// outcome hands the broker's answer to the core, as a Produce response
// body of the request's version.
func (k *core) outcome(pl *decide.Plan, version int16, res []kafka.PartResult, now time.Time) []decide.ConnID {
	resp := kmsg.NewPtrProduceResponse()
	resp.SetVersion(version)
	rt := kmsg.NewProduceResponseTopic()
	rt.Topic = kafka.Topic
	for _, r := range res {
		rp := kmsg.NewProduceResponseTopicPartition()
		rp.Partition, rp.ErrorCode, rp.BaseOffset, rp.LogAppendTime, rp.LogStartOffset = r.Partition, r.Code, r.Offset, r.AppendTime, 0
		rt.Partitions = append(rt.Partitions, rp)
	}
	resp.Topics = append(resp.Topics, rt)
	fx := k.step(decide.Event{Kind: decide.EvAnswered, Plan: pl, Scanner: &k.sc, Body: resp.AppendTo(nil)}, now)
	if fx.Err != nil {
		panic(fx.Err) // the simulation built the body: a bug here
	}
	return fx.Wake
}

func (k *core) lost(pl *decide.Plan, now time.Time) []decide.ConnID {
	return k.step(decide.Event{Kind: decide.EvLost, Plan: pl}, now).Wake
}

func (k *core) unsent(pl *decide.Plan, now time.Time) []decide.ConnID {
	return k.step(decide.Event{Kind: decide.EvUnsent, Plan: pl}, now).Wake
}

func (k *core) delivered(pl *decide.Plan, ok bool, now time.Time) {
	k.step(decide.Event{Kind: decide.EvWritten, Plan: pl, OK: ok}, now)
}

func (k *core) tailKey(p int32) decide.TailKey { return decide.TailKey{Topic: k.topic, Partition: p} }

func (k *core) tailRead(p int32, records []byte, now time.Time) []decide.ConnID {
	return k.step(decide.Event{Kind: decide.EvTailRead, Tail: k.tailKey(p), Records: records}, now).Wake
}

func (k *core) tailFailed(p int32, now time.Time) []decide.ConnID {
	return k.step(decide.Event{Kind: decide.EvTailFailed, Tail: k.tailKey(p)}, now).Wake
}

// handOff moves the legacy state of partitions parts to core to, as two
// replicas do when a node changes hands (docs/replicas.md). Both cores
// intern the one topic first, so its number is the same in both.
func (k *core) handOff(to *core, parts []int32, now time.Time) int {
	want := func(_ seqstate.TopicID, p int32) bool {
		for _, q := range parts {
			if q == p {
				return true
			}
		}
		return false
	}
	handed := k.step(decide.Event{Kind: decide.EvHandOff, Want: want}, now).Handed
	return to.step(decide.Event{Kind: decide.EvTakeOver, Handed: handed}, now).Taken
}

func (k *core) rewarm(p int32) {
	k.step(decide.Event{Kind: decide.EvRewarm, Topic: k.topic, Partition: p}, time.Time{})
}
