package proxy

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// Config is the whole application configuration, read from YAML (see
// config.example.yaml, which a test keeps in step with this struct) and
// overridden by command-line flags. The zero value of each field means the
// default documented on it; call [Config.EnsureDefaults] then
// [Config.Validate].
type Config struct {
	// Upstream lists bootstrap brokers of the real cluster as host:port.
	// Empty means the command starts an embedded in-memory cluster.
	Upstream []string `yaml:"upstream"`

	// Listen is the bootstrap listener's bind address. Default
	// 127.0.0.1:9092. Broker node N is served on the same host at port
	// (listen port + 1 + N) unless Nodes maps it. With port 0 every
	// listener takes a free port (how tests run).
	Listen string `yaml:"listen"`

	// Advertise is the host:port clients are told for the bootstrap
	// listener; node N is advertised at (advertise port + 1 + N). Empty
	// means the address actually bound, which needs a concrete listen host.
	// Set it behind NAT, in containers and behind port-forwards.
	Advertise string `yaml:"advertise"`

	// Nodes overrides the listen and advertised address of single broker
	// nodes, by node id.
	Nodes map[int32]NodeConfig `yaml:"nodes"`

	// Admin is the HTTP address of /metrics, /healthz and /readyz. Default
	// 127.0.0.1:9080, below the default broker port range. "off" disables it.
	Admin string `yaml:"admin"`

	// MaxFrameBytes caps one request or response frame. Default 100 MiB,
	// Kafka's socket.request.max.bytes.
	MaxFrameBytes int32 `yaml:"max_frame_bytes"`

	// MaxInflight caps the requests of one client connection awaiting their
	// response; when reached the proxy stops reading from that client
	// (backpressure). Default 256.
	MaxInflight int `yaml:"max_inflight"`

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

	// LogLevel is debug, info, warn or error. Default info.
	LogLevel string `yaml:"log_level"`

	// Dedup configures deduplication of idempotent Produce batches.
	Dedup DedupConfig `yaml:"dedup"`
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

	// Topics overrides settings per topic, by name.
	Topics map[string]TopicDedupConfig `yaml:"topics"`
}

// Legacy match modes: what makes two legacy batches the same.
const (
	MatchRecords = "records" // same partition, record count and records section: restamped retries match
	MatchExact   = "exact"   // the same, and the same header timestamps: only byte-identical retries match
	MatchOff     = "off"     // legacy batches are relayed untouched
)

// LegacyConfig configures deduplication of legacy producers.
type LegacyConfig struct {
	// Match is records (default), exact or off; see the Match constants.
	Match string `yaml:"match"`
	// Window is how long an acknowledged legacy batch is remembered: an
	// identical batch arriving on another connection within it is answered
	// as a retry. Default 2m, the default delivery.timeout.ms of the Java
	// client and librdkafka, after which they stop retrying.
	Window time.Duration `yaml:"window"`
	// MaxIdentities caps the legacy batches remembered (about 56 bytes
	// each); the oldest is forgotten first. Default 262144.
	MaxIdentities int `yaml:"max_identities"`
}

// TopicDedupConfig is the per-topic part of DedupConfig.
type TopicDedupConfig struct {
	// LegacyMatch overrides dedup.legacy.match for this topic. Empty means
	// the global setting.
	LegacyMatch string `yaml:"legacy_match"`
}

// NodeConfig pins the listener of one broker node.
type NodeConfig struct {
	// Listen is the bind address. Empty means the derived one.
	Listen string `yaml:"listen"`
	// Advertise is what clients are told. Empty means the derived one.
	Advertise string `yaml:"advertise"`
}

