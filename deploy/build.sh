#!/bin/sh
# The release build of dedupproxy, used by the Dockerfile's build stage, by
# `make build` and by deploy's TestBuildIsStatic: a static binary
# (CGO_ENABLED=0), without local paths (-trimpath), stripped.
#
#   deploy/build.sh [OUTPUT]          default bin/dedupproxy
#
# The version and revision come from the build information (a git checkout
# stamps vcs.revision); VERSION and REVISION in the environment set them
# where there is none (a container build without .git).
set -eu
out=${1:-bin/dedupproxy}
pkg=github.com/dedupproxy/dedupproxy/proxy
ldflags="-s -w"
[ -n "${VERSION:-}" ] && ldflags="$ldflags -X $pkg.Version=$VERSION"
[ -n "${REVISION:-}" ] && ldflags="$ldflags -X $pkg.Revision=$REVISION"
CGO_ENABLED=0 exec go build -trimpath -ldflags "$ldflags" -o "$out" ./cmd/dedupproxy
