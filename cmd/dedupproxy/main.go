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

// run is main without the process: it returns the exit code. Help and the
// version go to stdout, errors and logs to stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "demo":
			if err := runDemo(ctx, stdout); err != nil {
				fmt.Fprintln(stderr, "dedupproxy demo:", err)
				return 1
			}
			return 0
		case "audit":
			return runAudit(ctx, args[1:], stdout, stderr)
		case "version":
			fmt.Fprintln(stdout, versionLine())
			return 0
		case "help":
			newFlags().usage(stdout)
			return 0
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

	embedded := len(cfg.Upstream) == 0 || cfg.Upstream[0] == proxy.EmbeddedUpstream
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
		log.Warn("EMBEDDED CLUSTER: no real upstream; started an embedded in-memory 3-broker Kafka cluster (kfake) on loopback; everything written is LOST on exit. For a real cluster set --upstream or upstream: in the config file",
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
			return 1
		}
		srv.AdminAddr = adminLn.Addr()
	}
	if err := srv.Start(ctx); err != nil {
		log.Error("cannot start", "err", err)
		if adminLn != nil {
			adminLn.Close()
		}
		return 1
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
	start := time.Now()
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
	log.Info("stopped", "drain", time.Since(start).Round(time.Millisecond))
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
	f.defineUpstream(fs)
	f.listen = fs.String("listen", proxy.DefaultListen, "bootstrap listener `HOST:PORT`; broker node N listens on port+1+N (see node_port_base, node_id_offset in the config file)")
	f.advertise = fs.String("advertise", "", "`HOST:PORT` clients are told (default: the listen address); node N is advertised shifted alike, at port+1+N by default")
	f.admin = fs.String("admin", proxy.DefaultAdmin, "HTTP `HOST:PORT` for /metrics, /healthz, /readyz, or \"off\"")
	f.logLevel = fs.String("log-level", "", "`level`: debug, info, warn or error (default info; SIGHUP reloads log_level from the config file)")
	f.logFormat = fs.String("log-format", "", "log `format`: text or json (default text)")
	f.dedup = fs.String("dedup-mode", "", "`mode`: enforce (answer retries like Kafka), observe (count, forward everything) or off (default enforce)")
	f.version = fs.Bool("version", false, "print the version and VCS revision, and exit")
	f.def("tls-cert", "PEM certificate `file` (with its chain) for the client listeners; with --tls-key every listener speaks TLS",
		func(c *proxy.Config, v string) { c.TLS.Cert = v })
	f.def("tls-key", "PEM private key `file` of --tls-cert", func(c *proxy.Config, v string) { c.TLS.Key = v })
	f.def("tls-client-ca", "PEM CA `file`: clients must present a certificate it issued (mutual TLS)",
		func(c *proxy.Config, v string) { c.TLS.ClientCA = v })
	f.def("tls-principal-mapping-rules", "the brokers' ssl.principal.mapping.rules `rules`: how a client certificate's subject becomes the principal that scopes its state (default DEFAULT)",
		func(c *proxy.Config, v string) { c.TLS.PrincipalMappingRules = v })
	f.def("admin-tls-cert", "PEM certificate `file` for the admin listener; with --admin-tls-key it serves HTTPS",
		func(c *proxy.Config, v string) { c.AdminTLS.Cert = v })
	f.def("admin-tls-key", "PEM private key `file` of --admin-tls-cert", func(c *proxy.Config, v string) { c.AdminTLS.Key = v })
	f.def("replicas", "every replica's advertised bootstrap `ADDR0,ADDR1,...` in index order, or one with {i} for the index and --replica-count (docs/replicas.md); default: one proxy on its own",
		func(c *proxy.Config, v string) { c.Replicas = splitList(v) })
	f.def("replica-index", "this replica's `index` in --replicas (default: the number ending the host name, as StatefulSet pods are named)",
		func(c *proxy.Config, v string) {
			i, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				i = -1 // Validate names the range
			}
			c.ReplicaIndex = &i
		})
	f.def("replica-count", "how many replicas a --replicas address with {i} stands for (`N`)",
		func(c *proxy.Config, v string) {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				n = -1
			}
			c.ReplicaCount = n
		})
	f.def("replica-owners", "broker nodes owned by another replica than node id mod the count, `NODE=INDEX[,...]`",
		func(c *proxy.Config, v string) { c.ReplicaOwners = parseOwners(v) })
	f.def("replica-admin", "every replica's admin `HOST:PORT,...` (or one with {i}), where peers read /replica (default: each --replicas host at this --admin port)",
		func(c *proxy.Config, v string) { c.ReplicaAdmin = splitList(v) })
	f.adminPprof = fs.Bool("admin-pprof", false, "serve Go's profiles (net/http/pprof) under /debug/pprof/ on the admin listener")
	return f
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
func (f *flags) defineUpstream(fs *flag.FlagSet) {
	f.config = fs.String("config", "", "YAML config `file` (see config.example.yaml); it must set upstream")
	f.upstream = fs.String("upstream", "", "bootstrap brokers of the real cluster, `HOST:PORT[,HOST:PORT...]`, or \"embedded\" for an in-memory test cluster (the default without --config)")
	f.upstreamTLS = fs.Bool("upstream-tls", false, "TLS to the brokers, verified against the system roots (or --upstream-tls-ca)")
	f.def("upstream-tls-ca", "PEM CA `file` that issued the brokers' certificates (implies --upstream-tls; default: the system roots)",
		func(c *proxy.Config, v string) { c.UpstreamTLS.CA = v })
	f.def("upstream-tls-cert", "PEM client certificate `file` presented to brokers (implies --upstream-tls)",
		func(c *proxy.Config, v string) { c.UpstreamTLS.Cert = v })
	f.def("upstream-tls-key", "PEM private key `file` of --upstream-tls-cert", func(c *proxy.Config, v string) { c.UpstreamTLS.Key = v })
	f.def("upstream-tls-server-name", "`name` every broker certificate is verified against (default: each broker's own host)",
		func(c *proxy.Config, v string) { c.UpstreamTLS.ServerName = v })
	f.def("upstream-sasl-mechanism", "SASL `mechanism` of the proxy's own connections (readiness, discovery): PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512",
		func(c *proxy.Config, v string) { c.UpstreamSASL.Mechanism = v })
	f.def("upstream-sasl-user", "SASL `user` of the proxy's own connections", func(c *proxy.Config, v string) { c.UpstreamSASL.User = v })
	f.def("upstream-sasl-password-file", "`file` holding the SASL password of the proxy's own connections (never on the command line)",
		func(c *proxy.Config, v string) { c.UpstreamSASL.PasswordFile = v })
}

