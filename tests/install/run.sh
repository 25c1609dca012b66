#!/usr/bin/env bash
# Install test of the C++ client (issue #5, item 3): installs the build into a temporary prefix
# with `cmake --install`, configures and builds tests/install/consumer (find_package(samplerd)
# + samplerd::client) against it alone, and runs the consumer against a real server.
#
#   tests/install/run.sh
#
# Needs a build in build/default (SAMPLERD_PRESET selects another; SAMPLERD_BIN the server).
set -euo pipefail
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../deploy/local/lib.sh"

[[ -f "${SAMPLERD_BUILD}/cmake_install.cmake" ]] ||
  samplerd::die "no build at ${SAMPLERD_BUILD} (build first)"
[[ -x "${SAMPLERD_BIN}" ]] || samplerd::die "no server binary at ${SAMPLERD_BIN} (build first)"

TMP="$(mktemp -d "${TMPDIR:-/tmp}/samplerd-install.XXXXXX")"
readonly TMP PREFIX="${TMP}/prefix" SOCK="${TMP}/s.sock"
SERVER_PID=""
cleanup() {
  if [[ -n "${SERVER_PID}" ]]; then
    kill -KILL "${SERVER_PID}" 2>/dev/null || true
    wait "${SERVER_PID}" 2>/dev/null || true
  fi
  rm -rf "${TMP}"
}
trap cleanup EXIT

samplerd::log "installing ${SAMPLERD_BUILD#"${SAMPLERD_ROOT}"/} into ${PREFIX}"
cmake --install "${SAMPLERD_BUILD}" --prefix "${PREFIX}" >"${TMP}/install.log" ||
  { cat "${TMP}/install.log"; exit 1; }
for f in include/samplerd/client.h include/samplerd/v1/sampler.grpc.pb.h \
         include/samplerd/device_session.h include/samplerd/v1/device_session.h \
         lib/cmake/samplerd/samplerdConfig.cmake; do
  [[ -f "${PREFIX}/${f}" ]] || samplerd::die "install lacks ${f}"
done

samplerd::log "configuring and building tests/install/consumer against the prefix"
cmake -S "${SAMPLERD_ROOT}/tests/install/consumer" -B "${TMP}/consumer" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="${PREFIX}" >"${TMP}/configure.log" ||
  { cat "${TMP}/configure.log"; exit 1; }
cmake --build "${TMP}/consumer"
# The consumer must use the installed headers, never the source tree's.
if grep -rqF -- "${SAMPLERD_ROOT}/client" "${TMP}/consumer/build.ninja"; then
  samplerd::die "consumer build refers to the source tree"
fi

"${SAMPLERD_BIN}" --listen="unix://${SOCK}" --backend=cpu >"${TMP}/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 300); do [[ -S "${SOCK}" ]] && break; sleep 0.1; done
# The client waits for the channel only as long as its deadline; retry while the server starts.
for attempt in 1 2 3 4 5; do
  if "${TMP}/consumer/consumer" "unix://${SOCK}"; then
    echo "cpp-install: find_package(samplerd) consumer built and sampled"
    exit 0
  fi
  echo "attempt ${attempt} failed" >&2
  sleep 1
done
cat "${TMP}/server.log" >&2
exit 1
