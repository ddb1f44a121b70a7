package config

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/dedupproxy/dedupproxy/certprincipal"
	"github.com/dedupproxy/dedupproxy/decide"
	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// Config is the whole application configuration, read from YAML (see
// config.example.yaml, which a test keeps in step with this struct) and
// overridden by command-line flags. The zero value of each field means the
// default documented on it; call [Config.EnsureDefaults] then
// [Config.Validate].
type Config struct {
	// Upstream lists bootstrap brokers of the real cluster as host:port,
	// or is the single word "embedded" ([EmbeddedUpstream]): the command
	// then starts an in-memory test cluster. A config file must set it;
	// with neither a file nor --upstream the command starts the embedded
	// cluster.
	Upstream []string `yaml:"upstream"`

	// Listen is the bootstrap listener's bind address. Default
	// 127.0.0.1:9092. Broker node N is served on the same host at port
	// NodePortBase + (N − NodeIDOffset), by default listen port + 1 + N,
	// unless Nodes maps it. With port 0 (and no NodePortBase) every
	// listener takes a free port (how tests run).
	Listen string `yaml:"listen"`

	// Advertise is the host:port clients are told for the bootstrap
	// listener. Broker nodes are advertised shifted like it: node N at
	// advertise port + (its listen port − listen port), by default
	// advertise port + 1 + N. Empty means the address actually bound, which
	// needs a concrete listen host. Set it behind NAT, in containers and
	// behind port-forwards.
	Advertise string `yaml:"advertise"`

	// NodePortBase is the listen port of node NodeIDOffset; node N listens
	// on NodePortBase + (N − NodeIDOffset). 0 (the default) means listen
	// port + 1, or free ports when the listen port is 0.
	NodePortBase int `yaml:"node_port_base"`

	// NodeIDOffset is subtracted from node ids before they pick a port:
	// ZooKeeper-era clusters number brokers from 1001, so 1000 puts node
	// 1001 on NodePortBase. Default 0. A node whose id is below it, or
	// whose port would fall outside 1..65535, gets no listener: it is
	// logged once and left out of every response (never advertised at an
	// address that is not its own), unless Nodes maps it.
	NodeIDOffset int32 `yaml:"node_id_offset"`

	// Nodes overrides the listen and advertised address of single broker
	// nodes, by node id.
	Nodes map[int32]NodeConfig `yaml:"nodes"`

	// Replicas lists the advertised bootstrap address (host:port) of every
	// replica of the proxy, in index order; their number is the replica
	// count. Empty (the default) means one proxy on its own. Replica i owns
	// the broker nodes whose id ≡ i mod the count (ReplicaOwners overrides
	// single nodes), and every replica advertises node N at its owner's
	// host and port + (node N's listen port − listen port), by default
	// port + 1 + N (docs/replicas.md). "{i}" in an address stands for the
	// index: one templated address with ReplicaCount stands for them all.
	Replicas []string `yaml:"replicas"`

	// ReplicaIndex is this replica's index in Replicas. Unset (nil, the
	// default) means the number that ends the host name, as StatefulSet
	// pods are named (dedupproxy-2 is replica 2).
	ReplicaIndex *int `yaml:"replica_index"`

	// ReplicaCount is how many replicas a templated Replicas address
	// ("dedupproxy-{i}.dedupproxy-headless:9092") stands for. 0 (the
	// default) means as many as Replicas lists.
	ReplicaCount int `yaml:"replica_count"`

	// ReplicaOwners assigns single broker nodes to a replica, by node id,
	// instead of node id mod the replica count. Empty by default.
	ReplicaOwners map[int32]int `yaml:"replica_owners"`

	// ReplicaAdmin lists the admin address (host:port) of every replica, in
	// index order, or one templated with "{i}": replicas read each other's
	// state from /replica there during a handover. Empty (the default)
	// means each replica's Replicas host at this replica's admin port.
	ReplicaAdmin []string `yaml:"replica_admin"`

	// Admin is the HTTP address of /metrics, /healthz and /readyz. Default
	// 127.0.0.1:9080, below the default broker ports. "off" disables it.
	// Validate refuses only an admin port equal to a listen port it knows
	// (listen, nodes); a derived node port on it is found when that node's
	// listener binds (see proxy.Server.AdminAddr).
	Admin string `yaml:"admin"`

	// AdminPprof serves Go's net/http/pprof profiles under /debug/pprof/
	// on the admin listener. Off (false) by default: a profile shows
	// internals and costs CPU while taken, so it is served only when an
	// operator asks for it.
	AdminPprof bool `yaml:"admin_pprof"`

	// MaxFrameBytes caps one request or response frame. Default 100 MiB,
	// Kafka's socket.request.max.bytes.
	MaxFrameBytes int32 `yaml:"max_frame_bytes"`

	// RequestMemory is the budget, in bytes over all connections, for the
	// buffers of requests larger than 64 KiB (in practice Produce requests,
	// which the proxy reads whole to decide them) while they are read and
	// forwarded, plus idle buffers kept for the next ones. A request that
	// does not fit waits until others have been forwarded (TCP holds its
	// bytes meanwhile), for at most 500 ms, and not behind a client that has
	// stopped sending its request; one larger than the budget goes alone. Default 8 MiB: a few of the largest requests common
	// clients send (1 MB by default, several MB for franz-go).
	RequestMemory int `yaml:"request_memory"`

	// ProduceSplice keeps the records of large idempotent batches out of the
	// proxy's memory: spliced from the client's socket into pipes and from
	// the pipes to the broker (Linux, plain TCP on both legs).
	// Copying them through user space was most of what the proxy cost above
	// a bare relay (docs/performance.md, "Produce at the relay's cost").
	// nil (unset) means on where it applies, silently elsewhere; false
	// turns it off; true says so at start when it cannot apply.
	ProduceSplice *bool `yaml:"produce_splice"`

	// UnauthenticatedMaxFrameBytes caps a request frame from a client the
	// broker has not yet authenticated (docs/security.md); a larger one
	// closes the connection. Default 512 KiB, Kafka's
	// sasl.server.max.receive.size.
	UnauthenticatedMaxFrameBytes int32 `yaml:"unauthenticated_max_frame_bytes"`

	// OAuthBearerPrincipalClaim is the token claim that names an
	// OAUTHBEARER client's principal, as the brokers'
	// sasl.oauthbearer.sub.claim.name. Default "sub".
	OAuthBearerPrincipalClaim string `yaml:"oauthbearer_principal_claim"`

	// MaxInflight caps the requests of one client connection awaiting their
	// response; when reached the proxy stops reading from that client
	// (backpressure). Default 256.
	MaxInflight int `yaml:"max_inflight"`

	// MaxConnections caps the client connections open at once, over all
	// listeners; one beyond it is closed as soon as it is accepted (each
	// costs a broker connection, two goroutines and their buffers). Default
	// 10000; -1 means unlimited.
	MaxConnections int `yaml:"max_connections"`

	// MaxConnectionsPerIP caps the client connections open at once from one
	// IP address, so one client cannot take them all. Default 0: unlimited
	// (clients behind one NAT share an address).
	MaxConnectionsPerIP int `yaml:"max_connections_per_ip"`

	// DialTimeout bounds connecting to a broker. Default 10s.
	DialTimeout time.Duration `yaml:"dial_timeout"`

	// IdleTimeout closes a client connection that sends nothing for this
	// long, like Kafka's connections.max.idle.ms. Default 10m.
	IdleTimeout time.Duration `yaml:"idle_timeout"`

	// WriteTimeout bounds writing one frame to a client or a broker, so a
	// client that stops reading cannot pin memory. Default 30s.
	WriteTimeout time.Duration `yaml:"write_timeout"`

	// DrainTimeout bounds how long shutdown, or a client that disconnected,
	// waits for responses to requests already sent to a broker. Default 30s.
	DrainTimeout time.Duration `yaml:"drain_timeout"`

	// LogLevel is debug, info, warn or error. Default info. SIGHUP reloads
	// it.
	LogLevel string `yaml:"log_level"`

	// LogFormat is text (logfmt-like key=value, the default) or json.
	LogFormat string `yaml:"log_format"`

	// Dedup configures deduplication of idempotent Produce batches.
	Dedup DedupConfig `yaml:"dedup"`

	// TLS makes every client listener (bootstrap and broker nodes) speak
	// TLS when Cert and Key are set. The zero value: plaintext.
	TLS TLSConfig `yaml:"tls"`

	// UpstreamTLS makes every connection to a broker (clients' and the
	// proxy's own) speak TLS. The zero value: plaintext.
	UpstreamTLS UpstreamTLSConfig `yaml:"upstream_tls"`

	// UpstreamSASL is the proxy's own identity on a cluster that requires
	// SASL: its readiness probe and broker and topic discovery
	// authenticate with it. Clients' connections never use it: they
	// authenticate themselves, relayed untouched. The zero value: the
	// proxy's own connections do not authenticate.
	UpstreamSASL SASLConfig `yaml:"upstream_sasl"`

	// AdminTLS makes the admin HTTP listener serve HTTPS when Cert and Key
	// are set. The zero value: plain HTTP (on loopback by default).
	AdminTLS TLSConfig `yaml:"admin_tls"`

	// CertReloadInterval is how often every certificate, key and CA file
	// the proxy reads (tls, upstream_tls client certificate, admin_tls) is
	// checked for changes; a change is loaded for new connections without
	// dropping open ones. SIGHUP reloads at once. Default 10s.
	CertReloadInterval time.Duration `yaml:"cert_reload_interval"`
}

