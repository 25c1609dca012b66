#!/usr/bin/env bash
# Builds samplerd (incrementally) and runs it in the foreground with the flags given:
#
#   deploy/local/run.sh [samplerd flags...]     e.g. --listen=unix:///tmp/s.sock --backend=cpu
#
# Installs missing dependencies first (deploy/local/install_deps.sh), prints where the server
# listens and ready-to-paste `buf curl` calls, then execs build/auto/service/samplerd.
# The `auto` preset builds the GPU backend when nvcc (CUDA) or hipcc (ROCm) is installed, else
# the CPU backend only; the server then samples on the GPU when one is present, else the CPU.
# Environment: SAMPLERD_PRESET=default forces a CPU-only build in build/default;
# SAMPLERD_SKIP_DEPS=1 skips the dependency check.
#
#   deploy/local/run.sh --mps [samplerd flags...]     (or SAMPLERD_MPS=1)
#
# also starts a private CUDA MPS control daemon (nvidia-cuda-mps-control -d) with fresh pipe and
# log directories, runs samplerd under it, prints how an engine joins the same daemon, and quits
# the daemon when samplerd exits. Device-session steps on the GPU plane then cost a few us
# instead of ~280 us of GPU context switches; the engine's CUDA-graph replay gets slower under
# MPS (docs/DEVICE_SESSIONS.md). It never changes GPU settings (no compute mode, no
# nvidia-smi -c): an MPS daemon of another user or a GPU in a mode that refuses MPS fails here.
set -euo pipefail
export SAMPLERD_PRESET="${SAMPLERD_PRESET:-auto}"
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# The server's default --listen (service/main.cc).
readonly DEFAULT_LISTEN="unix:///run/samplerd/samplerd.sock"

