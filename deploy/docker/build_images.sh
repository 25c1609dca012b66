#!/usr/bin/env bash
# Builds the container images of deploy/docker from nothing but the Debian archive, with no
# Docker engine and no registry, then checks each one running (check_image.sh):
#
#   deploy/docker/build_images.sh [cpu|rocm|cuda]...
#
# Default: cpu and rocm, plus cuda when /usr/local/cuda/bin/nvcc exists (built against that
# toolkit, CUDA_TOOLKIT=mounted, instead of NVIDIA's repository). Images: localhost/samplerd:VARIANT
# in a private podman store (images_lib.sh), removed at the end; SAMPLERD_IMAGES_KEEP=1 keeps them.
#
# 1. tools      podman, runc, mmdebstrap and apt-ftparchive from Debian, when missing
# 2. packages   the .debs of a minimal Debian 12 plus every package the Dockerfiles' build stages
#               install, fetched once by an mmdebstrap run into SAMPLERD_IMAGES_CACHE and made a
#               local repository (Packages with the archive's Priority fields, and a Release file
#               naming the suite: mmdebstrap's minbase selects required packages by both). The
#               only step that uses the network, and only when the package list changed (or
#               SAMPLERD_IMAGES_REFRESH=1, to pick up Debian updates).
# 3. base       mmdebstrap --variant=minbase from the local repository with no network (unshare
#               --net, and --mount so that no mount outlives it): a debian:12-slim-like root
#               (merged /usr; no docs, man pages or locales; apt keeps no .debs or caches in a
#               layer; deb.debian.org in its sources), imported as debian:12-slim and debian:12.
#               The tarball is cached too (same inputs, same root).
# 4. build      `podman build --format docker --network none` (HEALTHCHECK needs the docker format)
#               with the local repository mounted over the image's apt sources, at nice 10 and
#               SAMPLERD_IMAGE_JOBS (default 2) compile jobs.
# 5. check      check_image.sh on each image.
#
# Needs root (mmdebstrap's root mode and rootful podman). Environment: see images_lib.sh.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "${HERE}/../.." && pwd)"
# shellcheck source=deploy/docker/images_lib.sh
source "${HERE}/images_lib.sh"
readonly SUITE=bookworm
readonly MIRRORS=(
  "deb http://deb.debian.org/debian ${SUITE} main"
  "deb http://deb.debian.org/debian ${SUITE}-updates main"
  "deb http://deb.debian.org/debian-security ${SUITE}-security main"
)
readonly JOBS="${SAMPLERD_IMAGE_JOBS:-2}"
readonly CUDA_HOME=/usr/local/cuda-13.0

die() { printf 'build_images.sh: %s\n' "$*" >&2; exit 1; }

# Runs "$@" with its output in IMAGES_WORK/logs/NAME.log; on failure prints the log's tail.
logged() {
  local name="$1" start=${SECONDS}
  shift
  mkdir -p "${IMAGES_WORK}/logs"
  if "$@" >"${IMAGES_WORK}/logs/${name}.log" 2>&1; then
    images::log "${name}: done in $((SECONDS - start)) s"
    return 0
  fi
  tail -n 60 "${IMAGES_WORK}/logs/${name}.log" >&2
  images::log "${name}: FAILED after $((SECONDS - start)) s (log above: ${name}.log)"
  return 1
}

