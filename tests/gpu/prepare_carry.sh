#!/usr/bin/env bash
# Builds the CUDA tree here and assembles .carry/gpu_run/: everything tests/gpu/run_on_gpu.sh
# needs on the GPU machine (which has no Debian gRPC/Abseil libraries and no network).
#
#   tests/gpu/prepare_carry.sh            # build build/cuda, assemble .carry/gpu_run, check it
#
# Then, on the GPU machine, from the repository root with .carry/gpu_run carried along:
#   cd .carry/gpu_run && bash run_on_gpu.sh [--bench-args "--quick"] [--no-bench]
#
# The folder holds run_on_gpu.sh, bench_kernels.py, bench_processors.py, ipc_producer.py,
# ipc_owner_kill.py, python_client_cuda.py, device_session_cuda.py with its modules session_common.py,
# session_checks_correctness.py, session_checks_kill.py, session_checks_bench.py and
# session_checks_processors.py, session_bench_processors.py,
# decode_loop.py, kernel_ab.sh and profile_cases.py (A/B of two kernel libraries), py/ (the Python client package
# with the stubs of proto/samplerd/v1/*.proto, generated here with protoc and grpc_python_plugin: the GPU
# machine has grpcio and protobuf but no generator), README.md, MANIFEST.txt and payload.tar.xz
# (the stripped binaries, libsamplerd_capi.so and lib/ with the Debian shared libraries of the
# gRPC binaries), which run_on_gpu.sh unpacks.
#
# Environment: SAMPLERD_CUDA_BUILD (build folder, default build/cuda), SAMPLERD_CARRY_DIR
# (default .carry/gpu_run), SAMPLERD_CARRY_OLD_DIR (where the replaced carry's kernel library
# is kept, default the carry's sibling old/), JOBS (ninja -j, default 2), SAMPLERD_CARRY_MAX_MIB (default 60),
# SAMPLERD_CARRY_PACK=0 (leave the files unpacked: ~50 MiB).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
BUILD="${SAMPLERD_CUDA_BUILD:-build/cuda}"
CARRY="$(realpath -m "${SAMPLERD_CARRY_DIR:-.carry/gpu_run}")"
JOBS="${JOBS:-2}"
MAX_MIB="${SAMPLERD_CARRY_MAX_MIB:-60}"

log() { printf 'prepare_carry: %s\n' "$*"; }
die() { printf 'prepare_carry: error: %s\n' "$*" >&2; exit 1; }

# --- build --------------------------------------------------------------------------------------
if [[ ! -f "$BUILD/CMakeCache.txt" ]]; then
  log "configuring $BUILD (CUDA, Release)"
  cmake -S . -B "$BUILD" -G Ninja -DSAMPLERD_GPU=cuda -DCMAKE_BUILD_TYPE=Release
fi
grep -q '^SAMPLERD_GPU:STRING=cuda$' "$BUILD/CMakeCache.txt" ||
  die "$BUILD is not configured with -DSAMPLERD_GPU=cuda"

TARGETS=(samplerd samplerd_gpu_sampler_test samplerd_gpu_greedy_test samplerd_gpu_statistics_test
         samplerd_gpu_processors_test
         samplerd_server_gpu_test
         samplerd_capi samplerd_example_sample_random samplerd_gpu_ipc_runtime_test
         samplerd_ipc_producer_raw samplerd_bench_transports)
# Targets carried when the tree has them (run_on_gpu.sh reports a missing one as a failed step).
OPTIONAL_TARGETS=(samplerd_session_gpu_test samplerd_cpp_session_gpu_test bench_fast_cpu)
MISSING=()
ninja -C "$BUILD" build.ninja >/dev/null  # re-runs CMake when a CMakeLists.txt changed
for target in "${OPTIONAL_TARGETS[@]}"; do
  if ninja -C "$BUILD" -t query "$target" >/dev/null 2>&1; then
    TARGETS+=("$target")
  else
    MISSING+=("$target")
    log "warning: no target $target in $BUILD (not carried; its step will fail)"
  fi
done
log "building ${TARGETS[*]} (ninja -j$JOBS)"
ninja -C "$BUILD" -j"$JOBS" "${TARGETS[@]}"

