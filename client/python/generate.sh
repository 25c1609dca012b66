#!/usr/bin/env bash
# Generates the Python stubs (and .pyi) of proto/samplerd/v1/*.proto into the git-ignored
# client/python/samplerd/v1/ (a subpackage of the hand-written `samplerd` package, matching the
# generated `from samplerd.v1 import ...` imports), with the system protoc and Debian's
# grpc_python_plugin (see docs/TOOLCHAIN.md, "Python clients"). Run it before importing
# `samplerd`; deploy/local/test.sh python-client does.
#
#   client/python/generate.sh
#
# Environment: PROTOC (default protoc), GRPC_PYTHON_PLUGIN (default /usr/bin/grpc_python_plugin).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "${HERE}/../.." && pwd)"
GEN="${HERE}/samplerd/v1"
PROTOC="${PROTOC:-protoc}"
PLUGIN="${GRPC_PYTHON_PLUGIN:-/usr/bin/grpc_python_plugin}"

command -v "${PROTOC}" >/dev/null || { echo "error: no ${PROTOC} (apt-get install protobuf-compiler)" >&2; exit 1; }
[[ -x "${PLUGIN}" ]] || { echo "error: no ${PLUGIN} (apt-get install protobuf-compiler-grpc)" >&2; exit 1; }

rm -rf "${GEN}"
"${PROTOC}" -I "${ROOT}/proto" \
  --python_out="${HERE}" --pyi_out="${HERE}" --grpc_python_out="${HERE}" \
  --plugin=protoc-gen-grpc_python="${PLUGIN}" \
  "${ROOT}"/proto/samplerd/v1/*.proto
touch "${GEN}/__init__.py"
echo "generated Python stubs in ${GEN#"${ROOT}"/}"
