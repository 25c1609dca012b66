#!/usr/bin/env bash
# Builds samplerd and runs every check that works on a machine without a GPU, as named steps:
#
#   deploy/local/test.sh            all steps
#   deploy/local/test.sh STEP...    only those (in the order given); --list prints them
#
# Exits non-zero when any step fails and ends with a summary. This is what CI runs (.ci/run).
# Environment: SAMPLERD_PRESET (default "default", the CPU build in build/default),
# SAMPLERD_SKIP_DEPS=1 skips the dependency check, SAMPLERD_SKIP_IMAGES=1 the images step.
set -uo pipefail
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "${SAMPLERD_ROOT}" || exit 1

# Steps run in this order. Each is a function step_NAME that returns non-zero on failure.
# To add one (GPU compile checks, Python and Go client tests, ...): write step_NAME, add NAME
# here, and list what it needs in install_deps.sh.
readonly ALL_STEPS=(deps build ctest buf-lint format shell-lint e2e python-client go-client
  gpu_compile_checks cpp-install deploy asan tsan fuzz soak images)

step_deps() { deploy/local/install_deps.sh && echo "dependencies: all present"; }

# All targets of the preset's build (server, tests, benchmarks, clients).
step_build() { samplerd::build "$@"; }

# Every ctest run of this script. A test that outlives SAMPLERD_TEST_TIMEOUT seconds (default
# 300; the longest, the emulated GPU's, take ~55 s) is killed, reported as ***Timeout by name and
# run once more, so that one hung test cannot use up CI's 90 minutes without being named (the
# asan step of a CI run once waited there until CI was killed). Tests that timed out are listed
# again at the end of the run, whether or not their second run passed.
run_ctest() {
  local dir="$1" log rc
  shift
  log="$(mktemp)"
  ctest --test-dir "${dir}" --output-on-failure --no-tests=error -j2 \
    --timeout "${SAMPLERD_TEST_TIMEOUT:-300}" --repeat after-timeout:2 "$@" | tee "${log}"
  rc="${PIPESTATUS[0]}"
  if grep -q '\*\*\*Timeout' "${log}"; then
    echo "WARNING: tests in ${dir} timed out and ran again:"
    grep '\*\*\*Timeout' "${log}"
  fi
  rm -f "${log}"
  return "${rc}"
}

step_ctest() {
  needs_build || return
  run_ctest "${SAMPLERD_BUILD}"
}

step_buf-lint() { "${SAMPLERD_BUF}" lint && echo "buf lint: clean"; }

# Every source is kept formatted: C++, CUDA and HIP by clang-format (.clang-format), Go by gofmt,
# the proto by `buf format`. Checks the files git tracks, and new ones it does not ignore (generated
# code is ignored); prints each file that is not formatted and the command that fixes it.
step_format() {
  local rc=0 out
  local -a files bad

  mapfile -t files < <(source_files '*.h' '*.cc' '*.cpp' '*.hip' '*.cuh' '*.cu')
  # One clang-format for all of them (~2 s); with --Werror it reports every file, then fails.
  if out="$(clang-format --dry-run --Werror "${files[@]}" </dev/null 2>&1)"; then
    echo "clang-format: ${#files[@]} C++/HIP files clean"
  else
    mapfile -t bad < <(grep -e '-Wclang-format-violations' <<<"${out}" | cut -d: -f1 | sort -u)
    unformatted clang-format "clang-format -i" "${bad[@]}" || printf '%s\n' "${out}"
    rc=1
  fi

  mapfile -t files < <(source_files '*.go')
  if ! out="$(gofmt -l "${files[@]}" </dev/null 2>&1)"; then
    printf '%s\n' "${out}"  # e.g. a syntax error
    rc=1
  elif [[ -n "${out}" ]]; then
    mapfile -t bad <<<"${out}"
    unformatted gofmt "gofmt -w" "${bad[@]}"
    rc=1
  else
    echo "gofmt: ${#files[@]} Go files clean"
  fi

  # -d prints the diff that `buf format -w` would apply.
  if "${SAMPLERD_BUF}" format -d --exit-code; then echo "buf format: clean"; else rc=1; fi
  return "${rc}"
}

