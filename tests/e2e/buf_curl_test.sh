#!/usr/bin/env bash
# End-to-end test of the real samplerd binary through `buf curl` and server reflection, the way a
# person debugs it: list and describe services, health checks, Sample with inline logits, error
# statuses, GetServerInfo, and a clean SIGTERM shutdown.
#
#   tests/e2e/buf_curl_test.sh
#
# Starts build/default/service/samplerd (SAMPLERD_BIN overrides) with the CPU backend on a unix
# socket in a fresh temporary directory; uses the project-local buf (SAMPLERD_BUF overrides).
# Prints one PASS/FAIL line per check and exits non-zero if any failed.
set -uo pipefail
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../deploy/local/lib.sh"

readonly STOP_TIMEOUT_S="${SAMPLERD_E2E_STOP_TIMEOUT:-15}"  # from SIGTERM to exit
E2E_NAME=e2e
# shellcheck source=tests/e2e/e2e_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/e2e_lib.sh"

# tensor_json SHAPE_B SHAPE_V FLOATS...: the proto3 JSON of a DTYPE_FP32 logits tensor.
tensor_json() {
  local b="$1" v="$2"
  shift 2
  printf '{"dtype":"DTYPE_FP32","shape":[%s,%s],"inlineData":"%s"}' "$b" "$v" \
    "$(samplerd::floats_base64 "$@")"
}

