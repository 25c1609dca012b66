# shellcheck shell=bash disable=SC2034  # the variables are used by the scripts that source this.
# Shared by build_images.sh and check_image.sh: where the offline image build keeps its state, and
# podman run against a private store and configuration (the host's podman setup, if any, is
# neither read nor changed). Source it; it only defines variables and functions.
#
#   SAMPLERD_IMAGES_CACHE  kept between runs: the fetched .debs and the local repository made
#                          from them (default /var/cache/samplerd-images)
#   SAMPLERD_IMAGES_WORK   scratch: podman's store, the base tarball, logs; emptied by every
#                          build (default /var/tmp/samplerd-images)

IMAGES_CACHE="${SAMPLERD_IMAGES_CACHE:-/var/cache/samplerd-images}"
IMAGES_WORK="${SAMPLERD_IMAGES_WORK:-/var/tmp/samplerd-images}"
# The local repository, and where the builds mount it.
IMAGES_REPO="${IMAGES_CACHE}/repo"
readonly IMAGES_REPO_MOUNT=/srv/samplerd-apt
# The image tags the builds produce (localhost/samplerd:cpu, ...).
readonly IMAGES_NAME=localhost/samplerd

# images::log MESSAGE...: a progress line on stderr.
images::log() { printf '==> [images %4ss] %s\n' "${SECONDS}" "$*" >&2; }

# IMAGES_PODMAN, images::podman ARG...: podman with the private store under IMAGES_WORK and the
# private containers.conf written by images::configure. runc, not crun: crun refuses this VM's
# hybrid cgroup layout (v1 controllers plus a v2 "unified" mount), runc accepts it. cgroupfs and
# a file event log: there is no systemd to ask.
IMAGES_PODMAN=(env "CONTAINERS_CONF=${IMAGES_WORK}/containers.conf" podman
  --root "${IMAGES_WORK}/storage" --runroot "${IMAGES_WORK}/runroot"
  --storage-driver overlay --cgroup-manager cgroupfs --events-backend file --runtime runc)
images::podman() { "${IMAGES_PODMAN[@]}" "$@"; }

# images::configure: writes the private containers.conf. Podman's default rlimits (nofile and
# nproc at 1048576) fail in setrlimit where the process lacks CAP_SYS_RESOURCE to raise them over
# its own hard limit: ask for the hard limit instead.
images::configure() {
  mkdir -p "${IMAGES_WORK}" || return
  local nofile
  nofile="$(ulimit -Hn)"
  [[ "${nofile}" == unlimited ]] && nofile=1048576
  cat >"${IMAGES_WORK}/containers.conf" <<EOF
# Written by deploy/docker/images_lib.sh; used only for the samplerd image build and checks.
[containers]
default_ulimits = ["nofile=${nofile}:${nofile}", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
}
