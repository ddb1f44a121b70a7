package load

import (
	"math"
	"testing"
	"time"
)

func TestHistogramQuantiles(t *testing.T) {
	var h Histogram
	for i := 1; i <= 10000; i++ {
		h.Record(time.Duration(i) * time.Microsecond)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 5000 * time.Microsecond}, {0.99, 9900 * time.Microsecond}, {0.999, 9990 * time.Microsecond}} {
		got := h.Quantile(c.q)
		if rel := math.Abs(float64(got-c.want)) / float64(c.want); rel > 0.01 {
			t.Errorf("q%v = %v, want %v within 1%%", c.q, got, c.want)
		}
	}
	for _, ns := range []int64{0, 1, 127, 128, 129, 1 << 20, 1<<40 + 12345} {
		i := bucketIndex(ns)
		if v := bucketValue(i); ns >= histSub && math.Abs(float64(v-ns))/float64(ns) > 0.01 {
			t.Errorf("bucket of %d has value %d", ns, v)
		}
	}
}
