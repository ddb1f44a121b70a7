package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestTuneGC: the proxy collects at defaultGCPercent unless the operator's
// GOGC says otherwise. Not parallel: it changes the process's GC setting.
func TestTuneGC(t *testing.T) {
	prev := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(prev) })

	t.Setenv("GOGC", "50") // restored after the test
	debug.SetGCPercent(50)
	if tuneGC() {
		t.Fatal("tuneGC changed the GC percent although GOGC is set")
	}
	if got := debug.SetGCPercent(50); got != 50 {
		t.Fatalf("GC percent %d with GOGC=50, want 50", got)
	}

	os.Unsetenv("GOGC")
	if !tuneGC() {
		t.Fatal("tuneGC left the GC percent alone although GOGC is unset")
	}
	if got := debug.SetGCPercent(100); got != defaultGCPercent {
		t.Fatalf("GC percent %d with GOGC unset, want %d", got, defaultGCPercent)
	}
}

// TestMetricsUncompressed: /metrics answers plain text even to a scraper
// that offers gzip, so no compressor stays alive on the heap.
func TestMetricsUncompressed(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "dedupproxy_test_total", Help: "A test counter."})
	reg.MustRegister(c)
	c.Inc()
	h := adminHandler(nil, reg, false)
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	req.Header.Set("Accept-Encoding", "gzip")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: status %d", rec.Code)
	}
	if enc := rec.Header().Get("Content-Encoding"); enc != "" {
		t.Fatalf("Content-Encoding %q, want none", enc)
	}
	if body := rec.Body.String(); !strings.Contains(body, "dedupproxy_test_total 1") {
		t.Fatalf("body lacks the counter:\n%s", body)
	}
}