// EmbeddedUpstream, as the only upstream, asks the command for an embedded
// in-memory cluster (for trying the proxy out; its data is lost on exit).
const EmbeddedUpstream = "embedded"

// Log formats accepted as log_format.
const (
	LogText = "text"
	LogJSON = "json"
)

// TLS versions accepted as min_version.
const (
	TLS12 = "1.2"
	TLS13 = "1.3"
)

// TLSConfig is a TLS server: the proxy's client listeners, or its admin
// listener.
type TLSConfig struct {
	// Cert is a PEM file: the certificate, then any intermediate
	// certificates up to (not including) the root. Its names must cover
	// every host clients use: the advertised hosts of the bootstrap and
	// broker node listeners. Empty (with Key): no TLS.
	Cert string `yaml:"cert"`
	// Key is the PEM file of Cert's private key.
	Key string `yaml:"key"`
	// ClientCA is a PEM file of CA certificates; when set, every client
	// must present a certificate issued by one of them (mutual TLS).
	// Empty: client certificates are not asked for.
	ClientCA string `yaml:"client_ca"`
	// MinVersion is the oldest TLS version accepted: 1.2 (default) or 1.3.
	MinVersion string `yaml:"min_version"`
	// PrincipalMappingRules maps a client certificate's subject to the
	// principal that scopes its state, in the syntax of Kafka's
	// ssl.principal.mapping.rules (docs/security.md, "The certificate
	// principal"): give it the brokers' value. Empty: DEFAULT, the subject
	// as Kafka prints it. Client listeners (tls) only.
	PrincipalMappingRules string `yaml:"principal_mapping_rules"`
}

