package replica

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/dedupproxy/dedupproxy/decide"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// Legacy state at a handover (docs/replicas.md): the replica that starts
// deciding a node another replica decided before takes from it, over the
// admin listener (POST /replica/legacy), the legacy batches of the node's
// partitions whose acknowledgement their client may not hold. Without
// them it knows those batches only from the log, where a retry stamped
// anew (kafka-go, kafkajs) matches nothing and is written again. The
// decision core's two halves of it are its EvHandOff step (the giver's)
// and EvTakeOver (the taker's): Core.HandOff and Core.TakeOver.

// legacyRequest names the node moving and its partitions.
type legacyRequest struct {
	Node       int32         `json:"node"`
	Partitions []legacyTopic `json:"partitions"`
}

type legacyTopic struct {
	Topic      string  `json:"topic"`
	Partitions []int32 `json:"partitions"`
}

type legacyResponse struct {
	Batches []handedBatch `json:"batches"`
}

// handedBatch is a decide.Handed on the wire, with names for numbers.
type handedBatch struct {
	Principal  string `json:"principal"`
	ClientID   string `json:"client_id"`
	Host       []byte `json:"host"` // 16 bytes
	Topic      string `json:"topic"`
	Partition  int32  `json:"partition"`
	Whole      bool   `json:"whole,omitempty"`
	LeftMillis int64  `json:"left_ms"`
	AppendTime int64  `json:"append_time"`
	Records    []byte `json:"records"` // per record: hash, then offset, 8 bytes each, big-endian
}

// Bounds of the exchange: a request names a node's partitions; an answer
// holds at most what the peer's dedup.legacy.max_records allows (24 bytes
// a record in JSON).
const (
	maxLegacyRequest  = 4 << 20
	maxLegacyResponse = 256 << 20
	legacyTimeout     = 5 * time.Second
)

// serveLegacy serves POST /replica/legacy: it moves out of the core the
// batches of the named partitions, but only once node is not decided here
// (released to a peer, or never served): a node still decided here keeps
// them (409).
func (rs *Set) serveLegacy(w http.ResponseWriter, r *http.Request) {
	var req legacyRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, maxLegacyRequest)).Decode(&req); err != nil {
		http.Error(w, "bad request: "+err.Error(), http.StatusBadRequest)
		return
	}
	if n := rs.Node(req.Node); n != nil {
		// The node's state may still be coming in here (a cover or a
		// take-back under way, released meanwhile by a stop): handed on
		// before it arrived, it would stay behind. Wait for the take's end
		// (a change), bounded.
		timer := rs.Clock.NewTimer(legacyTimeout)
		defer timer.Stop()
		for {
			changed := rs.waitChange()
			if !rs.fetching(n) {
				break
			}
			select {
			case <-changed:
				continue
			case <-timer.C:
			case <-r.Context().Done():
				return
			}
			break
		}
		if decides(n.state.Load()) {
			http.Error(w, fmt.Sprintf("node %d is decided here", req.Node), http.StatusConflict)
			return
		}
	}
	resp := legacyResponse{Batches: []handedBatch{}}
	if c := rs.Core; c != nil {
		want := map[seqstate.Key]bool{}
		for _, tp := range req.Partitions {
			id, ok := c.LookupTopic(tp.Topic)
			if !ok {
				continue
			}
			for _, p := range tp.Partitions {
				want[seqstate.Key{Topic: id, Partition: p}] = true
			}
		}
		hs := c.HandOff(func(t seqstate.TopicID, p int32) bool { return want[seqstate.Key{Topic: t, Partition: p}] })
		for _, h := range hs {
			principal, ok1 := c.PrincipalName(h.Principal)
			topic, ok2 := c.TopicName(h.Topic)
			if !ok1 || !ok2 {
				continue
			}
			recs := make([]byte, 0, 16*len(h.Hashes))
			for i, hash := range h.Hashes {
				recs = binary.BigEndian.AppendUint64(recs, hash)
				recs = binary.BigEndian.AppendUint64(recs, uint64(h.Offsets[i]))
			}
			resp.Batches = append(resp.Batches, handedBatch{
				Principal: principal, ClientID: h.ClientID, Host: h.Host[:], Topic: topic, Partition: h.Partition,
				Whole: h.Whole, LeftMillis: h.Left.Milliseconds(), AppendTime: h.AppendTime, Records: recs,
			})
		}
		rs.log.Info("gave a node's legacy state to the peer taking it", "node", req.Node, "batches", len(resp.Batches))
	}
	var b bytes.Buffer
	json.NewEncoder(&b).Encode(resp)
	w.Header().Set("Content-Type", "application/json")
	w.Write(b.Bytes())
}

