#!/usr/bin/env bash
# Builds the fuzz targets with Debian's clang (libFuzzer, ASan + UBSan) into build/fuzz (or
# $SAMPLERD_FUZZ_BUILD): configures it the first time, then builds only what the targets link.
#   tests/fuzz/build.sh [TARGET...]    default: every target (TARGETS below)
# Needs clang and libclang-rt-14-dev (deploy/local/install_deps.sh installs them).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
readonly ROOT
readonly BUILD="${SAMPLERD_FUZZ_BUILD:-${ROOT}/build/fuzz}"
readonly TARGETS=(fuzz_request fuzz_stream fuzz_regions fuzz_session)

if [[ ! -f "${BUILD}/build.ninja" ]]; then
  cmake -S "${ROOT}/tests/fuzz" -B "${BUILD}" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null
fi
# SAMPLERD_FUZZ_JOBS: compile jobs (default: ninja's, one per core + 2).
ninja -C "${BUILD}" ${SAMPLERD_FUZZ_JOBS:+-j "${SAMPLERD_FUZZ_JOBS}"} "${@:-${TARGETS[@]}}"