// Enabled reports whether the listener speaks TLS.
func (c TLSConfig) Enabled() bool { return c.Cert != "" || c.Key != "" }

// UpstreamTLSConfig is the proxy as a TLS client of the brokers.
type UpstreamTLSConfig struct {
	// Enabled turns TLS to brokers on, verifying them against the system
	// roots unless CA is set. Setting any other field here implies it.
	Enabled bool `yaml:"enabled"`
	// CA is a PEM file of the CA certificates that issued the brokers'
	// certificates. Empty: the system roots.
	CA string `yaml:"ca"`
	// Cert and Key are PEM files of a client certificate (with its chain)
	// for brokers that require one (ssl.client.auth=required). Every
	// connection through the proxy then presents it. Empty: none.
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
	// ServerName is the name every broker's certificate is verified
	// against. Empty (the default): each broker's own host, as the
	// cluster's metadata names it (the bootstrap host for bootstrap
	// connections).
	ServerName string `yaml:"server_name"`
	// InsecureSkipVerify accepts any broker certificate. Anyone on the
	// network path can then read and change the traffic: for tests only.
	// The proxy logs a warning at start.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
	// MinVersion is the oldest TLS version spoken: 1.2 (default) or 1.3.
	MinVersion string `yaml:"min_version"`
}

// SASL mechanisms the proxy's own connections can authenticate with.
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// SASLConfig is the proxy's own SASL identity.
type SASLConfig struct {
	// Mechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512. Empty (the
	// default): no authentication.
	Mechanism string `yaml:"mechanism"`
	// User is the SASL user name.
	User string `yaml:"user"`
	// PasswordFile holds the password (a trailing newline is ignored). It
	// is read again for every authentication, so it can be rotated in
	// place. Never put a password in the configuration itself.
	PasswordFile string `yaml:"password_file"`
}

// Dedup modes.
const (
	DedupEnforce = "enforce" // decide every idempotent batch and answer like Kafka
	DedupObserve = "observe" // decide and count, forward everything
	DedupOff     = "off"     // relay Produce untouched
)

// DedupConfig configures the producer-state table and what the proxy does
// with its decisions.
type DedupConfig struct {
	// Mode is enforce (default: retries are answered by the proxy, out of
	// order and fenced batches rejected, exactly as Kafka would), observe
	// (decide and count, forward everything) or off (relay Produce
	// untouched).
	Mode string `yaml:"mode"`
	// RetainedBatches is the dedup window per producer and partition.
	// Default 5, Kafka's; up to 16 catches older retries than Kafka does.
	RetainedBatches int `yaml:"retained_batches"`
	// MaxEntries caps the (producer, partition) entries kept; the least
	// recently used is evicted, and an evicted producer is accepted with
	// any sequence, as Kafka accepts an unknown one. Default 262144.
	MaxEntries int `yaml:"max_entries"`
	// ProducerIDExpiration forgets a producer idle this long, like Kafka's
	// producer.id.expiration.ms. Default 24h.
	ProducerIDExpiration time.Duration `yaml:"producer_id_expiration"`

	// Legacy configures deduplication of legacy batches (producer id -1),
	// which Kafka cannot deduplicate (docs/legacy.md).
	Legacy LegacyConfig `yaml:"legacy"`

	// Keys configures idempotency keys, for the topics that opt in
	// (Topics[name].IdempotencyKey).
	Keys KeysConfig `yaml:"keys"`

	// Warm configures reading a partition's tail to fill the tables on its
	// first Produce since the proxy started (docs/warm.md).
	Warm WarmConfig `yaml:"warm"`

	// Topics overrides settings per topic, by name.
	Topics map[string]TopicDedupConfig `yaml:"topics"`
}

