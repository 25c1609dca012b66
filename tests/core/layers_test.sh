#!/usr/bin/env bash
# The core's libraries include only what they link (service/core/CMakeLists.txt):
#   model <- backend <- regions <- session <- core (the top folder: SamplerCore)
# A file in a sub-folder may include its own folder and the folders below it, never core/'s own
# headers; nothing under service/core includes gRPC, generated protobuf code or service/grpc.
# Usage: layers_test.sh REPO_ROOT. Prints every offending #include and exits 1 if there is one.
set -euo pipefail

root="${1:?usage: layers_test.sh REPO_ROOT}"
core="${root}/service/core"
failed=0

# check FOLDER ALLOWED...: FOLDER's files include service/core/ headers of ALLOWED folders only.
check() {
  local folder="$1"
  shift
  local allowed
  allowed="$(printf '%s|' "${folder}" "$@")"
  local bad
  bad="$(grep -rnE '^#include "service/core/' "${core}/${folder}" |
    grep -vE "#include \"service/core/(${allowed%|})/" || true)"
  if [[ -n "${bad}" ]]; then
    printf '%s may include service/core/{%s} only:\n%s\n' "${folder}/" "${allowed%|}" "${bad}"
    failed=1
  fi
}

check model
check backend model
check regions backend model
check session regions backend model

bad="$(grep -rnE '^#include [<"](grpc|grpcpp|google/protobuf|service/grpc)/|\.pb\.h"' "${core}" || true)"
if [[ -n "${bad}" ]]; then
  printf 'service/core must not include gRPC or protobuf:\n%s\n' "${bad}"
  failed=1
fi

((failed == 0)) && echo "service/core layers: clean"
exit "${failed}"