// Defaults.
const (
	DefaultListen       = "127.0.0.1:9092"
	DefaultAdmin        = "127.0.0.1:9080"
	DefaultMaxInflight  = 256
	DefaultDialTimeout  = 10 * time.Second
	DefaultIdleTimeout  = 10 * time.Minute
	DefaultWriteTimeout = 30 * time.Second
	DefaultDrainTimeout = 30 * time.Second
)

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
	if c.MaxInflight == 0 {
		c.MaxInflight = DefaultMaxInflight
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
		c.Dedup.Legacy.Match = MatchRecords
	}
	if c.Dedup.Legacy.Window == 0 {
		c.Dedup.Legacy.Window = seqstate.DefaultLegacyWindow
	}
	if c.Dedup.Legacy.MaxIdentities == 0 {
		c.Dedup.Legacy.MaxIdentities = seqstate.DefaultMaxIdentities
	}
}

// Validate reports the first problem with the configuration.
func (c *Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	for _, u := range c.Upstream {
		if _, _, err := splitHostPort(u); err != nil {
			return bad("upstream %q: %v", u, err)
		}
	}
	host, port, err := splitHostPort(c.Listen)
	if err != nil {
		return bad("listen %q: %v", c.Listen, err)
	}
	if c.Advertise == "" && unspecifiedHost(host) {
		return bad("listen %q binds every interface: clients cannot connect to that address, so set advertise to the host:port they should use", c.Listen)
	}
	if c.Advertise != "" {
		if _, aport, err := splitHostPort(c.Advertise); err != nil {
			return bad("advertise %q: %v", c.Advertise, err)
		} else if aport == 0 {
			return bad("advertise %q: port 0 cannot be advertised", c.Advertise)
		}
	}
	for id, n := range c.Nodes {
		if id < 0 {
			return bad("nodes: node id %d is negative", id)
		}
		if n.Listen != "" {
			if _, _, err := splitHostPort(n.Listen); err != nil {
				return bad("nodes[%d].listen %q: %v", id, n.Listen, err)
			}
		}
		if n.Advertise != "" {
			if _, _, err := splitHostPort(n.Advertise); err != nil {
				return bad("nodes[%d].advertise %q: %v", id, n.Advertise, err)
			}
		}
	}
	if c.Admin != "off" {
		ahost, aport, err := splitHostPort(c.Admin)
		if err != nil {
			return bad("admin %q: %v", c.Admin, err)
		}
		// The admin port must not fall in the broker range of the default
		// derivation, or the first broker listener that lands on it fails.
		if port != 0 && aport >= port && aport <= port+1024 && (ahost == host || unspecifiedHost(ahost) || unspecifiedHost(host)) {
			return bad("admin port %d collides with the proxy's listener range %d..%d (listen port + 1 + node id)", aport, port, port+1024)
		}
	}
	if c.MaxFrameBytes < 1024 {
		return bad("max_frame_bytes %d is below 1024", c.MaxFrameBytes)
	}
	if c.MaxInflight < 1 {
		return bad("max_inflight %d must be at least 1", c.MaxInflight)
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
	if !validMatch(c.Dedup.Legacy.Match) {
		return bad("dedup.legacy.match %q: want records, exact or off", c.Dedup.Legacy.Match)
	}
	if c.Dedup.Legacy.Window < 0 {
		return bad("dedup.legacy.window %s is negative", c.Dedup.Legacy.Window)
	}
	if c.Dedup.Legacy.MaxIdentities < 1 || c.Dedup.Legacy.MaxIdentities > 1<<30 {
		return bad("dedup.legacy.max_identities %d: want 1..2^30", c.Dedup.Legacy.MaxIdentities)
	}
	for name, tc := range c.Dedup.Topics {
		if tc.LegacyMatch != "" && !validMatch(tc.LegacyMatch) {
			return bad("dedup.topics[%q].legacy_match %q: want records, exact or off", name, tc.LegacyMatch)
		}
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return bad("log_level %q: want debug, info, warn or error", c.LogLevel)
	}
	return nil
}

func validMatch(m string) bool { return m == MatchRecords || m == MatchExact || m == MatchOff }

func splitHostPort(addr string) (string, int, error) {
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
