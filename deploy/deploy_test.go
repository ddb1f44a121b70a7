package deploy

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
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

	"github.com/dedupproxy/dedupproxy/internal/testskip"
	"github.com/dedupproxy/dedupproxy/proxy"
)

// TestKubernetesManifests: the manifests pass the offline schema
// (kubeschema_test.go), and run three replicas as a StatefulSet
// (docs/replicas.md) whose config loads for every pod: a headless Service
// (per-pod addresses, published before the pods are ready) that the
// StatefulSet names and that publishes every container port, a bootstrap
// Service, a PodDisruptionBudget of one, RollingUpdate, pod anti-affinity,
// probes on /readyz and /healthz, a preStop, and a grace period that leaves
// the handover and drain their time.
func TestKubernetesManifests(t *testing.T) {
	files, _ := filepath.Glob("kubernetes/*.yaml")
	if len(files) == 0 {
		t.Fatal("no manifests")
	}
	var all kubeDocs
	all.services = map[string]kubeService{}
	for _, f := range files {
		docs, err := decodeKube(f)
		if err != nil {
			t.Fatal(err)
		}
		all.configMaps = append(all.configMaps, docs.configMaps...)
		all.statefulSets = append(all.statefulSets, docs.statefulSets...)
		all.pdbs = append(all.pdbs, docs.pdbs...)
		for n, s := range docs.services {
			all.services[n] = s
		}
	}
	if len(all.statefulSets) != 1 || len(all.configMaps) != 1 || len(all.pdbs) != 1 {
		t.Fatalf("want one StatefulSet, one ConfigMap, one PodDisruptionBudget; got %d, %d, %d", len(all.statefulSets), len(all.configMaps), len(all.pdbs))
	}
	sts, cm, pdb := all.statefulSets[0], all.configMaps[0], all.pdbs[0]
	spec := sts.Spec
	if spec.Replicas == nil || *spec.Replicas != 3 {
		t.Errorf("replicas %v, want 3", spec.Replicas)
	}
	if spec.UpdateStrategy.Type != "RollingUpdate" {
		t.Errorf("updateStrategy %q, want RollingUpdate", spec.UpdateStrategy.Type)
	}
	labels := spec.Template.Metadata.Labels
	matches := func(sel map[string]string) bool {
		if len(sel) == 0 {
			return false
		}
		for k, v := range sel {
			if labels[k] != v {
				return false
			}
		}
		return true
	}
	if !matches(spec.Selector.MatchLabels) {
		t.Errorf("the StatefulSet's selector %v does not match its pods' labels %v", spec.Selector.MatchLabels, labels)
	}
	if !matches(pdb.Spec.Selector.MatchLabels) || fmt.Sprint(pdb.Spec.MaxUnavailable) != "1" {
		t.Errorf("PodDisruptionBudget: selector %v, maxUnavailable %v; want the pods' labels and 1", pdb.Spec.Selector.MatchLabels, pdb.Spec.MaxUnavailable)
	}
	pod := spec.Template.Spec
	if a := pod.Affinity; a == nil || a.PodAntiAffinity == nil ||
		len(a.PodAntiAffinity.Preferred)+len(a.PodAntiAffinity.Required) == 0 {
		t.Error("no pod anti-affinity")
	} else {
		for _, p := range a.PodAntiAffinity.Preferred {
			if p.PodAffinityTerm.TopologyKey != "kubernetes.io/hostname" || !matches(p.PodAffinityTerm.LabelSelector.MatchLabels) {
				t.Errorf("anti-affinity term %+v: want the pods' labels per kubernetes.io/hostname", p.PodAffinityTerm)
			}
		}
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	ctr := pod.Containers[0]
	if p := ctr.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" {
		t.Errorf("readiness probe %+v", p)
	}
	if p := ctr.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" {
		t.Errorf("liveness probe %+v", p)
	}
	preStop := int64(0)
	if l := ctr.Lifecycle; l != nil && l.PreStop != nil && l.PreStop.Sleep != nil {
		preStop = l.PreStop.Sleep.Seconds
	}
	if preStop <= 0 {
		t.Errorf("no preStop sleep")
	}
	if ctr.Resources.Requests["cpu"] == "" || ctr.Resources.Requests["memory"] == "" {
		t.Errorf("no resource requests")
	}

	// The config loads, validates, and gives each pod its own replica.
	var cfg proxy.Config
	dec := yaml.NewDecoder(strings.NewReader(cm.Data["config.yaml"]))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		t.Fatalf("ConfigMap config.yaml: %v", err)
	}
	cfg.EnsureDefaults()
	for i := range int(*spec.Replicas) {
		c := cfg
		c.ReplicaIndex = &i // the ordinal of pod dedupproxy-i
		if err := c.Validate(); err != nil {
			t.Fatalf("ConfigMap config.yaml as pod %d: %v", i, err)
		}
	}
	if cfg.ReplicaCount != int(*spec.Replicas) {
		t.Errorf("replica_count %d, but the StatefulSet runs %d replicas", cfg.ReplicaCount, *spec.Replicas)
	}
	if want := fmt.Sprintf("%s-{i}.%s.", sts.Metadata.Name, spec.ServiceName); len(cfg.Replicas) != 1 || !strings.HasPrefix(cfg.Replicas[0], want) {
		t.Errorf("replicas %v: want each pod's headless name, %s...", cfg.Replicas, want)
	}
	grace := int64(0)
	if pod.TerminationGracePeriodSeconds != nil {
		grace = *pod.TerminationGracePeriodSeconds
	}
	if need := time.Duration(preStop)*time.Second + cfg.DrainTimeout; time.Duration(grace)*time.Second <= need {
		t.Errorf("terminationGracePeriodSeconds %d leaves no margin over preStop %ds + drain_timeout %s", grace, preStop, cfg.DrainTimeout)
	}

	// The headless Service gives each pod its address, before it is ready,
	// with every container port; the bootstrap Service spreads clients.
	headless, ok := all.services[spec.ServiceName]
	if !ok || headless.Spec.ClusterIP != "None" || !headless.Spec.PublishNotReadyAddresses || !matches(headless.Spec.Selector) {
		t.Fatalf("serviceName %q: want a headless Service (clusterIP None, publishNotReadyAddresses) over the pods; got %+v", spec.ServiceName, headless.Spec)
	}
	boot, ok := all.services[sts.Metadata.Name]
	if !ok || boot.Spec.ClusterIP == "None" || !matches(boot.Spec.Selector) {
		t.Fatalf("no bootstrap Service %q over the pods", sts.Metadata.Name)
	}
	_, lport, _ := strings.Cut(cfg.Listen, ":")
	listen, _ := strconv.Atoi(lport)
	published := map[any]bool{}
	for _, p := range headless.Spec.Ports {
		published[p.TargetPort] = true
	}
	names := map[any]bool{}
	for _, p := range ctr.Ports {
		names[p.Name] = true
		if !published[p.Name] {
			t.Errorf("container port %s is not in the headless Service", p.Name)
		}
		if id, ok := strings.CutPrefix(p.Name, "node-"); ok {
			if n, _ := strconv.Atoi(id); int(p.ContainerPort) != listen+1+n {
				t.Errorf("%s on %d, want listen port + 1 + %d = %d", p.Name, p.ContainerPort, n, listen+1+n)
			}
		}
		if p.Name == "bootstrap" && int(p.ContainerPort) != listen {
			t.Errorf("bootstrap port %d, want the listen port %d", p.ContainerPort, listen)
		}
	}
	for _, svc := range []kubeService{headless, boot} {
		for _, p := range svc.Spec.Ports {
			if !names[p.TargetPort] {
				t.Errorf("Service %s targets port %v, which the container does not name", svc.Metadata.Name, p.TargetPort)
			}
		}
	}
	if len(boot.Spec.Ports) != 1 || boot.Spec.Ports[0].TargetPort != "bootstrap" {
		t.Errorf("the bootstrap Service publishes %+v, want only the bootstrap port", boot.Spec.Ports)
	}
}