step_tools() {
  local -a missing=()
  local p
  for p in podman runc mmdebstrap apt-utils; do
    [[ "$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null)" == ii* ]] || missing+=("$p")
  done
  ((${#missing[@]} == 0)) && return 0
  images::log "installing ${missing[*]}"
  logged apt-install env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    --no-install-recommends "${missing[@]}" ||
    { logged apt-update env DEBIAN_FRONTEND=noninteractive apt-get update -q &&
      logged apt-install env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        --no-install-recommends "${missing[@]}"; }
}

# The packages that `apt-get install` names in the build stage (the first) of each Dockerfile,
# minus those named through a build argument (NVIDIA's, never offline).
build_stage_packages() {
  local f
  for f in "${HERE}"/Dockerfile.*; do
    # Join continued lines; keep the first stage's RUNs; one shell command a line.
    sed -e ':a' -e '/\\$/{N;s/\\\n//;ba' -e '}' "${f}" |
      awk '/^FROM /{n++} n == 1 && /^RUN /' | sed -e 's/&&/\n/g; s/;/\n/g' |
      awk '{for (i = 1; i < NF; i++) if ($i == "apt-get" && $(i + 1) == "install") {
              for (j = i + 2; j <= NF; j++) if ($j !~ /^-/ && $j !~ /[$"]/) print $j
            }}'
  done | sort -u
}

step_packages() {
  local want
  want="$(build_stage_packages)"
  [[ -n "${want}" ]] || die "no apt-get install found in the Dockerfiles' build stages"
  if [[ "${SAMPLERD_IMAGES_REFRESH:-0}" != 1 && -f "${IMAGES_REPO}/Release" ]] &&
     [[ "$(cat "${IMAGES_CACHE}/packages.list" 2>/dev/null)" == "${want}" ]]; then
    images::log "packages: cached in ${IMAGES_REPO} ($(find "${IMAGES_REPO}" -name '*.deb' |
      wc -l) .debs)"
    return 0
  fi
  local fetch="${IMAGES_CACHE}/fetch"
  rm -rf "${fetch}" && mkdir -p "${fetch}/debs" "${fetch}/lists" "${IMAGES_REPO}" || return
  # Keep every .deb that a minimal system and the build packages need (--skip=essential/unlink),
  # and the archive's package lists for the Priority fields.
  local -a include
  mapfile -t include <<<"${want}"
  local IFS_SAVE="${IFS}"
  IFS=,
  local includes="${include[*]}"
  IFS="${IFS_SAVE}"
  # (A mount namespace of its own: mounts that a failing mmdebstrap leaves die with it.)
  logged fetch unshare --mount --propagation private -- \
    mmdebstrap --mode=root --variant=minbase --skip=essential/unlink \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr --include="${includes}" \
    --customize-hook="sync-out /var/cache/apt/archives ${fetch}/debs" \
    --customize-hook="sync-out /var/lib/apt/lists ${fetch}/lists" \
    "${SUITE}" /dev/null "${MIRRORS[@]}" || return
  make_repository "${fetch}" && printf '%s\n' "${want}" >"${IMAGES_CACHE}/packages.list" &&
    rm -rf "${fetch}"
}

# make_repository FETCH: a flat repository in IMAGES_REPO from FETCH/debs, with an override file
# made from the archive's lists in FETCH/lists (Priority, Section).
make_repository() {
  local fetch="$1" repo="${IMAGES_REPO}.new"
  rm -rf "${repo}" && mkdir -p "${repo}" || return
  find "${fetch}/debs" -maxdepth 1 -name '*.deb' -exec mv -t "${repo}" {} + || return
  awk 'BEGIN{r = "optional"; s = "misc"}
       /^Package: /{p = $2} /^Priority: /{r = $2} /^Section: /{s = $2}
       /^$/{if (p != "") print p, r, s; p = ""; r = "optional"; s = "misc"}' \
    <(/usr/lib/apt/apt-helper cat-file "${fetch}"/lists/*_Packages*) |  # (any compression)
    sort -u -k1,1 >"${fetch}/override" || return
  (cd "${repo}" &&
    apt-ftparchive packages . "${fetch}/override" >Packages 2>"${fetch}/ftparchive.log" &&
    apt-ftparchive -o APT::FTPArchive::Release::Suite="${SUITE}" \
      -o APT::FTPArchive::Release::Codename="${SUITE}" release . >"${fetch}/Release" &&
    mv "${fetch}/Release" Release) || return
  chmod -R a+rX "${repo}" && rm -rf "${IMAGES_REPO}" && mv "${repo}" "${IMAGES_REPO}" &&
    images::log "packages: $(find "${IMAGES_REPO}" -name '*.deb' | wc -l) .debs, $(du -sh \
      "${IMAGES_REPO}" | cut -f1), in ${IMAGES_REPO}"
}

# Files the base image gets on top of minbase (the official images' apt settings, in our words).
write_base_files() {
  local d="${IMAGES_WORK}/base-files"
  mkdir -p "${d}/etc/apt/apt.conf.d" "${d}/etc/apt/sources.list.d" || return
  local clean='"rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb'
  clean+=' /var/cache/apt/*.bin || true";'
  cat >"${d}/etc/apt/apt.conf.d/docker-clean" <<EOF
// Image layers keep no downloaded .debs and no binary package caches.
DPkg::Post-Invoke { ${clean} };
APT::Update::Post-Invoke { ${clean} };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  printf '%s\n' 'Acquire::Languages "none";' 'Acquire::GzipIndexes "true";' \
    'APT::AutoRemove::SuggestsImportant "false";' >"${d}/etc/apt/apt.conf.d/docker-slim"
  cat >"${d}/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: http://deb.debian.org/debian
Suites: ${SUITE} ${SUITE}-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: ${SUITE}-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  # What the builds mount over debian.sources: the local repository only.
  printf 'Types: deb\nURIs: file:%s\nSuites: ./\nTrusted: yes\n' "${IMAGES_REPO_MOUNT}" \
    >"${IMAGES_WORK}/local.sources"
}

# The base root as a tarball, cached in IMAGES_CACHE under a key of everything it is made from
# (the repository's index, the files added, this function), so that a warm run only imports it.
step_base() {
  write_base_files || return
  local key tar
  key="$(cat "${IMAGES_REPO}/Packages" <(find "${IMAGES_WORK}/base-files" -type f -exec cat {} +) \
    <(declare -f step_base) | sha256sum | cut -c1-16)"
  tar="${IMAGES_CACHE}/base-${key}.tar"
  if [[ -f "${tar}" ]]; then
    images::log "base: cached ${tar}"
  else
    local -a slim=(--dpkgopt='path-exclude=/usr/share/doc/*'
      --dpkgopt='path-include=/usr/share/doc/*/copyright'
      --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*'
      --dpkgopt='path-exclude=/usr/share/locale/*'
      --dpkgopt='path-include=/usr/share/locale/locale.alias')
    rm -f "${IMAGES_CACHE}"/base-*.tar
    # shellcheck disable=SC2016  # $1 is the hook's argument (the root), expanded by mmdebstrap.
    if ! logged base unshare --net --mount --propagation private -- \
      mmdebstrap --mode=root --variant=minbase --format=tar \
      --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
      --hook-dir=/usr/share/mmdebstrap/hooks/file-mirror-automount "${slim[@]}" \
      --customize-hook='rm -f "$1"/etc/apt/sources.list' \
      --customize-hook="cp -a ${IMAGES_WORK}/base-files/. \"\$1\"/" \
      "${SUITE}" "${tar}.new" "deb [trusted=yes] file://${IMAGES_REPO} ./"; then
      rm -f "${tar}.new"
      return 1
    fi
    mv "${tar}.new" "${tar}" || return
  fi
  logged import images::podman import --change 'CMD ["bash"]' "${tar}" \
    docker.io/library/debian:12-slim &&
    images::podman tag docker.io/library/debian:12-slim docker.io/library/debian:12
}

# build VARIANT: localhost/samplerd:VARIANT from deploy/docker/Dockerfile.VARIANT, offline.
build() {
  local variant="$1"
  local -a args=(--format docker --network none --pull=never --layers=false
    -v "${IMAGES_REPO}:${IMAGES_REPO_MOUNT}:ro"
    -v "${IMAGES_WORK}/local.sources:/etc/apt/sources.list.d/debian.sources:ro"
    --build-arg "CMAKE_BUILD_PARALLEL_LEVEL=${JOBS}")
  if [[ "${variant}" == cuda ]]; then
    args+=(--build-arg CUDA_TOOLKIT=mounted -v "${CUDA_HOME}:${CUDA_HOME}:ro")
  fi
  logged "build-${variant}" nice -n 10 "${IMAGES_PODMAN[@]}" build "${args[@]}" \
    -f "deploy/docker/Dockerfile.${variant}" -t "${IMAGES_NAME}:${variant}" . || return
  images::log "${IMAGES_NAME}:${variant}: $(images::podman image inspect --format '{{.Size}}' \
    "${IMAGES_NAME}:${variant}" | numfmt --to=si --suffix=B)"
}

main() {
  ((EUID == 0)) || die "needs root (mmdebstrap --mode=root, rootful podman)"
  cd "${ROOT}" || die "cannot cd to ${ROOT}"  # the build context
  local -a variants=("$@")
  if ((${#variants[@]} == 0)); then
    variants=(cpu rocm)
    [[ -x /usr/local/cuda/bin/nvcc ]] && variants+=(cuda)
  fi
  local v
  for v in "${variants[@]}"; do
    [[ -f "${HERE}/Dockerfile.${v}" ]] || die "unknown variant '${v}' (expected cpu, rocm or cuda)"
  done
  if [[ " ${variants[*]} " == *" cuda "* && ! -x "${CUDA_HOME}/bin/nvcc" ]]; then
    die "cuda: expected a CUDA 13.0 toolkit at ${CUDA_HOME}, got no ${CUDA_HOME}/bin/nvcc"
  fi
  mkdir -p "${IMAGES_CACHE}" || die "cannot create ${IMAGES_CACHE}"
  # One run at a time on a machine: they share the cache and the store.
  exec 9>"${IMAGES_CACHE}/lock"
  if ! flock -n 9; then
    images::log "another build_images.sh holds ${IMAGES_CACHE}/lock: waiting"
    flock -w 3600 9 || die "${IMAGES_CACHE}/lock still held after an hour"
  fi
  images::configure || die "cannot write ${IMAGES_WORK}/containers.conf"
  rm -rf "${IMAGES_WORK}/logs"
  step_tools || die "cannot install the tools"
  # A fresh store every run: the images are built from scratch; only the .debs and the base
  # tarball are cached.
  images::podman system reset --force >/dev/null 2>&1
  rm -rf "${IMAGES_WORK}/storage" "${IMAGES_WORK}/runroot"
  step_packages || die "cannot fetch the packages"
  step_base || die "cannot make the base image"
  local rc=0
  for v in "${variants[@]}"; do
    if build "${v}"; then
      "${HERE}/check_image.sh" "${IMAGES_NAME}:${v}" "${v}" || rc=1
    else
      rc=1
    fi
  done
  if [[ "${SAMPLERD_IMAGES_KEEP:-0}" != 1 ]]; then
    images::podman system reset --force >/dev/null 2>&1
    rm -rf "${IMAGES_WORK}/storage"
  fi
  images::log "images ${variants[*]}: $( ((rc == 0)) && echo passed || echo FAILED)"
  return "${rc}"
}

main "$@"
