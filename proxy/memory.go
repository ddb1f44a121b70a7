package proxy

import (
	"github.com/dedupproxy/dedupproxy/config"
	"github.com/dedupproxy/dedupproxy/relay"
)

// requestPool returns the server's pool of large request buffers
// (request_memory), made on first use.
func (s *Server) requestPool() *relay.RequestPool {
	s.reqPoolOnce.Do(func() {
		budget := s.Config.RequestMemory
		if budget <= 0 { // a Config that skipped EnsureDefaults
			budget = config.DefaultRequestMemory
		}
		var pm *relay.PoolMetrics
		if m := s.Metrics; m != nil {
			pm = m.RequestPool()
		}
		s.reqPool = relay.NewRequestPool(budget, pm)
	})
	return s.reqPool
}
