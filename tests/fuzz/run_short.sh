#!/usr/bin/env bash
# The test command's `fuzz` step (deploy/local/test.sh fuzz): builds the fuzz targets
# (tests/fuzz/build.sh: clang, libFuzzer, ASan + UBSan, build/fuzz) and runs each for a bounded
# time from its checked-in seeds (every seed runs first). Any finding (a crash, a sanitizer
# report, a failed check, a leak, an input running 10 s, 2 GiB of memory) fails it; the input
# is kept in build/fuzz/short/artifacts/ and the log in build/fuzz/short/TARGET.log.
#
#   tests/fuzz/run_short.sh [TARGET...]    default: every target
# SAMPLERD_FUZZ_SECONDS: seconds per target (default 20).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
readonly ROOT
readonly BUILD="${SAMPLERD_FUZZ_BUILD:-${ROOT}/build/fuzz}"
readonly WORK="${BUILD}/short"
readonly SECONDS_EACH="${SAMPLERD_FUZZ_SECONDS:-20}"
targets=("$@")
((${#targets[@]})) || targets=(fuzz_request fuzz_stream fuzz_regions fuzz_session)

mkdir -p "${WORK}/artifacts"
if ! "${ROOT}/tests/fuzz/build.sh" "${targets[@]}" >"${WORK}/build.log" 2>&1; then
  tail -n 40 "${WORK}/build.log"
  echo "the fuzz targets did not build (log ${WORK#"${ROOT}"/}/build.log)"
  exit 1
fi
tail -n 1 "${WORK}/build.log"
rc=0
for t in "${targets[@]}"; do
  # A fresh corpus per run: what it grows is thrown away; the seeds are read, never written.
  corpus="${WORK}/corpus-${t}"
  rm -rf "${corpus}"
  mkdir -p "${corpus}"
  if "${BUILD}/${t}" -max_total_time="${SECONDS_EACH}" -timeout=10 -rss_limit_mb=2048 \
       -max_len=4096 -print_final_stats=1 -artifact_prefix="${WORK}/artifacts/${t}-" \
       "${corpus}" "${ROOT}/tests/fuzz/corpus/${t}" >"${WORK}/${t}.log" 2>&1; then
    runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "${WORK}/${t}.log")"
    speed="$(sed -n 's/^stat::average_exec_per_sec: *//p' "${WORK}/${t}.log")"
    echo "${t}: ${runs} executions in ${SECONDS_EACH} s (${speed}/s), no finding"
  else
    rc=1
    echo "${t}: FINDING (log ${WORK#"${ROOT}"/}/${t}.log):"
    grep -E 'FUZZ FINDING|ERROR: |SUMMARY|runtime error|Test unit written' "${WORK}/${t}.log" |
      head -n 8
    echo "replay: ${BUILD#"${ROOT}"/}/${t} <the input named above>"
  fi
  rm -rf "${corpus}"
done
exit "${rc}"
