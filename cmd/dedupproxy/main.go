// Command dedupproxy runs the Kafka deduplicating proxy.
//
//	dedupproxy demo
//	dedupproxy [--config FILE] [--upstream HOST:PORT,...] [--listen HOST:PORT]
//	           [--advertise HOST:PORT] [--admin HOST:PORT]
//
// With no upstream it starts an embedded in-memory 3-broker Kafka cluster
// (franz-go kfake) on loopback, so it works out of the box.
package main

import (
	"context"
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

	var admin *http.Server
	if adminLn != nil {
		admin = &http.Server{Handler: adminHandler(srv, reg), ReadHeaderTimeout: 5 * time.Second}
		log.Info("admin listening", "addr", adminLn.Addr().String(), "paths", "/metrics /healthz /readyz")
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
