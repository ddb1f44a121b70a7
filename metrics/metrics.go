package metrics

import (
	"runtime"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/auth"
	"github.com/dedupproxy/dedupproxy/config"
	"github.com/dedupproxy/dedupproxy/decide"
	"github.com/dedupproxy/dedupproxy/relay"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// Metrics are the proxy's Prometheus metrics. Every label takes its values
// from a small closed set: never a producer id, topic, client id or address.
// The proxy counts through the fields and methods; tests read the counters.
type Metrics struct {
	ClientConnectionsTotal prometheus.Counter
	ClientConnections      prometheus.Gauge
	ClientReadBytes        prometheus.Counter
	ClientWrittenBytes     prometheus.Counter
	BrokerReadBytes        prometheus.Counter
	BrokerWrittenBytes     prometheus.Counter
	Panics                 prometheus.Counter

	reg prometheus.Registerer

	// Batches is indexed by the Out* outcomes.
	Batches      [NumBatchOutcomes]prometheus.Counter
	DupAnswered  [2]prometheus.Counter // DupByProxy, DupByBroker
	Warmups      [NumWarmResults]prometheus.Counter
	WarmBytes    prometheus.Counter
	WarmSeconds  prometheus.Observer
	KeysDropped  prometheus.Counter
	KeysObserved prometheus.Counter
	RetryRecords [2]prometheus.Counter // RetryDropped: legacy records not written again; RetryObserved: that would not be
	// Per topic, for the topics dedup.topics lists with metrics: true.
	topicBatches      *prometheus.CounterVec
	topicRetryRecords *prometheus.CounterVec
	Passthrough       [decide.NumPass]prometheus.Counter
	WaitTimeouts      prometheus.Counter
	Waiting           prometheus.Gauge
	// The large-request budget (relay.RequestPool).
	reqMemWaits   [numReqMemWaits]prometheus.Counter
	reqMemStalled prometheus.Counter
	reqMemHeld    prometheus.Gauge
	// Produce record bytes kept out of the proxy's memory (relay/holes.go).
	ProduceSpliced  prometheus.Counter
	ProduceReadBack prometheus.Counter

	Requests        *prometheus.CounterVec
	requestDuration *prometheus.HistogramVec
	ClientErrors    *prometheus.CounterVec
	BrokerErrors    *prometheus.CounterVec

	// Per-API children are resolved once, on first use, so the hot path
	// does no label lookups and only APIs actually seen get series.
	apiMu sync.Mutex
	apis  [kmsg.MaxKey + 1]*API

	// Listeners and connection limits.
	ListenerErrors *prometheus.CounterVec
	RefusedConns   *prometheus.CounterVec

	// Authentication.
	AuthUnfollowed prometheus.Counter
	// AuthRelayedOnly: client_auth_relayed_only_total{reason}, reasons
	// auth.RelayPipelined and auth.RelayReauth.
	AuthRelayedOnly *prometheus.CounterVec
}

// API is one Kafka API's children of requests_total and
// request_duration_seconds.
type API struct {
	Requests prometheus.Counter
	Duration prometheus.Observer
}

// Closed label sets.
const (
	// broker_errors_total{reason}
	BrokerDial     = "dial"
	BrokerRead     = "read"
	BrokerWrite    = "write"
	BrokerProtocol = "protocol"
	BrokerTLS      = "tls" // the TLS handshake with the broker failed
	// client_errors_total{reason}
	ClientFrame     = "bad_frame"
	ClientHeader    = "bad_header"
	ClientTLS       = "tls"           // a TLS handshake on a plaintext listener
	ClientPlaintext = "plaintext"     // plaintext on a TLS listener
	ClientHandshake = "tls_handshake" // a TLS handshake that failed
	ClientHTTP      = "http"
	ClientIdle      = "idle_timeout"
	ClientWrite     = "write"
	ClientRequest   = "bad_request"
	ClientUnauth    = "unauthenticated_frame" // a frame above unauthenticated_max_frame_bytes before authentication
	// client_connections_refused_total{reason}
	RefusedMaxConns = "max_connections"
	RefusedMaxPerIP = "max_connections_per_ip"
)

// Build is what dedupproxy_build_info reports.
type Build struct{ Version, Revision string }

// New creates the metrics and registers them, with the Go and process
// collectors, on reg. A nil reg registers nothing.
func New(reg prometheus.Registerer, build Build) *Metrics {
	const ns = "dedupproxy"
	m := &Metrics{
		ClientConnectionsTotal: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: "client", Name: "connections_total",
			Help: "Client connections accepted."}),
		ClientConnections: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: "client", Name: "connections",
			Help: "Client connections open now."}),
		ClientReadBytes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: "client", Name: "read_bytes_total",
			Help: "Bytes read from clients (requests)."}),
		ClientWrittenBytes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: "client", Name: "written_bytes_total",
			Help: "Bytes written to clients (responses)."}),
		BrokerReadBytes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: "broker", Name: "read_bytes_total",
			Help: "Bytes read from brokers (responses)."}),
		BrokerWrittenBytes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: "broker", Name: "written_bytes_total",
			Help: "Bytes written to brokers (requests)."}),
		Panics: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "panics_total",
			Help: "Panics recovered in connection goroutines; each closed its connection."}),
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "requests_total",
			Help: "Requests read from clients, by Kafka API."}, []string{"api"}),
		requestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "request_duration_seconds",
			Help:    "Time from reading a request to writing its response, by Kafka API.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}}, []string{"api"}),
		ClientErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: "client", Name: "errors_total",
			Help: "Client connections closed for an error, by reason."}, []string{"reason"}),
		BrokerErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: "broker", Name: "errors_total",
			Help: "Broker (upstream) connection errors, by reason."}, []string{"reason"}),
	}
	m.reg = reg
	batches := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "batches_total",
		Help: "Produce batches by the proxy's decision: idempotent (accepted, duplicate, in_flight_wait, out_of_order, fenced, sequence_reuse) and legacy, producer id -1 (legacy_accepted: new data; legacy_duplicate: every record a retry, answered by the proxy; legacy_rebatched: some records retries, the rest forwarded; legacy_in_flight_wait: waited for records in flight). In observe mode, what enforce would have done."}, []string{"outcome"})
	for o, name := range batchOutcomes {
		m.Batches[o] = batches.WithLabelValues(name)
	}
	m.Waiting = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: "produce", Name: "waiting_retries",
		Help: "Produce requests waiting for an outcome they need: records in flight they repeat, or a partition's tail being read."})
	dups := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: "produce", Name: "duplicates_total",
		Help: "Duplicate batches (idempotent and legacy) by who answered them: proxy (the retry never reached the broker) or broker (forwarded for the broker to decide: an acks=1 or offset-less original, or a batch the broker would reject)."}, []string{"answered_by"})
	m.DupAnswered[DupByProxy] = dups.WithLabelValues("proxy")
	m.DupAnswered[DupByBroker] = dups.WithLabelValues("broker")
	warmups := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: "warm", Name: "partitions_total",
		Help: "Partition warm-ups from the log tail (docs/warm.md), by result: ok, failed (the tail could not be read; its batches were decided without it), timed_out (a Produce stopped waiting for it)."}, []string{"result"})
	for r, name := range warmResults {
		m.Warmups[r] = warmups.WithLabelValues(name)
	}
	warmBytes := prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: "warm", Name: "read_bytes_total",
		Help: "Bytes of partition tails read to warm the tables."})
	m.WarmBytes = warmBytes
	warmSeconds := prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: "warm", Name: "duration_seconds",
		Help:    "Time to read and apply one partition's tail.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}})
	m.WarmSeconds = warmSeconds
	keyDups := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "key_duplicate_records_total",
		Help: "Records whose idempotency key was written to their topic within dedup.keys.ttl: dropped (legacy batches) or observed (idempotent batches, which are never cut)."}, []string{"action"})
	m.KeysDropped = keyDups.WithLabelValues("dropped")
	m.KeysObserved = keyDups.WithLabelValues("observed")
	retryRecords := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "legacy_retry_records_total",
		Help: "Legacy records a client instance sent again whose first copy was written (docs/legacy.md): dropped (enforce: not written again) or observed (observe: written, as enforce would not have)."}, []string{"action"})
	m.RetryRecords[RetryDropped] = retryRecords.WithLabelValues(retryActions[RetryDropped])
	m.RetryRecords[RetryObserved] = retryRecords.WithLabelValues(retryActions[RetryObserved])
	m.topicBatches = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "topic_batches_total",
		Help: "dedupproxy_batches_total for each topic dedup.topics lists with metrics: true (the operator's list bounds the label set)."}, []string{"topic", "outcome"})
	m.topicRetryRecords = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "topic_legacy_retry_records_total",
		Help: "dedupproxy_legacy_retry_records_total for each topic dedup.topics lists with metrics: true."}, []string{"topic", "action"})
	passthrough := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "batches_passthrough_total",
		Help: "Produce batches relayed without a decision, by reason: legacy (producer id -1 with legacy dedup off for its topic, or acks=0), invalid (the broker answers), old_format (message format v0/v1; counted per request for Produce v0-v2), unknown_topic (not yet seen in a Metadata response), unauthenticated (the broker has not authenticated the connection), dedup_off (dedup off, per request, or for the batch's topic), keys_compressed (idempotency keys not checked in a compressed batch)."}, []string{"reason"})
	for r, name := range passthroughReasons {
		m.Passthrough[r] = passthrough.WithLabelValues(name)
	}
	reqMemWaits := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: "request_memory", Name: "waits_total",
		Help: "Large requests that waited for the request_memory budget, by outcome: fit (others gave bytes back) or over_budget (read over the budget after 500 ms, or the connection closed)."}, []string{"outcome"})
	for i, name := range reqMemWaitOutcomes {
		m.reqMemWaits[i] = reqMemWaits.WithLabelValues(name)
	}
	m.reqMemStalled = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: "request_memory", Name: "stalled_total",
		Help: "Large requests whose client sent nothing of them for 100 ms while others waited: their bytes stopped counting against request_memory."})
	m.reqMemHeld = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: "request_memory", Name: "held_bytes",
		Help: "Bytes of the request_memory budget held by large requests being read or forwarded."})
	m.ProduceSpliced = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: "produce", Name: "spliced_bytes_total",
		Help: "Record bytes of large idempotent batches moved from client to broker socket to socket (splice), never in the proxy's memory."})
	m.ProduceReadBack = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: "produce", Name: "spliced_read_back_bytes_total",
		Help: "Record bytes held in pipes that the proxy read back, to answer a batch itself or to rebuild a request."})
	m.WaitTimeouts = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: "produce", Name: "wait_timeouts_total",
		Help: "Retries that waited for their in-flight original past the request's timeout_ms and were answered REQUEST_TIMED_OUT."})
	for _, r := range []string{BrokerDial, BrokerRead, BrokerWrite, BrokerProtocol, BrokerTLS} {
		m.BrokerErrors.WithLabelValues(r)
	}
	for _, r := range []string{ClientFrame, ClientHeader, ClientTLS, ClientPlaintext, ClientHandshake, ClientHTTP, ClientIdle, ClientWrite, ClientRequest, ClientUnauth} {
		m.ClientErrors.WithLabelValues(r)
	}
	if reg != nil {
		buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "build_info",
			Help:        "Always 1; labels carry the build.",
			ConstLabels: prometheus.Labels{"version": build.Version, "goversion": runtime.Version(), "revision": build.Revision}})
		buildInfo.Set(1)
		reg.MustRegister(m.ClientConnectionsTotal, m.ClientConnections, m.ClientReadBytes, m.ClientWrittenBytes,
			m.BrokerReadBytes, m.BrokerWrittenBytes, m.Panics, m.Requests, m.requestDuration,
			m.ClientErrors, m.BrokerErrors, buildInfo, batches, passthrough, keyDups, retryRecords, m.topicBatches, m.topicRetryRecords, dups, m.WaitTimeouts, m.Waiting, reqMemWaits, m.reqMemStalled, m.reqMemHeld, m.ProduceSpliced, m.ProduceReadBack, warmups, warmBytes, warmSeconds,
			collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}

	// Listeners and connection limits.
	m.ListenerErrors = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: "broker", Name: "listener_errors_total",
		Help: "Broker node listeners that could not be started, by reason (port_range, bind, admin_port); such a node is left out of responses. A failed bind is retried at most every 30s."}, []string{"reason"})
	for _, r := range []string{ListenerPortRange, ListenerBind, ListenerAdminPort} {
		m.ListenerErrors.WithLabelValues(r)
	}
	m.RefusedConns = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: "client", Name: "connections_refused_total",
		Help: "Client connections closed as soon as accepted because a limit was reached, by limit (max_connections, max_connections_per_ip)."}, []string{"reason"})
	for _, r := range []string{RefusedMaxConns, RefusedMaxPerIP} {
		m.RefusedConns.WithLabelValues(r)
	}
	m.AuthUnfollowed = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: "client", Name: "auth_unfollowed_total",
		Help: "SASL exchanges with a mechanism the proxy cannot follow (GSSAPI, custom): their connections are relayed and never deduplicated."})
	m.AuthRelayedOnly = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: "client", Name: "auth_relayed_only_total",
		Help: "Client connections relayed undecided from a second SASL exchange on: pipelined (begun before the broker answered the last SASL request) or reauth_changed (a re-authentication as another principal, or by a mechanism the proxy cannot follow)."}, []string{"reason"})
	for _, r := range []string{auth.RelayPipelined, auth.RelayReauth} {
		m.AuthRelayedOnly.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.ListenerErrors, m.RefusedConns, m.AuthUnfollowed, m.AuthRelayedOnly)
	}
	return m
}

