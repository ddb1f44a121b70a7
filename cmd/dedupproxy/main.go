// Command dedupproxy runs the Kafka deduplicating proxy.
//
//	dedupproxy [flags]       run the proxy (dedupproxy --help lists the flags)
//	dedupproxy demo          show duplicates prevented, against an embedded cluster
//	dedupproxy audit         count the duplicates a topic already holds
//	dedupproxy version       print the version and VCS revision
//	dedupproxy help          print the help
//
// SIGHUP applies the config keys of reloadedKeys and re-reads every
// certificate file, and says which other changes of the config file need a
// restart; SIGTERM and SIGINT drain and exit.
//
// With neither --upstream nor --config, or with "upstream: embedded", it
// starts an embedded in-memory 3-broker Kafka cluster (franz-go kfake) on
// loopback, so it works out of the box. A config file without upstream is
// an error.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	httppprof "net/http/pprof"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/dedupproxy/dedupproxy/clock"
	"github.com/dedupproxy/dedupproxy/config"
	"github.com/dedupproxy/dedupproxy/proxy"
)

func main() {
	tuneGC()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// defaultGCPercent is the proxy's GOGC unless the environment sets one. Its
// live heap is a few MB (large requests are read into mappings outside it)
// and its hot paths do not allocate, so collecting at 25 % growth rather
// than Go's 100 % costs little CPU and keeps the heap's headroom, and the
// memory it holds, small (docs/performance.md, "Memory").
const defaultGCPercent = 25

// tuneGC applies defaultGCPercent unless GOGC is set, and reports whether
// it did.
func tuneGC() bool {
	if _, set := os.LookupEnv("GOGC"); set {
		return false
	}
	debug.SetGCPercent(defaultGCPercent)
	return true
}

// subcommands are the command's subcommands, in the order the help lists
// them. Each answers --help (and -h) with its own help and runs nothing.
var subcommands = []struct {
	name, summary string
	run           func(ctx context.Context, args []string, stdout, stderr io.Writer) int
	usage         func(w io.Writer)
}{
	{"cluster", "run a local in-memory Kafka cluster to try the proxy on", runCluster, func(w io.Writer) { newClusterFlags().usage(w) }},
	{"demo", "show duplicates prevented, against an embedded cluster", runDemoCommand, demoUsage},
	{"audit", "count the duplicates a topic already holds", runAudit, func(w io.Writer) { newAuditFlags().usage(w) }},
	{"version", "print the version and VCS revision (also --version)", runVersion, versionUsage},
	{"help", "print this help, or a subcommand's (help audit)", nil, nil},
}

// run is main without the process: it returns the exit code, 0 on
// success, 2 for a configuration error (a flag, a config key, a file it
// names, a port it cannot bind: nothing started) and 1 for a failure at
// run time (docs/operations.md, "Exit codes"). Help and the version go to
// stdout, errors and logs to stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		if args[0] == "help" {
			return runHelp(args[1:], stdout, stderr)
		}
		for _, sc := range subcommands {
			if sc.name == args[0] {
				return sc.run(ctx, args[1:], stdout, stderr)
			}
		}
	}
	fl := newFlags()
	cfg, err := fl.load(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fl.usage(stdout)
		return 0
	case err == nil && *fl.version:
		fmt.Fprintln(stdout, versionLine())
		return 0
	case errors.Is(err, errUnexpectedArg):
		fmt.Fprintf(stderr, "dedupproxy: %v (subcommands: %s)\n", err, subcommandNames())
		fmt.Fprintln(stderr, "Run 'dedupproxy --help' for the subcommands and flags.")
		return 2
	case err != nil:
		fmt.Fprintln(stderr, "dedupproxy:", err)
		if fl.parseErr {
			fmt.Fprintln(stderr, "Run 'dedupproxy --help' for the subcommands and flags.")
		}
		return 2
	}
	level := new(slog.LevelVar)
	level.Set(parseLevel(cfg.LogLevel))
	log := slog.New(newLogHandler(stderr, cfg.LogFormat, level))

	embedded := len(cfg.Upstream) == 0 || cfg.Upstream[0] == config.EmbeddedUpstream
	if embedded && (cfg.UpstreamTLS.Enabled || cfg.UpstreamSASL.Mechanism != "") {
		fmt.Fprintln(stderr, "dedupproxy: upstream_tls and upstream_sasl need an upstream (--upstream): the embedded cluster speaks neither")
		return 2
	}
	configName := *fl.config
	if configName == "" {
		configName = "none (flags and defaults)"
	}
	version, revision := buildVersion()
	log.Info("dedupproxy starting", "version", version, "revision", revision, "go", runtime.Version(),
		"config", configName, "dedup_mode", cfg.Dedup.Mode, "log_level", cfg.LogLevel, "log_format", cfg.LogFormat)
	loaded := cfg // as configured, before the embedded cluster's addresses
	if embedded {
		cluster, err := startEmbedded()
		if err != nil {
			log.Error("cannot start the embedded cluster", "err", err)
			return 1
		}
		defer cluster.Close()
		cfg.Upstream = cluster.ListenAddrs()
		log.Warn("EMBEDDED CLUSTER: no real upstream; started an embedded in-memory 3-broker Kafka cluster (kfake) on loopback; everything written is LOST on exit; it lives in this process, so replicas and dedupproxy audit cannot share it (dedupproxy cluster runs one they can). For a real cluster set --upstream or upstream: in the config file",
			"brokers", strings.Join(cfg.Upstream, ","))
	} else {
		log.Info("upstream", "brokers", strings.Join(cfg.Upstream, ","),
			"upstream_tls", cfg.UpstreamTLS.Enabled, "upstream_sasl", cfg.UpstreamSASL.Mechanism)
	}

	reg := prometheus.NewRegistry()
	srv := &proxy.Server{Config: cfg, Logger: log, Metrics: proxy.NewMetrics(reg)}

	// The admin listener is bound first, so that a proxy listener that
	// would take its port is found when it binds, named as the admin
	// listener's, and fails Start (see proxy.Server.AdminAddr). It serves
	// only once the proxy has started: /readyz probes through it.
	var adminLn net.Listener
	if cfg.Admin != "off" {
		if adminLn, err = net.Listen("tcp", cfg.Admin); err != nil {
			log.Error("cannot start the admin listener", "addr", cfg.Admin, "err", err)
			return 2
		}
		srv.AdminAddr = adminLn.Addr()
	}
	// Start fails only on what it was given: the configuration, the
	// files it names (certificates), the ports it binds. So its failure
	// is a configuration error, exit 2, like a bad flag.
	if err := srv.Start(ctx); err != nil {
		log.Error("cannot start", "err", err)
		if adminLn != nil {
			adminLn.Close()
		}
		return 2
	}

	// SIGHUP reloads what can change safely.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		running := loaded
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				running = reload(log, level, srv, fl, args, running)
			}
		}
	}()

	var admin *http.Server
	adminAddr := "off"
	if adminLn != nil {
		admin = &http.Server{Handler: adminHandler(srv, reg, cfg.AdminPprof), ReadHeaderTimeout: 5 * time.Second}
		scheme := "http"
		if tc := srv.AdminTLSConfig(); tc != nil {
			adminLn = tls.NewListener(adminLn, tc)
			scheme = "https"
		}
		adminAddr = scheme + "://" + adminLn.Addr().String()
		paths := "/metrics /healthz /readyz /replica"
		if cfg.AdminPprof {
			paths += " /debug/pprof/"
		}
		log.Info("admin listening", "addr", adminLn.Addr().String(), "scheme", scheme, "paths", paths)
		go func() {
			if err := admin.Serve(adminLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("admin server failed", "err", err)
			}
		}()
	}
	log.Info("started", "bootstrap", srv.Addr().String(), "nodes", strings.Join(srv.NodeListeners(), " "), "admin", adminAddr,
		"upstream", strings.Join(cfg.Upstream, ","), "embedded", embedded, "dedup_mode", cfg.Dedup.Mode)

	<-ctx.Done()
	log.Info("shutting down: /readyz answers 503; no new connections or requests; waiting for in-flight Produce requests (consumers' Fetches are cut)", "drain_timeout", cfg.DrainTimeout)
	start := clock.Real.Now()
	sctx, cancel := context.WithTimeout(context.Background(), cfg.DrainTimeout)
	defer cancel()
	code := 0
	if err := srv.Shutdown(sctx); err != nil {
		log.Error("drain timed out; closed the remaining connections", "err", err)
		code = 1
	}
	if admin != nil {
		admin.Shutdown(sctx)
	}
	log.Info("stopped", "drain", clock.Real.Now().Sub(start).Round(time.Millisecond))
	return code
}

