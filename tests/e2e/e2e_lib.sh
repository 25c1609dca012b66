# shellcheck shell=bash
# Shared by tests/e2e/*_test.sh (sourced, after deploy/local/lib.sh): a temporary folder with the
# server's socket and log, PASS/FAIL bookkeeping, `buf curl` calls, and starting the real server
# until health says SERVING. Set E2E_NAME (the temporary folder's tag) before sourcing.
#
#   pass NAME / fail NAME WHY       count and print a check (fail also shows the last call)
#   bufcurl ARGS... / call METHOD [JSON]   one buf curl: $TMP/out, $TMP/err, exit code in RC
#   out_has FRAGMENT                the last output, whitespace removed, contains FRAGMENT
#   start_server [FLAGS...]         samplerd --backend=cpu on $SOCK; 0 once SERVING
#   server_running                  the server process exists and is not a zombie

readonly START_TIMEOUT_S="${SAMPLERD_E2E_START_TIMEOUT:-30}"  # until health says SERVING
readonly CALL_TIMEOUT_S=30                                    # any single buf curl call

[[ -x "${SAMPLERD_BIN}" ]] || samplerd::die "no server binary at ${SAMPLERD_BIN} (build first)"
[[ -x "${SAMPLERD_BUF}" ]] ||
  samplerd::die "no buf at ${SAMPLERD_BUF} (run deploy/local/install_deps.sh)"

TMP="$(mktemp -d "${TMPDIR:-/tmp}/samplerd-${E2E_NAME:-e2e}.XXXXXX")"
readonly TMP SOCK="${TMP}/s.sock" SERVER_LOG="${TMP}/server.log"
SERVER_PID=""
PASSED=0
FAILED=0
RC=0

e2e::cleanup() {
  if [[ -n "${SERVER_PID}" ]] && kill -0 "${SERVER_PID}" 2>/dev/null; then
    kill -KILL "${SERVER_PID}" 2>/dev/null
    wait "${SERVER_PID}" 2>/dev/null
  fi
  if ((FAILED > 0)) && [[ -s "${SERVER_LOG}" ]]; then
    echo "--- server log (last 40 lines) ---"
    tail -n 40 "${SERVER_LOG}"
  fi
  rm -rf "${TMP}"
}
trap e2e::cleanup EXIT

pass() { echo "PASS  $1"; PASSED=$((PASSED + 1)); }
fail() {
  echo "FAIL  $1: $2"
  sed 's/^/      stdout| /' "${TMP}/out" 2>/dev/null | head -n 20
  sed 's/^/      stderr| /' "${TMP}/err" 2>/dev/null | head -n 20
  FAILED=$((FAILED + 1))
}

server_running() {
  local state
  state="$(awk '{print $3}' "/proc/${SERVER_PID}/stat" 2>/dev/null)" || return 1
  [[ -n "${state}" && "${state}" != Z ]]
}

bufcurl() {
  timeout "${CALL_TIMEOUT_S}" "${SAMPLERD_BUF}" curl --protocol grpc --http2-prior-knowledge \
    --unix-socket "${SOCK}" "$@" >"${TMP}/out" 2>"${TMP}/err"
  RC=$?
}
call() {
  if (($# > 1)); then bufcurl "http://localhost/$1" -d "$2"; else bufcurl "http://localhost/$1"; fi
}
compact_out() { tr -d ' \t\n' <"${TMP}/out"; }
out_has() { compact_out | grep -qF -- "$1"; }

start_server() {
  "${SAMPLERD_BIN}" --listen="unix://${SOCK}" --backend=cpu "$@" >"${SERVER_LOG}" 2>&1 &
  SERVER_PID=$!
  local deadline=$((SECONDS + START_TIMEOUT_S))
  while ((SECONDS < deadline)); do
    if ! server_running; then
      fail "server starts" "samplerd exited during start-up"
      return 1
    fi
    if [[ -S "${SOCK}" ]]; then
      call grpc.health.v1.Health/Check
      ((RC == 0)) && out_has '"status":"SERVING"' && return 0
    fi
    sleep 0.1  # poll interval, not synchronisation: readiness is the health answer above
  done
  fail "server starts" "health did not say SERVING within ${START_TIMEOUT_S}s"
  return 1
}
