package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// Kafka is the proxy's memory (docs/warm.md). The tables live in memory,
// but what they hold — each batch's producer id, epoch, sequences, base
// offset, max timestamp and records — is in the partition's log. The first
// Produce to a partition this proxy has not seen since it started (a
// restart, a leader that moved here) waits for one read of the partition's
// tail, which fills the tables as if the proxy had seen those batches
// appended. Concurrent first batches share the read; it is bounded in time
// and bytes, and a partition whose tail cannot be read is decided as
// before (counted).

// warmState is one partition's warm-up: done is closed when it ends.
type warmState struct {
	done chan struct{}
	ok   bool
}

// warmer tracks which partitions have been warmed: every Produce asks
// about each of its partitions, so the map is sharded like logStartOffsets.
type warmer struct {
	shards [warmShards]warmShard
}

type warmShard struct {
	mu    sync.Mutex
	parts map[seqstate.Key]*warmState // ProducerID 0
	_     [48]byte                    // own cache line
}

const warmShards = 64

// maxWarmPerShard bounds the partitions remembered as warmed (256 Ki in
// all); past it a shard is cleared, and a partition touched again is
// warmed again, which costs a read but never a wrong decision.
const maxWarmPerShard = 4096

func (w *warmer) shard(k seqstate.Key) *warmShard {
	h := (uint64(k.Topic)<<32 | uint64(uint32(k.Partition))) * 0x9e3779b97f4a7c15
	return &w.shards[h>>(64-6)]
}

// begin returns the warm-up of partition k and whether the caller must run
// it (it is the first to ask).
func (w *warmer) begin(k seqstate.Key) (*warmState, bool) {
	k = k.PartitionKey()
	sh := w.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.parts == nil || len(sh.parts) >= maxWarmPerShard {
		sh.parts = map[seqstate.Key]*warmState{}
	}
	if st, ok := sh.parts[k]; ok {
		return st, false
	}
	st := &warmState{done: make(chan struct{})}
	sh.parts[k] = st
	return st, true
}

// isWarm reports whether partition k's warm-up has ended.
func (w *warmer) isWarm(k seqstate.Key) bool {
	k = k.PartitionKey()
	sh := w.shard(k)
	sh.mu.Lock()
	st, ok := sh.parts[k]
	sh.mu.Unlock()
	if !ok {
		return false
	}
	select {
	case <-st.done:
		return true
	default:
		return false
	}
}

// abandon ends the warm-up st of partition k that begin asked the caller to
// run, without running it: whoever waits on it goes on without it, and
// the next touch starts another.
func (w *warmer) abandon(k seqstate.Key, st *warmState) {
	k = k.PartitionKey()
	sh := w.shard(k)
	sh.mu.Lock()
	if sh.parts[k] == st {
		delete(sh.parts, k)
	}
	sh.mu.Unlock()
	close(st.done)
}

// forget makes partition k warm again on its next touch: a batch's outcome
// became unknown (its upstream connection broke), and the log will tell.
func (w *warmer) forget(k seqstate.Key) {
	k = k.PartitionKey()
	sh := w.shard(k)
	sh.mu.Lock()
	if st, ok := sh.parts[k]; ok {
		select {
		case <-st.done:
			delete(sh.parts, k)
		default: // a warm-up is running: it reads what is there now
		}
	}
	sh.mu.Unlock()
}

// warmRequest warms every partition of a Produce request that needs it,
// waiting at most dedup.warm.timeout in all. Partitions of unknown topics
// are left to the planner, which relays them undecided.
//
// A legacy batch resending one whose answer went unread makes partitions be
// read again (unread.go): it is looked for before warming, in what the
// proxy already knows, and once more after a first warm-up, in what the log
// has just shown (after a restart the proxy knows nothing before it).
func (c *session) warmRequest(h protocol.RequestHeader, body []byte) {
	pn := c.s.planner
	cfg := &c.s.Config.Dedup.Warm
	if pn.table == nil || !*cfg.Enabled || h.APIVersion < 3 || !c.isAuthenticated() {
		// Before the broker has authenticated the client it gets no work
		// done on its behalf (docs/security.md).
		return
	}
	sc := &c.scan
	reset := func() bool { return sc.Reset(body[h.BodyOffset:], h.APIVersion) == nil && sc.Acks != 0 }
	if !reset() {
		return
	}
	if pn.unread.live(time.Now()) || c.produces <= siblingRequests {
		c.noteRetries(h, sc)
		if !reset() {
			return
		}
	}
	if !c.warmScanned(h, sc) || !pn.unread.live(time.Now()) || !reset() {
		return
	}
	if c.noteRetries(h, sc) > 0 && reset() {
		c.warmScanned(h, sc)
	}
}