// flags are the command's flags; load applies them over the config file.
type flags struct {
	fs                         *flag.FlagSet
	config, upstream, listen   *string
	advertise, admin           *string
	logLevel, logFormat, dedup *string
	upstreamTLS, version       *bool
	adminPprof                 *bool
	strFlags                   map[string]strFlag
	parseErr                   bool // the error is the command line's
	// clusterOnly: only the settings that reach the cluster matter (the
	// audit); a config file's replica settings, which need this host's
	// replica index, are the proxy's and are not checked.
	clusterOnly bool
}

type strFlag struct {
	val *string
	set func(c *proxy.Config, v string)
}

func newFlags() *flags {
	fs := flag.NewFlagSet("dedupproxy", flag.ContinueOnError)
	// The flag package would print the error and the whole usage on a
	// bad flag; run prints the error once, and a hint.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	f := &flags{fs: fs, strFlags: map[string]strFlag{}}
	f.defineUpstream(fs, "the cluster's bootstrap brokers, `HOST:PORT[,...]`; \"embedded\" (the default without --config) starts an in-memory cluster inside the proxy")
	f.listen = fs.String("listen", config.DefaultListen, "bootstrap listener `HOST:PORT`; broker node N listens on port+1+N (node_port_base, node_id_offset and nodes in the config file change that); port 0 takes free ports")
	f.advertise = fs.String("advertise", "", "`HOST:PORT` clients are told (default: the listen address); node N is advertised shifted alike, at port+1+N by default")
	f.admin = fs.String("admin", config.DefaultAdmin, "HTTP `HOST:PORT` for /metrics, /healthz, /readyz and /replica, or \"off\"")
	f.logLevel = fs.String("log-level", "", "`level`: debug, info, warn or error (default info; SIGHUP reloads log_level from the config file)")
	f.logFormat = fs.String("log-format", "", "log `format`: text or json (default text)")
	f.dedup = fs.String("dedup-mode", "", "`mode`: enforce (answer retries like Kafka), observe (count and log them, forward everything) or off (default enforce; per topic: dedup.topics in the config file)")
	f.version = fs.Bool("version", false, "print the version and VCS revision, and exit")
	f.def("tls-cert", "PEM certificate `file` (with its chain) for the client listeners: every listener speaks TLS",
		func(c *proxy.Config, v string) { c.TLS.Cert = v })
	f.def("tls-key", "PEM private key `file` of --tls-cert", func(c *proxy.Config, v string) { c.TLS.Key = v })
	f.def("tls-client-ca", "PEM CA `file`: clients must present a certificate it issued (mutual TLS)",
		func(c *proxy.Config, v string) { c.TLS.ClientCA = v })
	f.def("tls-principal-mapping-rules", "the brokers' ssl.principal.mapping.rules `rules`: how a client certificate's subject becomes the principal that scopes its state (default DEFAULT)",
		func(c *proxy.Config, v string) { c.TLS.PrincipalMappingRules = v })
	f.def("admin-tls-cert", "PEM certificate `file` for the admin listener: it serves HTTPS",
		func(c *proxy.Config, v string) { c.AdminTLS.Cert = v })
	f.def("admin-tls-key", "PEM private key `file` of --admin-tls-cert", func(c *proxy.Config, v string) { c.AdminTLS.Key = v })
	f.def("replicas", "every replica's advertised bootstrap `ADDR0,ADDR1,...` in index order, or one with {i} for the index (default: one proxy on its own)",
		func(c *proxy.Config, v string) { c.Replicas = splitList(v) })
	f.def("replica-index", "this replica's `index` in --replicas (default: the number ending the host name, as StatefulSet pods are named)",
		func(c *proxy.Config, v string) {
			i, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				i = -1 // Validate names the range
			}
			c.ReplicaIndex = &i
		})
	f.def("replica-count", "how many replicas (`N`) a --replicas address with {i} stands for",
		func(c *proxy.Config, v string) {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				n = -1
			}
			c.ReplicaCount = n
		})
	f.def("replica-owners", "broker nodes owned by another replica than node id mod the count, `NODE=INDEX[,...]`",
		func(c *proxy.Config, v string) { c.ReplicaOwners = parseOwners(v) })
	f.def("replica-admin", "every replica's admin `HOST:PORT,...` in index order (or one with {i}), where peers read /replica (default: each --replicas host at this --admin port)",
		func(c *proxy.Config, v string) { c.ReplicaAdmin = splitList(v) })
	f.adminPprof = fs.Bool("admin-pprof", false, "serve Go's profiles (net/http/pprof) under /debug/pprof/ on the admin listener")
	return f
}

