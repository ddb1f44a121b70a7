// Command dedupproxy runs the Kafka deduplicating proxy.
//
//	dedupproxy demo
//	dedupproxy [--config FILE] [--upstream HOST:PORT,...] [--listen HOST:PORT]
//	           [--advertise HOST:PORT] [--admin HOST:PORT]
//	           [--tls-cert FILE --tls-key FILE [--tls-client-ca FILE]]
//	           [--upstream-tls] [--upstream-tls-ca FILE] [--upstream-tls-cert FILE --upstream-tls-key FILE]
//	           [--upstream-tls-server-name NAME]
//	           [--upstream-sasl-mechanism PLAIN|SCRAM-SHA-256|SCRAM-SHA-512
//	            --upstream-sasl-user USER --upstream-sasl-password-file FILE]
//	           [--admin-tls-cert FILE --admin-tls-key FILE]
//
// SIGHUP reloads every certificate file; SIGTERM and SIGINT drain and exit.
//
// With no upstream it starts an embedded in-memory 3-broker Kafka cluster
// (franz-go kfake) on loopback, so it works out of the box.
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
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kfake"
	"gopkg.in/yaml.v3"

	"github.com/dedupproxy/dedupproxy/proxy"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}

// run is main without the process: it returns the exit code.
func run(ctx context.Context, args []string, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "demo" {
		if err := runDemo(ctx, os.Stdout); err != nil {
			fmt.Fprintln(stderr, "dedupproxy demo:", err)
			return 1
		}
		return 0
	}
	cfg, err := loadConfig(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "dedupproxy:", err)
		return 2
	}
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel)) // validated already
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	if len(cfg.Upstream) == 0 && (cfg.UpstreamTLS.Enabled || cfg.UpstreamSASL.Mechanism != "") {
		fmt.Fprintln(stderr, "dedupproxy: upstream_tls and upstream_sasl need an upstream (--upstream): the embedded cluster speaks neither")
		return 2
	}
	if len(cfg.Upstream) == 0 {
		cluster, err := kfake.NewCluster(
			kfake.NumBrokers(3),
			kfake.AllowAutoTopicCreation(),
			kfake.DefaultNumPartitions(6),
		)
		if err != nil {
			log.Error("cannot start the embedded cluster", "err", err)
			return 1
		}
		defer cluster.Close()
		cfg.Upstream = cluster.ListenAddrs()
		log.Info("no upstream configured: started an embedded in-memory 3-broker Kafka cluster (kfake) on loopback; its data is lost on exit",
			"brokers", strings.Join(cfg.Upstream, ","))
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

	// SIGHUP reloads the certificates now rather than at the next check.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				if err := srv.ReloadTLS(); err != nil {
					log.Warn("SIGHUP: some certificates did not reload; the previous ones stay in use", "err", err)
				} else {
					log.Info("SIGHUP: certificate files checked")
				}
			}
		}
	}()

	var admin *http.Server
	if adminLn != nil {
		admin = &http.Server{Handler: adminHandler(srv, reg), ReadHeaderTimeout: 5 * time.Second}
		scheme := "http"
		if tc := srv.AdminTLSConfig(); tc != nil {
			adminLn = tls.NewListener(adminLn, tc)
			scheme = "https"
		}
		log.Info("admin listening", "addr", adminLn.Addr().String(), "scheme", scheme, "paths", "/metrics /healthz /readyz")
		go func() {
			if err := admin.Serve(adminLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("admin server failed", "err", err)
			}
		}()
	}

	<-ctx.Done()
	log.Info("shutting down: no new connections or requests; waiting for in-flight requests", "drain_timeout", cfg.DrainTimeout)
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
	log.Info("stopped")
	return code
}

