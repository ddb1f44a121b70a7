package client

import (
	"time"

	"github.com/dedupproxy/dedupproxy/sim/kafka"
)

// Ledger is what a run's clients made and sent: every logical record (by
// lid) and every request (by id - 1), with what became of each, written
// by the clients, the network, the proxy and the broker as it happens,
// and read by the checks afterwards.
type Ledger struct {
	Records  []Record
	Requests []*Request
}

// Record is what the simulation knows of one logical record.
type Record struct {
	Client   *Client
	Name     string
	fresh    time.Duration // when the client made it
	Acked    bool          // the client was told it is written
	GaveUp   string        // why the client gave up on it, "" if it did not
	Lost     string        // acks=0: lost where the client cannot know (the network, the broker)
	Sends    []int         // requests that carried it
	Written  []int         // requests whose batch put it in the log
	Upstream bool          // the proxy forwarded it at least once
}

func (led *Ledger) newLid(c *Client, name string, now time.Duration) kafka.Lid {
	led.Records = append(led.Records, Record{Client: c, Name: name, fresh: now})
	return kafka.Lid(len(led.Records) - 1)
}

// LostAcks0 marks the records of an acks=0 request lost on the way: its
// client cannot know, and no one claims they are written.
func (led *Ledger) LostAcks0(req *Request, why string) {
	if req.Acks != 0 {
		return
	}
	for _, b := range req.Parts {
		for _, r := range b.Recs {
			if led.Records[r.Lid].Lost == "" {
				led.Records[r.Lid].Lost = why
			}
		}
	}
}
