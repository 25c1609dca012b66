#!/usr/bin/env bash
# Runs mps_graph_probe twice on the GPU machine (issue 10): once plain, then under a private
# MPS daemon started here. Builds nothing:
#
#   tests/gpu/probes/run_mps_probe.sh /tmp/mps_graph_probe [PROBE FLAGS...]
#
# Each run's output goes to stdout after a header line, "== no MPS ==" then "== MPS ==". The
# daemon runs as this user with its pipe and log folders in fresh mktemp -d folders, and a trap
# always tells it to quit. Changes no GPU setting (no compute mode, clocks or reset). Exits
# non-zero if either run failed or the daemon did not start.
set -euo pipefail

if [[ $# -lt 1 || ! -x "$1" ]]; then
  echo "usage: $0 PROBE_BINARY [PROBE FLAGS...]  (got: ${1:-nothing})" >&2
  exit 2
fi
PROBE="$1"
shift

MPS_CONTROL=/usr/local/nvidia/bin/nvidia-cuda-mps-control
if [[ ! -x "$MPS_CONTROL" ]]; then
  MPS_CONTROL="$(command -v nvidia-cuda-mps-control || true)"
fi

status=0

echo "== no MPS =="
(
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  "$PROBE" "$@"
) || status=$?

if [[ -z "$MPS_CONTROL" ]]; then
  echo "nvidia-cuda-mps-control not found in /usr/local/nvidia/bin or on PATH" >&2
  exit 1
fi

CUDA_MPS_PIPE_DIRECTORY="$(mktemp -d)"
CUDA_MPS_LOG_DIRECTORY="$(mktemp -d)"
export CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY

# shellcheck disable=SC2317  # invoked by the EXIT trap
# Tells the daemon to quit and waits (up to 10 s) for the control daemon's pid to go; the logs
# stay in CUDA_MPS_LOG_DIRECTORY.
stop_mps() {
  local pid_file="$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid"
  local pid=""
  [[ -r "$pid_file" ]] && pid="$(cat "$pid_file")"
  echo quit | "$MPS_CONTROL" >/dev/null 2>&1 || true
  if [[ -n "$pid" ]]; then
    for _ in $(seq 1 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
  fi
  echo "MPS logs: $CUDA_MPS_LOG_DIRECTORY" >&2
}
trap stop_mps EXIT

"$MPS_CONTROL" -d
echo "== MPS =="
"$PROBE" "$@" || status=$?
# Shows that the probe really went through an MPS server (empty if it did not).
echo "MPS server list: $(echo get_server_list | "$MPS_CONTROL" 2>&1 | tr '\n' ' ')"
if [[ $status -ne 0 ]]; then
  for log in "$CUDA_MPS_LOG_DIRECTORY"/*.log; do
    [[ -r "$log" ]] || continue
    echo "--- $log (last 20 lines)" >&2
    tail -n 20 "$log" >&2
  done
fi
exit "$status"
