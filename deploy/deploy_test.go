package deploy

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"gopkg.in/yaml.v3"

	"github.com/dedupproxy/dedupproxy/proxy"
)

// yamlDocs decodes every document of a YAML file.
func yamlDocs(t *testing.T, path string) []map[string]any {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var docs []map[string]any
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	for {
		var doc map[string]any
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			return docs
		} else if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if doc != nil {
			docs = append(docs, doc)
		}
	}
}

// dig walks maps and lists by key and index.
func dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			l, _ := v.([]any)
			if k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

// TestKubernetesManifests: the manifests parse, run one replica with
// probes on /readyz and /healthz and a preStop, leave the drain its time,
// publish every container port in the Service, and their config loads.
func TestKubernetesManifests(t *testing.T) {
	files, _ := filepath.Glob("kubernetes/*.yaml")
	if len(files) == 0 {
		t.Fatal("no manifests")
	}
	kinds := map[string]map[string]any{}
	for _, f := range files {
		for _, doc := range yamlDocs(t, f) {
			kind, _ := doc["kind"].(string)
			if kind == "" || doc["apiVersion"] == nil || dig(doc, "metadata", "name") == nil {
				t.Errorf("%s: a document without kind, apiVersion or metadata.name", f)
			}
			kinds[kind] = doc
		}
	}
	dep, svc, cm := kinds["Deployment"], kinds["Service"], kinds["ConfigMap"]
	if dep == nil || svc == nil || cm == nil {
		t.Fatalf("want a Deployment, a Service and a ConfigMap; got %v", kinds)
	}
	if r := dig(dep, "spec", "replicas"); r != 1 {
		t.Errorf("replicas %v, want 1", r)
	}
	ctr := dig(dep, "spec", "template", "spec", "containers", 0)
	if p := dig(ctr, "readinessProbe", "httpGet", "path"); p != "/readyz" {
		t.Errorf("readiness probe %v", p)
	}
	if p := dig(ctr, "livenessProbe", "httpGet", "path"); p != "/healthz" {
		t.Errorf("liveness probe %v", p)
	}
	preStop, _ := dig(ctr, "lifecycle", "preStop", "sleep", "seconds").(int)
	if preStop <= 0 {
		t.Errorf("no preStop sleep")
	}
	if dig(ctr, "resources", "requests", "cpu") == nil || dig(ctr, "resources", "requests", "memory") == nil {
		t.Errorf("no resource requests")
	}

	var cfg proxy.Config
	dec := yaml.NewDecoder(strings.NewReader(dig(cm, "data", "config.yaml").(string)))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		t.Fatalf("ConfigMap config.yaml: %v", err)
	}
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("ConfigMap config.yaml: %v", err)
	}
	grace, _ := dig(dep, "spec", "template", "spec", "terminationGracePeriodSeconds").(int)
	if need := time.Duration(preStop)*time.Second + cfg.DrainTimeout; time.Duration(grace)*time.Second <= need {
		t.Errorf("terminationGracePeriodSeconds %d leaves no margin over preStop %ds + drain_timeout %s", grace, preStop, cfg.DrainTimeout)
	}

	// Every container port is published, with the node ports where the
	// config puts them: listen port + 1 + node id.
	_, lport, _ := strings.Cut(cfg.Listen, ":")
	listen, _ := strconv.Atoi(lport)
	published := map[any]bool{}
	for _, p := range dig(svc, "spec", "ports").([]any) {
		published[dig(p, "targetPort")] = true
	}
	for _, p := range dig(ctr, "ports").([]any) {
		name, port := dig(p, "name").(string), dig(p, "containerPort").(int)
		if !published[name] {
			t.Errorf("container port %s is not in the Service", name)
		}
		if id, ok := strings.CutPrefix(name, "node-"); ok {
			if n, _ := strconv.Atoi(id); port != listen+1+n {
				t.Errorf("%s on %d, want listen port + 1 + %d = %d", name, port, n, listen+1+n)
			}
		}
	}
}

// releaseBuild builds the binary once with deploy/build.sh, the
// Dockerfile's build.
var releaseBuild = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "dedupproxy-build")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "dedupproxy")
	// build.sh builds ./cmd/dedupproxy from the repository root.
	cmd := exec.Command("/bin/sh", "deploy/build.sh", bin)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "VERSION=v9.9.9-test", "REVISION=0123abc")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", errors.New("deploy/build.sh: " + err.Error() + "\n" + string(out))
	}
	return bin, nil
})

