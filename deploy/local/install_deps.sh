#!/usr/bin/env bash
# Installs what building, running and testing samplerd needs, and only what is missing:
#   - Debian 12 packages: compiler, CMake, Ninja, shellcheck and clang-format (the test command's
#     lint and format steps), clang and its libFuzzer/sanitizer runtimes (the fuzz step),
#     gRPC/protobuf/Abseil, GoogleTest, benchmark, prometheus-cpp (metrics),
#     Python's grpcio/protobuf/numpy/pip (the Python client, its tests and packaging), Go 1.19
#     with grpc-go and protobuf (the Go client; protobuf 1-5 named, or apt picks 1-3);
#   - buf (proto lint, `buf curl`), from npm into the project-local, git-ignored .tools/.
# Idempotent and quiet: a machine that has everything costs a few dpkg-query calls. Runs as root
# (as on CI), or through sudo when available. SAMPLERD_SKIP_DEPS=1 skips it all (e.g. on a
# machine that is not Debian and was provisioned by hand).
set -euo pipefail
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# The Debian packages (see shared TOOLCHAIN notes for why each one).
readonly APT_PACKAGES=(
  g++ cmake ninja-build pkg-config ca-certificates perl shellcheck clang-format
  clang libclang-rt-14-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler grpc-proto
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev libcivetweb-dev openssl
  python3-grpcio python3-protobuf python3-numpy python3-pip python3-setuptools python3-wheel
  golang-go golang-google-grpc-dev golang-google-protobuf-dev protoc-gen-go protoc-gen-go-grpc
  golang-github-golang-protobuf-1-5-dev
  python3-yaml
  prometheus-cpp-dev
)
# buf's npm package ships a static binary; pinned so that lint results do not drift.
readonly BUF_NPM_PACKAGE="@bufbuild/buf@1.75.0"

# Prints the packages among "$@" that dpkg does not list as installed.
missing_apt_packages() {
  local p
  for p in "$@"; do
    [[ "$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null)" == ii* ]] || echo "$p"
  done
}

as_root() {
  if [[ ${EUID} -eq 0 ]]; then "$@"
  elif command -v sudo >/dev/null; then sudo "$@"
  else samplerd::die "need root (or sudo) to run: $*"
  fi
}

install_apt_packages() {
  local -a wanted=("${APT_PACKAGES[@]}") missing
  # npm comes from Debian only where no node toolchain is installed already.
  command -v npm >/dev/null || wanted+=(npm)
  mapfile -t missing < <(missing_apt_packages "${wanted[@]}")
  ((${#missing[@]} == 0)) && return 0
  samplerd::log "installing Debian packages: ${missing[*]}"
  local log
  log="$(mktemp)"
  if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >"${log}" 2>&1 ||
     ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
         "${missing[@]}" >>"${log}" 2>&1; then
    cat "${log}" >&2
    rm -f "${log}"
    samplerd::die "apt-get failed (output above)"
  fi
  rm -f "${log}"
}

install_buf() {
  [[ -x "${SAMPLERD_BUF}" ]] && "${SAMPLERD_BUF}" --version >/dev/null 2>&1 && return 0
  samplerd::log "installing ${BUF_NPM_PACKAGE} into .tools/"
  local log
  log="$(mktemp)"
  if ! npm install --prefix "${SAMPLERD_ROOT}/.tools" --no-audit --no-fund --loglevel=error \
       "${BUF_NPM_PACKAGE}" >"${log}" 2>&1; then
    cat "${log}" >&2
    rm -f "${log}"
    samplerd::die "npm install ${BUF_NPM_PACKAGE} failed (output above)"
  fi
  rm -f "${log}"
  "${SAMPLERD_BUF}" --version >/dev/null || samplerd::die "buf installed but does not run"
}

main() {
  if [[ "${SAMPLERD_SKIP_DEPS:-0}" == 1 ]]; then
    samplerd::log "SAMPLERD_SKIP_DEPS=1: not checking dependencies"
    return 0
  fi
  install_apt_packages
  install_buf
}

main "$@"
