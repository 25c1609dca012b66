#!/usr/bin/env bash
# Runs one built samplerd image the way Kubernetes runs the sidecar and checks it, printing
# PASS/FAIL per check (build_images.sh calls it after each build):
#
#   deploy/docker/check_image.sh IMAGE cpu|rocm|cuda
#
# The container runs with no network, a read-only root (and no tmpfs on it), every capability
# dropped and no-new-privileges; the socket directory /run/samplerd is a host directory
# bind-mounted in, as the shared emptyDir is in the pod.
#   identity   the server process runs as UID and GID 65532 with no capability at all
#   read-only  writing to / fails with EROFS, even as root inside
#   health     the image's HEALTHCHECK (`podman healthcheck run`) and its probe script
#              (grpc-health-probe.sh) report SERVING
#   sample     the Python client (Debian's /usr/bin/python3) over the bind-mounted socket: the
#              server reports the CPU backend (the GPU images fall back to it without a GPU),
#              greedy rows return the argmax token ids, seeded top-k draws stay in the top k,
#              differ between seeds and repeat with the same seeds
#   gpu        `--backend=gpu` without a GPU exits non-zero, saying why
#   sigterm    SIGTERM stops the server with exit status 0
# Uses the private podman store of images_lib.sh.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "${HERE}/../.." && pwd)"
# shellcheck source=deploy/docker/images_lib.sh
source "${HERE}/images_lib.sh"

readonly IMAGE="${1:?usage: check_image.sh IMAGE cpu|rocm|cuda}"
readonly VARIANT="${2:?usage: check_image.sh IMAGE cpu|rocm|cuda}"
readonly NAME="samplerd-check-${VARIANT}"
readonly PROBE=/usr/local/lib/samplerd/grpc-health-probe.sh
SOCKDIR="$(mktemp -d /tmp/samplerd-image-XXXXXX)"
readonly SOCKDIR
FAILED=0

cleanup() {
  images::podman rm -f -t 0 "${NAME}" >/dev/null 2>&1
  rm -rf "${SOCKDIR}"
}
trap cleanup EXIT

pass() { echo "PASS ${VARIANT} $*"; }
fail() { echo "FAIL ${VARIANT} $*"; FAILED=1; }

# The container options of every run: what the Kubernetes manifests ask for.
readonly RUN_OPTS=(--network none --read-only --read-only-tmpfs=false --cap-drop=all
  --security-opt=no-new-privileges -v "${SOCKDIR}:/run/samplerd")

check_identity() {
  local pid status
  pid="$(images::podman inspect --format '{{.State.Pid}}' "${NAME}")"
  status="$(cat "/proc/${pid}/status" 2>/dev/null)"
  local uid gid caps
  uid="$(awk '/^Uid:/{print $2, $3, $4, $5}' <<<"${status}")"
  gid="$(awk '/^Gid:/{print $2, $3, $4, $5}' <<<"${status}")"
  caps="$(awk '/^Cap(Inh|Prm|Eff|Bnd|Amb):/{printf "%s%s ", $1, $2}' <<<"${status}")"
  if [[ "${uid}" == "65532 65532 65532 65532" && "${gid}" == "65532 65532 65532 65532" ]]; then
    pass "identity: UID/GID 65532"
  else
    fail "identity: expected UID and GID 65532, got Uid ${uid:-?}, Gid ${gid:-?} (pid ${pid})"
  fi
  if [[ "${caps}" =~ ^(Cap[A-Za-z]+:0000000000000000\ ){5}$ ]]; then
    pass "identity: no capabilities"
  else
    fail "identity: expected no capabilities, got ${caps}"
  fi
}

check_read_only() {
  local out
  if out="$(images::podman exec --user 0 "${NAME}" touch /probe-write 2>&1)"; then
    fail "read-only: root could write to / inside the container"
  elif [[ "${out}" == *"Read-only file system"* ]]; then
    pass "read-only: writing / fails with EROFS"
  else
    fail "read-only: expected 'Read-only file system', got: ${out}"
  fi
}

# Waits up to 120 s for the image's own HEALTHCHECK, then runs the probe script directly.
check_health() {
  local i out
  for ((i = 0; i < 120; i++)); do
    images::podman healthcheck run "${NAME}" >/dev/null 2>&1 && break
    sleep 1
  done
  if ((i < 120)); then
    pass "health: HEALTHCHECK healthy after ${i} s"
  else
    fail "health: HEALTHCHECK not healthy within 120 s"
    images::podman logs "${NAME}" 2>&1 | tail -n 20
  fi
  out="$(images::podman exec "${NAME}" bash "${PROBE}" 127.0.0.1:8081 2>&1)"
  if [[ "${out}" == SERVING ]]; then
    pass "health: ${PROBE} says SERVING"
  else
    fail "health: expected ${PROBE} to print SERVING, got: ${out}"
  fi
}