// Closed label set of broker_listener_errors_total{reason}.
const (
	ListenerPortRange = "port_range"
	ListenerBind      = "bind"
	ListenerAdminPort = "admin_port"
)

// Registerer is the registry New registered on, nil for none.
func (m *Metrics) Registerer() prometheus.Registerer { return m.reg }

// ListenerError counts a broker node listener that could not start.
func (m *Metrics) ListenerError(reason string) { m.ListenerErrors.WithLabelValues(reason).Inc() }

// ConnectionRefused counts a client connection refused for a limit.
func (m *Metrics) ConnectionRefused(reason string) { m.RefusedConns.WithLabelValues(reason).Inc() }

// API returns the resolved children for key, which the caller has checked
// is a known API.
func (m *Metrics) API(key int16) *API {
	m.apiMu.Lock()
	defer m.apiMu.Unlock()
	a := m.apis[key]
	if a == nil {
		name := kmsg.NameForKey(key)
		a = &API{Requests: m.Requests.WithLabelValues(name), Duration: m.requestDuration.WithLabelValues(name)}
		m.apis[key] = a
	}
	return a
}

// BrokerError counts one upstream error; reason is one of the closed set.
func (m *Metrics) BrokerError(reason string) { m.BrokerErrors.WithLabelValues(reason).Inc() }