// WarmConfig configures warm-up from the log.
type WarmConfig struct {
	// Enabled turns warm-up on. Nil (absent) means true.
	Enabled *bool `yaml:"enabled"`
	// Timeout bounds one warm-up, and how long a Produce waits for it.
	// Default 5s.
	Timeout time.Duration `yaml:"timeout"`
	// MaxBytes bounds the tail read per partition. Default 4194304
	// (4 MiB): at least the last few batches of any producer.
	MaxBytes int `yaml:"max_bytes"`
	// MaxConcurrent bounds the warm-ups running at once over the whole
	// proxy, each a connection of the proxy's own to a broker. Default 64.
	// One client connection runs at most 8 at once (docs/security.md).
	MaxConcurrent int `yaml:"max_concurrent"`
}

// Warm defaults.
const (
	DefaultWarmTimeout       = 5 * time.Second
	DefaultWarmMaxBytes      = 4 << 20
	DefaultWarmMaxConcurrent = 64
)

// KeysConfig bounds the idempotency keys remembered (docs/legacy.md).
type KeysConfig struct {
	// TTL is how long a written key is remembered: a legacy record with
	// the same key within it is not written again. Default 24h.
	TTL time.Duration `yaml:"ttl"`
	// MaxKeys caps the keys remembered (about 40 bytes each); the oldest
	// goes first. Default 1048576.
	MaxKeys int `yaml:"max_keys"`
}

// IdempotencyKeyConfig turns idempotency keys on for a topic.
type IdempotencyKeyConfig struct {
	// Header is the record header whose value names the logical operation
	// (an event id). Default idempotency-key.
	Header string `yaml:"header"`
}

// DefaultKeyHeader is IdempotencyKeyConfig.Header's default.
const DefaultKeyHeader = "idempotency-key"

// Legacy match modes: what makes two legacy records the same.
const (
	MatchAuto    = "auto"    // the same key, value, headers and timestamp, the timestamp left out for clients that restamp resends
	MatchRecords = "records" // the same key, value and headers: restamped retries match
	MatchExact   = "exact"   // the same, and the same timestamp: only byte-identical retries match
	MatchOff     = "off"     // legacy batches are relayed untouched
)

// What a clean close of a client connection means (LegacyConfig.CleanClose).
const (
	CleanCloseRead   = "read"   // the client read every answer written: their records are its acknowledged data
	CleanCloseIgnore = "ignore" // every close is taken as broken (clients behind a proxy that terminates their connections)
)

// Legacy scopes: what makes connections one client instance.
const (
	ScopeInstance = "instance"  // the same principal, client id and client host
	ScopeClientID = "client_id" // the same principal and client id (clients behind a NAT whose address changes)
)

// LegacyConfig configures deduplication of legacy producers.
type LegacyConfig struct {
	// Match is auto (default), records, exact or off; see the Match
	// constants and docs/legacy.md, "What a record is".
	Match string `yaml:"match"`
	// Scope is instance (default) or client_id; see the Scope constants.
	// Records of different client instances are never retries of each
	// other.
	Scope string `yaml:"scope"`
	// Window is how long a legacy record may be answered as a retry, from
	// its original's append; answering it never extends that. Default 2m,
	// the default delivery.timeout.ms of the Java client and librdkafka,
	// after which they stop retrying.
	Window time.Duration `yaml:"window"`
	// MaxRecords caps the legacy records remembered over all client
	// instances (what each takes: docs/operations.md, Sizing); beyond it a
	// connection's oldest answered batches go first, and then new batches
	// are not remembered (counted). Default 1048576.
	MaxRecords int `yaml:"max_records"`
	// CleanClose is what a clean close of a client connection means: read
	// (default): the client read every answer written on it, so their
	// records are new data on its next connection; ignore: every close is
	// taken as one after which the answers written may be unread, for
	// clients behind a proxy that terminates their connections (a service
	// mesh sidecar), which closes cleanly whatever its client read. See
	// docs/legacy.md, "The rule".
	CleanClose string `yaml:"clean_close"`
}

// TopicDedupConfig is the per-topic part of DedupConfig.
type TopicDedupConfig struct {
	// Mode overrides dedup.mode for this topic: enforce, observe or off.
	// Empty means the global mode. SIGHUP applies it, so a team can move
	// one topic at a time from observe to enforce.
	Mode string `yaml:"mode"`
	// LegacyMatch overrides dedup.legacy.match for this topic. Empty means
	// the global setting.
	LegacyMatch string `yaml:"legacy_match"`
	// IdempotencyKey, when set (even empty: {}), drops legacy records whose
	// key header was written to this topic within dedup.keys.ttl, and counts
	// repeated keys in idempotent batches (which cannot lose records
	// without breaking their producer's sequences).
	IdempotencyKey *IdempotencyKeyConfig `yaml:"idempotency_key"`
	// Metrics: count this topic's batches and retried records in
	// dedupproxy_topic_batches_total and
	// dedupproxy_topic_legacy_retry_records_total (labelled by topic; only
	// listed topics get series, at most MaxMetricsTopics).
	Metrics bool `yaml:"metrics"`
}

// MaxMetricsTopics bounds the topics with per-topic series, each adding
// MetricsTopicSeries (the proxy's metrics check the figure).
const (
	MaxMetricsTopics   = 500
	MetricsTopicSeries = 12
)