# Where each target's file is in the build tree.
declare -A BUILT=(
  [samplerd]="$BUILD/service/samplerd"
  [samplerd_gpu_sampler_test]="$BUILD/tests/gpu/samplerd_gpu_sampler_test"
  [samplerd_gpu_greedy_test]="$BUILD/tests/gpu/samplerd_gpu_greedy_test"
  [samplerd_gpu_statistics_test]="$BUILD/tests/gpu/samplerd_gpu_statistics_test"
  [samplerd_gpu_processors_test]="$BUILD/tests/gpu/samplerd_gpu_processors_test"
  [samplerd_server_gpu_test]="$BUILD/tests/gpu/samplerd_server_gpu_test"
  [samplerd_example_sample_random]="$BUILD/client/cpp/samplerd_example_sample_random"
  [libsamplerd_capi.so]="$BUILD/tests/bench/gpu/libsamplerd_capi.so"
  [samplerd_gpu_ipc_runtime_test]="$BUILD/tests/gpu/samplerd_gpu_ipc_runtime_test"
  [samplerd_ipc_producer_raw]="$BUILD/tests/gpu/samplerd_ipc_producer_raw"
  [samplerd_bench_transports]="$BUILD/tests/bench/gpu/samplerd_bench_transports"
  [samplerd_session_gpu_test]="$BUILD/tests/gpu/samplerd_session_gpu_test"
  [samplerd_cpp_session_gpu_test]="$BUILD/tests/gpu/samplerd_cpp_session_gpu_test"
  [bench_fast_cpu]="$BUILD/tests/bench/bench_fast_cpu"
)
for target in "${MISSING[@]}"; do
  unset "BUILT[$target]"
done

# --- assemble -----------------------------------------------------------------------------------
# The binaries and libraries are staged in $STAGE, checked, then packed into payload.tar.xz: the
# four binaries with kernels each hold the same ~7 MiB of GPU code, which xz's 64 MiB window
# stores once (~50 MiB plain, ~7 MiB packed). run_on_gpu.sh unpacks it. SAMPLERD_CARRY_PACK=0
# leaves the files unpacked in $CARRY instead.
STAGE="$CARRY.stage"
# The kernel library of the carry this one replaces, kept for tests/gpu/kernel_ab.sh --old as
# $OLD_DIR/libsamplerd_capi_<commit>[-dirty]_<date>.so.xz (the newest three; ~8 MiB each, and
# they travel with the carry when the device call names the folder).
OLD_DIR="${SAMPLERD_CARRY_OLD_DIR:-$(dirname "$CARRY")/old}"
if [[ -f "$CARRY/payload.tar.xz" && -f "$CARRY/MANIFEST.txt" ]]; then
  old_commit="$(sed -n 's/^commit: *//p' "$CARRY/MANIFEST.txt" | cut -c1-12)"
  old_date="$(sed -n 's/^date: *//p' "$CARRY/MANIFEST.txt" | tr -d ':-')"
  old_dirty="$(awk '/^uncommitted changes/ {on = 1; next} /^files/ {on = 0} on {n++} END {print (n ? "-dirty" : "")}' \
    "$CARRY/MANIFEST.txt")"
  old_tmp="$(mktemp -d)"
  if tar -xJf "$CARRY/payload.tar.xz" -C "$old_tmp" ./libsamplerd_capi.so 2>/dev/null; then
    mkdir -p "$OLD_DIR"
    old_lib="$OLD_DIR/libsamplerd_capi_${old_commit:-unknown}${old_dirty}_${old_date:-undated}.so.xz"
    xz -T0 -c "$old_tmp/libsamplerd_capi.so" >"$old_lib"
    log "kept the replaced carry's kernel library as $old_lib"
    ls -t "$OLD_DIR"/libsamplerd_capi_*.so.xz | tail -n +4 | xargs -r rm -f
  fi
  rm -rf "$old_tmp"
fi
log "assembling $CARRY"
rm -rf "$CARRY" "$STAGE"
mkdir -p "$CARRY" "$STAGE/lib"
for name in "${!BUILT[@]}"; do
  [[ -f "${BUILT[$name]}" ]] || die "missing ${BUILT[$name]}"
  cp "${BUILT[$name]}" "$STAGE/$name"
done
cp tests/bench/gpu/bench_kernels.py tests/bench/gpu/bench_processors.py tests/gpu/run_on_gpu.sh \
  tests/gpu/run_on_gpu_steps.sh tests/gpu/README.md tests/gpu/ipc_producer.py tests/gpu/python_client_cuda.py tests/gpu/device_session_cuda.py \
  tests/gpu/session_common.py tests/gpu/session_checks_correctness.py \
  tests/gpu/session_checks_kill.py tests/gpu/session_checks_bench.py \
  tests/gpu/session_checks_processors.py tests/gpu/session_bench_processors.py \
  tests/gpu/ipc_owner_kill.py tests/gpu/kernel_ab.sh tests/bench/gpu/profile_cases.py \
  tests/bench/engine/decode_loop.py "$CARRY/"
chmod +x "$CARRY/run_on_gpu.sh" "$CARRY/bench_kernels.py" "$CARRY/ipc_producer.py" \
  "$CARRY/device_session_cuda.py" "$CARRY/ipc_owner_kill.py"

