package proxy

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupproxy/dedupproxy/metrics"
)

// Version is the proxy's version, reported by dedupproxy_build_info.
var Version = "dev"

// Revision is the VCS revision the proxy was built from, reported by
// dedupproxy_build_info; the command sets it from the build information.
var Revision = "unknown"

// Metrics are the proxy's Prometheus metrics (package metrics).
type Metrics = metrics.Metrics

// NewMetrics creates the metrics and registers them, with the Go and
// process collectors, on reg. A nil reg registers nothing.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	return metrics.New(reg, metrics.Build{Version: Version, Revision: Revision})
}
