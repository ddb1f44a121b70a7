package proxy

import (
	"github.com/prometheus/client_golang/prometheus"
)

// replicaMetrics are the replicas' metrics (docs/replicas.md, "Metrics").
// A proxy on its own exports them too, as the one replica that owns and
// serves every node, so dashboards and alerts need no second form.
type replicaMetrics struct {
	foreignConns   prometheus.Counter
	foreignProduce prometheus.Counter
	redirected     prometheus.Counter
	rewarmed       prometheus.Counter
	handovers      [numHandoverEvents]prometheus.Counter
	held           prometheus.Observer
}

// newReplicaMetrics makes the replicas' metrics and registers them, with
// gauges that read s, on s.Metrics' registry (if any).
func newReplicaMetrics(s *Server) *replicaMetrics {
	const ns, sub = "dedupproxy", "replica"
	m := &replicaMetrics{
		foreignConns: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "foreign_connections_total",
			Help: "Client connections to a broker node this replica does not serve (a client with metadata from before a handover): relayed."}),
		foreignProduce: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "foreign_produce_requests_total",
			Help: "Produce requests for a node this replica does not serve, relayed and decided here."}),
		redirected: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "redirected_requests_total",
			Help: "Produce requests answered NOT_LEADER_OR_FOLLOWER, pointing at the replica that serves their node, while nodes moved between replicas."}),
		rewarmed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "rewarm_partitions_total",
			Help: "Partitions marked to be warmed from the log again: their node was covered (taken from a peer), or their leader moved away from the nodes this replica serves."}),
	}
	handovers := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "handovers_total",
		Help: "Broker nodes moved between replicas, by event: released (handed to a peer), covered (a peer's node taken), reclaimed (an owned node taken back, or first served, after a start)."}, []string{"event"})
	for i, e := range handoverEvents {
		m.handovers[i] = handovers.WithLabelValues(e)
	}
	held := prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "held_seconds",
		Help:    "Time Produce requests waited while their node moved between replicas.",
		Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}})
	m.held = held
	reg := s.Metrics.reg
	if reg == nil {
		return m
	}
	nodes := func(role string, count func(owned, serving, covered int) int, alone func() int) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "nodes",
			Help:        "Broker nodes by this replica's role: owned (by the ownership rule), serving (decided here now: owned and taken back, or covered), covered (served here for a peer).",
			ConstLabels: prometheus.Labels{"role": role}},
			func() float64 {
				if rs := s.replicas; rs != nil {
					rs.mu.Lock()
					defer rs.mu.Unlock()
					return float64(count(rs.own.Count()))
				}
				return float64(alone())
			})
	}
	known := func() int { return len(s.NodeListeners()) }
	reg.MustRegister(m.foreignConns, m.foreignProduce, m.redirected, m.rewarmed, handovers, held,
		nodes("owned", func(owned, _, _ int) int { return owned }, known),
		nodes("serving", func(_, serving, _ int) int { return serving }, known),
		nodes("covered", func(_, _, covered int) int { return covered }, func() int { return 0 }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "ready",
			Help: "1 when this replica serves every node it owns and is not handing over (a proxy on its own: not draining)."},
			func() float64 {
				if s.Draining() {
					return 0
				}
				if rs := s.replicas; rs != nil && rs.ready() != nil {
					return 0
				}
				return 1
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "peers_reachable",
			Help: "Peers whose status this replica read at its last poll."},
			func() float64 {
				rs := s.replicas
				if rs == nil {
					return 0
				}
				rs.mu.Lock()
				defer rs.mu.Unlock()
				return float64(rs.own.Reachable())
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "peers_disagreeing",
			Help: "Reachable peers that publish another replica list or layout than this replica's: the replicas are configured differently and advertise nodes at different addresses."},
			func() float64 {
				rs := s.replicas
				if rs == nil {
					return 0
				}
				rs.mu.Lock()
				defer rs.mu.Unlock()
				differ, _ := rs.own.LayoutVotes()
				return float64(len(differ))
			}),
	)
	return m
}