// warmScanned warms the partitions of the request sc has been reset on. It
// reports whether it waited for any warm-up, and each finished in time.
//
// Only partitions the cluster's metadata lists are warmed (partition
// numbers are the client's choice), each on a connection of the proxy's
// own: at most connWarmups at once for this connection and
// dedup.warm.max_concurrent for the proxy. A partition that gets no slot
// in time is decided without its warm-up and warmed on a later touch.
func (c *session) warmScanned(h protocol.RequestHeader, sc *protocol.ProduceScanner) bool {
	pn := c.s.planner
	bound := c.s.Config.Dedup.Warm.Timeout
	var waits []*warmState
	settling := false // some partition waits for batches a gone client left in flight
	var timer *time.Timer
	for sc.Next() {
		part := sc.Partition()
		topic, ok := pn.lookupTopic(h.APIVersion, part.Topic, part.TopicID)
		if !ok || part.Partition < 0 || part.Partition >= pn.table.TopicPartitions(topic) {
			continue
		}
		k := seqstate.Key{Topic: topic, Partition: part.Partition}
		if pn.warm.isWarm(k) {
			continue
		}
		settling = settling || pn.settling.wait(k) != nil
		st, run := pn.warm.begin(k)
		if run {
			if timer == nil {
				timer = time.NewTimer(bound)
				defer timer.Stop()
			}
			if !c.warmSlot(timer.C) {
				pn.warm.abandon(k, st)
				c.s.Metrics.warmups[warmTimedOut].Inc()
				continue
			}
			name, _ := pn.table.TopicName(topic)
			if !c.s.spawn(func() { defer c.releaseWarmSlot(); c.s.warmPartition(st, name, k) }) {
				c.releaseWarmSlot()
				close(st.done) // shutting down: nothing to wait for
			}
		}
		waits = append(waits, st)
	}
	if len(waits) == 0 {
		return false
	}
	if settling {
		// Waiting for originals still in flight is waiting for their
		// outcome, as a retry of one would (planner.wait): bounded by
		// the request's own timeout, and counted with those retries.
		bound = max(bound, min(time.Duration(max(sc.TimeoutMillis, 0))*time.Millisecond, maxWaitTimeout)+waitMargin)
		pn.nWaiting.Add(1)
		defer pn.nWaiting.Add(-1)
	}
	if timer == nil {
		timer = time.NewTimer(bound)
		defer timer.Stop()
	} else if settling {
		timer.Reset(bound)
	}
	for _, st := range waits {
		select {
		case <-st.done:
		case <-timer.C:
			c.s.Metrics.warmups[warmTimedOut].Inc()
			return false
		case <-c.closed:
			return false
		}
	}
	return true
}

// connWarmups bounds the warm-ups one client connection runs at once.
const connWarmups = 8

// warmSlot takes a slot for one warm-up: the connection's, then the
// proxy's. It gives up when expired fires or the connection closes.
func (c *session) warmSlot(expired <-chan time.Time) bool {
	select {
	case c.warmSlots <- struct{}{}:
	case <-expired:
		return false
	case <-c.closed:
		return false
	}
	select {
	case c.s.warmSlots <- struct{}{}:
		return true
	case <-expired:
	case <-c.closed:
	}
	<-c.warmSlots
	return false
}

func (c *session) releaseWarmSlot() {
	<-c.s.warmSlots
	<-c.warmSlots
}

