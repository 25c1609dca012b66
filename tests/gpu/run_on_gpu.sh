#!/usr/bin/env bash
# Runs samplerd's GPU checks in one go, on a machine with an NVIDIA GPU, from the folder that
# tests/gpu/prepare_carry.sh assembles (.carry/gpu_run: payload.tar.xz with the binaries and lib/
# with the Debian gRPC libraries, unpacked into a temporary folder; the kernel benchmark). Needs
# bash, coreutils, tar with xz or python3, nvidia-smi; python3 with PyTorch and grpcio for the
# kernel benchmark and the PyTorch IPC producer. No network, no build.
#
#   cd .carry/gpu_run && bash run_on_gpu.sh [options]
#
# Steps, in order; each is logged in full to $RESULTS/<step>.log, reported PASS/FAIL, and a
# failure does not stop the later steps:
#   mps_start             (--mps only) a private CUDA MPS control daemon (fresh pipe and log
#                         folders), started before any GPU work so that every step runs under
#                         MPS; `quit` at exit. GPU settings (compute mode etc.) are never changed
#   gpu_sampler_test      GPU kernels vs the CPU reference (a skipped test counts as a failure)
#   gpu_statistics_test   the statistical suite on the GPU
#   gpu_processors_test   the logits processors (bitmask, bias, penalties) vs the CPU reference
#   gpu_ipc_runtime_test  GpuIpc over the runtime in one process (refusals, MemoryRange)
#   session_kernels       samplerd_session_gpu_test: the GPU plane's runner (device sessions)
#   servers_start         samplerd --backend=gpu and samplerd --backend=cpu on unix sockets
#   gpu_flag_refused      --gpu naming no device: exit 2, the devices listed (the GPU server
#                         itself runs with --gpu set to nvidia-smi's spelling of its bus id)
#   server_gpu_test       the GPU server vs the CPU server, through the C++ client
#   example_client        samplerd_example_sample_random against the GPU server
#   ipc_raw               samplerd_ipc_producer_raw: a C++ producer's GPU IPC regions and events,
#                         tokens vs the CPU server; bad ranges and handles; unregister in flight
#   ipc_torch             ipc_producer.py: PyTorch tensors shared by _share_cuda_(), ready and
#                         done events, tokens vs the CPU server (Python stubs from ./py)
#   ipc_owner             ipc_owner_kill.py: a producer's GPU IPC and host shm regions, owned by
#                         its pid, are released within 1 s of its SIGKILL (fds, shm mappings and
#                         GPU memory back to baseline)
#   pyclient_cuda         python_client_cuda.py: the Python client with CUDA tensors (GPU IPC regions
#                         cached per allocation, ready events, fallbacks), tokens vs the CPU server
#   cpp_session           samplerd_cpp_session_gpu_test: the C++ client's DeviceSession on the GPU
#                         plane with a token bitmask and processors (this process the engine),
#                         tokens and statuses vs the same server's unary Sample
#   device_session        device_session_cuda.py: device sessions (host and GPU plane; eager, CUDA
#                         graph, invalid rows, concurrency, engine / server SIGKILLed) vs unary
#                         Sample, and the per-step overhead benchmark (device_session_bench.json /
#                         .md into $RESULTS)
#   engine                decode_loop.py: a 0.5B decoder generating with PyTorch-native sampling vs
#                         samplerd over GPU IPC (a benchmark: engine.json / engine.md into $RESULTS)
#   transports            samplerd_bench_transports: round trips by transport vs the bare kernel
#                         (transports.json / transports.md into $RESULTS)
#   servers_stop          SIGTERM both servers; each must exit 0
#   bench                 bench_kernels.py: ours vs PyTorch (--json/--markdown into $RESULTS)
#
# SAMPLERD_GPU_SERVER_FLAGS (environment): more flags for the GPU server, e.g.
# "--host_plane_threads=12".
# $RESULTS is $OUT when set, else ./results. Exit status: 0 when every step passed, else 1.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE" || exit 2