# unformatted TOOL FIX FILE...: names the files that TOOL would change and the command that
# fixes them; returns 1 when no file is named.
unformatted() {
  local tool="$1" fix="$2" f
  shift 2
  (($#)) || return 1
  for f in "$@"; do echo "not formatted (${tool}): ${f}"; done
  echo "fix: ${fix} $*"
}

# source_files PATTERN...: the files git tracks, or does not ignore, that match, and exist.
source_files() {
  local f
  git ls-files --cached --others --exclude-standard -- "$@" | sort -u | while IFS= read -r f; do
    [[ -f "${f}" ]] && printf '%s\n' "${f}"
  done
}

step_shell-lint() {
  local -a scripts
  mapfile -t scripts < <(source_files '*.sh' .ci/run)
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

# The Python client (client/python): generates its stubs (git-ignored), then runs tests/python
# with Debian's /usr/bin/python3 against the real server (CPU backend, its own unix socket).
step_python-client() {
  needs_build || return
  client/python/generate.sh &&
    SAMPLERD_BIN="${SAMPLERD_BIN}" timeout 120 /usr/bin/python3 -m unittest discover \
      -s tests/python -t tests/python -v
}

# The Go client (client/go): generates its code (git-ignored), vets, builds the example and runs
# `go test` offline (Debian's Go packages) against the real server.
step_go-client() {
  needs_build || return
  SAMPLERD_BIN="${SAMPLERD_BIN}" timeout 600 client/go/test.sh
}

# Both GPU backends compile (issue #3), so that neither path rots on machines without a GPU:
# build/cuda with nvcc (when installed; sm_90 + sm_80), whose ctest must pass on the CPU here, and
# build/hip with Debian's hipcc (installed when missing; gfx90a wave64 + gfx1030 wave32, -Werror),
# which links but cannot run here.
step_gpu_compile_checks() {
  local rc=0
  if command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; then
    if gpu_build cuda; then
      run_ctest build/cuda || rc=1
    else
      rc=1
    fi
  else
    echo "nvcc not found (PATH, /usr/local/cuda/bin): CUDA build skipped"
  fi
  { install_hipcc && gpu_build hip; } || rc=1
  return "${rc}"
}

# gpu_build cuda|hip: configures build/<backend> (first time only) and builds every target.
gpu_build() {
  local dir="${SAMPLERD_ROOT}/build/$1"
  if [[ ! -f "${dir}/CMakeCache.txt" ]]; then
    samplerd::log "configuring build/$1"
    # The emulated GPU's tests (kernels/gpu/emu) already ran in the default build's ctest.
    cmake -S "${SAMPLERD_ROOT}" -B "${dir}" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DSAMPLERD_GPU="$1" -DSAMPLERD_GPU_EMULATION=OFF >/dev/null || return
  fi
  samplerd::log "building build/$1"
  cmake --build "${dir}"
}

# hipcc and the HIP runtime from Debian (HIP 5.2), unless SAMPLERD_SKIP_DEPS=1.
install_hipcc() {
  local -a missing=()
  local p
  for p in hipcc libamdhip64-dev; do
    [[ "$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null)" == ii* ]] || missing+=("$p")
  done
  ((${#missing[@]} == 0)) && return 0
  if [[ "${SAMPLERD_SKIP_DEPS:-0}" == 1 ]]; then
    echo "missing ${missing[*]} (SAMPLERD_SKIP_DEPS=1: not installing)"
    return 1
  fi
  local -a sudo=()
  ((EUID == 0)) || sudo=(sudo)
  samplerd::log "installing ${missing[*]}"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null ||
    { "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null &&
      "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends "${missing[@]}" >/dev/null; }
}

# Set by on_step_failure (below) when the build step fails.
BUILD_FAILED=0
# Returns 0 when the build is there to test, else SKIP after a failed build step, else 1.
needs_build() {
  if ((BUILD_FAILED)); then
    echo "skipped: the build failed"
    return "${SAMPLERD_SKIP}"
  fi
  [[ -x "${SAMPLERD_BIN}" ]] && return 0
  echo "no build at ${SAMPLERD_BUILD#"${SAMPLERD_ROOT}"/} (run the build step first)"
  return 1
}

# The C++ client installs, and an engine's CMake uses it through find_package(samplerd)
# (tests/install/run.sh: install into a temporary prefix, build a consumer, sample with it).
step_cpp-install() {
  needs_build || return
  tests/install/run.sh
}

# Container images and the Kubernetes sidecar (tests/deploy/check.sh): every overlay renders,
# validates against Kubernetes schemas, keeps the sidecar invariants; Dockerfiles lint; the
# images' health probe works against the real server. npm tools go into .tools/deploy-check.
step_deploy() {
  needs_build || return
  SAMPLERD_BIN="${SAMPLERD_BIN}" tests/deploy/check.sh
}

# AddressSanitizer + UBSan (preset asan: build/asan, Debug, no benchmarks): every ctest test, the
# integration tests included, which then run the ASan server. Any finding fails the step: ASan
# and UBSan stop at their first report (a test, or the server its test checks the exit code
# of), and LeakSanitizer reports leaks at exit. No suppressions are needed; add one only with a
# comment saying why.
step_asan() {
  sanitizer_build asan || return
  ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:strict_init_order=1" \
    UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
    run_ctest build/asan
}

# ThreadSanitizer (preset tsan: build/tsan): the threaded parts of the core, the executor, the
# thread pool, the region registry and its owner watcher, and the drain's cancel (only
# samplerd_core_test is built). A report fails the step (halt_on_error). SampleStream's reactor
# is not run here: Debian's gRPC is not built with TSan, so its own locking is invisible and
# every call reads as racy.
step_tsan() {
  local tests='^(Executor|ThreadPool|HostRegions|GpuRegions|GpuRegionsWithoutIpc'
  tests+='|SamplerCoreCancel|OwnerWatcher|RegistryOwners)\.'
  sanitizer_build tsan samplerd_core_test || return
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1" \
    run_ctest build/tsan -R "${tests}"
}

# The libFuzzer targets (tests/fuzz/README.md): request bytes through parse, convert, validate
# and sampling; SampleStream's reactor over a stream of step messages; region registration
# against real shm objects. Built with clang, ASan + UBSan, into build/fuzz; each runs 20 s from
# its checked-in seeds (SAMPLERD_FUZZ_SECONDS); any finding fails the step.
step_fuzz() { tests/fuzz/run_short.sh; }

# sanitizer_build PRESET [TARGET...]: configures and builds build/PRESET (all targets when none
# are named) with the shared build helper.
sanitizer_build() {
  local preset="$1"
  shift
  SAMPLERD_PRESET="${preset}" SAMPLERD_BUILD="${SAMPLERD_ROOT}/build/${preset}" samplerd::build "$@"
}

# The load-and-faults program, bounded (tests/soak/README.md; ~20 s): 16 streams x 300 steps
# from 4 client processes against the CPU server (after a 150-step warm-up, which settles RSS
# before its baseline), a client SIGKILLed mid-stream, host shm
# regions unregistered in flight, --max_inflight saturation, SIGTERM under load. Fails unless
# every step is answered once and in order, and the server's fds, threads and RSS come back.
step_soak() {
  needs_build || return
  client/python/generate.sh &&
    SAMPLERD_BIN="${SAMPLERD_BIN}" timeout 300 /usr/bin/python3 tests/soak/soak.py \
      --streams 16 --steps 300 --procs 4 --warmup_steps 150
}

# The container images, built with Debian's tools (mmdebstrap, podman) and no network once the
# .debs are fetched (cached in /var/cache/samplerd-images), then run and checked: UID 65532,
# read-only root, no capabilities, HEALTHCHECK SERVING, Sample over the socket, --backend=gpu
# refused, SIGTERM exit 0 (deploy/docker/build_images.sh; cpu, rocm, and cuda when
# /usr/local/cuda/bin/nvcc exists). SAMPLERD_SKIP_IMAGES=1 skips it (local runs; CI runs it).
step_images() {
  if [[ "${SAMPLERD_SKIP_IMAGES:-0}" == 1 ]]; then
    echo "SAMPLERD_SKIP_IMAGES=1: images not built"
    return "${SAMPLERD_SKIP}"
  fi
  deploy/docker/build_images.sh
}

# The step runner (lib.sh) calls this when a step fails; non-zero stops the run.
on_step_failure() {
  case "$1" in
    deps) return 1 ;;  # without the dependencies nothing after can run
    build) BUILD_FAILED=1 ;;
  esac
  return 0
}

main() {
  if [[ "${1:-}" == --list ]]; then printf '%s\n' "${ALL_STEPS[@]}"; return 0; fi
  if (($#)); then samplerd::run_steps test "$@"; else samplerd::run_steps test "${ALL_STEPS[@]}"; fi
}

main "$@"