// proxyFlagGroups order the proxy's help by concern, each with what holds
// between its flags. TestHelp fails when a flag is in no group.
// NOTE: a new flag goes into the group of its concern here.
var proxyFlagGroups = []flagGroup{
	{title: "Config", flags: []string{"config", "version"},
		note: "Flags win over the config file. A config file must set upstream."},
	{title: "Listeners", flags: []string{"listen", "advertise"},
		note: "Clients connect to --listen; each broker node gets a listener of its own beside it. " +
			"--advertise is needed when --listen binds every address (0.0.0.0)."},
	{title: "Upstream", flags: []string{"upstream"},
		note: "Without --upstream and --config the proxy starts an embedded in-memory cluster whose data is lost on exit: " +
			"for trying it out. For a cluster that outlives the proxy, or that replicas and dedupproxy audit share, " +
			"run dedupproxy cluster and pass its address."},
	{title: "TLS and SASL", flags: []string{"tls-cert", "tls-key", "tls-client-ca", "tls-principal-mapping-rules",
		"upstream-tls", "upstream-tls-ca", "upstream-tls-cert", "upstream-tls-key", "upstream-tls-server-name",
		"upstream-sasl-mechanism", "upstream-sasl-user", "upstream-sasl-password-file"},
		note: "--tls-cert and --tls-key go together; --tls-client-ca needs them, and --tls-principal-mapping-rules " +
			"--tls-client-ca. Every --upstream-tls-* flag implies " +
			"--upstream-tls; --upstream-tls-cert and --upstream-tls-key go together. --upstream-sasl-mechanism needs " +
			"--upstream-sasl-user and --upstream-sasl-password-file (clients' own SASL is relayed; this is the proxy's). " +
			"None of them works with the embedded cluster. Other TLS and SASL keys: the config file."},
	{title: "Dedup", flags: []string{"dedup-mode"},
		note: "Per-topic modes, the legacy rule, idempotency keys and the tables' sizes: the dedup keys of the config file."},
	{title: "Replicas", flags: []string{"replicas", "replica-count", "replica-index", "replica-owners", "replica-admin"},
		note: "--replicas turns replicas on; the other replica flags need it. --replica-count is required when the " +
			"address has {i}; --replica-index unless the host name ends with the index. --replica-admin is required " +
			"when replicas share a host (their admin addresses would collide). --listen must have the port of this " +
			"replica's entry, --advertise must be empty or the entry, and --admin cannot be off (docs/replicas.md)."},
	{title: "Admin", flags: []string{"admin", "admin-tls-cert", "admin-tls-key", "admin-pprof"},
		note: "--admin-tls-cert and --admin-tls-key go together and need --admin. No broker node's port may be the admin port."},
	{title: "Logging", flags: []string{"log-level", "log-format"}},
}

