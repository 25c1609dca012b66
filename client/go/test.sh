#!/usr/bin/env bash
# The Go client's single test entry point: checks the tools, generates the code, checks
# formatting, vets, builds the example and runs the tests against the real server, offline
# (offline_go.sh: Debian's Go packages, GOPROXY=off, caches in GO_BUILD_DIR).
#
#   client/go/test.sh                     # from any directory
#   SAMPLERD_BIN=/path/to/samplerd client/go/test.sh -run TestSession -v
#
# Extra arguments go to `go test`. Environment: SAMPLERD_BIN (the server binary; default
# <repo>/build/default/service/samplerd), GO_BUILD_DIR (default <repo>/build/go), and those of
# generate.sh.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "${HERE}/../.." && pwd)"
BUILD="${GO_BUILD_DIR:-${ROOT}/build/go}"
GOCODE="${GOCODE:-/usr/share/gocode/src}"
APT="apt-get install -y golang-go golang-google-grpc-dev golang-google-protobuf-dev protoc-gen-go protoc-gen-go-grpc golang-github-golang-protobuf-1-5-dev"

fail() { echo "error: $*" >&2; exit 1; }
for tool in go gofmt protoc protoc-gen-go protoc-gen-go-grpc; do
  command -v "${tool}" >/dev/null || fail "no ${tool} on PATH; install with: ${APT}"
done
[[ -f "${GOCODE}/google.golang.org/grpc/go.mod" ]] || fail "no grpc-go in ${GOCODE}; install with: ${APT}"
# golang-github-golang-protobuf-1-3-dev (what apt picks when 1-5 is not named) predates
# google.golang.org/protobuf; clients built with it panic at their first call.
grep -q "google.golang.org/protobuf" "${GOCODE}/github.com/golang/protobuf/go.mod" 2>/dev/null ||
  fail "github.com/golang/protobuf in ${GOCODE} is not 1.5; install with: ${APT}"
SAMPLERD_BIN="$(realpath -m "${SAMPLERD_BIN:-${ROOT}/build/default/service/samplerd}")"  # go test runs in package dirs
export SAMPLERD_BIN
[[ -x "${SAMPLERD_BIN}" ]] || fail "no server binary ${SAMPLERD_BIN} (build it, or set SAMPLERD_BIN)"
export GO_BUILD_DIR="${BUILD}"

echo "== generate"
"${HERE}/generate.sh"
echo "== gofmt"
unformatted="$(cd "${HERE}" && find . -name '*.go' -not -path './samplerdv1/*' -exec gofmt -l {} +)"
[[ -z "${unformatted}" ]] || fail "not gofmt-formatted: ${unformatted}"
echo "== go vet"
"${HERE}/offline_go.sh" vet ./...
echo "== go build (example)"
"${HERE}/offline_go.sh" build -o "${BUILD}/bin/samplerd-example" ./cmd/samplerd-example
echo "== go test (server: ${SAMPLERD_BIN})"
log="${BUILD}/test.log"
status=0
"${HERE}/offline_go.sh" test -count=1 -timeout=5m -v "$@" ./... >"${log}" 2>&1 || status=$?
if [[ ${status} -ne 0 ]]; then
  cat "${log}"
else
  grep -E '^(ok|FAIL|\?) ' "${log}" || true
fi
count() { grep -cE "^ *--- $1: " "${log}" || true; }
echo "go tests: $(count PASS) passed, $(count FAIL) failed, $(count SKIP) skipped (log: ${log#"${ROOT}"/})"
exit "${status}"