check_sample() {
  [[ -f "${ROOT}/client/python/samplerd/v1/sampler_pb2.py" ]] ||
    "${ROOT}/client/python/generate.sh" >/dev/null || { fail "sample: no Python stubs"; return; }
  local out
  if out="$(PYTHONPATH="${ROOT}/client/python" timeout 60 /usr/bin/python3 - \
            "unix://${SOCKDIR}/samplerd.sock" 2>&1 <<'EOF'
import sys
import numpy as np
import samplerd
from samplerd.v1 import sampler_pb2 as pb

client = samplerd.Client(sys.argv[1])
info = client.server_info()
backend = pb.Backend.Name(info.backend)
if backend != "BACKEND_CPU":
    sys.exit(f"expected backend BACKEND_CPU without a GPU, got {backend}")
vocab = 1000
logits = np.random.default_rng(3).standard_normal((3, vocab)).astype(np.float32)
logits[0, 617] = 9.0
logits[1, 42] = 9.0
logits[2, 999] = 9.0
greedy = client.sample(logits, temperature=0.0)
if list(greedy.tokens) != [617, 42, 999]:
    sys.exit(f"expected greedy token ids [617, 42, 999], got {list(greedy.tokens)}")
# 16 rows of the same flat logits, 16 seeds: the draws stay in the top 5, differ between seeds
# (a real draw, not argmax) and repeat with the same seeds.
flat = np.tile(np.linspace(0.0, 1.0, vocab, dtype=np.float32), (16, 1))
seeds = list(range(100, 116))
draws = [list(client.sample(flat, temperature=1.0, top_k=5, seed=seeds).tokens)
         for _ in range(2)]
if not all(vocab - 5 <= t < vocab for t in draws[0]):
    sys.exit(f"expected top-5 ids in [{vocab - 5}, {vocab}), got {draws[0]}")
if len(set(draws[0])) < 2:
    sys.exit(f"expected 16 seeds to draw more than one id, got {draws[0]}")
if draws[0] != draws[1]:
    sys.exit(f"expected the same seeds to draw the same ids, got {draws[0]}, {draws[1]}")
print(f"{backend} {info.version}: greedy {list(greedy.tokens)}, seeded top-5 draws "
      f"{sorted(set(draws[0]))}")
EOF
  )"; then
    pass "sample: ${out}"
  else
    fail "sample: ${out}"
  fi
}

# --backend=gpu with no GPU: a clear refusal, not a hang or a crash.
check_gpu_refused() {
  local out rc=0
  out="$(timeout 120 "${IMAGES_PODMAN[@]}" run --rm "${RUN_OPTS[@]}" "${IMAGE}" --backend=gpu \
         --listen=unix:///run/samplerd/gpu.sock --health_port=0 --metrics_port=0 2>&1)" || rc=$?
  if ((rc != 0 && rc != 124)) && [[ "${out}" == *"--backend=gpu"* ]]; then
    pass "gpu: --backend=gpu exits ${rc}: $(grep -m1 -e '--backend=gpu' <<<"${out}" | cut -c1-160)"
  else
    fail "gpu: expected a non-zero exit naming --backend=gpu, got exit ${rc}: ${out}"
  fi
}

check_sigterm() {
  images::podman kill --signal TERM "${NAME}" >/dev/null
  local code
  code="$(timeout 60 "${IMAGES_PODMAN[@]}" wait "${NAME}" 2>&1)"
  if [[ "${code}" == 0 ]]; then
    pass "sigterm: exit 0"
  else
    fail "sigterm: expected exit 0, got ${code}"
    images::podman logs "${NAME}" 2>&1 | tail -n 20
  fi
}

main() {
  chown 65532:65532 "${SOCKDIR}" && chmod 0750 "${SOCKDIR}" || exit 1
  images::podman rm -f -t 0 "${NAME}" >/dev/null 2>&1
  # (Its stderr only on failure: podman also complains that it has no systemd for the
  # HEALTHCHECK's timer, which check_health replaces with `podman healthcheck run`.)
  local out
  if ! out="$(images::podman run -d --name "${NAME}" "${RUN_OPTS[@]}" "${IMAGE}" 2>&1)"; then
    fail "start: podman run ${IMAGE} failed: ${out}"
    exit 1
  fi
  check_identity
  check_read_only
  check_health
  check_sample
  check_gpu_refused
  check_sigterm
  return "${FAILED}"
}

main "$@"