// def defines a string flag whose value load sets with set.
func (f *flags) def(name, usage string, set func(*proxy.Config, string)) {
	f.strFlags[name] = strFlag{f.fs.String(name, "", usage), set}
}

// defineUpstream defines the flags that say how to reach the cluster: the
// config file, the bootstrap brokers, TLS and SASL. The proxy and
// dedupproxy audit share them, so the audit reaches the cluster exactly as
// the proxy's own connections do. No flag takes a password: it would show
// in ps and in shell history.
func (f *flags) defineUpstream(fs *flag.FlagSet, upstreamUsage string) {
	f.config = fs.String("config", "", "YAML config `file` (every key: config.example.yaml); it must set upstream")
	f.upstream = fs.String("upstream", "", upstreamUsage)
	f.upstreamTLS = fs.Bool("upstream-tls", false, "TLS to the brokers, verified against the system roots (or --upstream-tls-ca)")
	f.def("upstream-tls-ca", "PEM CA `file` that issued the brokers' certificates (default: the system roots)",
		func(c *proxy.Config, v string) { c.UpstreamTLS.CA = v })
	f.def("upstream-tls-cert", "PEM client certificate `file` presented to brokers",
		func(c *proxy.Config, v string) { c.UpstreamTLS.Cert = v })
	f.def("upstream-tls-key", "PEM private key `file` of --upstream-tls-cert", func(c *proxy.Config, v string) { c.UpstreamTLS.Key = v })
	f.def("upstream-tls-server-name", "`name` every broker certificate is verified against (default: each broker's own host)",
		func(c *proxy.Config, v string) { c.UpstreamTLS.ServerName = v })
	f.def("upstream-sasl-mechanism", "SASL `mechanism` of the proxy's own connections (readiness, discovery, warm-ups): PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512",
		func(c *proxy.Config, v string) { c.UpstreamSASL.Mechanism = v })
	f.def("upstream-sasl-user", "SASL `user` of the proxy's own connections", func(c *proxy.Config, v string) { c.UpstreamSASL.User = v })
	f.def("upstream-sasl-password-file", "`file` holding that user's password (no flag takes a password: it would show in ps)",
		func(c *proxy.Config, v string) { c.UpstreamSASL.PasswordFile = v })
}

