#!/usr/bin/env bash
# Runs the go tool on this module offline, against Debian's Go packages in /usr/share/gocode
# (docs/TOOLCHAIN.md, "Go clients (offline)"): writes an alternate go.mod (go.mod plus
# `replace` lines for them, and empty stub modules for those grpc's go.mod lists but Debian
# lacks) and the Go caches into GO_BUILD_DIR, then runs `go "$@"` in client/go with it.
#
#   client/go/offline_go.sh build ./...
#   client/go/offline_go.sh test -run TestSession ./...
#
# Environment: GO_BUILD_DIR (default <repo>/build/go, git-ignored), GOCODE (default
# /usr/share/gocode/src), GO (default go).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "${HERE}/../.." && pwd)"
BUILD="${GO_BUILD_DIR:-${ROOT}/build/go}"
GOCODE="${GOCODE:-/usr/share/gocode/src}"
GO="${GO:-go}"

# Modules of the build graph that Debian ships (with a go.mod), and those it does not: grpc's
# and genproto's go.mod files name them, but no package of theirs is compiled.
DEBIAN_MODULES=(
  google.golang.org/grpc google.golang.org/protobuf google.golang.org/genproto
  github.com/golang/protobuf github.com/google/go-cmp
  golang.org/x/net golang.org/x/sys golang.org/x/text golang.org/x/oauth2
)
STUB_MODULES=(
  github.com/cncf/udpa/go github.com/envoyproxy/go-control-plane github.com/golang/glog
  github.com/google/uuid golang.org/x/term golang.org/x/lint golang.org/x/tools golang.org/x/mod
  honnef.co/go/tools cloud.google.com/go/compute/metadata google.golang.org/appengine
)

mkdir -p "${BUILD}/stubs"
MODFILE="${BUILD}/offline.mod"
{
  cat "${HERE}/go.mod"
  echo
  echo "replace ("
  for m in "${DEBIAN_MODULES[@]}"; do
    [[ -f "${GOCODE}/${m}/go.mod" ]] || { echo "error: no ${GOCODE}/${m} (see client/go/README.md, Install)" >&2; exit 1; }
    echo "	${m} => ${GOCODE}/${m}"
  done
  for m in "${STUB_MODULES[@]}"; do
    mkdir -p "${BUILD}/stubs/${m}"
    echo "module ${m}" >"${BUILD}/stubs/${m}/go.mod"
    echo "	${m} => ${BUILD}/stubs/${m}"
  done
  echo ")"
} >"${MODFILE}.tmp"
mv "${MODFILE}.tmp" "${MODFILE}"
: >>"${BUILD}/offline.sum"

export GOPATH="${BUILD}/gopath" GOCACHE="${BUILD}/cache" GOMODCACHE="${BUILD}/gopath/pkg/mod"
export GOPROXY=off GOSUMDB=off GO111MODULE=on GOTOOLCHAIN=local
# -mod=readonly: the build fails, rather than edits the alternate go.mod, when go.mod lacks a
# requirement, so go.mod stays complete for builds with a module proxy.
export GOFLAGS="-modfile=${MODFILE} -mod=${GO_MOD_MODE:-readonly}"
cd "${HERE}"
exec "${GO}" "$@"