usage() {
  cat <<'EOF'
usage: run_on_gpu.sh [--no-bench] [--bench-args "ARGS"] [--transport-args "ARGS"] [--only STEPS]
                     [--session-args "ARGS"] [--mps] [--timeout SECS] [--bench-timeout SECS]
                     [--deadline SECS]
  --no-bench           skip the kernel benchmark and the transport benchmark
  --bench-args "ARGS"  more arguments for bench_kernels.py, e.g. "--quick" or
                       "--batches 1,128 --vocabs 151936 --dtypes fp32"
  --transport-args "ARGS"  more arguments for samplerd_bench_transports, e.g. "--seconds 1"
  --engine-args "ARGS" more arguments for decode_loop.py, e.g. "--batches 1 --steps 16" or
                       "--samplers pytorch,session-host,session-gpu-graph"
  --session-args "ARGS" more arguments for device_session_cuda.py, e.g. "--quick" or
                       "--planes gpu --checks eager,graph"
  --mps                start a private CUDA MPS control daemon first (every step runs under it)
  --only STEPS         comma-separated groups to run: sampler,processors,statistics,server,ipc,
                       example,session_kernels,pyclient,cpp_session,device_session,engine,
                       transports,bench
  --timeout SECS       limit of each test step (default 240)
  --bench-timeout SECS limit of the benchmark (default 420)
  --deadline SECS      the whole run ends within this (default 570: a summary before a 600 s kill)
EOF
}

BENCH=1
BENCH_ARGS=""
TRANSPORT_ARGS=""
SESSION_ARGS=""
MPS=0
ONLY="sampler,processors,statistics,server,example,ipc,session_kernels,pyclient,cpp_session,device_session,engine,transports,bench"
ENGINE_ARGS=""
STEP_TIMEOUT=240
BENCH_TIMEOUT=420
DEADLINE=570
while (($# > 0)); do
  case "$1" in
    --no-bench) BENCH=0 ;;
    --bench-args) BENCH_ARGS="${2-}"; shift ;;
    --bench-args=*) BENCH_ARGS="${1#*=}" ;;
    --transport-args) TRANSPORT_ARGS="${2-}"; shift ;;
    --transport-args=*) TRANSPORT_ARGS="${1#*=}" ;;
    --engine-args) ENGINE_ARGS="${2-}"; shift ;;
    --engine-args=*) ENGINE_ARGS="${1#*=}" ;;
    --session-args) SESSION_ARGS="${2-}"; shift ;;
    --session-args=*) SESSION_ARGS="${1#*=}" ;;
    --mps) MPS=1 ;;
    --only) ONLY="${2-}"; shift ;;
    --only=*) ONLY="${1#*=}" ;;
    --timeout) STEP_TIMEOUT="${2-}"; shift ;;
    --timeout=*) STEP_TIMEOUT="${1#*=}" ;;
    --bench-timeout) BENCH_TIMEOUT="${2-}"; shift ;;
    --bench-timeout=*) BENCH_TIMEOUT="${1#*=}" ;;
    --deadline) DEADLINE="${2-}"; shift ;;
    --deadline=*) DEADLINE="${1#*=}" ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_on_gpu.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
for n in "$STEP_TIMEOUT" "$BENCH_TIMEOUT" "$DEADLINE"; do
  [[ "$n" =~ ^[0-9]+$ ]] || { echo "run_on_gpu.sh: expected a number of seconds, got '$n'" >&2; exit 2; }
done
selected() { [[ ",$ONLY," == *",$1,"* ]]; }

RESULTS="${OUT:-$HERE/results}"
mkdir -p "$RESULTS" || exit 2
START=$SECONDS

# The running step, our servers (by pid), our MPS daemon and the unpacked payload: ended and
# removed at exit, also when interrupted.
GPU_PID="" CPU_PID="" STEP_PID="" UNPACKED="" MPS_DIR="" MPS_CTL=""
# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
  local pid
  [[ -n "$STEP_PID" ]] && kill -TERM "$STEP_PID" 2>/dev/null  # `timeout` passes it on
  for pid in "$GPU_PID" "$CPU_PID"; do
    [[ -n "$pid" ]] && kill -KILL "$pid" 2>/dev/null
  done
  [[ -n "$MPS_DIR" ]] && stop_mps
  [[ -n "$UNPACKED" ]] && rm -rf "$UNPACKED"
  return 0
}
trap cleanup EXIT
trap 'echo "run_on_gpu.sh: interrupted" >&2; exit 130' INT TERM

