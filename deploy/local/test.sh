#!/usr/bin/env bash
# Builds samplerd and runs every check that works on a machine without a GPU, as named steps:
#
#   deploy/local/test.sh            all steps
#   deploy/local/test.sh STEP...    only those (in the order given); --list prints them
#
# Exits non-zero when any step fails and ends with a summary. This is what CI runs (.ci/run).
# Environment: SAMPLERD_PRESET (default "default", the CPU build in build/default),
# SAMPLERD_SKIP_DEPS=1 skips the dependency check.
set -uo pipefail
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "${SAMPLERD_ROOT}" || exit 1

# Steps run in this order. Each is a function step_NAME that returns non-zero on failure.
# To add one (GPU compile checks, Python and Go client tests, ...): write step_NAME, add NAME
# here, and list what it needs in install_deps.sh.
readonly ALL_STEPS=(deps build ctest buf-lint buf-format shell-lint e2e)

step_deps() { deploy/local/install_deps.sh && echo "dependencies: all present"; }

# All targets of the preset's build (server, tests, benchmarks, clients).
step_build() { samplerd::build "$@"; }

step_ctest() {
  needs_build || return
  ctest --test-dir "${SAMPLERD_BUILD}" --output-on-failure --no-tests=error -j2
}

step_buf-lint() { "${SAMPLERD_BUF}" lint && echo "buf lint: clean"; }

# The proto is kept in `buf format` layout; -d shows the diff that would fix it.
step_buf-format() { "${SAMPLERD_BUF}" format -d --exit-code && echo "buf format: clean"; }

step_shell-lint() {
  local -a scripts
  mapfile -t scripts < <(git ls-files --cached --others --exclude-standard \
    '*.sh' .ci/run | sort -u)
  shellcheck -x --severity=warning "${scripts[@]}" &&
    echo "shellcheck: ${#scripts[@]} scripts clean"
}

# Every tests/e2e/*_test.sh, each against its own server.
step_e2e() {
  needs_build || return
  local t rc=0
  for t in tests/e2e/*_test.sh; do
    echo "--- ${t}"
    bash "${t}" || rc=1
  done
  return "${rc}"
}

# Returns 0 when the build is there to test, else SKIP after a failed build step, else 1.
readonly SKIP=77
BUILD_FAILED=0
needs_build() {
  if ((BUILD_FAILED)); then
    echo "skipped: the build failed"
    return "${SKIP}"
  fi
  [[ -x "${SAMPLERD_BIN}" ]] && return 0
  echo "no build at ${SAMPLERD_BUILD#"${SAMPLERD_ROOT}"/} (run the build step first)"
  return 1
}

main() {
  local -a steps=("$@")
  if [[ "${1:-}" == --list ]]; then printf '%s\n' "${ALL_STEPS[@]}"; return 0; fi
  ((${#steps[@]})) || steps=("${ALL_STEPS[@]}")
  local s
  for s in "${steps[@]}"; do
    declare -F "step_${s}" >/dev/null || samplerd::die "unknown step '${s}' (--list shows them)"
  done

  local -a results=()
  local passed=0 failed=0 skipped=0 start rc
  for s in "${steps[@]}"; do
    echo
    echo "=== ${s}"
    start=${SECONDS}
    "step_${s}"
    rc=$?
    if ((rc == 0)); then
      results+=("$(printf 'PASS  %-12s %4ss' "${s}" $((SECONDS - start)))")
      passed=$((passed + 1))
    elif ((rc == SKIP)); then
      results+=("$(printf 'SKIP  %-12s' "${s}")")
      skipped=$((skipped + 1))
    else
      results+=("$(printf 'FAIL  %-12s %4ss  (exit %s)' "${s}" $((SECONDS - start)) "${rc}")")
      failed=$((failed + 1))
      # Without the dependencies nothing after can run.
      [[ "${s}" == deps ]] && break
      [[ "${s}" == build ]] && BUILD_FAILED=1
    fi
  done

  echo
  echo "=== summary"
  printf '  %s\n' "${results[@]}"
  skipped=$((${#steps[@]} - passed - failed))  # run, or never reached
  echo "steps: ${passed} passed, ${failed} failed$( ((skipped)) && echo ", ${skipped} skipped")"
  ((failed == 0))
}

main "$@"
