package proc

import "testing"

func TestMetricValue(t *testing.T) {
	const text = `# HELP dedupproxy_batches_total x
# TYPE dedupproxy_batches_total counter
dedupproxy_batches_total{outcome="accepted"} 10
dedupproxy_batches_total{outcome="duplicate"} 3
dedupproxy_batches_total_other 99
dedupproxy_seqstate_entries 4.5e+06
`
	for _, c := range []struct {
		name, label string
		want        float64
	}{
		{"dedupproxy_batches_total", `outcome="duplicate"`, 3},
		{"dedupproxy_batches_total", "", 13},
		{"dedupproxy_seqstate_entries", "", 4.5e6},
		{"dedupproxy_missing", "", 0},
	} {
		var labels []string
		if c.label != "" {
			labels = append(labels, c.label)
		}
		if got := MetricValue(text, c.name, labels...); got != c.want {
			t.Errorf("%s %s = %v, want %v", c.name, c.label, got, c.want)
		}
	}
}