// TestBuildIsStatic: the Dockerfile's build stage runs deploy/build.sh,
// which gives a static binary that reports its version and revision; the
// image runs as non-root with no HEALTHCHECK.
func TestBuildIsStatic(t *testing.T) {
	docker, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	d := string(docker)
	for _, want := range []string{" AS build\n", "deploy/build.sh /out/dedupproxy", "FROM gcr.io/distroless/static", "USER nonroot"} {
		if !strings.Contains(d, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	if strings.Contains(d, "\nHEALTHCHECK") {
		t.Error("Dockerfile has a HEALTHCHECK; the orchestrator probes /healthz and /readyz")
	}
	if mk, _ := os.ReadFile("../Makefile"); !strings.Contains(string(mk), "\tdeploy/build.sh bin/dedupproxy") {
		t.Error("make build does not run deploy/build.sh")
	}
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin, err := releaseBuild()
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary is dynamically linked (has an ELF interpreter)")
		}
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil || !strings.Contains(string(out), "dedupproxy v9.9.9-test (revision 0123abc,") {
		t.Errorf("version: %q %v", out, err)
	}
}

// TestSystemdUnit: the unit is hardened, reloads with SIGHUP, stops with
// SIGTERM and a timeout above the default drain_timeout, and (where
// systemd-analyze exists) verifies cleanly.
func TestSystemdUnit(t *testing.T) {
	const path = "systemd/dedupproxy.service"
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{}
	for _, line := range strings.Split(string(raw), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			keys[k] = v
		}
	}
	for k, want := range map[string]string{
		"DynamicUser": "yes", "ProtectSystem": "strict", "Restart": "on-failure", "NoNewPrivileges": "yes",
		"ExecReload": "/bin/kill -HUP $MAINPID", "KillSignal": "SIGTERM",
	} {
		if keys[k] != want {
			t.Errorf("%s=%q, want %q", k, keys[k], want)
		}
	}
	var def proxy.Config
	def.EnsureDefaults()
	if stop, err := strconv.Atoi(keys["TimeoutStopSec"]); err != nil || time.Duration(stop)*time.Second <= def.DrainTimeout {
		t.Errorf("TimeoutStopSec=%q must be above drain_timeout (%s)", keys["TimeoutStopSec"], def.DrainTimeout)
	}
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not installed; the unit was checked by its keys only")
	}
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin, err := releaseBuild()
	if err != nil {
		t.Fatal(err)
	}
	// verify checks that ExecStart exists: point it at the fresh build.
	unit := filepath.Join(t.TempDir(), "dedupproxy.service")
	if err := os.WriteFile(unit, bytes.ReplaceAll(raw, []byte("/usr/local/bin/dedupproxy"), []byte(bin)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", unit).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// promtool finds promtool, failing under CI=true where .ci/run installs it.
func promtool(t *testing.T) string {
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool missing (Debian package prometheus; .ci/run installs it)")
		}
		t.Skip("promtool not installed (Debian package prometheus)")
	}
	return p
}

// TestAlertRules: promtool checks the rules and runs their unit tests.
func TestAlertRules(t *testing.T) {
	bin := promtool(t)
	for _, args := range [][]string{{"check", "rules", "alerts.yaml"}, {"test", "rules", "alerts_test.yaml"}} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = "prometheus"
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// metricName matches the metric names in a PromQL expression that the
// proxy exports (its own, and the process collector's).
var metricName = regexp.MustCompile(`\b(?:dedupproxy|process|go)_[a-z0-9_]+\b`)

// TestDashboardAndRulesMetricsExist scrapes a running proxy's /metrics and
// checks that every metric the dashboard and the alert rules use exists.
func TestDashboardAndRulesMetricsExist(t *testing.T) {
	used := map[string][]string{} // metric → where
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	raw, err := os.ReadFile("grafana/dedupproxy.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, m := range metricName.FindAllString(tg.Expr, -1) {
				used[m] = append(used[m], "dashboard panel "+strconv.Quote(p.Title))
			}
		}
	}
	var rules struct {
		Groups []struct {
			Rules []struct{ Alert, Expr string }
		}
	}
	rraw, err := os.ReadFile("prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(rraw, &rules); err != nil {
		t.Fatal(err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			for _, m := range metricName.FindAllString(r.Expr, -1) {
				used[m] = append(used[m], "alert "+r.Alert)
			}
		}
	}
	if len(used) < 10 {
		t.Fatalf("found only %d metric names: %v", len(used), used)
	}

	exported := scrape(t)
	var missing []string
	for m, where := range used {
		base := m
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(m, suffix); ok && exported[b] == "histogram" {
				base = b
			}
		}
		if exported[base] == "" {
			missing = append(missing, m+" (used by "+strings.Join(where, ", ")+")")
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("not in /metrics: %s", m)
	}
}

// scrape starts a proxy as the command does (every table on: a topic with
// idempotency keys), produces through it so that per-API series exist, and
// returns the metric families of its /metrics with their types.
func scrape(t *testing.T) map[string]string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "metrics"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	reg := prometheus.NewRegistry()
	srv := &proxy.Server{
		Config: proxy.Config{Upstream: c.ListenAddrs(), Listen: "127.0.0.1:0", Admin: "off",
			Dedup: proxy.DedupConfig{Topics: map[string]proxy.TopicDedupConfig{"metrics": {IdempotencyKey: &proxy.IdempotencyKeyConfig{}}}}},
		Logger:  slog.New(slog.DiscardHandler),
		Metrics: proxy.NewMetrics(reg),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(ctx)
	cl, err := kgo.NewClient(kgo.SeedBrokers(srv.Addr().String()), kgo.DefaultProduceTopic("metrics"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("x")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer hs.Close()
	resp, err := hs.Client().Get(hs.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	types := map[string]string{}
	for _, line := range strings.Split(string(body), "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			types[f[2]] = f[3]
		}
	}
	return types
}
