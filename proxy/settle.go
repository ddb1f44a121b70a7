package proxy

import (
	"sync"
	"sync/atomic"

	"github.com/dedupproxy/dedupproxy/seqstate"
)

// Batches left in flight by a client that has gone (docs/legacy.md,
// "Records of an unacknowledged append"). A client that times a request out
// closes its connection and sends the records again on a new one, while the
// broker may still append the originals; librdkafka batches them again at
// other boundaries, so no batch identity matches. The partition is
// therefore not read from the log, and no Produce to it is decided, until
// those originals have settled: then the read finds them appended, keeps a
// stamp of each of their records (resent.go), and the records sent again
// are not written twice.

// settling tracks, per partition, the legacy batches in flight upstream from
// connections whose client has gone.
type settling struct {
	mu    sync.Mutex
	parts map[seqstate.Key]*settleState // ProducerID 0
	n     atomic.Int64                  // len(parts), read without the lock
}

type settleState struct {
	ids  map[uint64]struct{}
	done chan struct{} // closed when ids empties
}

// maxSettlingPartitions bounds the partitions tracked; past it a batch is
// not waited for (its partition is decided as without this).
const maxSettlingPartitions = 4096

func settleKey(k seqstate.Key) seqstate.Key {
	k = k.PartitionKey()
	return k
}

// add records batch id of partition k as in flight from a gone client.
func (s *settling) add(k seqstate.Key, id uint64) {
	k = settleKey(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.parts == nil {
		s.parts = map[seqstate.Key]*settleState{}
	}
	st := s.parts[k]
	if st == nil {
		if len(s.parts) >= maxSettlingPartitions {
			return
		}
		st = &settleState{ids: map[uint64]struct{}{}, done: make(chan struct{})}
		s.parts[k] = st
		s.n.Store(int64(len(s.parts)))
	}
	st.ids[id] = struct{}{}
}

// settled records that batch id of partition k was committed or released.
func (s *settling) settled(k seqstate.Key, id uint64) {
	if s.n.Load() == 0 {
		return
	}
	k = settleKey(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.parts[k]
	if st == nil {
		return
	}
	delete(st.ids, id)
	if len(st.ids) == 0 {
		close(st.done)
		delete(s.parts, k)
		s.n.Store(int64(len(s.parts)))
	}
}

// wait returns a channel closed when partition k has nothing in flight
// from a gone client, or nil if it has nothing now.
func (s *settling) wait(k seqstate.Key) <-chan struct{} {
	if s.n.Load() == 0 {
		return nil
	}
	k = settleKey(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.parts[k]; st != nil {
		return st.done
	}
	return nil
}
