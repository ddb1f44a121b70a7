// Package metrics holds the proxy's Prometheus metrics (docs/reference.md,
// "Metrics"): the counters of connections, requests and bytes, the
// decisions' outcomes as the proxy counts them ([Metrics.Count] reads a
// decided part's verdict), the tables' and the Produce path's gauges, the
// warm-ups, the large-request budget, listeners and authentication.
//
// Every label takes its values from a closed set the package names (the
// Out*, Client*, Broker*, Listener* and Refused* constants), or from the
// operator's own list of topics: never a producer id, client id or
// address. It decides nothing and reads no clock; the replicas' metrics
// are package replica's.
package metrics