// usage prints the subcommands and every flag, by concern.
func (f *flags) usage(w io.Writer) {
	fmt.Fprint(w, `dedupproxy: a Kafka-protocol proxy that stops duplicate Produce writes.

Usage:
  dedupproxy [flags]             run the proxy
`)
	for _, sc := range subcommands {
		fmt.Fprintf(w, "  dedupproxy %-19s %s\n", sc.name, sc.summary)
	}
	fmt.Fprintf(w, "\n%s\n\n", wrap("Each subcommand answers --help. SIGHUP applies "+reloadedKeysText()+
		" from the config file and re-reads the certificate files; SIGTERM drains in-flight Produce requests "+
		"(up to drain_timeout) and exits. Exit codes: 0 done, 2 a configuration error (a flag, a key, a file, "+
		"a port: nothing started), 1 a failure at run time.", "", 78))
	printFlags(w, f.fs, proxyFlagGroups)
	fmt.Fprint(w, "\nEvery config key: config.example.yaml. Operating it: docs/operations.md.\n")
}

// load parses args, reads the config file, then applies the flags that were
// set: flags win over the file.
func (f *flags) load(args []string) (proxy.Config, error) {
	var cfg proxy.Config
	if err := f.fs.Parse(args); err != nil {
		f.parseErr = !errors.Is(err, flag.ErrHelp)
		if f.parseErr {
			err = flagError(f.fs, err)
		}
		return cfg, err
	}
	if f.fs.NArg() > 0 {
		f.parseErr = true
		return cfg, fmt.Errorf("%w %q", errUnexpectedArg, f.fs.Arg(0))
	}
	if *f.config != "" {
		var err error
		if cfg, err = readConfigFile(*f.config); err != nil {
			return cfg, err
		}
	}
	upstreamSet := false
	f.fs.Visit(func(fl *flag.Flag) {
		switch fl.Name {
		case "upstream":
			cfg.Upstream = splitList(*f.upstream)
			upstreamSet = true
		case "listen":
			cfg.Listen = *f.listen
		case "advertise":
			cfg.Advertise = *f.advertise
		case "admin":
			cfg.Admin = *f.admin
		case "upstream-tls":
			cfg.UpstreamTLS.Enabled = *f.upstreamTLS
		case "admin-pprof":
			cfg.AdminPprof = *f.adminPprof
		case "log-level":
			cfg.LogLevel = *f.logLevel
		case "log-format":
			cfg.LogFormat = *f.logFormat
		case "dedup-mode":
			cfg.Dedup.Mode = *f.dedup
		}
		if sf, ok := f.strFlags[fl.Name]; ok {
			sf.set(&cfg, *sf.val)
		}
	})
	if *f.config != "" && len(cfg.Upstream) == 0 && !upstreamSet {
		return cfg, fmt.Errorf("config %s: %w", *f.config, errNoUpstream)
	}
	if f.clusterOnly {
		cfg.Replicas, cfg.ReplicaAdmin, cfg.ReplicaOwners, cfg.ReplicaIndex, cfg.ReplicaCount = nil, nil, nil, nil, 0
	}
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return cfg, err
	}
	return cfg, placeholderUpstream(cfg.Upstream)
}

