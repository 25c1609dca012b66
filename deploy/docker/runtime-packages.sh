#!/usr/bin/env bash
# Prints, one a line, the Debian packages that own the shared libraries a binary loads:
#
#   runtime-packages.sh BINARY > runtime-packages.txt
#
# Run in an image's build stage; the runtime stage installs exactly that list on debian:12-slim.
# This way the runtime image follows the build (a new library, e.g. libprometheus-cpp-core1.0 and
# libprometheus-cpp-pull1.0 for metrics, needs no edit here) and carries no -dev package, compiler
# or CMake. Debian puts the soname in the package name (libgrpc29, libabsl20220623), so the same
# names on the same release are ABI-compatible. Libraries that a binary opens with dlopen
# (libcuda.so.1, which the NVIDIA container runtime or the DRA driver mounts from the host) are
# not listed, by design.
# Fails when a library belongs to no package (e.g. one built into /usr/local by hand).
set -euo pipefail

readonly BINARY="${1:?usage: runtime-packages.sh BINARY}"

libs="$(ldd "${BINARY}")" || { echo "runtime-packages.sh: ldd ${BINARY} failed" >&2; exit 1; }
if grep -q 'not found' <<<"${libs}"; then
  echo "runtime-packages.sh: unresolved libraries:" >&2
  grep 'not found' <<<"${libs}" >&2
  exit 1
fi
# "libfoo.so.1 => /path/libfoo.so.1 (0x...)" and "/lib64/ld-linux-x86-64.so.2 (0x...)".
mapfile -t paths < <(awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' \
  <<<"${libs}")

# dpkg knows a file by the path its package ships, which on a merged-/usr system may be the /lib
# or the /usr/lib spelling, before or after resolving symlinks: ask for every spelling at once
# (one dpkg-query call; each call reads the whole database).
candidates() {
  local path="$1" real
  real="$(readlink -f "${path}")"
  printf '%s\n' "${path}" "${real}" "${path#/usr}" "${real#/usr}" "/usr${path}" "/usr${real}"
}
declare -A owner=()
while IFS= read -r line; do
  # "libc6:amd64: /lib/x86_64-linux-gnu/libc.so.6"; skip "diversion by ..." lines.
  [[ "${line}" == diversion* ]] && continue
  owner["${line#*: }"]="${line%%:*}"
done < <(for p in "${paths[@]}"; do candidates "${p}"; done | sort -u |
         xargs -r dpkg-query -S 2>/dev/null)

packages=()
for p in "${paths[@]}"; do
  found=""
  while IFS= read -r c; do
    if [[ -n "${owner[${c}]:-}" ]]; then found="${owner[${c}]}"; break; fi
  done < <(candidates "${p}")
  if [[ -z "${found}" ]]; then
    echo "runtime-packages.sh: no Debian package owns ${p}" >&2
    exit 1
  fi
  packages+=("${found}")
done
printf '%s\n' "${packages[@]}" | sort -u