// fetching reports whether n's take (its legacy state from a peer) is
// under way.
func (rs *Set) fetching(n *Node) bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.own.Fetching(n.id)
}

// takeLegacy takes from peer from the legacy state of node's partitions
// (keys), as serveLegacy gives it, into the core. A peer that does not
// answer costs what it cost before: the retries of those batches stamped
// anew are written again.
func (rs *Set) takeLegacy(from int, node int32, keys []seqstate.Key) {
	c := rs.Core
	if c == nil || from < 0 || from == rs.l.Self || len(keys) == 0 {
		return
	}
	req := legacyRequest{Node: node}
	byTopic := map[string]int{}
	for _, k := range keys {
		name, ok := c.TopicName(k.Topic)
		if !ok {
			continue
		}
		i, ok := byTopic[name]
		if !ok {
			i = len(req.Partitions)
			byTopic[name] = i
			req.Partitions = append(req.Partitions, legacyTopic{Topic: name})
		}
		req.Partitions[i].Partitions = append(req.Partitions[i].Partitions, k.Partition)
	}
	resp, err := rs.postLegacy(from, &req)
	if err != nil {
		rs.log.Warn("cannot take the legacy state of a node from the peer that decided it; retries of its batches stamped anew may be written again", "node", node, "peer", from, "err", err)
		return
	}
	hs := make([]decide.Handed, 0, len(resp.Batches))
	for _, b := range resp.Batches {
		topic, ok := c.LookupTopic(b.Topic)
		if !ok || len(b.Host) != 16 || len(b.Records)%16 != 0 || b.LeftMillis <= 0 {
			continue
		}
		principal, ok := c.PrincipalID(b.Principal)
		if !ok {
			continue
		}
		h := decide.Handed{
			Principal: principal, ClientID: b.ClientID, Topic: topic, Partition: b.Partition, Whole: b.Whole,
			Left: time.Duration(b.LeftMillis) * time.Millisecond, AppendTime: b.AppendTime,
		}
		copy(h.Host[:], b.Host)
		for r := b.Records; len(r) >= 16; r = r[16:] {
			h.Hashes = append(h.Hashes, binary.BigEndian.Uint64(r))
			h.Offsets = append(h.Offsets, int64(binary.BigEndian.Uint64(r[8:])))
		}
		hs = append(hs, h)
	}
	taken := c.TakeOver(hs)
	rs.log.Info("took the legacy state of a node from the peer that decided it", "node", node, "peer", from, "batches", taken)
}

func (rs *Set) postLegacy(peer int, req *legacyRequest) (*legacyResponse, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(rs.Ctx, min(legacyTimeout, rs.DrainTimeout))
	defer cancel()
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, rs.peerURL(peer, "/replica/legacy"), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	hr.Header.Set("Content-Type", "application/json")
	// rs.client's timeout is one status request's; the state may be larger.
	r, err := (&http.Client{Transport: rs.client.Transport}).Do(hr)
	if err != nil {
		return nil, err
	}
	defer r.Body.Close()
	if r.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(r.Body, 512))
		return nil, fmt.Errorf("POST /replica/legacy: %s: %s", r.Status, bytes.TrimSpace(msg))
	}
	var resp legacyResponse
	if err := json.NewDecoder(io.LimitReader(r.Body, maxLegacyResponse)).Decode(&resp); err != nil {
		return nil, fmt.Errorf("POST /replica/legacy: %w", err)
	}
	return &resp, nil
}