// noteRetries passes each legacy batch of a Produce request to
// planner.noteRetry and, in the connection's first requests, to
// noteSiblingRetry. It returns how many batches it found unread.
func (c *session) noteRetries(h protocol.RequestHeader, sc *protocol.ProduceScanner) int {
	pn := c.s.planner
	who, trusted := c.authenticated()
	if pn.legacy == nil || pn.settings.Load().mode != DedupEnforce || !trusted {
		return 0
	}
	now := time.Now()
	found := 0
	var sibs []*session
	if c.produces <= siblingRequests {
		sibs = c.s.siblingsOf(c, nil)
	}
	for sc.Next() {
		part := sc.Partition()
		var bh protocol.BatchHeader
		if n, err := protocol.ReadBatch(part.Records, &bh); err != nil || n != 1 || bh.Magic < 2 || bh.ProducerID >= 0 {
			continue
		}
		topic, ok := pn.lookupTopic(h.APIVersion, part.Topic, part.TopicID)
		if !ok || pn.matchFor(topic) == MatchOff {
			continue
		}
		k := seqstate.Key{Topic: topic, Partition: part.Partition, Principal: who.id}
		first := protocol.FirstRecordHash(part.Records, &bh)
		found += pn.noteRetry(k, part, &bh, first, now)
		if len(sibs) > 0 {
			c.noteSiblingRetry(sibs, k, part, &bh, first)
		}
	}
	return found
}

// Warm-up outcomes, for dedupproxy_warmups_total{result}.
const (
	warmOK       = iota // the tail was read and applied
	warmFailed          // the tail could not be read: decided without it
	warmTimedOut        // a request stopped waiting for it
	numWarmResults
)

var warmResults = [numWarmResults]string{warmOK: "ok", warmFailed: "failed", warmTimedOut: "timed_out"}

// warmPartition reads the tail of one partition and applies it to the
// tables, then marks st done.
func (s *Server) warmPartition(st *warmState, topic string, k seqstate.Key) {
	defer close(st.done)
	cfg := &s.Config.Dedup.Warm
	if ch := s.planner.settling.wait(k); ch != nil {
		// Read the log once the batches a gone client left in flight
		// have settled (settle.go); a session gives up on them after
		// drain_timeout, and then they are settled too.
		t := time.NewTimer(s.Config.DrainTimeout)
		select {
		case <-ch:
		case <-t.C:
		case <-s.dialCtx.Done():
		}
		t.Stop()
	}
	ctx, cancel := context.WithTimeout(s.dialCtx, cfg.Timeout)
	defer cancel()
	start := time.Now()
	n, bytes, err := s.readTail(ctx, topic, k)
	if err != nil {
		s.Metrics.warmups[warmFailed].Inc()
		if ok, suppressed := s.warmLog.allow(time.Now()); ok {
			s.Logger.Warn("cannot read partition tail; deciding its batches without it", "topic", topic, "partition", k.Partition, "err", err, "suppressed", suppressed)
		}
		return
	}
	st.ok = true
	s.Metrics.warmups[warmOK].Inc()
	s.Metrics.warmBytes.Add(float64(bytes))
	s.Metrics.warmSeconds.Observe(time.Since(start).Seconds())
	s.Logger.Debug("warmed partition from its tail", "topic", topic, "partition", k.Partition, "batches", n, "bytes", bytes, "took", time.Since(start))
}