// usage prints the subcommands and every flag.
func (f *flags) usage(w io.Writer) {
	fmt.Fprintf(w, `dedupproxy: a Kafka-protocol proxy that stops duplicate Produce writes.

Usage:
  dedupproxy [flags]     run the proxy
  dedupproxy demo        show duplicates prevented, against an embedded cluster
  dedupproxy audit       count the duplicates a topic already holds (audit --help)
  dedupproxy version     print the version and VCS revision (also --version)
  dedupproxy help        print this help (also --help)

With neither --upstream nor --config the proxy starts an embedded in-memory
cluster whose data is lost on exit: for trying it out. A config file must set
upstream (a list, a comma-separated string, or "embedded"). Flags win over
the file. SIGHUP applies %s from the
config file and re-reads the certificate files; SIGTERM drains in-flight
Produce requests (up to drain_timeout) and exits.

Flags:
`, reloadedKeysText())
	printFlags(w, f.fs)
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
		return cfg, fmt.Errorf("unexpected argument %q (subcommands: demo, audit, version, help)", f.fs.Arg(0))
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
	cfg.EnsureDefaults()
	return cfg, cfg.Validate()
}

// loadConfig parses args (flags over the config file) as run does.
func loadConfig(args []string) (proxy.Config, error) { return newFlags().load(args) }

func parseLevel(s string) slog.Level {
	var level slog.Level
	_ = level.UnmarshalText([]byte(s)) // validated already
	return level
}

func newLogHandler(w io.Writer, format string, level slog.Leveler) slog.Handler {
	opts := &slog.HandlerOptions{Level: level}
	if format == proxy.LogJSON {
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