# flag_value NAME DEFAULT ARGS...: prints the value of the last --NAME flag in ARGS (absl accepts
# --NAME=X, --NAME X and the single-dash forms), or DEFAULT.
flag_value() {
  local name="$1" value="$2"
  shift 2
  while (($#)); do
    case "$1" in
      --"${name}"=* | -"${name}"=*) value="${1#*=}" ;;
      --"${name}" | -"${name}") (($# > 1)) && { value="$2"; shift; } ;;
    esac
    shift
  done
  printf '%s\n' "${value}"
}

# Prints the value of the last --listen flag in "$@", or DEFAULT_LISTEN.
listen_flag() { flag_value listen "${DEFAULT_LISTEN}" "$@"; }

# buf_target ADDRESS [TLS_CERT [TLS_CLIENT_CA]]: prints the `buf curl` connection flags and base
# URL for one gRPC listen address, tab-separated: "unix:///abs/p" and "unix:p" -> --unix-socket;
# "host:port" -> http://host:port (a wildcard host becomes localhost), or with TLS_CERT (the
# server's --tls_cert: TCP listeners speak TLS) https://host:port trusting that certificate, and
# with TLS_CLIENT_CA placeholders for the client certificate mutual TLS asks for. Prints nothing
# for forms buf curl cannot reach (e.g. unix-abstract:).
buf_target() {
  local addr="$1" tls_cert="${2:-}" client_ca="${3:-}" path
  case "${addr}" in
    unix://*) path="${addr#unix://}" ;;
    unix:*) path="${addr#unix:}" ;;
    unix-abstract:*) return 0 ;;
    *)
      local host="${addr%:*}" port="${addr##*:}"
      case "${host}" in "" | 0.0.0.0 | "[::]" | "::") host=localhost ;; esac
      if [[ -z "${tls_cert}" ]]; then
        printf -- '--protocol grpc --http2-prior-knowledge\thttp://%s:%s\n' "${host}" "${port}"
      else
        [[ "${tls_cert}" == /* ]] || tls_cert="${PWD}/${tls_cert}"
        local client=""
        [[ -n "${client_ca}" ]] && client=" --cert CLIENT_CERT.pem --key CLIENT_KEY.pem"
        printf -- '--protocol grpc --cacert %s%s\thttps://%s:%s\n' "${tls_cert}" "${client}" \
          "${host}" "${port}"
      fi
      return 0
      ;;
  esac
  [[ "${path}" == /* ]] || path="${PWD}/${path}"
  printf -- '--protocol grpc --http2-prior-knowledge --unix-socket %s\thttp://localhost\n' "${path}"
}

# print_usage_hints LISTEN [TLS_CERT [TLS_CLIENT_CA]]: where the server listens and buf curl calls
# for it (the values of --listen, --tls_cert and --tls_client_ca).
print_usage_hints() {
  # Hints use the first address buf curl can reach, preferring any over a TCP port 0, and a unix
  # socket (always plaintext) over a TLS port.
  local listen="$1" tls_cert="${2:-}" client_ca="${3:-}" first_target="" addr target
  IFS=, read -ra addrs <<<"${listen}"
  for addr in "${addrs[@]}"; do
    target="$(buf_target "${addr}" "${tls_cert}" "${client_ca}")"
    [[ -z "${target}" ]] && continue
    if [[ -z "${first_target}" || "${first_target}" == *:0 ||
          ("${first_target}" == *https://* && "${target}" != *https://*) ]]; then
      first_target="${target}"
    fi
  done
  printf '\nsamplerd %s\n  listening on: %s\n' "${SAMPLERD_BIN#"${SAMPLERD_ROOT}"/}" "${listen}"
  [[ -z "${first_target}" ]] && { printf '\n'; return 0; }

  local flags="${first_target%%$'\t'*}" base="${first_target#*$'\t'}"
  [[ "${base}" == *:0 ]] &&
    printf '  (port 0: the server logs the port it picked; use it in place of 0 below)\n'
  [[ "${flags}" == *CLIENT_CERT.pem* ]] &&
    printf '  (mutual TLS: use a client certificate and key that --tls_client_ca trusts)\n'
  local call="${SAMPLERD_BUF} curl ${flags}"
  local svc="${base}/samplerd.v1.SamplerService"
  # Four fp32 logits; greedy (temperature 0) picks the largest, index 2.
  local b64
  b64="$(samplerd::floats_base64 0.5 1.0 3.0 2.0)"
  local request='{"logits": {"dtype": "DTYPE_FP32", "shape": [1, 4], "inlineData": "'"${b64}"'"},'
  request+=' "params": [{"temperature": 0}]}'
  cat <<HINTS

Try it from another shell (grpcurl works the same way: the server has reflection):

  # services, health, server info
  ${call} --list-services ${base}
  ${call} ${base}/grpc.health.v1.Health/Check
  ${call} ${svc}/GetServerInfo

  # sample one row of 4 fp32 logits [0.5, 1.0, 3.0, 2.0] greedily: inlineData is their
  # little-endian bytes in base64 (${b64}); the answer has "tokenIds": [2]
  ${call} ${svc}/Sample -d '${request}'

HINTS
}

MPS_DIR=""

# Dies unless an NVIDIA GPU and the MPS control daemon are there (checked before building).
require_mps() {
  if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    samplerd::die "--mps needs an NVIDIA GPU (nvidia-smi -L lists none)"
  fi
  command -v nvidia-cuda-mps-control >/dev/null ||
    samplerd::die "--mps needs nvidia-cuda-mps-control (it comes with the NVIDIA driver)"
}

# Starts a private MPS control daemon and exports CUDA_MPS_PIPE_DIRECTORY and
# CUDA_MPS_LOG_DIRECTORY for samplerd.
start_mps() {
  MPS_DIR="$(mktemp -d "${TMPDIR:-/tmp}/samplerd-mps.XXXXXX")"
  export CUDA_MPS_PIPE_DIRECTORY="${MPS_DIR}/pipe" CUDA_MPS_LOG_DIRECTORY="${MPS_DIR}/log"
  mkdir -p "${CUDA_MPS_PIPE_DIRECTORY}" "${CUDA_MPS_LOG_DIRECTORY}"
  trap stop_mps EXIT
  nvidia-cuda-mps-control -d || samplerd::die "nvidia-cuda-mps-control -d failed"
  local i
  for ((i = 0; i < 100; i++)); do
    [[ -S "${CUDA_MPS_PIPE_DIRECTORY}/control" ]] && break
    sleep 0.1
  done
  [[ -S "${CUDA_MPS_PIPE_DIRECTORY}/control" ]] ||
    samplerd::die "the MPS control daemon did not start (log: ${CUDA_MPS_LOG_DIRECTORY})"
  cat <<MPS

CUDA MPS: a private control daemon runs for this server. An engine joins it (and only then
shares the GPU with samplerd without context switches) when started, as the same user, with:

  export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY}

Daemon log: ${CUDA_MPS_LOG_DIRECTORY}/control.log. It quits when samplerd exits.
MPS
}

# Quits the daemon started by start_mps (its MPS server ends with its last client).
stop_mps() {
  [[ -n "${MPS_DIR}" ]] || return 0
  echo quit | nvidia-cuda-mps-control >/dev/null 2>&1 || true
  rm -rf "${MPS_DIR}"
  MPS_DIR=""
}

# Runs samplerd as a child (not exec: the EXIT trap must quit the daemon afterwards), passing
# SIGTERM and SIGINT on so that it drains, and returns its exit status.
run_child() {
  "${SAMPLERD_BIN}" "$@" &
  local pid=$!
  trap 'kill -TERM "${pid}" 2>/dev/null' TERM
  trap 'kill -INT "${pid}" 2>/dev/null' INT
  local rc=0
  wait "${pid}" || rc=$?
  # A trapped signal interrupts `wait` (status > 128) before the child has exited.
  while kill -0 "${pid}" 2>/dev/null; do wait "${pid}" || rc=$?; done
  return "${rc}"
}

main() {
  local -a args=()
  local arg mps="${SAMPLERD_MPS:-0}"
  for arg in "$@"; do
    if [[ "${arg}" == --mps ]]; then mps=1; else args+=("${arg}"); fi
  done
  set -- "${args[@]+"${args[@]}"}"
  [[ "${mps}" == 1 ]] && require_mps
  "${SAMPLERD_ROOT}/deploy/local/install_deps.sh"
  samplerd::build samplerd
  [[ -x "${SAMPLERD_BIN}" ]] || samplerd::die "no server binary at ${SAMPLERD_BIN}"

  local arg
  for arg in "$@"; do
    # Help and version output should not be buried under hints.
    case "${arg}" in --help* | -help* | --version | -version) exec "${SAMPLERD_BIN}" "$@" ;; esac
  done
  local -a hint_args
  hint_args=("$(listen_flag "$@")" "$(flag_value tls_cert "" "$@")"
             "$(flag_value tls_client_ca "" "$@")")
  if [[ "${mps}" == 1 ]]; then
    start_mps
    print_usage_hints "${hint_args[@]}"
    run_child "$@"
    return
  fi
  print_usage_hints "${hint_args[@]}"
  exec "${SAMPLERD_BIN}" "$@"
}

# Sourced (tests/e2e/run_sh_hints_test.sh): only the functions, nothing run.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then main "$@"; fi