// readTail reads up to dedup.warm.max_bytes from the end of partition k
// (topic) at its leader and applies every batch to the tables. It returns
// the batches and bytes read.
func (s *Server) readTail(ctx context.Context, topic string, k seqstate.Key) (batches, bytes int, err error) {
	leader, err := s.leaderOf(ctx, topic, k.Partition)
	if err != nil {
		return 0, 0, err
	}
	conn, corr, err := s.ownConn(ctx, leader)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	rt := func(req kmsg.Request, resp kmsg.Response) error {
		corr++
		return s.probeRoundTrip(conn, req, resp, corr)
	}
	// The log's bounds, earliest (-2) and latest (-1), and the first
	// offset within the legacy window (by timestamp): one request each
	// (ListOffsets takes a partition once per request).
	now := time.Now()
	var bounds [3]int64
	// Twice the window: batch timestamps are the producers' clocks
	// (CreateTime), which may lag.
	for i, ts := range []int64{-2, -1, now.Add(-2 * s.Config.Dedup.Legacy.Window).UnixMilli()} {
		lo := kmsg.NewPtrListOffsetsRequest()
		lo.SetVersion(4)
		lt := kmsg.NewListOffsetsRequestTopic()
		lt.Topic = topic
		p := kmsg.NewListOffsetsRequestTopicPartition()
		p.Partition, p.Timestamp = k.Partition, ts
		lt.Partitions = append(lt.Partitions, p)
		lo.Topics = append(lo.Topics, lt)
		resp := kmsg.NewPtrListOffsetsResponse()
		resp.SetVersion(4)
		if err := rt(lo, resp); err != nil {
			return 0, 0, fmt.Errorf("list offsets: %w", err)
		}
		if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
			return 0, 0, errors.New("list offsets: unexpected answer")
		}
		rp := resp.Topics[0].Partitions[0]
		if rp.ErrorCode != 0 {
			return 0, 0, fmt.Errorf("list offsets: %w", kerr.ErrorForCode(rp.ErrorCode))
		}
		bounds[i] = rp.Offset
	}
	logStart, end, windowStart := bounds[0], bounds[1], bounds[2]
	s.planner.logStart.set(k, logStart)
	maxBytes := s.Config.Dedup.Warm.MaxBytes
	// Start far enough back that maxBytes of small records still reaches
	// the end, but not before the legacy window (an idempotent producer's
	// last batches are recent too); the broker returns whole batches.
	// -1: no batch is that recent.
	from := max(logStart, end-int64(maxBytes)/64)
	if windowStart < 0 {
		windowStart = end
	}
	from = max(from, min(windowStart, end))
	for iter := 0; from < end && bytes < maxBytes && iter < 64; iter++ {
		fr := kmsg.NewPtrFetchRequest()
		fr.SetVersion(11)
		fr.ReplicaID, fr.MaxWaitMillis, fr.MinBytes, fr.MaxBytes = -1, 0, 1, int32(maxBytes-bytes)
		fr.IsolationLevel, fr.SessionID, fr.SessionEpoch = 0, 0, -1 // read uncommitted, no fetch session
		ft := kmsg.NewFetchRequestTopic()
		ft.Topic = topic
		fp := kmsg.NewFetchRequestTopicPartition()
		fp.Partition, fp.FetchOffset, fp.PartitionMaxBytes, fp.LogStartOffset, fp.CurrentLeaderEpoch = k.Partition, from, int32(maxBytes-bytes), -1, -1
		ft.Partitions = append(ft.Partitions, fp)
		fr.Topics = append(fr.Topics, ft)
		resp := kmsg.NewPtrFetchResponse()
		resp.SetVersion(11)
		if err := rt(fr, resp); err != nil {
			return batches, bytes, fmt.Errorf("fetch: %w", err)
		}
		if resp.ErrorCode != 0 {
			return batches, bytes, fmt.Errorf("fetch: %w", kerr.ErrorForCode(resp.ErrorCode))
		}
		if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
			return batches, bytes, errors.New("fetch: unexpected answer")
		}
		p := resp.Topics[0].Partitions[0]
		if p.ErrorCode != 0 {
			return batches, bytes, fmt.Errorf("fetch: %w", kerr.ErrorForCode(p.ErrorCode))
		}
		n, next := s.planner.applyLog(k, p.RecordBatches, now)
		batches += n
		bytes += len(p.RecordBatches)
		if next <= from { // nothing whole came back: a batch larger than the budget
			break
		}
		from = next
	}
	return batches, bytes, nil
}

// leaderOf returns the address of the leader of topic/partition, from a
// Metadata request to a bootstrap broker.
func (s *Server) leaderOf(ctx context.Context, topic string, partition int32) (string, error) {
	var errs []error
	for _, addr := range s.Config.Upstream {
		conn, corr, err := s.ownConn(ctx, addr)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		req := kmsg.NewPtrMetadataRequest()
		req.SetVersion(probeMetadataVersion)
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(topic)
		req.Topics = append(req.Topics, rt)
		resp := kmsg.NewPtrMetadataResponse()
		resp.SetVersion(probeMetadataVersion)
		err = s.probeRoundTrip(conn, req, resp, corr+1)
		conn.Close()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, b := range resp.Brokers {
			s.nodes.MapBroker(b.NodeID, b.Host, b.Port)
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if p.Partition != partition {
					continue
				}
				if p.ErrorCode != 0 {
					return "", fmt.Errorf("metadata: %w", kerr.ErrorForCode(p.ErrorCode))
				}
				if a, ok := s.nodes.upstream(p.Leader); ok {
					return a, nil
				}
			}
		}
		return "", fmt.Errorf("metadata: no leader for %s/%d", topic, partition)
	}
	return "", errors.Join(errs...)
}

