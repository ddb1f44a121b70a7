package main

import (
	"log/slog"
	"reflect"
	"strings"

	"github.com/dedupproxy/dedupproxy/proxy"
)

// reloadedKeys are the config keys SIGHUP applies to a running proxy
// (besides re-reading every certificate file); any other key that changed
// is logged as needing a restart. The help text is written from this
// list, TestReloadAppliesReloadedKeys holds reload to it, and
// TestDocsSIGHUPKeys fails when a document states another list.
// NOTE: a key reload learns to apply goes here.
var reloadedKeys = []string{"log_level", "dedup.mode", "dedup.legacy.match", "dedup.topics"}

// reloadedKeysText is reloadedKeys as a sentence: a, b, c and d.
func reloadedKeysText() string {
	n := len(reloadedKeys)
	return strings.Join(reloadedKeys[:n-1], ", ") + " and " + reloadedKeys[n-1]
}

// reload is SIGHUP: it reads the config file and flags again, applies what
// can change in a running proxy (reloadedKeys; certificate files are
// re-read in place), logs what changed, and names every other changed key
// as needing a restart. It returns the configuration now in effect, as
// configured (the running one when the file does not load).
func reload(log *slog.Logger, level *slog.LevelVar, srv *proxy.Server, fl *flags, args []string, running proxy.Config) proxy.Config {
	if err := srv.ReloadTLS(); err != nil {
		log.Warn("SIGHUP: some certificates did not reload; the previous ones stay in use", "err", err)
	} else {
		log.Info("SIGHUP: certificate files checked")
	}
	if *fl.config == "" {
		log.Info("SIGHUP: no config file; nothing else to reload")
		return running
	}
	next, err := loadConfig(args)
	if err != nil {
		log.Error("SIGHUP: config not reloaded; the running configuration stays", "err", err)
		return running
	}
	applied := running
	var changed, restart []string
	dedupLive := false // dedup.mode, dedup.legacy.match, dedup.topics changed
	for _, key := range configDiff(running, next) {
		switch key {
		case "log_level":
			old := level.Level()
			level.Set(parseLevel(next.LogLevel))
			applied.LogLevel = next.LogLevel
			changed = append(changed, key)
			log.Info("SIGHUP: log level changed", "from", strings.ToLower(old.String()), "to", next.LogLevel)
		case "dedup.mode", "dedup.topics":
			dedupLive = true
		case "dedup.legacy":
			// Only the match mode can change live; the window and the
			// table's size need a restart.
			a, b := running.Dedup.Legacy, next.Dedup.Legacy
			a.Match = b.Match
			if a != b {
				restart = append(restart, "dedup.legacy")
			}
			if running.Dedup.Legacy.Match != next.Dedup.Legacy.Match {
				dedupLive = true
			}
		default:
			restart = append(restart, key)
		}
	}
	if dedupLive {
		want := running.Dedup
		want.Mode, want.Legacy.Match, want.Topics = next.Dedup.Mode, next.Dedup.Legacy.Match, next.Dedup.Topics
		keys, err := srv.SetDedup(want)
		if err != nil {
			log.Warn("SIGHUP: dedup settings not applied; the running ones stay", "err", err)
		} else {
			applied.Dedup = want
			changed = append(changed, keys...)
			log.Info("SIGHUP: dedup settings changed", "keys", strings.Join(keys, " "), "mode", want.Mode)
		}
	}
	if len(restart) > 0 {
		log.Warn("SIGHUP: these keys changed but need a restart; the running values stay", "keys", strings.Join(restart, " "))
	}
	log.Info("SIGHUP: config reloaded", "config", *fl.config, "applied", strings.Join(changed, " "))
	return applied
}

// configDiff names the config keys that differ between a and b: top-level
// yaml keys, and dedup's own keys one level down.
func configDiff(a, b proxy.Config) []string {
	var out []string
	var walk func(va, vb reflect.Value, prefix string)
	walk = func(va, vb reflect.Value, prefix string) {
		t := va.Type()
		for i := range t.NumField() {
			tag := strings.Split(t.Field(i).Tag.Get("yaml"), ",")[0]
			fa, fb := va.Field(i), vb.Field(i)
			if reflect.DeepEqual(fa.Interface(), fb.Interface()) {
				continue
			}
			if prefix == "" && tag == "dedup" {
				walk(fa, fb, "dedup.")
				continue
			}
			out = append(out, prefix+tag)
		}
	}
	walk(reflect.ValueOf(a), reflect.ValueOf(b), "")
	return out
}