# The binaries and lib/ come packed in payload.tar.xz (prepare_carry.sh). They are unpacked into a
# temporary folder, not next to this script, so that this folder stays small enough to carry.
# Without xz, Python's tarfile unpacks.
BIN="$HERE"
unpack() {  # unpack DIR
  tar -xJf "$HERE/payload.tar.xz" -C "$1" 2>/dev/null ||
    python3 - "$HERE/payload.tar.xz" "$1" <<'PY'
import sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    try:
        t.extractall(sys.argv[2], filter="tar")
    except TypeError:  # Python < 3.12
        t.extractall(sys.argv[2])
PY
}
if [[ -f "$HERE/payload.tar.xz" ]]; then
  UNPACKED="$(mktemp -d "${TMPDIR:-/tmp}/samplerd-gpu-run.XXXXXX")" || exit 2
  BIN="$UNPACKED"
  if ! unpack "$BIN"; then
    echo "run_on_gpu.sh: cannot unpack payload.tar.xz" >&2
    exit 2
  fi
  echo "unpacked payload.tar.xz into $BIN ($((SECONDS - START)) s)"
fi
[[ -x "$BIN/samplerd" ]] || chmod +x "$BIN"/samplerd* 2>/dev/null  # carried copies may lose x
# Only the gRPC binaries get lib/: python3 and nvidia-smi keep the machine's own libraries.
GRPC_ENV=(env "LD_LIBRARY_PATH=$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
# Line-buffered test output, so that a log cut off by a timeout still holds everything printed.
LINEBUF=()
command -v stdbuf >/dev/null 2>&1 && LINEBUF=(stdbuf -oL -eL)

# --- step bookkeeping: record, budget, show_tail, run_step, stop_mps and wait_ready ---------------
# shellcheck source=tests/gpu/run_on_gpu_steps.sh
source "$HERE/run_on_gpu_steps.sh"

# --- the device ---------------------------------------------------------------------------------
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  host: $(uname -n)  kernel: $(uname -r)"
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=index,name,pci.bus_id,uuid,driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.draw,temperature.gpu --format=csv 2>&1
  else
    echo "nvidia-smi: not found (no NVIDIA driver on this machine?)"
  fi
  [[ -f MANIFEST.txt ]] && sed -n '1,4p' MANIFEST.txt
  echo "binaries: $BIN"
} 2>&1 | tee "$RESULTS/device.txt"

# --- MPS (--mps) ---------------------------------------------------------------------------------
# A private control daemon: its own pipe and log folders, exported so that every later process
# (servers, tests, benchmarks) is its client. Only `nvidia-cuda-mps-control -d` and `quit`: no GPU
# setting (compute mode, clocks) is touched. (stop_mps: run_on_gpu_steps.sh.)
MPS_UP=0
if ((MPS)); then
  t0=$SECONDS
  log="$RESULTS/mps_start.log"
  MPS_CTL=/usr/local/nvidia/bin/nvidia-cuda-mps-control
  [[ -x "$MPS_CTL" ]] || MPS_CTL="$(command -v nvidia-cuda-mps-control 2>/dev/null)"
  if [[ -z "$MPS_CTL" ]]; then
    echo "nvidia-cuda-mps-control: not in /usr/local/nvidia/bin nor on PATH" >"$log"
    record mps_start FAIL 0 "nvidia-cuda-mps-control not found"
  else
    MPS_DIR="$(mktemp -d "${TMPDIR:-/tmp}/samplerd-mps.XXXXXX")" || exit 2
    mkdir -p "$MPS_DIR/pipe" "$MPS_DIR/log"
    export CUDA_MPS_PIPE_DIRECTORY="$MPS_DIR/pipe" CUDA_MPS_LOG_DIRECTORY="$MPS_DIR/log"
    {
      echo "--- $MPS_CTL -d  (CUDA_MPS_PIPE_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY)"
      "$MPS_CTL" -d
      echo "exit $?"
      # Up when it answers a query (within 5 s).
      for _ in $(seq 50); do
        if echo get_server_list | "$MPS_CTL"; then MPS_UP=1; break; fi
        sleep 0.1
      done
      echo "answers queries: $MPS_UP"
    } >"$log" 2>&1
    if ((MPS_UP)); then
      show_tail "$log" 3
      record mps_start PASS $((SECONDS - t0)) "CUDA_MPS_PIPE_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY"
    else
      show_tail "$log" 15
      stop_mps
      record mps_start FAIL $((SECONDS - t0)) "the MPS daemon did not start; the steps run without MPS"
    fi
  fi
  echo "mps: $( ((MPS_UP)) && echo "on, CUDA_MPS_PIPE_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY" || echo off)" \
    >>"$RESULTS/device.txt"