// NodeConfig pins the listener of one broker node.
type NodeConfig struct {
	// Listen is the bind address. Empty means the derived one.
	Listen string `yaml:"listen"`
	// Advertise is what clients are told. Empty means the derived one.
	Advertise string `yaml:"advertise"`
}

// Defaults.
const (
	DefaultListen         = "127.0.0.1:9092"
	DefaultAdmin          = "127.0.0.1:9080"
	DefaultMaxInflight    = 256
	DefaultRequestMemory  = 8 << 20
	DefaultMaxConnections = 10000
	DefaultDialTimeout    = 10 * time.Second
	DefaultIdleTimeout    = 10 * time.Minute
	DefaultWriteTimeout   = 30 * time.Second
	DefaultDrainTimeout   = 30 * time.Second

	DefaultUnauthenticatedMaxFrameBytes = 512 << 10
	DefaultOAuthBearerPrincipalClaim    = "sub"
	DefaultLegacyMaxRecords             = decide.DefaultMaxRecords

	DefaultCertReloadInterval = 10 * time.Second
)

// ProduceSpliceOn reports whether ProduceSplice is on (see there).
func (c *Config) ProduceSpliceOn() bool { return c.ProduceSplice == nil || *c.ProduceSplice }

// ErrInvalidConfig wraps every configuration error.
var ErrInvalidConfig = errors.New("proxy: invalid config")

// EnsureDefaults fills zero fields with their defaults.
func (c *Config) EnsureDefaults() {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.Admin == "" {
		c.Admin = DefaultAdmin
	}
	if c.MaxFrameBytes == 0 {
		c.MaxFrameBytes = protocol.DefaultMaxFrameSize
	}
	if c.UnauthenticatedMaxFrameBytes == 0 {
		c.UnauthenticatedMaxFrameBytes = DefaultUnauthenticatedMaxFrameBytes
	}
	if c.OAuthBearerPrincipalClaim == "" {
		c.OAuthBearerPrincipalClaim = DefaultOAuthBearerPrincipalClaim
	}
	if c.MaxInflight == 0 {
		c.MaxInflight = DefaultMaxInflight
	}
	if c.RequestMemory == 0 {
		c.RequestMemory = DefaultRequestMemory
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = DefaultMaxConnections
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = DefaultDrainTimeout
	}
	if c.LogLevel == "" {
		c.LogLevel = "info"
	}
	if c.LogFormat == "" {
		c.LogFormat = LogText
	}
	if c.Dedup.Mode == "" {
		c.Dedup.Mode = DedupEnforce
	}
	if c.Dedup.RetainedBatches == 0 {
		c.Dedup.RetainedBatches = seqstate.DefaultRetainedBatches
	}
	if c.Dedup.MaxEntries == 0 {
		c.Dedup.MaxEntries = seqstate.DefaultMaxEntries
	}
	if c.Dedup.ProducerIDExpiration == 0 {
		c.Dedup.ProducerIDExpiration = seqstate.DefaultProducerIDExpiration
	}
	if c.Dedup.Legacy.Match == "" {
		c.Dedup.Legacy.Match = MatchAuto
	}
	if c.Dedup.Legacy.CleanClose == "" {
		c.Dedup.Legacy.CleanClose = CleanCloseRead
	}
	if c.Dedup.Legacy.Window == 0 {
		c.Dedup.Legacy.Window = decide.DefaultWindow
	}
	if c.Dedup.Legacy.MaxRecords == 0 {
		c.Dedup.Legacy.MaxRecords = DefaultLegacyMaxRecords
	}
	if c.Dedup.Legacy.Scope == "" {
		c.Dedup.Legacy.Scope = ScopeInstance
	}
	if c.Dedup.Warm.Enabled == nil {
		on := true
		c.Dedup.Warm.Enabled = &on
	}
	if c.Dedup.Warm.Timeout == 0 {
		c.Dedup.Warm.Timeout = DefaultWarmTimeout
	}
	if c.Dedup.Warm.MaxBytes == 0 {
		c.Dedup.Warm.MaxBytes = DefaultWarmMaxBytes
	}
	if c.Dedup.Warm.MaxConcurrent == 0 {
		c.Dedup.Warm.MaxConcurrent = DefaultWarmMaxConcurrent
	}
	if c.Dedup.Keys.TTL == 0 {
		c.Dedup.Keys.TTL = seqstate.DefaultKeyTTL
	}
	if c.Dedup.Keys.MaxKeys == 0 {
		c.Dedup.Keys.MaxKeys = seqstate.DefaultMaxKeys
	}
	for name, tc := range c.Dedup.Topics {
		if tc.IdempotencyKey != nil && tc.IdempotencyKey.Header == "" {
			k := *tc.IdempotencyKey
			k.Header = DefaultKeyHeader
			tc.IdempotencyKey = &k
			c.Dedup.Topics[name] = tc
		}
	}
	for _, v := range []*string{&c.TLS.MinVersion, &c.AdminTLS.MinVersion, &c.UpstreamTLS.MinVersion} {
		if *v == "" {
			*v = TLS12
		}
	}
	if u := &c.UpstreamTLS; u.CA != "" || u.Cert != "" || u.Key != "" || u.ServerName != "" || u.InsecureSkipVerify {
		u.Enabled = true // each of them means TLS to brokers
	}
	c.UpstreamSASL.Mechanism = strings.ToUpper(c.UpstreamSASL.Mechanism)
	if c.CertReloadInterval == 0 {
		c.CertReloadInterval = DefaultCertReloadInterval
	}
	// Empty is unset: one proxy on its own.
	if len(c.Replicas) == 0 {
		c.Replicas = nil
	}
	if len(c.ReplicaAdmin) == 0 {
		c.ReplicaAdmin = nil
	}
	if len(c.ReplicaOwners) == 0 {
		c.ReplicaOwners = nil
	}
}

