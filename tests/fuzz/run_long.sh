#!/usr/bin/env bash
# Runs one fuzz target for a long time (hours), from the checked-in seeds plus what earlier long
# runs found, and prints a summary for FUZZ_RESULTS.md:
#
#   tests/fuzz/run_long.sh TARGET SECONDS [MAX_RUNS]
#   e.g. nice -n 15 tests/fuzz/run_long.sh fuzz_stream 14400
#
# TARGET: fuzz_request, fuzz_stream, fuzz_regions or fuzz_session. Stops after SECONDS, or MAX_RUNS
# executions when given, or at the first finding. Works in build/fuzz/long/TARGET/ (corpus/,
# the grown corpus, kept between runs; artifacts/, the input of a finding; log). Builds the
# target first (tests/fuzz/build.sh). Exits non-zero on a finding; the reproducer is
# artifacts/crash-* (or leak-*, timeout-*, oom-*): run `build/fuzz/TARGET FILE` to replay it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
readonly ROOT
if (($# < 2)); then
  sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
readonly TARGET="$1" SECONDS_="$2" MAX_RUNS="${3:--1}"
readonly BUILD="${SAMPLERD_FUZZ_BUILD:-${ROOT}/build/fuzz}"
readonly SEEDS="${ROOT}/tests/fuzz/corpus/${TARGET}"
readonly WORK="${BUILD}/long/${TARGET}"
[[ -d "${SEEDS}" ]] || { echo "no seeds for ${TARGET} in ${SEEDS}" >&2; exit 2; }

"${ROOT}/tests/fuzz/build.sh" "${TARGET}" >/dev/null
mkdir -p "${WORK}/corpus" "${WORK}/artifacts"
commit="$(git -C "${ROOT}" rev-parse --short HEAD)"
started="$(date -u +%FT%TZ)"
echo "${TARGET}: ${SECONDS_} s (max runs ${MAX_RUNS}) from ${started}, commit ${commit}," \
  "log ${WORK}/log"

# -timeout: an input running 10 s is a hang (a finding); -rss_limit_mb: so is using 2 GiB.
# The grown corpus comes first: new inputs are written there, the seeds stay as they are.
rc=0
"${BUILD}/${TARGET}" -max_total_time="${SECONDS_}" -runs="${MAX_RUNS}" -timeout=10 \
  -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1 \
  -artifact_prefix="${WORK}/artifacts/" "${WORK}/corpus" "${SEEDS}" >"${WORK}/log" 2>&1 || rc=$?

runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "${WORK}/log")"
speed="$(sed -n 's/^stat::average_exec_per_sec: *//p' "${WORK}/log")"
secs="$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "${WORK}/log")"
cov="$(grep -o 'cov: [0-9]* ft: [0-9]*' "${WORK}/log" | tail -1)"
files="$(find "${WORK}/corpus" -type f | wc -l)"
findings="$(find "${WORK}/artifacts" -type f | wc -l)"
echo "${TARGET}: commit ${commit}, started ${started}, exit ${rc}, executions ${runs:-?}," \
  "exec/s ${speed:-?}, seconds ${secs:-?}, ${cov:-cov ?}, corpus ${files} files" \
  "(+ $(find "${SEEDS}" -type f | wc -l) seeds), findings ${findings}"
if ((rc != 0)); then
  grep -E 'FUZZ FINDING|ERROR: |SUMMARY' "${WORK}/log" | head -5
  ls "${WORK}/artifacts"
fi
exit "${rc}"
