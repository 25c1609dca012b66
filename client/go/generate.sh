#!/usr/bin/env bash
# Generates the Go code of proto/samplerd/v1/*.proto (messages and the SamplerService
# client) into the git-ignored client/go/samplerdv1/, the package the proto's go_package names
# ("samplerd.dev/client/go/samplerdv1"). Uses the system protoc with Debian's protoc-gen-go and
# protoc-gen-go-grpc (see docs/TOOLCHAIN.md, "Go clients (offline)"). test.sh runs it.
#
#   client/go/generate.sh
#
# Environment: PROTOC (default protoc), PROTOC_GEN_GO and PROTOC_GEN_GO_GRPC (default: found
# on PATH).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "${HERE}/../.." && pwd)"
MODULE="samplerd.dev/client/go"
GEN="${HERE}/samplerdv1"
PROTOC="${PROTOC:-protoc}"
GEN_GO="${PROTOC_GEN_GO:-$(command -v protoc-gen-go || true)}"
GEN_GO_GRPC="${PROTOC_GEN_GO_GRPC:-$(command -v protoc-gen-go-grpc || true)}"

command -v "${PROTOC}" >/dev/null || { echo "error: no ${PROTOC} (apt-get install protobuf-compiler)" >&2; exit 1; }
[[ -x "${GEN_GO}" ]] || { echo "error: no protoc-gen-go (apt-get install protoc-gen-go)" >&2; exit 1; }
[[ -x "${GEN_GO_GRPC}" ]] || { echo "error: no protoc-gen-go-grpc (apt-get install protoc-gen-go-grpc)" >&2; exit 1; }

rm -rf "${GEN}"
mkdir -p "${GEN}"
# module= strips the module path from go_package, so the files land in ${HERE}/samplerdv1.
"${PROTOC}" -I "${ROOT}/proto" \
  --plugin=protoc-gen-go="${GEN_GO}" --plugin=protoc-gen-go-grpc="${GEN_GO_GRPC}" \
  --go_out="${HERE}" --go_opt=module="${MODULE}" \
  --go-grpc_out="${HERE}" --go-grpc_opt=module="${MODULE}" \
  "${ROOT}"/proto/samplerd/v1/*.proto
echo "generated Go code in ${GEN#"${ROOT}"/}"