fi

# --- (a), (b) kernel tests ----------------------------------------------------------------------
if selected sampler; then
  run_step gpu_sampler_test "$STEP_TIMEOUT" "${LINEBUF[@]}" "$BIN/samplerd_gpu_sampler_test" \
    "--gtest_output=xml:$RESULTS/gpu_sampler_test.xml"
  run_step gpu_greedy_test "$STEP_TIMEOUT" "${LINEBUF[@]}" "$BIN/samplerd_gpu_greedy_test" \
    "--gtest_output=xml:$RESULTS/gpu_greedy_test.xml"
fi
if selected processors; then
  run_step gpu_processors_test "$STEP_TIMEOUT" "${LINEBUF[@]}" "$BIN/samplerd_gpu_processors_test" \
    "--gtest_output=xml:$RESULTS/gpu_processors_test.xml"
fi
if selected statistics; then
  run_step gpu_statistics_test "$STEP_TIMEOUT" "${LINEBUF[@]}" "$BIN/samplerd_gpu_statistics_test" \
    "--gtest_output=xml:$RESULTS/gpu_statistics_test.xml"
fi

if selected ipc; then
  run_step gpu_ipc_runtime_test "$STEP_TIMEOUT" "${GRPC_ENV[@]}" "${LINEBUF[@]}" \
    "$BIN/samplerd_gpu_ipc_runtime_test" "--gtest_output=xml:$RESULTS/gpu_ipc_runtime_test.xml"
fi

# The GPU plane of device sessions in one process (no server needed).
if selected session_kernels; then
  if [[ -x "$BIN/samplerd_session_gpu_test" ]]; then
    run_step session_kernels "$STEP_TIMEOUT" "${GRPC_ENV[@]}" "${LINEBUF[@]}" \
      "$BIN/samplerd_session_gpu_test" "--gtest_output=xml:$RESULTS/session_kernels.xml"
  else
    echo "not run: samplerd_session_gpu_test is not in the payload" >"$RESULTS/session_kernels.log"
    record session_kernels FAIL 0 "not run: samplerd_session_gpu_test missing (prepare_carry.sh)"
  fi
fi

# --- (c), (d) the server on the GPU -------------------------------------------------------------
SOCK_DIR=/tmp/samplerd-gpu
GPU_TARGET="unix://$SOCK_DIR/s.sock"
CPU_TARGET="unix://$SOCK_DIR/cpu.sock"
GPU_UP=0 CPU_UP=0