// Validate reports the first problem with the configuration.
func (c *Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	for _, u := range c.Upstream {
		if u == EmbeddedUpstream {
			if len(c.Upstream) > 1 {
				return bad("upstream: %q cannot be combined with broker addresses", EmbeddedUpstream)
			}
			continue
		}
		if _, _, err := SplitHostPort(u); err != nil {
			return bad("upstream %q: %v", u, err)
		}
	}
	host, port, err := SplitHostPort(c.Listen)
	if err != nil {
		return bad("listen %q: %v", c.Listen, err)
	}
	if c.Advertise == "" && unspecifiedHost(host) && len(c.Replicas) == 0 {
		return bad("listen %q binds every interface: clients cannot connect to that address, so set advertise to the host:port they should use", c.Listen)
	}
	if c.Advertise != "" {
		if _, aport, err := SplitHostPort(c.Advertise); err != nil {
			return bad("advertise %q: %v", c.Advertise, err)
		} else if aport == 0 {
			return bad("advertise %q: port 0 cannot be advertised", c.Advertise)
		}
	}
	if c.NodePortBase < 0 || c.NodePortBase > 65535 {
		return bad("node_port_base %d: want 1..65535, or 0 for listen port + 1", c.NodePortBase)
	}
	if c.NodePortBase == 0 && port == 65535 {
		return bad("listen port 65535 leaves no port for broker nodes (listen port + 1 + node id): set node_port_base")
	}
	if c.NodeIDOffset < 0 {
		return bad("node_id_offset %d is negative", c.NodeIDOffset)
	}
	if c.Advertise != "" {
		// The port of node node_id_offset, shifted like the bootstrap's.
		_, aport, _ := SplitHostPort(c.Advertise)
		if first := aport + c.nodePortBase(port) - port; first < 1 || first > 65535 {
			return bad("advertise %q with node ports from %d: nodes would be advertised from port %d, outside 1..65535", c.Advertise, c.nodePortBase(port), first)
		}
	}
	for id, n := range c.Nodes {
		if id < 0 {
			return bad("nodes: node id %d is negative", id)
		}
		if n.Listen != "" {
			nh, _, err := SplitHostPort(n.Listen)
			if err != nil {
				return bad("nodes[%d].listen %q: %v", id, n.Listen, err)
			}
			if unspecifiedHost(nh) && n.Advertise == "" && c.Advertise == "" {
				return bad("nodes[%d].listen %q binds every interface: set nodes[%d].advertise (or advertise) to the host:port clients should use", id, n.Listen, id)
			}
		}
		if n.Advertise != "" {
			if _, aport, err := SplitHostPort(n.Advertise); err != nil {
				return bad("nodes[%d].advertise %q: %v", id, n.Advertise, err)
			} else if aport == 0 {
				return bad("nodes[%d].advertise %q: port 0 cannot be advertised", id, n.Advertise)
			}
		}
		// What the override leaves to derivation must be derivable.
		if _, _, err := c.NodeAddrs(id); err != nil {
			return bad("nodes[%d]: %v", id, err)
		}
	}
	if c.Admin != "off" {
		ahost, aport, err := SplitHostPort(c.Admin)
		if err != nil {
			return bad("admin %q: %v", c.Admin, err)
		}
		// Only the exact collisions known now; a node listener that would
		// take the admin port is found when it binds (package proxy).
		if aport != 0 && aport == port && hostsOverlap(ahost, host) {
			return bad("admin %q and listen %q are the same port", c.Admin, c.Listen)
		}
		for id, n := range c.Nodes {
			if nh, np, _ := SplitHostPort(n.Listen); n.Listen != "" && aport != 0 && np == aport && hostsOverlap(ahost, nh) {
				return bad("admin %q and nodes[%d].listen %q are the same port", c.Admin, id, n.Listen)
			}
		}
	}
	if c.MaxFrameBytes < 1024 {
		return bad("max_frame_bytes %d is below 1024", c.MaxFrameBytes)
	}
	if c.RequestMemory < 0 {
		return bad("request_memory %d is negative", c.RequestMemory)
	}
	if c.MaxInflight < 1 {
		return bad("max_inflight %d must be at least 1", c.MaxInflight)
	}
	if c.MaxConnections < -1 {
		return bad("max_connections %d: want at least 1, or -1 for unlimited", c.MaxConnections)
	}
	if c.MaxConnectionsPerIP < 0 {
		return bad("max_connections_per_ip %d: want at least 1, or 0 for unlimited", c.MaxConnectionsPerIP)
	}
	for name, d := range map[string]time.Duration{"dial_timeout": c.DialTimeout, "idle_timeout": c.IdleTimeout, "write_timeout": c.WriteTimeout, "drain_timeout": c.DrainTimeout} {
		if d < 0 {
			return bad("%s %s is negative", name, d)
		}
	}
	switch c.Dedup.Mode {
	case DedupEnforce, DedupObserve, DedupOff:
	default:
		return bad("dedup.mode %q: want enforce, observe or off", c.Dedup.Mode)
	}
	if c.Dedup.RetainedBatches < 1 || c.Dedup.RetainedBatches > seqstate.MaxRetainedBatches {
		return bad("dedup.retained_batches %d: want 1..%d", c.Dedup.RetainedBatches, seqstate.MaxRetainedBatches)
	}
	if c.Dedup.MaxEntries < 1 {
		return bad("dedup.max_entries %d must be at least 1", c.Dedup.MaxEntries)
	}
	if c.Dedup.ProducerIDExpiration < 0 {
		return bad("dedup.producer_id_expiration %s is negative", c.Dedup.ProducerIDExpiration)
	}
	if cc := c.Dedup.Legacy.CleanClose; cc != CleanCloseRead && cc != CleanCloseIgnore {
		return bad("dedup.legacy.clean_close %q: want read or ignore", cc)
	}
	if !validMatch(c.Dedup.Legacy.Match) {
		return bad("dedup.legacy.match %q: want auto, records, exact or off", c.Dedup.Legacy.Match)
	}
	if c.Dedup.Legacy.Window < 0 {
		return bad("dedup.legacy.window %s is negative", c.Dedup.Legacy.Window)
	}
	if c.Dedup.Legacy.MaxRecords < 1 || c.Dedup.Legacy.MaxRecords > 1<<30 {
		return bad("dedup.legacy.max_records %d: want 1..2^30", c.Dedup.Legacy.MaxRecords)
	}
	if s := c.Dedup.Legacy.Scope; s != ScopeInstance && s != ScopeClientID {
		return bad("dedup.legacy.scope %q: want instance or client_id", s)
	}
	for name, tc := range c.Dedup.Topics {
		if tc.Mode != "" && tc.Mode != DedupEnforce && tc.Mode != DedupObserve && tc.Mode != DedupOff {
			return bad("dedup.topics[%q].mode %q: want enforce, observe or off", name, tc.Mode)
		}
		if tc.LegacyMatch != "" && !validMatch(tc.LegacyMatch) {
			return bad("dedup.topics[%q].legacy_match %q: want auto, records, exact or off", name, tc.LegacyMatch)
		}
	}
	if n := metricsTopics(c.Dedup.Topics); n > MaxMetricsTopics {
		return bad("dedup.topics: %d topics with metrics: true, at most %d (each adds %d series)", n, MaxMetricsTopics, MetricsTopicSeries)
	}
	if c.Dedup.Warm.Timeout < 0 || c.Dedup.Warm.MaxBytes < 1024 || c.Dedup.Warm.MaxConcurrent < 1 {
		return bad("dedup.warm: timeout %s must not be negative, max_bytes %d at least 1024, max_concurrent %d at least 1", c.Dedup.Warm.Timeout, c.Dedup.Warm.MaxBytes, c.Dedup.Warm.MaxConcurrent)
	}
	if c.Dedup.Keys.TTL < 0 {
		return bad("dedup.keys.ttl %s is negative", c.Dedup.Keys.TTL)
	}
	if c.Dedup.Keys.MaxKeys < 1 || c.Dedup.Keys.MaxKeys > 1<<30 {
		return bad("dedup.keys.max_keys %d: want 1..2^30", c.Dedup.Keys.MaxKeys)
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return bad("log_level %q: want debug, info, warn or error", c.LogLevel)
	}
	if c.LogFormat != LogText && c.LogFormat != LogJSON {
		return bad("log_format %q: want text or json", c.LogFormat)
	}
	for _, l := range []struct {
		name string
		tc   TLSConfig
	}{{"tls", c.TLS}, {"admin_tls", c.AdminTLS}} {
		if err := l.tc.validate(l.name); err != nil {
			return bad("%v", err)
		}
	}
	if c.AdminTLS.Enabled() && c.Admin == "off" {
		return bad("admin_tls is set but admin is off")
	}
	u := c.UpstreamTLS
	if (u.Cert == "") != (u.Key == "") {
		return bad("upstream_tls: cert and key go together (a client certificate and its key)")
	}
	if !validTLSVersion(u.MinVersion) {
		return bad("upstream_tls.min_version %q: want 1.2 or 1.3", u.MinVersion)
	}
	sa := c.UpstreamSASL
	switch sa.Mechanism {
	case "":
		if sa.User != "" || sa.PasswordFile != "" {
			return bad("upstream_sasl: user and password_file need a mechanism (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)")
		}
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
		if sa.User == "" || sa.PasswordFile == "" {
			return bad("upstream_sasl.mechanism %s needs user and password_file", sa.Mechanism)
		}
	default:
		return bad("upstream_sasl.mechanism %q: want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (GSSAPI and OAUTHBEARER clients are relayed, but the proxy cannot authenticate with them itself)", sa.Mechanism)
	}
	if c.CertReloadInterval < 0 {
		return bad("cert_reload_interval %s is negative", c.CertReloadInterval)
	}
	if _, err := c.ReplicaLayout(); err != nil {
		return bad("%v", err)
	}
	return nil
}

