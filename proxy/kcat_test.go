package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/dedupproxy/dedupproxy/internal/testskip"
)

// TestKcatThroughProxy drives librdkafka's kcat through the proxy: the
// metadata listing shows only proxy addresses, and 1,000 records produced
// are consumed back. CI installs kcat (.ci/run); elsewhere the test skips.
func TestKcatThroughProxy(t *testing.T) {
	t.Parallel()
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		testskip.Skip(t, "kcat not installed (apt-get install -y kcat); .ci/run installs it")
	}
	const topic, n = "kcat", 1000
	c := newCluster(t, kfake.SeedTopics(3, topic))
	p := startProxy(t, c, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	common := []string{"-b", p.addr(), "-X", "socket.timeout.ms=10000", "-X", "topic.metadata.refresh.interval.ms=1000"}

	out, err := exec.CommandContext(ctx, kcat, append([]string{"-L", "-J"}, common...)...).Output()
	if err != nil {
		t.Fatalf("kcat -L: %v", err)
	}
	var md struct {
		Brokers []struct {
			ID   int32  `json:"id"`
			Name string `json:"name"`
		} `json:"brokers"`
	}
	if err := json.Unmarshal(out, &md); err != nil {
		t.Fatalf("kcat -L -J output: %v\n%s", err, out)
	}
	if len(md.Brokers) != 3 {
		t.Fatalf("kcat listed %d brokers, want 3:\n%s", len(md.Brokers), out)
	}
	real := realAddrs(c)
	for _, b := range md.Brokers {
		want, _ := p.nodes.Advertised(b.ID)
		if real[b.Name] || b.Name != want {
			t.Errorf("kcat sees broker %d at %s, want the proxy listener %s", b.ID, b.Name, want)
		}
	}
	for a := range real {
		if strings.Contains(string(out), a) {
			t.Errorf("real broker address %s appears in kcat's metadata", a)
		}
	}

	var in strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&in, "k%d:v%d\n", i, i)
	}
	prod := exec.CommandContext(ctx, kcat, append([]string{"-P", "-t", topic, "-K:", "-X", "enable.idempotence=true"}, common...)...)
	prod.Stdin = strings.NewReader(in.String())
	if out, err := prod.CombinedOutput(); err != nil || strings.Contains(string(out), "failed") || strings.Contains(string(out), "FATAL") {
		t.Fatalf("kcat -P: %v\n%s", err, out) // kcat exits 0 on failed deliveries, hence the output check
	}
	out, err = exec.CommandContext(ctx, kcat, append([]string{"-C", "-t", topic, "-o", "beginning", "-e", "-q", "-f", "%k=%s\n"}, common...)...).Output()
	if err != nil {
		t.Fatalf("kcat -C: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	seen := map[string]bool{}
	for _, l := range lines {
		seen[l] = true
	}
	if len(lines) != n || len(seen) != n || !seen["k0=v0"] || !seen[fmt.Sprintf("k%d=v%d", n-1, n-1)] {
		t.Fatalf("consumed %d lines (%d distinct), want %d", len(lines), len(seen), n)
	}
}