if selected server || selected example || selected ipc || selected pyclient ||
   selected cpp_session || selected device_session || (selected engine && ((BENCH))) ||
   (selected transports && ((BENCH))); then
  t0=$SECONDS
  log="$RESULTS/servers_start.log"
  rm -rf "$SOCK_DIR" && mkdir -p "$SOCK_DIR"
  echo "--- servers_start: samplerd --backend=gpu --listen=$GPU_TARGET; samplerd --backend=cpu --listen=$CPU_TARGET"
  # --gpu in nvidia-smi's spelling of the bus id (8-digit domain): the server must accept it.
  gpu_flag=()
  smi_bus="$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i 0 2>/dev/null | head -n 1)"
  [[ -n "$smi_bus" ]] && gpu_flag=("--gpu=$smi_bus")
  # SAMPLERD_GPU_SERVER_FLAGS: more flags for the GPU server (say --host_plane_threads=12).
  extra_flags=()
  read -r -a extra_flags <<<"${SAMPLERD_GPU_SERVER_FLAGS:-}"
  "${GRPC_ENV[@]}" "$BIN/samplerd" --backend=gpu "${gpu_flag[@]}" "--listen=$GPU_TARGET" --grace_period=10s \
    "${extra_flags[@]}" >"$RESULTS/server_gpu.log" 2>&1 &
  GPU_PID=$!
  "${GRPC_ENV[@]}" "$BIN/samplerd" --backend=cpu "--listen=$CPU_TARGET" --grace_period=10s \
    >"$RESULTS/server_cpu.log" 2>&1 &
  CPU_PID=$!
  {
    wait_ready "GPU server" "$GPU_PID" "$RESULTS/server_gpu.log" && GPU_UP=1
    wait_ready "CPU server" "$CPU_PID" "$RESULTS/server_cpu.log" && CPU_UP=1
  } >"$log" 2>&1
  # wait_ready ran in this shell (a { } group, not a subshell), so GPU_UP/CPU_UP are set here.
  ((GPU_UP)) || GPU_PID=""
  ((CPU_UP)) || CPU_PID=""
  note=""
  ((GPU_UP)) || note="GPU server did not start: $(grep -m 1 -E 'samplerd: ' "$RESULTS/server_gpu.log" | sed 's/^[^ ]* samplerd: //' | cut -c1-200)"
  ((CPU_UP)) || note="${note:+$note; }CPU server did not start"
  if ((GPU_UP && CPU_UP)); then
    show_tail "$log" 2
    record servers_start PASS $((SECONDS - t0)) ""
  else
    show_tail "$log" 25
    record servers_start FAIL $((SECONDS - t0)) "$note"
  fi

  if selected server; then
    # A --gpu naming no device: exit 2 before serving, with the devices listed.
    run_step gpu_flag_refused 60 bash -c 'out="$("$@" --backend=gpu --gpu=0000:ff:1f.7 \
        --listen=unix:///tmp/samplerd-gpu-flag.sock 2>&1)"; rc=$?; echo "$out"; echo "exit $rc"
        ((rc == 2)) && [[ "$out" == *"expected --gpu to name one GPU by PCI bus id or UUID"* ]]' \
      _ "${GRPC_ENV[@]}" "$BIN/samplerd"
    # Run even without a GPU server: the binary then skips, and the skip fails the step.
    test_env=("${GRPC_ENV[@]}")
    ((GPU_UP)) && test_env+=("SAMPLERD_TEST_GPU_SERVER=$GPU_TARGET")
    ((CPU_UP)) && test_env+=("SAMPLERD_TEST_CPU_SERVER=$CPU_TARGET")
    run_step server_gpu_test "$STEP_TIMEOUT" "${test_env[@]}" "${LINEBUF[@]}" \
      "$BIN/samplerd_server_gpu_test" \
      "--gtest_output=xml:$RESULTS/server_gpu_test.xml"
  fi

  if selected example; then
    if ((GPU_UP)); then
      run_step example_client 60 "${GRPC_ENV[@]}" "$BIN/samplerd_example_sample_random" \
        "--target=$GPU_TARGET" --batch=8 --vocab=151936 --iters=5
    else
      echo "not run: no GPU server" >"$RESULTS/example_client.log"
      record example_client FAIL 0 "not run: no GPU server"
    fi
  fi

  # GPU IPC from two producer processes (C++ and PyTorch), each against both servers.
  if selected ipc; then
    if ((GPU_UP && CPU_UP)); then
      run_step ipc_raw "$STEP_TIMEOUT" "${GRPC_ENV[@]}" "SAMPLERD_TEST_GPU_SERVER=$GPU_TARGET" \
        "SAMPLERD_TEST_CPU_SERVER=$CPU_TARGET" "${LINEBUF[@]}" "$BIN/samplerd_ipc_producer_raw" \
        "--gtest_output=xml:$RESULTS/ipc_raw.xml"
      run_step ipc_torch "$STEP_TIMEOUT" python3 -u "$HERE/ipc_producer.py" \
        --gpu "$GPU_TARGET" --cpu "$CPU_TARGET" --stubs "$HERE/py"
      run_step ipc_owner "$STEP_TIMEOUT" python3 -u "$HERE/ipc_owner_kill.py" \
        --gpu "$GPU_TARGET" --server-pid "$GPU_PID" --stubs "$HERE/py"
    else
      for name in ipc_raw ipc_torch ipc_owner; do
        echo "not run: both servers are needed" >"$RESULTS/$name.log"
        record "$name" FAIL 0 "not run: both servers are needed"
      done
    fi
  fi

  # The Python client with CUDA tensors, against both servers.
  if selected pyclient; then
    if ((GPU_UP && CPU_UP)); then
      run_step pyclient_cuda "$STEP_TIMEOUT" python3 -u "$HERE/python_client_cuda.py" \
        --gpu "$GPU_TARGET" --cpu "$CPU_TARGET" --py "$HERE/py"
    else
      echo "not run: both servers are needed" >"$RESULTS/pyclient_cuda.log"
      record pyclient_cuda FAIL 0 "not run: both servers are needed"
    fi
  fi

  # The C++ client's GPU-plane device session with processors, against the GPU server. Run
  # even without the GPU server (when the binary is there): it then skips, which fails the step.
  if selected cpp_session; then
    if [[ -x "$BIN/samplerd_cpp_session_gpu_test" ]]; then
      test_env=("${GRPC_ENV[@]}")
      ((GPU_UP)) && test_env+=("SAMPLERD_TEST_GPU_SERVER=$GPU_TARGET")
      run_step cpp_session "$STEP_TIMEOUT" "${test_env[@]}" "${LINEBUF[@]}" \
        "$BIN/samplerd_cpp_session_gpu_test" "--gtest_output=xml:$RESULTS/cpp_session.xml"
    else
      echo "not run: samplerd_cpp_session_gpu_test is not in the payload" >"$RESULTS/cpp_session.log"
      record cpp_session FAIL 0 "not run: samplerd_cpp_session_gpu_test missing (prepare_carry.sh)"
    fi
  fi

  # Device sessions against the GPU server (server_kill starts servers of its own), with the
  # per-step overhead benchmark (device_session_bench.json / .md into $RESULTS).
  if selected device_session; then
    if ((GPU_UP)); then
      session_argv=()
      read -r -a session_argv <<<"$SESSION_ARGS"
      ((MPS_UP)) && session_argv+=(--expect-mps)
      # Its own deadline inside the step's limit, so that its summary prints before a timeout.
      ds_limit="$(budget "$STEP_TIMEOUT")"
      ((ds_limit > 45)) && session_argv=(--deadline $((ds_limit - 15)) "${session_argv[@]}")
      run_step device_session "$STEP_TIMEOUT" python3 -u "$HERE/device_session_cuda.py" \
        --gpu "$GPU_TARGET" --py "$HERE/py" --samplerd "$BIN/samplerd" --lib-dir "$BIN/lib" \
        --server-pid "$GPU_PID" --capi "$BIN/libsamplerd_capi.so" --results "$RESULTS" \
        "${session_argv[@]}"
      [[ -s "$RESULTS/device_session_bench.md" ]] &&
        echo "    device-session table: $RESULTS/device_session_bench.md"
    else
      echo "not run: no GPU server" >"$RESULTS/device_session.log"
      record device_session FAIL 0 "not run: no GPU server"
    fi
  fi

  # The engine decode loop (a benchmark: its numbers go to $RESULTS).
  if selected engine && ((BENCH)); then
    if ((GPU_UP)); then
      engine_argv=()
      read -r -a engine_argv <<<"$ENGINE_ARGS"
      run_step engine "$BENCH_TIMEOUT" python3 -u "$HERE/decode_loop.py" --target "$GPU_TARGET" \
        --py "$HERE/py" --json "$RESULTS/engine.json" --markdown "$RESULTS/engine.md" \
        "${engine_argv[@]}"
    else
      echo "not run: no GPU server" >"$RESULTS/engine.log"
      record engine FAIL 0 "not run: no GPU server"
    fi
  fi

  # Round trips by transport against the GPU server (a benchmark: its numbers go to $RESULTS).
  if selected transports && ((BENCH)); then
    if ((GPU_UP)); then
      transport_argv=()
      read -r -a transport_argv <<<"$TRANSPORT_ARGS"
      run_step transports "$STEP_TIMEOUT" "${GRPC_ENV[@]}" "${LINEBUF[@]}" \
        "$BIN/samplerd_bench_transports" --target "$GPU_TARGET" \
        --json "$RESULTS/transports.json" --markdown "$RESULTS/transports.md" "${transport_argv[@]}"
      [[ -s "$RESULTS/transports.md" ]] && echo "    transports table: $RESULTS/transports.md"
    else
      echo "not run: no GPU server" >"$RESULTS/transports.log"
      record transports FAIL 0 "not run: no GPU server"
    fi
  fi

  # SIGTERM both; each must drain and exit 0.
  t0=$SECONDS
  log="$RESULTS/servers_stop.log"
  : >"$log"
  note=""
  for which in GPU CPU; do
    if [[ "$which" == GPU ]]; then pid="$GPU_PID"; else pid="$CPU_PID"; fi
    [[ -n "$pid" ]] || continue
    kill -TERM "$pid" 2>/dev/null
    waited=0
    while kill -0 "$pid" 2>/dev/null && ((waited < 300)); do sleep 0.1; waited=$((waited + 1)); done
    if kill -0 "$pid" 2>/dev/null; then
      kill -KILL "$pid" 2>/dev/null
      note="${note:+$note; }$which server still running 30 s after SIGTERM (killed)"
    fi
    wait "$pid"
    rc=$?
    echo "$which server (pid $pid): exit code $rc after SIGTERM" >>"$log"
    ((rc == 0)) || note="${note:+$note; }$which server exit code $rc"
    if [[ "$which" == GPU ]]; then GPU_PID=""; else CPU_PID=""; fi
  done
  if [[ ! -s "$log" ]]; then
    echo "no server was running" >>"$log"
    note="no server was running"
  fi
  for which in gpu cpu; do
    echo "--- server_$which.log (last lines)" >>"$log"
    tail -n 5 "$RESULTS/server_$which.log" >>"$log" 2>/dev/null
  done
  show_tail "$log" 14
  if [[ -z "$note" ]]; then
    record servers_stop PASS $((SECONDS - t0)) ""
  else
    record servers_stop FAIL $((SECONDS - t0)) "$note"
  fi