func (c TLSConfig) validate(name string) error {
	if (c.Cert == "") != (c.Key == "") {
		return fmt.Errorf("%s: cert and key go together", name)
	}
	if c.ClientCA != "" && c.Cert == "" {
		return fmt.Errorf("%s.client_ca needs cert and key: client certificates are verified only on a TLS listener", name)
	}
	if !validTLSVersion(c.MinVersion) {
		return fmt.Errorf("%s.min_version %q: want 1.2 or 1.3", name, c.MinVersion)
	}
	if c.PrincipalMappingRules != "" {
		if name != "tls" {
			return fmt.Errorf("%s.principal_mapping_rules: only the client listeners (tls) have principals", name)
		}
		if c.ClientCA == "" {
			return fmt.Errorf("%s.principal_mapping_rules needs client_ca: without client certificates there is no subject to map", name)
		}
		if _, err := certprincipal.ParseRules(c.PrincipalMappingRules); err != nil {
			return fmt.Errorf("%s.principal_mapping_rules: %w", name, err)
		}
	}
	return nil
}

func validTLSVersion(v string) bool { return v == TLS12 || v == TLS13 }

func validMatch(m string) bool {
	return m == MatchAuto || m == MatchRecords || m == MatchExact || m == MatchOff
}

// nodePortBase returns the listen port of node NodeIDOffset, given the
// listen port: NodePortBase, or listen port + 1.
func (c *Config) nodePortBase(listenPort int) int {
	if c.NodePortBase != 0 {
		return c.NodePortBase
	}
	return listenPort + 1
}

