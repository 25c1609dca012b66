#!/usr/bin/env bash
# The ready-to-paste `buf curl` calls deploy/local/run.sh prints work against the server it starts:
# on a unix socket, on a plaintext TCP port, and on a TCP port with TLS (--tls_cert/--tls_key),
# where the hints must speak https and trust the server's certificate, or use a unix socket the
# same server listens on.
#
#   tests/e2e/run_sh_hints_test.sh
#
# Sources run.sh for its functions (print_usage_hints), starts the real server for each case and
# runs the printed health check. Prints one PASS/FAIL line per check; exits non-zero on failure.
set -uo pipefail
# run.sh builds build/auto by default; the tests run build/default's binary (SAMPLERD_BIN wins).
export SAMPLERD_PRESET="${SAMPLERD_PRESET:-default}"
# shellcheck source=deploy/local/run.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../deploy/local/run.sh"
set +e  # run.sh sets -e; the checks below look at exit codes themselves

E2E_NAME=run-sh-hints
# shellcheck source=tests/e2e/e2e_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/e2e_lib.sh"

# A self-signed certificate for localhost and 127.0.0.1.
make_cert() {
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "${TMP}/key.pem" -out "${TMP}/cert.pem" \
    -days 1 -subj /CN=localhost -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
    >/dev/null 2>&1
}

# The port the server logged for its TCP listener ("listening on ..., 127.0.0.1:PORT").
logged_port() {
  local i
  for ((i = 0; i < 100; i++)); do
    local port
    port="$(grep -o 'listening on .*' "${SERVER_LOG}" | grep -oE '127\.0\.0\.1:[0-9]+' |
      head -n 1 | cut -d: -f2)"
    [[ -n "${port}" ]] && { echo "${port}"; return 0; }
    sleep 0.1  # poll interval for the log line
  done
  return 1
}

# check NAME FRAGMENT LISTEN [TLS_CERT]: prints run.sh's hints for the running server (the
# arguments of print_usage_hints), runs the health check among them and expects SERVING; the
# call must contain FRAGMENT.
check() {
  local name="$1" fragment="$2"
  shift 2
  local hints call
  hints="$(print_usage_hints "$@")"
  call="$(grep -m1 'grpc.health.v1.Health/Check' <<<"${hints}" | sed 's/^ *//')"
  if [[ -z "${call}" ]]; then
    fail "${name}" "no health check among the hints: ${hints}"
    return
  fi
  if [[ "${call}" != *"${fragment}"* ]]; then
    fail "${name}" "expected the hint to use '${fragment}', got: ${call}"
    return
  fi
  eval "timeout ${CALL_TIMEOUT_S} ${call}" >"${TMP}/out" 2>"${TMP}/err"
  RC=$?
  if ((RC == 0)) && out_has '"status":"SERVING"'; then
    pass "${name}: ${call#*curl }"
  else
    fail "${name}" "the printed call failed (exit ${RC}): ${call}"
  fi
}

stop_server() {
  kill -TERM "${SERVER_PID}" 2>/dev/null
  wait "${SERVER_PID}" 2>/dev/null
  SERVER_PID=""
}

make_cert || samplerd::die "openssl could not make a test certificate"

# A unix socket: the common case.
if start_server --grace_period=1s; then
  check "unix socket" "--unix-socket ${SOCK}" "unix://${SOCK}"
  stop_server
fi

# Plaintext TCP beside the unix socket, hinted alone.
"${SAMPLERD_BIN}" --listen=127.0.0.1:0 --backend=cpu --grace_period=1s >"${SERVER_LOG}" 2>&1 &
SERVER_PID=$!
if port="$(logged_port)"; then
  check "plaintext TCP" "http://127.0.0.1:${port}" "127.0.0.1:${port}"
else
  fail "plaintext TCP" "the server logged no TCP port"
fi
stop_server

# TLS on TCP: the hint speaks https and trusts --tls_cert (it used plaintext h2c and failed).
"${SAMPLERD_BIN}" --listen=127.0.0.1:0 --backend=cpu --grace_period=1s \
  --tls_cert="${TMP}/cert.pem" --tls_key="${TMP}/key.pem" >"${SERVER_LOG}" 2>&1 &
SERVER_PID=$!
if port="$(logged_port)"; then
  check "TLS TCP" "https://127.0.0.1:${port}" "127.0.0.1:${port}" "${TMP}/cert.pem"
else
  fail "TLS TCP" "the server logged no TCP port"
fi
stop_server

# TLS on TCP listed first, and a unix socket: the hint takes the plaintext unix socket.
"${SAMPLERD_BIN}" --listen="127.0.0.1:0,unix://${SOCK}" --backend=cpu --grace_period=1s \
  --tls_cert="${TMP}/cert.pem" --tls_key="${TMP}/key.pem" >"${SERVER_LOG}" 2>&1 &
SERVER_PID=$!
if port="$(logged_port)"; then
  check "TLS TCP and a unix socket" "--unix-socket ${SOCK}" "127.0.0.1:${port},unix://${SOCK}" \
    "${TMP}/cert.pem"
else
  fail "TLS TCP and a unix socket" "the server logged no TCP port"
fi
stop_server

echo "run.sh hints: ${PASSED} passed, ${FAILED} failed"
((FAILED == 0))