// ownConn opens one of the proxy's own connections to addr: TLS and SASL
// as configured for them. It returns the last correlation id used.
func (s *Server) ownConn(ctx context.Context, addr string) (net.Conn, int32, error) {
	conn, err := s.dialUpstream(ctx, addr)
	if err != nil {
		return nil, 0, err
	}
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	corr := int32(0)
	if mech := s.saslMechanism(); mech != nil {
		host, _, _ := net.SplitHostPort(addr)
		if corr, err = saslAuthenticate(ctx, conn, mech, host, 1, s.probeRoundTrip); err != nil {
			conn.Close()
			return nil, 0, err
		}
	}
	return conn, corr, nil
}

// applyLog fills the tables from record batches read from partition k's
// log, as if the proxy had seen each appended: idempotent batches are
// committed with their offsets, legacy batches remembered (within the
// window, their acknowledgement owned by no connection, so a retry from
// any connection is answered), idempotency keys remembered. It returns the
// whole batches applied and the offset after the last one.
func (pn *planner) applyLog(k seqstate.Key, records []byte, now time.Time) (n int, next int64) {
	next = -1
	header, keyed := pn.keyHeaderFor(k.Topic)
	match := pn.matchFor(k.Topic)
	var keys, stamps []protocol.RecordKey
	// The legacy batches read, in log order (unread.go).
	var tailBuf [legacyRingSize]legacyRef
	tail, until := tailBuf[:0], int64(0)
	defer func() { pn.unread.addLog(k, tail, until) }()
	for len(records) > 0 {
		var bh protocol.BatchHeader
		if _, err := protocol.ReadBatch(records, &bh); err != nil {
			break
		}
		size := 12 + int(bh.Length)
		if size > len(records) {
			break // a partial batch at the end of the fetch
		}
		b := records[:size]
		records = records[size:]
		next = bh.BaseOffset + int64(bh.LastOffsetDelta) + 1
		n++
		if bh.Magic < 2 || bh.IsControl() {
			continue
		}
		switch {
		case bh.ProducerID >= 0:
			// Fingerprint 0 (unknown) matches any retry: the broker may
			// have recompressed the batch (topic compression.type), and
			// then its records are not the bytes the producer resends.
			key := seqstate.Key{ProducerID: bh.ProducerID, Topic: k.Topic, Partition: k.Partition}
			batch := seqstate.Batch{Epoch: bh.ProducerEpoch, FirstSeq: bh.BaseSequence, Count: bh.LastOffsetDelta + 1}
			pn.table.Commit(key, batch, bh.BaseOffset, bh.MaxTimestamp, now)
		case pn.legacy != nil && match != MatchOff:
			id := protocol.MixIdentity(protocol.RecordsIdentity(b, &bh, match == MatchExact), uint32(k.Topic), 0 /* read from the log: ANONYMOUS only (docs/security.md) */)
			if pn.legacy.Remember(id, k.Partition, bh.BaseOffset, bh.MaxTimestamp, now) && match == MatchRecords {
				// Appended, but its client was answered an error: it may
				// resend these records inside other batches (resent.go).
				stamps = pn.rememberUnacked(k, b, &bh, stamps, now)
			}
			if match == MatchRecords && bh.NumRecords > 0 {
				// Also a candidate for a re-batched retry (rebatch.go):
				// librdkafka resends a lost batch with newer records behind
				// it, to a proxy restarted in between too.
				seen := min(now.UnixNano(), bh.MaxTimestamp*int64(time.Millisecond))
				ref := legacyRef{id: id, topic: k.Topic, partition: k.Partition, count: bh.NumRecords,
					size: bh.RecordsLen(), first: protocol.FirstRecordHash(b, &bh)}
				pn.orphans.add([]legacyRef{ref}, seen+int64(pn.legacyWindow))
				if len(tail) == legacyRingSize {
					tail = append(tail[:0], tail[1:]...)
				}
				tail = append(tail, ref)
				until = max(until, seen+int64(pn.legacyWindow))
			}
		}
		if keyed {
			var err error
			if keys, err = protocol.RecordKeys(keys[:0], b, &bh, header); err == nil {
				for i, rk := range keys {
					if rk.Present {
						lo, hi := topicKey(rk, k)
						pn.keys.Commit(lo, hi, bh.BaseOffset+int64(i), now)
					}
				}
			}
		}
	}
	return n, next
}
