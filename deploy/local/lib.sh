# shellcheck shell=bash disable=SC2034  # variables are used by the scripts that source this.
# Shared helpers for the deploy/local scripts and tests/e2e. Source it; it defines no side effects
# beyond variables and functions.
#
#   SAMPLERD_ROOT     repository root (absolute)
#   SAMPLERD_PRESET   CMake configure preset to build (env; default "default" = CPU backend,
#                     build dir build/default; "auto" builds the best GPU backend in build/auto)
#   SAMPLERD_BUILD    build directory of that preset
#   SAMPLERD_BIN      the samplerd binary (env overrides)
#   SAMPLERD_BUF      the project-local buf binary (installed by install_deps.sh; env overrides)
#   SAMPLERD_SKIP     the status a step of samplerd::run_steps returns to say SKIP (77)

SAMPLERD_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SAMPLERD_PRESET="${SAMPLERD_PRESET:-default}"
SAMPLERD_BUILD="${SAMPLERD_ROOT}/build/${SAMPLERD_PRESET}"
SAMPLERD_BIN="${SAMPLERD_BIN:-${SAMPLERD_BUILD}/service/samplerd}"
SAMPLERD_BUF="${SAMPLERD_BUF:-${SAMPLERD_ROOT}/.tools/node_modules/.bin/buf}"
SAMPLERD_SKIP=77

# log MESSAGE...: a progress line on stderr, so that stdout stays clean for results.
samplerd::log() {
  if [[ -t 2 ]]; then printf '\033[1m==>\033[0m %s\n' "$*" >&2; else printf '==> %s\n' "$*" >&2; fi
}
samplerd::die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# build [TARGET...]: configures SAMPLERD_BUILD from its preset when it has no build.ninja yet, then
# builds incrementally (ninja re-runs CMake by itself when a CMakeLists.txt changes). Without
# targets builds everything. Extra CMake cache settings can be passed in SAMPLERD_CMAKE_ARGS.
samplerd::build() {
  local -a extra=()
  # shellcheck disable=SC2206  # word splitting is intended: "-DA=1 -DB=2".
  [[ -n "${SAMPLERD_CMAKE_ARGS:-}" ]] && extra=(${SAMPLERD_CMAKE_ARGS})
  if [[ ! -f "${SAMPLERD_BUILD}/build.ninja" || ${#extra[@]} -gt 0 ]]; then
    samplerd::log "configuring ${SAMPLERD_BUILD#"${SAMPLERD_ROOT}"/} (preset ${SAMPLERD_PRESET})"
    local out
    if ! out="$(cd "${SAMPLERD_ROOT}" &&
                cmake --preset "${SAMPLERD_PRESET}" "${extra[@]}" 2>&1)"; then
      printf '%s\n' "${out}" >&2
      return 1
    fi
  fi
  local -a targets=()
  local t
  for t in "$@"; do targets+=(--target "$t"); done
  samplerd::log "building ${SAMPLERD_BUILD#"${SAMPLERD_ROOT}"/}${*:+ ($*)}"
  cmake --build "${SAMPLERD_BUILD}" "${targets[@]}"
}

# floats_base64 F...: base64 of the floats as little-endian IEEE binary32, i.e. the
# `inlineData` of a DTYPE_FP32 tensor in proto3 JSON. perl is part of every Debian system.
samplerd::floats_base64() {
  perl -e 'print pack("f<*", @ARGV)' -- "$@" | base64 -w0
}

# run_steps LABEL STEP...: the PASS/FAIL step runner of test.sh and tests/deploy/check.sh. Runs the
# function step_STEP of each STEP in the order given, under a "=== LABEL: STEP" header, and times
# it. A step prints what it did and returns 0 (PASS), SAMPLERD_SKIP (SKIP: nothing to check, e.g.
# an earlier step failed) or anything else (FAIL). When a step fails and the caller defines
# on_step_failure, it is called with the step's name; if it returns non-zero, the remaining steps
# are not run (SKIP, "not run"). Ends with one line per step and "LABEL: N passed, N failed[, N
# skipped]"; returns 1 when any step failed, or when a STEP has no step_STEP (before running any).
samplerd::run_steps() {
  local label="$1"
  shift
  local s width=4
  for s in "$@"; do
    if ! declare -F "step_${s}" >/dev/null; then
      printf 'error: unknown step %s\n' "'${s}'" >&2
      return 1
    fi
    ((${#s} > width)) && width=${#s}
  done

  local -a results=()
  local passed=0 failed=0 skipped=0 start rc stop=0
  for s in "$@"; do
    if ((stop)); then
      results+=("$(printf 'SKIP  %-*s        (not run)' "${width}" "${s}")")
      skipped=$((skipped + 1))
      continue
    fi
    echo
    echo "=== ${label}: ${s}"
    start=${SECONDS}
    rc=0
    "step_${s}" || rc=$?
    if ((rc == 0)); then
      results+=("$(printf 'PASS  %-*s %5ss' "${width}" "${s}" $((SECONDS - start)))")
      passed=$((passed + 1))
    elif ((rc == SAMPLERD_SKIP)); then
      results+=("SKIP  ${s}")
      skipped=$((skipped + 1))
    else
      results+=("$(printf 'FAIL  %-*s %5ss  (exit %s)' "${width}" "${s}" $((SECONDS - start)) \
        "${rc}")")
      failed=$((failed + 1))
      if declare -F on_step_failure >/dev/null && ! on_step_failure "${s}"; then stop=1; fi
    fi
  done

  echo
  echo "=== ${label}: summary"
  printf '  %s\n' "${results[@]}"
  echo "${label}: ${passed} passed, ${failed} failed$( ((skipped)) && echo ", ${skipped} skipped")"
  ((failed == 0))
}
