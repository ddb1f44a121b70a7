package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestAdminPprof: the profiles are served on the admin listener only when
// admin_pprof (--admin-pprof) is set; by default they are not found.
func TestAdminPprof(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		want int
	}{
		{"default off", nil, http.StatusNotFound},
		{"flag on", []string{"--admin-pprof"}, http.StatusOK},
		{"flag off", []string{"--admin-pprof=false"}, http.StatusNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := loadConfig(append([]string{"--upstream", "a:1"}, tc.args...))
			if err != nil {
				t.Fatal(err)
			}
			h := adminHandler(nil, prometheus.NewRegistry(), cfg.AdminPprof)
			for _, path := range []string{"/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/heap"} {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
				if rec.Code != tc.want {
					t.Errorf("GET %s: status %d, want %d", path, rec.Code, tc.want)
				}
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
			if rec.Code != http.StatusOK {
				t.Errorf("GET /healthz: status %d", rec.Code)
			}
		})
	}
}

// TestAdminPprofFromFile: the config key turns it on as the flag does.
func TestAdminPprofFromFile(t *testing.T) {
	t.Parallel()
	path := t.TempDir() + "/c.yaml"
	if err := os.WriteFile(path, []byte("upstream: [a:1]\nadmin_pprof: true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig([]string{"--config", path})
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.AdminPprof {
		t.Fatal("admin_pprof: true in the file did not turn profiling on")
	}
}
