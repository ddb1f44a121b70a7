package proxy

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// describer is a prometheus.Registerer that only records the names of
// what is registered: their collect functions never run.
type describer struct{ names map[string]bool }

var fqNameRE = regexp.MustCompile(`fqName: "([a-z_]+)"`)

func (d *describer) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 64)
	go func() { c.Describe(ch); close(ch) }()
	for desc := range ch {
		if m := fqNameRE.FindStringSubmatch(desc.String()); m != nil {
			d.names[m[1]] = true
		}
	}
	return nil
}

func (d *describer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		d.Register(c)
	}
}

func (d *describer) Unregister(prometheus.Collector) bool { return false }

// TestMetricsDocumented: every metric the proxy registers (connections,
// decisions, tables, warm-ups, memory, replicas) has a row in
// docs/reference.md's metrics tables.
func TestMetricsDocumented(t *testing.T) {
	d := &describer{names: map[string]bool{}}
	s := &Server{Metrics: NewMetrics(d)}
	s.registerCore()
	newReplicaMetrics(s)
	raw, err := os.ReadFile("../docs/reference.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	n := 0
	for name := range d.names {
		if !strings.HasPrefix(name, "dedupproxy_") {
			continue // the Go runtime and process collectors
		}
		n++
		if !strings.Contains(doc, "`"+name+"`") && !strings.Contains(doc, "`"+name+"{") {
			t.Errorf("docs/reference.md does not document %s", name)
		}
	}
	if n < 40 {
		t.Fatalf("found %d metrics: the describer missed some", n)
	}
	t.Logf("%d metrics, each documented", n)
}