// ClientError counts a client connection closed for an error; reason is
// one of the closed set.
func (m *Metrics) ClientError(reason string) { m.ClientErrors.WithLabelValues(reason).Inc() }

// Outcomes of dedupproxy_batches_total{outcome}.
//
// NOTE: add new outcomes to batchOutcomes.
const (
	OutAccepted = iota
	OutDuplicate
	OutInFlight
	OutOutOfOrder
	OutFenced
	OutSequenceReuse
	OutLegacyAccepted
	OutLegacyDuplicate
	OutLegacyRebatched
	OutLegacyInFlight
	NumBatchOutcomes
)

var batchOutcomes = [NumBatchOutcomes]string{"accepted", "duplicate", "in_flight_wait", "out_of_order", "fenced", "sequence_reuse",
	"legacy_accepted", "legacy_duplicate", "legacy_rebatched", "legacy_in_flight_wait"}

// passthroughReasons names decide's passthrough reasons in
// dedupproxy_batches_passthrough_total{reason}.
var passthroughReasons = [decide.NumPass]string{
	decide.PassLegacy:          "legacy",
	decide.PassInvalid:         "invalid",
	decide.PassOldFormat:       "old_format",
	decide.PassUnknownTopic:    "unknown_topic",
	decide.PassUnauthenticated: "unauthenticated",
	decide.PassDedupOff:        "dedup_off",
	decide.PassKeysCompressed:  "keys_compressed",
}

