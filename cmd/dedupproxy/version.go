package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/dedupproxy/dedupproxy/proxy"
)

func init() { proxy.Version, proxy.Revision = buildVersion() }

// buildVersion is the module version and VCS revision the Go toolchain
// stamped into the binary (go build in a git checkout records the revision,
// with "-dirty" for uncommitted changes). A version set with -ldflags -X
// on proxy.Version (or proxy.Revision) wins: deploy/build.sh sets them
// where the build has no VCS information (a container build without .git).
func buildVersion() (version, revision string) {
	version, revision = proxy.Version, proxy.Revision
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return version, revision
	}
	if v := bi.Main.Version; version == "dev" && v != "" && v != "(devel)" {
		version = v
	}
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			if revision == "unknown" {
				revision = s.Value
			}
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty && revision != "unknown" {
		revision += "-dirty"
	}
	return version, revision
}

func versionLine() string {
	version, revision := buildVersion()
	return fmt.Sprintf("dedupproxy %s (revision %s, %s %s/%s)", version, revision, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