// loadConfig reads the config file, then applies the flags that were set:
// flags win over the file.
func loadConfig(args []string, stderr io.Writer) (proxy.Config, error) {
	var cfg proxy.Config
	fs := flag.NewFlagSet("dedupproxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "YAML config `file` (see config.example.yaml)")
	upstream := fs.String("upstream", "", "bootstrap brokers of the real cluster, `HOST:PORT[,HOST:PORT...]`; empty starts an embedded in-memory cluster")
	listen := fs.String("listen", proxy.DefaultListen, "bootstrap listener `HOST:PORT`; broker node N listens on port+1+N (see node_port_base, node_id_offset in the config file)")
	advertise := fs.String("advertise", "", "`HOST:PORT` clients are told (default: the listen address); node N is advertised shifted alike, at port+1+N by default")
	admin := fs.String("admin", proxy.DefaultAdmin, "HTTP `HOST:PORT` for /metrics, /healthz, /readyz, or \"off\"")
	// TLS and SASL. No flag takes a password: it would show in ps and in
	// shell history.
	type strFlag struct {
		val *string
		set func(c *proxy.Config, v string)
	}
	strFlags := map[string]strFlag{}
	def := func(name, usage string, set func(*proxy.Config, string)) {
		strFlags[name] = strFlag{fs.String(name, "", usage), set}
	}
	def("tls-cert", "PEM certificate `file` (with its chain) for the client listeners; with --tls-key every listener speaks TLS",
		func(c *proxy.Config, v string) { c.TLS.Cert = v })
	def("tls-key", "PEM private key `file` of --tls-cert", func(c *proxy.Config, v string) { c.TLS.Key = v })
	def("tls-client-ca", "PEM CA `file`: clients must present a certificate it issued (mutual TLS)",
		func(c *proxy.Config, v string) { c.TLS.ClientCA = v })
	def("upstream-tls-ca", "PEM CA `file` that issued the brokers' certificates (implies --upstream-tls; default: the system roots)",
		func(c *proxy.Config, v string) { c.UpstreamTLS.CA = v })
	def("upstream-tls-cert", "PEM client certificate `file` presented to brokers (implies --upstream-tls)",
		func(c *proxy.Config, v string) { c.UpstreamTLS.Cert = v })
	def("upstream-tls-key", "PEM private key `file` of --upstream-tls-cert", func(c *proxy.Config, v string) { c.UpstreamTLS.Key = v })
	def("upstream-tls-server-name", "`name` every broker certificate is verified against (default: each broker's own host)",
		func(c *proxy.Config, v string) { c.UpstreamTLS.ServerName = v })
	def("upstream-sasl-mechanism", "SASL `mechanism` of the proxy's own connections (readiness, discovery): PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512",
		func(c *proxy.Config, v string) { c.UpstreamSASL.Mechanism = v })
	def("upstream-sasl-user", "SASL `user` of the proxy's own connections", func(c *proxy.Config, v string) { c.UpstreamSASL.User = v })
	def("upstream-sasl-password-file", "`file` holding the SASL password of the proxy's own connections (never on the command line)",
		func(c *proxy.Config, v string) { c.UpstreamSASL.PasswordFile = v })
	def("admin-tls-cert", "PEM certificate `file` for the admin listener; with --admin-tls-key it serves HTTPS",
		func(c *proxy.Config, v string) { c.AdminTLS.Cert = v })
	def("admin-tls-key", "PEM private key `file` of --admin-tls-cert", func(c *proxy.Config, v string) { c.AdminTLS.Key = v })
	upstreamTLS := fs.Bool("upstream-tls", false, "TLS to the brokers, verified against the system roots (or --upstream-tls-ca)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *configPath != "" {
		var err error
		if cfg, err = readConfigFile(*configPath); err != nil {
			return cfg, err
		}
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "upstream":
			cfg.Upstream = splitList(*upstream)
		case "listen":
			cfg.Listen = *listen
		case "advertise":
			cfg.Advertise = *advertise
		case "admin":
			cfg.Admin = *admin
		case "upstream-tls":
			cfg.UpstreamTLS.Enabled = *upstreamTLS
		}
		if sf, ok := strFlags[f.Name]; ok {
			sf.set(&cfg, *sf.val)
		}
	})
	cfg.EnsureDefaults()
	return cfg, cfg.Validate()
}

func readConfigFile(path string) (proxy.Config, error) {
	var cfg proxy.Config
	f, err := os.Open(path)
	if err != nil {
		return cfg, err
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true) // a misspelt key is an error, not a silent default
	if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
		return cfg, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
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

func adminHandler(srv *proxy.Server, reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		if err := srv.Probe(ctx); err != nil {
			http.Error(w, "upstream not reachable: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	})
	return mux
}