// Actions of dedupproxy_legacy_retry_records_total{action}.
const (
	RetryDropped = iota
	RetryObserved
)

var retryActions = [2]string{"dropped", "observed"}

// TopicCounter is one listed topic's counters.
type TopicCounter struct {
	batches      [NumBatchOutcomes]prometheus.Counter
	retryRecords [len(retryActions)]prometheus.Counter
}

// The configuration states the series a listed topic adds
// (config.MetricsTopicSeries): this fails to compile when they differ.
var _ = [1]struct{}{}[config.MetricsTopicSeries-(NumBatchOutcomes+len(retryActions))]

// TopicCounters returns the counters of the topics cfg lists with
// metrics: true, and deletes the series of topics listed before (in old)
// and no longer: the label set stays what the operator lists. nil when
// none is listed.
func (m *Metrics) TopicCounters(cfg *config.DedupConfig, old map[string]*TopicCounter) map[string]*TopicCounter {
	var out map[string]*TopicCounter
	for name, tc := range cfg.Topics {
		if !tc.Metrics {
			continue
		}
		if out == nil {
			out = map[string]*TopicCounter{}
		}
		if c, ok := old[name]; ok {
			out[name] = c
			continue
		}
		c := &TopicCounter{}
		for o, outcome := range batchOutcomes {
			c.batches[o] = m.topicBatches.WithLabelValues(name, outcome)
		}
		for a, action := range retryActions {
			c.retryRecords[a] = m.topicRetryRecords.WithLabelValues(name, action)
		}
		out[name] = c
	}
	for name := range old {
		if _, ok := out[name]; !ok {
			m.topicBatches.DeletePartialMatch(prometheus.Labels{"topic": name})
			m.topicRetryRecords.DeletePartialMatch(prometheus.Labels{"topic": name})
		}
	}
	return out
}