// NodeAddrs returns the address broker node id binds and, when clients are
// told something other than the bound address, what they are told (adv is
// empty when they are told the bound address). The port is derived from the
// node id (see NodePortBase) unless Nodes sets the address; a derived port
// outside 1..65535, or an id below NodeIDOffset, is an error: such a node
// gets no listener. Call it on a validated Config.
func (c *Config) NodeAddrs(id int32) (bind, adv string, err error) {
	lhost, lport, _ := SplitHostPort(c.Listen)
	ov := c.Nodes[id]
	// derived is node id's port by the offset rule, before any override.
	derived := func() (int, error) {
		if id < c.NodeIDOffset {
			return 0, fmt.Errorf("node id %d is below node_id_offset %d, so it has no port (set nodes[%d] or lower node_id_offset)", id, c.NodeIDOffset, id)
		}
		p := c.nodePortBase(lport) + int(id-c.NodeIDOffset)
		if p > 65535 {
			return 0, fmt.Errorf("node %d would listen on port %d (%d + node id %d − node_id_offset %d), beyond 65535 (set node_port_base, node_id_offset or nodes[%d])",
				id, p, c.nodePortBase(lport), id, c.NodeIDOffset, id)
		}
		return p, nil
	}
	bind = ov.Listen
	if bind == "" {
		p, err := derived()
		if err != nil {
			return "", "", err
		}
		if lport == 0 && c.NodePortBase == 0 {
			p = 0 // free ports
		}
		bind = hostPort(lhost, p)
	}
	adv = ov.Advertise
	if adv == "" && c.Advertise != "" {
		p, err := derived()
		if err != nil {
			return "", "", err
		}
		ahost, aport, _ := SplitHostPort(c.Advertise)
		ap := aport + p - lport // shifted like the bootstrap listener
		if ap < 1 || ap > 65535 {
			return "", "", fmt.Errorf("node %d would be advertised at port %d (advertise port %d + node port %d − listen port %d), outside 1..65535", id, ap, aport, p, lport)
		}
		adv = hostPort(ahost, ap)
	}
	return bind, adv, nil
}

// hostsOverlap reports whether listeners on hosts a and b can collide: the
// same host, or either binding every interface.
func hostsOverlap(a, b string) bool {
	return a == b || unspecifiedHost(a) || unspecifiedHost(b)
}

// hostPort joins a host and a port.
func hostPort(host string, port int) string { return net.JoinHostPort(host, strconv.Itoa(port)) }

// SplitHostPort splits a host:port address of the configuration, its port
// a number in 0..65535.
func SplitHostPort(addr string) (string, int, error) {
	host, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port %q", ps)
	}
	return host, port, nil
}

func unspecifiedHost(host string) bool {
	if host == "" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsUnspecified()
}

func metricsTopics(topics map[string]TopicDedupConfig) int {
	n := 0
	for _, tc := range topics {
		if tc.Metrics {
			n++
		}
	}
	return n
}