check_list_services() {
  bufcurl --list-services http://localhost
  local svc missing=()
  for svc in samplerd.v1.SamplerService grpc.health.v1.Health; do
    grep -qFx -- "${svc}" "${TMP}/out" || missing+=("${svc}")
  done
  if ((RC != 0)); then fail "list services" "exit code ${RC}"
  elif ((${#missing[@]})); then fail "list services" "missing ${missing[*]}"
  else pass "list services (reflection): SamplerService and Health"
  fi
}

check_list_methods() {
  local name="describe via reflection: methods of $1"
  shift
  bufcurl --list-methods http://localhost
  local m missing=()
  for m in "$@"; do grep -qFx -- "${m}" "${TMP}/out" || missing+=("${m}"); done
  if ((RC != 0)); then fail "${name}" "exit code ${RC}"
  elif ((${#missing[@]})); then fail "${name}" "missing ${missing[*]}"
  else pass "${name}"
  fi
}

check_health() {
  local service="$1" label="${1:-\"\"}"
  call grpc.health.v1.Health/Check "{\"service\":\"${service}\"}"
  if ((RC != 0)); then fail "health ${label}" "exit code ${RC}"
  elif ! out_has '"status":"SERVING"'; then fail "health ${label}" "expected SERVING"
  else pass "health ${label} is SERVING"
  fi
}

check_sample_greedy() {
  # Row 0 peaks at index 2, row 1 at index 0; temperature 0 is greedy for every row.
  local logits
  logits="$(tensor_json 2 4 0.5 1.0 3.0 2.0 4.0 -1.0 0.25 3.5)"
  call samplerd.v1.SamplerService/Sample \
    "{\"requestId\":\"e2e-greedy\",\"logits\":${logits},\"params\":[{\"temperature\":0}]}"
  local name="Sample [2,4] greedy returns tokenIds [2,0]"
  if ((RC != 0)); then fail "${name}" "exit code ${RC}"
  elif ! out_has '"tokenIds":[2,0]'; then fail "${name}" "wrong token ids"
  elif ! out_has '"rowStatus":["ROW_STATUS_OK","ROW_STATUS_OK"]'; then fail "${name}" "row status"
  elif ! out_has '"requestId":"e2e-greedy"'; then fail "${name}" "requestId not echoed"
  else pass "${name}"
  fi
}

check_sample_ties_and_per_row_params() {
  # Row 0: a tie between 0 and 2 (lowest index wins); row 1: greedy picks 3.
  local logits
  logits="$(tensor_json 2 4 5.0 1.0 5.0 2.0 0.0 1.0 2.0 3.0)"
  call samplerd.v1.SamplerService/Sample \
    "{\"logits\":${logits},\"params\":[{\"temperature\":0},{\"temperature\":0,\"topK\":2}]}"
  local name="Sample with per-row params, greedy tie -> lowest index: tokenIds [0,3]"
  if ((RC != 0)); then fail "${name}" "exit code ${RC}"
  elif ! out_has '"tokenIds":[0,3]'; then fail "${name}" "wrong token ids"
  else pass "${name}"
  fi
}

check_sample_bad_row() {
  # A NaN row is reported per row; its neighbour is sampled as usual.
  local logits
  logits="$(tensor_json 2 4 1.0 NaN 0.0 0.0 0.0 0.0 0.0 9.0)"
  call samplerd.v1.SamplerService/Sample "{\"logits\":${logits},\"params\":[{\"temperature\":0}]}"
  local name="Sample with a NaN row: that row INVALID_NAN (-1), the other sampled"
  if ((RC != 0)); then fail "${name}" "exit code ${RC}"
  elif ! out_has '"tokenIds":[-1,3]'; then fail "${name}" "wrong token ids"
  elif ! out_has '"rowStatus":["ROW_STATUS_INVALID_NAN","ROW_STATUS_OK"]'; then
    fail "${name}" "wrong row status"
  else pass "${name}"
  fi
}

check_sample_seeded_replay() {
  local logits request first
  logits="$(tensor_json 1 8 0.1 0.2 0.3 0.4 0.5 0.6 0.7 0.8)"
  request="{\"logits\":${logits},\"params\":[{\"temperature\":1,\"seed\":\"42\",\"position\":7}]}"
  local name="Sample with seed and position replays the same token"
  call samplerd.v1.SamplerService/Sample "${request}"
  if ((RC != 0)); then fail "${name}" "exit code ${RC}"; return; fi
  first="$(compact_out | grep -o '"tokenIds":\[[^]]*\]')"
  if ! out_has '"seeds":["42"]'; then fail "${name}" "seed 42 not returned"; return; fi
  call samplerd.v1.SamplerService/Sample "${request}"
  if ((RC != 0)); then fail "${name}" "exit code ${RC} on replay"
  elif [[ -z "${first}" ]] || ! out_has "${first}"; then fail "${name}" "expected ${first} again"
  else pass "${name} (${first})"
  fi
}

check_sample_stream() {
  # Three steps on one stream; the middle one is invalid. Responses come in order, the bad step
  # is answered with its own status and the stream carries on.
  local good bad
  good="$(tensor_json 1 4 0.5 1.0 3.0 2.0)"
  bad='{"shape":[1,4],"inlineData":"AAAAPwAAgD8AAEBAAAAAQA=="}'
  call samplerd.v1.SamplerService/SampleStream "$(printf '%s\n' \
    "{\"request\":{\"requestId\":\"s1\",\"logits\":${good},\"params\":[{\"temperature\":0}]}}" \
    "{\"request\":{\"requestId\":\"s2\",\"logits\":${bad}}}" \
    "{\"request\":{\"requestId\":\"s3\",\"logits\":${good},\"params\":[{\"temperature\":0}]}}")"
  local name="SampleStream: steps answered in order, a bad step does not end the stream"
  local ids
  ids="$(compact_out | grep -o '"requestId":"s[0-9]"' | tr -d '\n')"
  if ((RC != 0)); then fail "${name}" "exit code ${RC}"
  elif [[ "${ids}" != '"requestId":"s1""requestId":"s2""requestId":"s3"' ]]; then
    fail "${name}" "expected responses s1 s2 s3 in order, got ${ids:-none}"
  elif ! out_has '"status":{"code":3,'; then fail "${name}" "no INVALID_ARGUMENT for step s2"
  elif [[ "$(compact_out | grep -o '"tokenIds":\[2\]' | wc -l)" != 2 ]]; then
    fail "${name}" "expected tokenIds [2] for steps s1 and s3"
  else pass "${name}"
  fi
}

# check_invalid NAME JSON: Sample must fail with INVALID_ARGUMENT (buf curl exits 8 × 3 = 24)
# and a message, and the server must keep serving.
check_invalid() {
  local name="$1"
  call samplerd.v1.SamplerService/Sample "$2"
  if ((RC != 24)); then fail "${name}" "expected exit code 24 (INVALID_ARGUMENT), got ${RC}"
  elif ! grep -q '"message": *"[^"]' "${TMP}/err"; then fail "${name}" "no error message"
  else pass "${name}: INVALID_ARGUMENT, $(grep -o '"message": *"[^"]*"' "${TMP}/err" | head -n 1)"
  fi
}

check_server_info() {
  call samplerd.v1.SamplerService/GetServerInfo
  local name="GetServerInfo says BACKEND_CPU"
  if ((RC != 0)); then fail "${name}" "exit code ${RC}"
  elif ! out_has '"backend":"BACKEND_CPU"'; then fail "${name}" "backend is not BACKEND_CPU"
  elif ! out_has '"version":"'; then fail "${name}" "no version"
  else pass "${name}"
  fi
}

check_sigterm() {
  local name="SIGTERM stops the server with exit code 0" rc
  kill -TERM "${SERVER_PID}"
  local deadline=$((SECONDS + STOP_TIMEOUT_S))
  while server_running && ((SECONDS < deadline)); do sleep 0.1; done
  : >"${TMP}/out"
  : >"${TMP}/err"
  if server_running; then
    fail "${name}" "still running ${STOP_TIMEOUT_S}s after SIGTERM"
    return
  fi
  wait "${SERVER_PID}"
  rc=$?
  SERVER_PID=""
  if ((rc != 0)); then fail "${name}" "exit code ${rc}"; else pass "${name}"; fi
}

main() {
  echo "e2e: ${SAMPLERD_BIN#"${SAMPLERD_ROOT}"/} on unix://${SOCK}," \
    "buf $("${SAMPLERD_BUF}" --version)"
  if start_server; then
    pass "server starts and health says SERVING"
    check_list_services
    check_list_methods "SamplerService and Health" \
      samplerd.v1.SamplerService/Sample samplerd.v1.SamplerService/GetServerInfo \
      grpc.health.v1.Health/Check grpc.health.v1.Health/Watch
    check_health ""
    check_health samplerd.v1.SamplerService
    check_sample_greedy
    check_sample_ties_and_per_row_params
    check_sample_bad_row
    check_sample_seeded_replay
    check_sample_stream
    check_invalid "Sample without dtype" \
      "{\"logits\":{\"shape\":[1,4],\"inlineData\":\"$(samplerd::floats_base64 1 2 3 4)\"}}"
    check_invalid "Sample with too few bytes for its shape" \
      "{\"logits\":$(tensor_json 2 4 1 2 3 4)}"
    check_invalid "Sample with negative temperature" \
      "{\"logits\":$(tensor_json 1 4 1 2 3 4),\"params\":[{\"temperature\":-1}]}"
    check_server_info
    check_health samplerd.v1.SamplerService  # still serving after the bad requests
    check_sigterm
  fi
  echo "e2e: ${PASSED} passed, ${FAILED} failed"
  ((FAILED == 0))
}

main "$@"
