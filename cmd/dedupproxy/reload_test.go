package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/dedupproxy/dedupproxy/internal/doccheck"
	"github.com/dedupproxy/dedupproxy/proxy"
)

// TestReloadAppliesReloadedKeys: SIGHUP's reload applies each key of
// reloadedKeys to the running proxy without asking for a restart, and
// names other keys as needing one without applying them. reloadedKeys is
// what the help text and every document say SIGHUP applies.
func TestReloadAppliesReloadedKeys(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	path := filepath.Join(t.TempDir(), "c.yaml")
	base := fmt.Sprintf("upstream: %s\nlisten: 127.0.0.1:0\nadmin: \"off\"\n", c.ListenAddrs()[0])
	write := func(extra string) {
		if err := os.WriteFile(path, []byte(base+extra), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("")
	args := []string{"--config", path}
	fl := newFlags()
	running, err := fl.load(args)
	if err != nil {
		t.Fatal(err)
	}
	logs := &strings.Builder{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	srv := &proxy.Server{Config: running, Logger: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(ctx)
	level := new(slog.LevelVar)

	applied := regexp.MustCompile(`msg="SIGHUP: config reloaded" config=\S+ applied="?([^"\n]*)"?\n`)
	restart := regexp.MustCompile(`need a restart; the running values stay" keys="?([^"\n]*)"?\n`)
	// hup changes the file by extra, reloads, and returns the keys applied
	// and the keys named for a restart; then it reloads the base file.
	hup := func(extra string) (got, later []string) {
		logs.Reset()
		write(extra)
		running = reload(log, level, srv, fl, args, running)
		if m := applied.FindStringSubmatch(logs.String()); m != nil {
			got = strings.Fields(m[1])
		} else {
			t.Fatalf("%q: no reload line in %s", extra, logs)
		}
		if m := restart.FindStringSubmatch(logs.String()); m != nil {
			later = strings.Fields(m[1])
		}
		write("")
		running = reload(log, level, srv, fl, args, running)
		return got, later
	}

	live := map[string]string{
		"log_level":          "log_level: debug\n",
		"dedup.mode":         "dedup:\n  mode: observe\n",
		"dedup.legacy.match": "dedup:\n  legacy:\n    match: exact\n",
		"dedup.topics":       "dedup:\n  topics:\n    t:\n      legacy_match: exact\n",
	}
	for _, key := range reloadedKeys {
		extra, ok := live[key]
		if !ok {
			t.Errorf("reloadedKeys has %s, which this test does not change: add a case", key)
			continue
		}
		got, later := hup(extra)
		if !reflect.DeepEqual(got, []string{key}) || len(later) != 0 {
			t.Errorf("changing %s: applied %v, restart %v; want applied [%s]", key, got, later, key)
		}
	}
	for key := range live {
		if !slices.Contains(reloadedKeys, key) {
			t.Errorf("the reload applies %s, which reloadedKeys (and so the docs) leaves out", key)
		}
	}
	for key, extra := range map[string]string{
		"max_inflight":         "max_inflight: 100\n",
		"log_format":           "log_format: json\n",
		"drain_timeout":        "drain_timeout: 5s\n",
		"dedup.legacy":         "dedup:\n  legacy:\n    window: 1m\n",
		"dedup.max_entries":    "dedup:\n  max_entries: 1000\n",
		"dedup.keys":           "dedup:\n  keys:\n    ttl: 1h\n",
		"cert_reload_interval": "cert_reload_interval: 1m\n",
	} {
		got, later := hup(extra)
		if len(got) != 0 || !reflect.DeepEqual(later, []string{key}) {
			t.Errorf("changing %s: applied %v, restart %v; want it named for a restart only", key, got, later)
		}
	}
}

// configKeys returns every key of the config file as a dotted path
// (dedup.legacy.match), from proxy.Config's yaml tags.
func configKeys() []string {
	var out []string
	var walk func(t reflect.Type, prefix string)
	walk = func(t reflect.Type, prefix string) {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct || t == reflect.TypeFor[time.Duration]() {
			return
		}
		for i := range t.NumField() {
			tag := strings.Split(t.Field(i).Tag.Get("yaml"), ",")[0]
			if tag == "" || tag == "-" {
				continue
			}
			out = append(out, prefix+tag)
			walk(t.Field(i).Type, prefix+tag+".")
		}
	}
	walk(reflect.TypeFor[proxy.Config](), "")
	return out
}

// keyMention finds config keys as documents write them: in backticks, or
// as a word with a dot or an underscore (log_level, dedup.mode).
var keyMention = regexp.MustCompile("`([a-z_.]+)`|\\b([a-z]+(?:[._][a-z]+)+)\\b")

// sighupContext keys may appear beside SIGHUP without being said to be
// applied by it: when certificates are also checked, and what SIGTERM
// waits for.
var sighupContext = map[string]bool{"cert_reload_interval": true, "drain_timeout": true}

// TestDocsSIGHUPKeys: every paragraph of README.md, docs/, config.example.yaml
// and deploy/systemd that says what SIGHUP (or systemctl reload) applies
// names every key of reloadedKeys; any other key a sentence names beside
// SIGHUP is said there to need a restart; and a config file comment on a
// reloaded key does not say it needs a restart.
func TestDocsSIGHUPKeys(t *testing.T) {
	root := filepath.Join("..", "..")
	files := []string{"README.md", "config.example.yaml"}
	for _, glob := range []string{"docs/*.md", "deploy/systemd/*"} {
		m, _ := filepath.Glob(filepath.Join(root, glob))
		for _, p := range m {
			rel, _ := filepath.Rel(root, p)
			files = append(files, rel)
		}
	}
	known := map[string]bool{}
	for _, k := range configKeys() {
		known[k] = true
	}
	reloaded := map[string]bool{}
	for _, k := range reloadedKeys {
		reloaded[k] = true
	}
	sighup := regexp.MustCompile(`SIGHUP|systemctl reload`)
	for _, name := range files {
		raw, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		units := doccheck.Units(string(raw), !strings.HasSuffix(name, ".md"), "", "")
		paragraphs := map[int][]doccheck.Unit{}
		for _, u := range units {
			paragraphs[u.Paragraph] = append(paragraphs[u.Paragraph], u)
			if reloaded[u.Key] && strings.Contains(u.Text, "restart") && !sighup.MatchString(u.Text) {
				t.Errorf("%s:%d: the comment on %s says it needs a restart; SIGHUP applies it:\n\t%s", name, u.Line, u.Key, u.Text)
			}
		}
		for _, para := range paragraphs {
			var text []string
			for _, u := range para {
				text = append(text, u.Text)
			}
			if !sighup.MatchString(strings.Join(text, " ")) {
				continue
			}
			named := map[string]bool{}
			for _, u := range para {
				for _, m := range keyMention.FindAllStringSubmatch(u.Text, -1) {
					key := m[1] + m[2]
					if !known[key] {
						continue
					}
					named[key] = true
					if !reloaded[key] && !sighupContext[key] && sighup.MatchString(u.Text) && !strings.Contains(u.Text, "restart") {
						t.Errorf("%s:%d names %s beside SIGHUP without saying it needs a restart; SIGHUP applies only %s:\n\t%s",
							name, u.Line, key, reloadedKeysText(), u.Text)
					}
				}
			}
			var have, missing []string
			for _, k := range reloadedKeys {
				if named[k] {
					have = append(have, k)
				} else {
					missing = append(missing, k)
				}
			}
			if len(have) > 0 && len(missing) > 0 {
				t.Errorf("%s:%d says SIGHUP applies %s but not %s (it applies %s):\n\t%s", name, para[0].Line,
					strings.Join(have, ", "), strings.Join(missing, ", "), reloadedKeysText(), strings.Join(text, " "))
			}
		}
	}
}