// TestKubernetesSchemaCatches: the offline schema refuses what a cluster
// would refuse: a misspelt field, a field's wrong type, an unknown kind,
// a kind's wrong apiVersion.
func TestKubernetesSchemaCatches(t *testing.T) {
	raw, err := os.ReadFile("kubernetes/dedupproxy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ from, to, want string }{
		{"podManagementPolicy:", "podManagmentPolicy:", "podManagmentPolicy"},
		{"replicas: 3\n", "replicas: three\n", "three"},
		{"kind: PodDisruptionBudget", "kind: PodDisruptionBudgets", "not in the schema"},
		{"apiVersion: policy/v1", "apiVersion: policy/v1beta1", "want \"policy/v1\""},
		{"publishNotReadyAddresses: true", "publishNotReadyAdresses: true", "publishNotReadyAdresses"},
	} {
		bad := strings.Replace(string(raw), tc.from, tc.to, 1)
		if bad == string(raw) {
			t.Fatalf("%q not in the manifest", tc.from)
		}
		path := filepath.Join(t.TempDir(), "bad.yaml")
		if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := decodeKube(path); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s -> %s: %v, want an error naming %s", tc.from, tc.to, err, tc.want)
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
		testskip.Skip(t, "builds the binary")
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

// TestSystemdUnit: the units (one proxy, and the template with one
// instance per replica, docs/replicas.md) are hardened, reload with
// SIGHUP, stop with SIGTERM and a timeout above the default drain_timeout,
// and (where systemd-analyze exists) verify cleanly; the template passes
// its instance as the replica index.
func TestSystemdUnit(t *testing.T) {
	for _, path := range []string{"systemd/dedupproxy.service", "systemd/dedupproxy@.service"} {
		t.Run(filepath.Base(path), func(t *testing.T) { checkSystemdUnit(t, path) })
	}
}

func checkSystemdUnit(t *testing.T, path string) {
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
	template := strings.Contains(path, "@")
	if template && !strings.Contains(keys["ExecStart"], "--replica-index %i") {
		t.Errorf("ExecStart=%q does not pass the instance as --replica-index", keys["ExecStart"])
	}
	var def proxy.Config
	def.EnsureDefaults()
	if stop, err := strconv.Atoi(keys["TimeoutStopSec"]); err != nil || time.Duration(stop)*time.Second <= def.DrainTimeout {
		t.Errorf("TimeoutStopSec=%q must be above drain_timeout (%s)", keys["TimeoutStopSec"], def.DrainTimeout)
	}
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		testskip.Skip(t, "systemd-analyze not installed; the unit was checked by its keys only")
	}
	if testing.Short() {
		testskip.Skip(t, "builds the binary")
	}
	bin, err := releaseBuild()
	if err != nil {
		t.Fatal(err)
	}
	// verify checks that ExecStart exists: point it at the fresh build.
	name := filepath.Base(path)
	if template {
		name = strings.Replace(name, "@", "@0", 1) // an instance of it
	}
	unit := filepath.Join(t.TempDir(), name)
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
		testskip.Skip(t, "promtool not installed (Debian package prometheus)")
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
