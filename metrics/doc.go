// Package metrics is what the proxy reports: its Prometheus metrics
// (docs/reference.md, "Metrics"), the counters of connections, requests
// and bytes, the decisions' outcomes ([Metrics.Count] reads a decided
// part's verdict), the tables' and the Produce path's gauges, the
// warm-ups, the large-request budget, listeners and authentication; and
// the log line of a part the proxy answered or cut itself
// ([LogVerdict], rate-limited by a [LogLimiter]).
//
// Every label takes its values from a closed set the package names (the
// Out*, Client*, Broker*, Listener* and Refused* constants), or from the
// operator's own list of topics: never a producer id, client id or
// address. It decides nothing and reads no clock (the time is given); the
// replicas' metrics are package replica's.
package metrics
