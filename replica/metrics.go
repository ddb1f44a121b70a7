package replica

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the replicas' metrics (docs/replicas.md, "Metrics").
// A proxy on its own exports them too, as the one replica that owns and
// serves every node, so dashboards and alerts need no second form.
// Tests read the counters.
type Metrics struct {
	ForeignConns   prometheus.Counter
	ForeignProduce prometheus.Counter
	Redirected     prometheus.Counter
	Rewarmed       prometheus.Counter
	Handovers      [numHandoverEvents]prometheus.Counter
	Held           prometheus.Observer
}

// Gauges is what the replicas' gauges read.
type Gauges struct {
	// Set is the replica set, nil while the proxy runs on its own.
	Set func() *Set
	// Nodes counts the broker nodes the proxy has a listener for: on its
	// own it owns and serves each.
	Nodes func() int
	// Draining reports whether the proxy stops.
	Draining func() bool
}

// NewMetrics makes the replicas' metrics and registers them on reg (if
// not nil), with gauges that read g.
func NewMetrics(reg prometheus.Registerer, g Gauges) *Metrics {
	const ns, sub = "dedupproxy", "replica"
	m := &Metrics{
		ForeignConns: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "foreign_connections_total",
			Help: "Client connections to a broker node this replica does not serve (a client with metadata from before a handover): relayed."}),
		ForeignProduce: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "foreign_produce_requests_total",
			Help: "Produce requests for a node this replica does not serve, relayed and decided here."}),
		Redirected: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "redirected_requests_total",
			Help: "Produce requests answered NOT_LEADER_OR_FOLLOWER, pointing at the replica that serves their node, while nodes moved between replicas."}),
		Rewarmed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "rewarm_partitions_total",
			Help: "Partitions marked to be warmed from the log again: their node was covered (taken from a peer), or their leader moved away from the nodes this replica serves."}),
	}
	handovers := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "handovers_total",
		Help: "Broker nodes moved between replicas, by event: released (handed to a peer), covered (a peer's node taken), reclaimed (an owned node taken back, or first served, after a start)."}, []string{"event"})
	for i, e := range handoverEvents {
		m.Handovers[i] = handovers.WithLabelValues(e)
	}
	held := prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "held_seconds",
		Help:    "Time Produce requests waited while their node moved between replicas.",
		Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}})
	m.Held = held
	if reg == nil {
		return m
	}
	nodes := func(role string, count func(owned, serving, covered int) int, alone func() int) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "nodes",
			Help:        "Broker nodes by this replica's role: owned (by the ownership rule), serving (decided here now: owned and taken back, or covered), covered (served here for a peer).",
			ConstLabels: prometheus.Labels{"role": role}},
			func() float64 {
				if rs := g.Set(); rs != nil {
					rs.mu.Lock()
					defer rs.mu.Unlock()
					return float64(count(rs.own.Count()))
				}
				return float64(alone())
			})
	}
	known := g.Nodes
	reg.MustRegister(m.ForeignConns, m.ForeignProduce, m.Redirected, m.Rewarmed, handovers, held,
		nodes("owned", func(owned, _, _ int) int { return owned }, known),
		nodes("serving", func(_, serving, _ int) int { return serving }, known),
		nodes("covered", func(_, _, covered int) int { return covered }, func() int { return 0 }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "ready",
			Help: "1 when this replica serves every node it owns and is not handing over (a proxy on its own: not draining)."},
			func() float64 {
				if g.Draining() {
					return 0
				}
				if rs := g.Set(); rs != nil && rs.Ready() != nil {
					return 0
				}
				return 1
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "peers_reachable",
			Help: "Peers whose status this replica read at its last poll."},
			func() float64 {
				rs := g.Set()
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
				rs := g.Set()
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