// Who answered a duplicate, for dedupproxy_produce_duplicates_total.
const (
	DupByProxy = iota
	DupByBroker
)

// Core is what the Produce path's gauges read.
type Core struct {
	// Pending counts the batches sent upstream and not yet settled.
	Pending func() int64
	// LegacyRecords counts the legacy records remembered, and those not
	// remembered for want of room (decide.Core.LegacyRecords).
	LegacyRecords func() (held int64, evicted uint64)
	// LegacyUse appends each principal's share of them
	// (decide.Core.LegacyUse).
	LegacyUse func([]decide.PrincipalUse) []decide.PrincipalUse
	// PrincipalName names a numbered principal (auth.Principals.Name).
	PrincipalName func(auth.PrincipalID) (string, bool)
}

// RegisterCore exports the gauges of the Produce path, reading c.
func (m *Metrics) RegisterCore(c Core) {
	if m.reg == nil {
		return
	}
	const ns = "dedupproxy"
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: "produce", Name: "pending_batches",
			Help: "Batches sent upstream and not yet settled (waiting for the broker's answer)."},
			func() float64 { return float64(c.Pending()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: "seqstate", Name: "legacy_records",
			Help: "Legacy (producer id -1) records remembered: those a retry may still need (docs/legacy.md, \"Bounded and cheap\")."},
			func() float64 { n, _ := c.LegacyRecords(); return float64(n) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Subsystem: "seqstate", Name: "legacy_evictions_total",
			Help: "Legacy batches not remembered because dedup.legacy.max_records was reached: a retry of them is written again (a miss, never a wrong answer)."},
			func() float64 { _, n := c.LegacyRecords(); return float64(n) }),
		&principalUseCollector{c: c},
	)
}