fi

# --- (e) the kernel benchmark -------------------------------------------------------------------
if selected bench && ((BENCH)); then
  bench_argv=()
  read -r -a bench_argv <<<"$BENCH_ARGS"
  run_step bench "$BENCH_TIMEOUT" python3 -u "$HERE/bench_kernels.py" --lib "$BIN/libsamplerd_capi.so" \
    --json "$RESULTS/bench.json" --markdown "$RESULTS/bench.md" "${bench_argv[@]}"
  if [[ -s "$RESULTS/bench.md" ]]; then
    echo "    bench table: $RESULTS/bench.md ($(wc -l <"$RESULTS/bench.md") lines)"
  fi
fi

# --- summary ------------------------------------------------------------------------------------
failed=0
{
  echo
  echo "==== run_on_gpu.sh summary ($((SECONDS - START)) s; logs in $RESULTS; MPS $( ((MPS_UP)) && echo on || echo off)) ===="
  printf '%-20s %-6s %7s  %s\n' step result seconds note
  for i in "${!NAMES[@]}"; do
    printf '%-20s %-6s %7s  %s\n' "${NAMES[$i]}" "${RESULTS_OF[$i]}" "${SECONDS_OF[$i]}" "${NOTES[$i]}"
    [[ "${RESULTS_OF[$i]}" == PASS ]] || failed=$((failed + 1))
  done
  if ((${#NAMES[@]} == 0)); then echo "(no step selected)"; fi
  if ((failed)); then echo "FAILED: $failed step(s)"; else echo "ALL PASSED"; fi
} | tee "$RESULTS/summary.txt"
# The table ran in a pipeline (a subshell): count again here for the exit status.
for r in "${RESULTS_OF[@]}"; do [[ "$r" == PASS ]] || exit 1; done
((${#NAMES[@]} > 0)) || exit 1
exit 0