// errUnexpectedArg: an argument that is not a flag (a subcommand
// misspelled, a flag's value without its flag).
var errUnexpectedArg = errors.New("unexpected argument")

// loadConfig parses args (flags over the config file) as run does.
func loadConfig(args []string) (proxy.Config, error) { return newFlags().load(args) }

func parseLevel(s string) slog.Level {
	var level slog.Level
	_ = level.UnmarshalText([]byte(s)) // validated already
	return level
}

func newLogHandler(w io.Writer, format string, level slog.Leveler) slog.Handler {
	opts := &slog.HandlerOptions{Level: level}
	if format == config.LogJSON {
		return slog.NewJSONHandler(w, opts)
	}
	return slog.NewTextHandler(w, opts)
}

func splitList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

// adminHandler serves /metrics, /healthz, /readyz and, only when pprof is
// set, Go's profiles under /debug/pprof/. The handlers are registered on
// this mux, never on http.DefaultServeMux (importing net/http/pprof
// registers there, but nothing serves that mux).
func adminHandler(srv *proxy.Server, reg *prometheus.Registry, pprof bool) http.Handler {
	mux := http.NewServeMux()
	if pprof {
		mux.HandleFunc("/debug/pprof/", httppprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", httppprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", httppprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", httppprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", httppprof.Trace)
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg,
		// A scrape is about 30 KB. Gzip would keep a compressor of
		// ~0.9 MB alive on the heap for it (docs/performance.md).
		DisableCompression: true}))
	// The replica protocol's status and wake-up (docs/replicas.md).
	mux.Handle("/replica", srv.ReplicaHandler())
	mux.Handle("/replica/", srv.ReplicaHandler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		if err := srv.Ready(ctx); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	})
	return mux
}