// principalUseCollector exports what each principal's client instances
// hold of the legacy records, and how many of theirs went for want of
// room (docs/security.md, "Fair shares"). Principals come only from
// exchanges the broker accepted, so the label's values are bounded.
type principalUseCollector struct {
	c   Core
	buf []decide.PrincipalUse
	mu  sync.Mutex
}

var (
	principalRecordsDesc = prometheus.NewDesc("dedupproxy_legacy_principal_records",
		"Legacy records remembered for the client instances of a principal (docs/security.md, \"Fair shares\").", []string{"principal"}, nil)
	principalEvictedDesc = prometheus.NewDesc("dedupproxy_legacy_principal_evicted_records_total",
		"Legacy records of a principal's client instances let go, or never remembered, for want of room: a retry of them is written again (a miss).", []string{"principal"}, nil)
)

func (pc *principalUseCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- principalRecordsDesc
	ch <- principalEvictedDesc
}

func (pc *principalUseCollector) Collect(ch chan<- prometheus.Metric) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	pc.buf = pc.c.LegacyUse(pc.buf[:0])
	for _, u := range pc.buf {
		name := auth.Anonymous
		if u.Principal != 0 {
			var ok bool
			if name, ok = pc.c.PrincipalName(u.Principal); !ok {
				continue
			}
		}
		ch <- prometheus.MustNewConstMetric(principalRecordsDesc, prometheus.GaugeValue, float64(u.Held), name)
		ch <- prometheus.MustNewConstMetric(principalEvictedDesc, prometheus.CounterValue, float64(u.Evicted), name)
	}
}

// RegisterKeys exports the idempotency key table's own counts.
func (m *Metrics) RegisterKeys(t *seqstate.KeyTable) {
	if m.reg == nil {
		return
	}
	const ns, sub = "dedupproxy", "seqstate"
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "keys",
			Help: "Idempotency keys remembered."}, func() float64 { return float64(t.Len()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "key_evictions_total",
			Help: "Idempotency keys forgotten before dedup.keys.ttl because the table was full (dedup.keys.max_keys)."},
			func() float64 { return float64(t.Evictions()) }),
	)
}

// RegisterTable exports the table's own counts.
func (m *Metrics) RegisterTable(t *seqstate.Table) {
	if m.reg == nil {
		return
	}
	const ns, sub = "dedupproxy", "seqstate"
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "entries",
			Help: "(producer, partition) entries in the table."}, func() float64 { return float64(t.Len()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "evictions_total",
			Help: "Entries evicted because the table was full; the producer is then unknown and accepted with any sequence."},
			func() float64 { return float64(t.Evictions()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "expirations_total",
			Help: "Entries forgotten after dedup.producer_id_expiration idle."},
			func() float64 { return float64(t.Expirations()) }),
	)
}

// Outcomes of a wait for the request_memory budget, for
// dedupproxy_request_memory_waits_total{outcome}.
const (
	reqMemFit        = iota // others gave bytes back
	reqMemOverBudget        // read over the budget
	numReqMemWaits
)

var reqMemWaitOutcomes = [numReqMemWaits]string{reqMemFit: "fit", reqMemOverBudget: "over_budget"}

// RequestPool is what the large-request budget counts (relay.RequestPool).
func (m *Metrics) RequestPool() *relay.PoolMetrics {
	return &relay.PoolMetrics{Held: m.reqMemHeld, Stalled: m.reqMemStalled,
		Fit: m.reqMemWaits[reqMemFit], OverBudget: m.reqMemWaits[reqMemOverBudget]}
}

// Warm-up outcomes, for dedupproxy_warm_partitions_total{result}.
const (
	WarmOK       = iota // the tail was read and applied
	WarmFailed          // the tail could not be read: decided without it
	WarmTimedOut        // a request stopped waiting for it
	NumWarmResults
)

var warmResults = [NumWarmResults]string{WarmOK: "ok", WarmFailed: "failed", WarmTimedOut: "timed_out"}