# Python stubs for ipc_producer.py (samplerd/v1/sampler_pb2.py and sampler_pb2_grpc.py under
# py/). Stubs from protoc 3.21 load with the GPU machine's grpcio 1.84 and protobuf 7.
PY_PLUGIN="${GRPC_PYTHON_PLUGIN:-/usr/bin/grpc_python_plugin}"
if [[ ! -x "$PY_PLUGIN" ]]; then
  if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    log "installing protobuf-compiler-grpc (grpc_python_plugin)"
    apt-get install -y protobuf-compiler-grpc >/dev/null
  fi
  [[ -x "$PY_PLUGIN" ]] ||
    die "expected $PY_PLUGIN (apt-get install protobuf-compiler-grpc), got none"
fi
command -v protoc >/dev/null 2>&1 || die "expected protoc on PATH (apt-get install protobuf-compiler)"
mkdir -p "$CARRY/py"
protoc --proto_path=proto --python_out="$CARRY/py" --grpc_python_out="$CARRY/py" \
  --plugin=protoc-gen-grpc_python="$PY_PLUGIN" proto/samplerd/v1/*.proto
[[ -f "$CARRY/py/samplerd/v1/sampler_pb2.py" && -f "$CARRY/py/samplerd/v1/sampler_pb2_grpc.py" ]] ||
  die "protoc did not write the Python stubs into $CARRY/py/samplerd/v1"
# The Python client package around them (python_client_cuda.py, decode_loop.py).
cp client/python/samplerd/*.py "$CARRY/py/samplerd/"
touch "$CARRY/py/samplerd/v1/__init__.py"

# Shared libraries: everything ldd resolves, except the C/C++ runtime the GPU machine has itself
# (a newer glibc and libstdc++ run binaries built against older ones).
is_system_lib() {
  case "$1" in
    linux-vdso.so.*|ld-linux*|libc.so.*|libm.so.*|libstdc++.so.*|libgcc_s.so.*|libpthread.so.*|\
    libdl.so.*|librt.so.*|libutil.so.*|libresolv.so.*|libmvec.so.*) return 0 ;;
    *) return 1 ;;
  esac
}
for name in "${!BUILT[@]}"; do
  while read -r soname arrow path _; do
    [[ "$arrow" == "=>" ]] || continue
    is_system_lib "$soname" && continue
    [[ "$path" != "not" ]] || die "$name: $soname not found by ldd"
    [[ -f "$STAGE/lib/$soname" ]] || cp -L "$path" "$STAGE/lib/$soname"
  done < <(ldd "$STAGE/$name")
done

log "stripping"
strip --strip-unneeded "$STAGE"/samplerd* "$STAGE"/libsamplerd_capi.so "$STAGE"/lib/*.so*
chmod +x "$STAGE"/samplerd*

# Every non-system library must now resolve inside lib/.
for name in "${!BUILT[@]}"; do
  while read -r soname arrow path _; do
    [[ "$arrow" == "=>" ]] || continue
    is_system_lib "$soname" && continue
    [[ "$path" == "$STAGE/lib/"* ]] || die "$name: $soname resolves to $path, not to $STAGE/lib"
  done < <(LD_LIBRARY_PATH="$STAGE/lib" ldd "$STAGE/$name")
done
plain_bytes="$(du -sb "$STAGE" | cut -f1)"

{
  echo "samplerd GPU run folder, assembled by tests/gpu/prepare_carry.sh"
  echo "date:   $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "build:  $BUILD ($(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$BUILD/CMakeCache.txt"))"
  echo "uncommitted changes in the working tree:"
  git status --short 2>/dev/null | sed 's/^/  /'
  echo "files (unpacked):"
  (cd "$STAGE" && find . -type f | sort | xargs sha256sum | sed 's/^/  /')
} >"$CARRY/MANIFEST.txt"

if [[ "${SAMPLERD_CARRY_PACK:-1}" == 0 ]]; then
  cp -a "$STAGE"/. "$CARRY"/
else
  log "packing payload.tar.xz (xz -9, about 30 s)"
  tar -C "$STAGE" -cf - . | xz -9 -T1 >"$CARRY/payload.tar.xz"
fi
rm -rf "$STAGE"

# --- size ---------------------------------------------------------------------------------------
bytes="$(du -sb "$CARRY" | cut -f1)"
mib=$(( (bytes + 1048575) / 1048576 ))
log "$CARRY: $(find "$CARRY" -type f | wc -l) files, ${mib} MiB ($bytes bytes; $(( (plain_bytes + 1048575) / 1048576 )) MiB unpacked)"
(( mib <= MAX_MIB )) || die "$CARRY is ${mib} MiB, over the ${MAX_MIB} MiB limit"
log "done. On the GPU machine (carry ${CARRY#"$ROOT"/}): cd ${CARRY#"$ROOT"/} && bash run_on_gpu.sh"
