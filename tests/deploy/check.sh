#!/usr/bin/env bash
# Offline checks of the container images (deploy/docker) and the Kubernetes manifests
# (deploy/k8s). The one entry point for the project's test command:
#
#   tests/deploy/check.sh
#
# Steps, each reported PASS / FAIL / SKIP, then "deploy: N passed, N failed":
#   tools        npm ci of tests/deploy/package.json (exact versions, package-lock.json) into the
#                git-ignored .tools/deploy-check, only when missing or changed
#   render       `kubectl kustomize` of the base and of every overlay, plus the nvidia overlay
#                under a namePrefix (the claim template's reference must follow the rename)
#   schemas      the rendered objects against Kubernetes schemas (k8s_schemas.mjs)
#   invariants   the sidecar's invariants per overlay and the Dockerfile rules (invariants.py)
#   dockerfiles  Dockerfile syntax and instruction arguments (dockerfile_syntax.mjs)
#   probe        the images' HEALTHCHECK script against a real samplerd (needs the build)
#   packages     the images' runtime-package lister on the real binary (needs the build)
# Needs: kubectl (on the base image), node and npm, /usr/bin/python3 with python3-yaml.
# Environment: SAMPLERD_BIN (default build/default/service/samplerd) for the last two steps.
set -uo pipefail
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../deploy/local/lib.sh"

readonly ROOT="${SAMPLERD_ROOT}"
readonly HERE="${ROOT}/tests/deploy"
readonly TOOLS="${ROOT}/.tools/deploy-check"
readonly OVERLAYS="${ROOT}/deploy/k8s/overlays"
WORK="$(mktemp -d)"
readonly WORK
SERVER_PID=""

cleanup() {
  if [[ -n "${SERVER_PID}" ]]; then kill "${SERVER_PID}" 2>/dev/null; fi
  rm -rf "${WORK}"
}
trap cleanup EXIT

step_tools() {
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "node and npm are needed (deploy/local/install_deps.sh installs npm from Debian)"
    return 1
  fi
  if [[ -d "${TOOLS}/node_modules" ]] &&
     cmp -s "${HERE}/package-lock.json" "${TOOLS}/package-lock.json"; then
    echo "validators present in ${TOOLS#"${ROOT}"/}"
    return 0
  fi
  echo "installing the validators (tests/deploy/package-lock.json) into ${TOOLS#"${ROOT}"/}"
  mkdir -p "${TOOLS}" && cp "${HERE}/package.json" "${HERE}/package-lock.json" "${TOOLS}/" || return
  if ! npm ci --prefix "${TOOLS}" --no-audit --no-fund --loglevel=error >"${WORK}/npm.log" 2>&1
  then
    cat "${WORK}/npm.log"
    rm -f "${TOOLS}/package-lock.json"  # so that the next run tries again
    echo "npm ci failed (output above)"
    return 1
  fi
}

step_render() {
  command -v kubectl >/dev/null || {
    echo "kubectl not found (it comes with the base image; Debian does not package it)"
    return 1
  }
  mkdir -p "${WORK}/render" "${WORK}/prefixed"
  local rc=0 dir name
  if kubectl kustomize "${ROOT}/deploy/k8s/base" >"${WORK}/base.yaml"; then
    echo "rendered deploy/k8s/base"
  else
    echo "FAILED: kubectl kustomize deploy/k8s/base"
    rc=1
  fi
  for dir in "${OVERLAYS}"/*/; do
    name="$(basename "${dir}")"
    if kubectl kustomize "${dir}" >"${WORK}/render/${name}.yaml"; then
      echo "rendered deploy/k8s/overlays/${name}"
    else
      echo "FAILED: kubectl kustomize deploy/k8s/overlays/${name}"
      rm -f "${WORK}/render/${name}.yaml"
      rc=1
    fi
  done
  # An overlay of the nvidia overlay that renames everything: kustomizeconfig.yaml in the base
  # must carry the rename into the pod's resourceClaimTemplateName (invariants.py checks it).
  cat >"${WORK}/prefixed/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $(realpath --relative-to="${WORK}/prefixed" "${OVERLAYS}/nvidia")
namePrefix: team-a-
EOF
  if kubectl kustomize --load-restrictor=LoadRestrictionsNone "${WORK}/prefixed" \
       >"${WORK}/render/nvidia-prefixed.yaml"; then
    echo "rendered overlays/nvidia under namePrefix team-a-"
  else
    echo "FAILED: kubectl kustomize of overlays/nvidia under a namePrefix"
    rc=1
  fi
  return "${rc}"
}

needs() {  # needs DIR-OR-FILE WHAT: SKIP when an earlier step left nothing to check
  [[ -e "$1" ]] && return 0
  echo "skipped: no $2 (an earlier step failed)"
  return "${SAMPLERD_SKIP}"
}

step_schemas() {
  needs "${TOOLS}/node_modules" validators || return
  needs "${WORK}/base.yaml" "rendered manifests" || return
  node "${HERE}/k8s_schemas.mjs" "${TOOLS}" "${WORK}/base.yaml" "${WORK}"/render/*.yaml
}

step_invariants() {
  needs "${WORK}/render" "rendered manifests" || return
  if ! /usr/bin/python3 -c 'import yaml' 2>/dev/null; then
    echo "python3-yaml is needed: apt-get install python3-yaml"
    return 1
  fi
  /usr/bin/python3 "${HERE}/invariants.py" "${WORK}/render"
}

step_dockerfiles() {
  needs "${TOOLS}/node_modules" validators || return
  node "${HERE}/dockerfile_syntax.mjs" "${TOOLS}" "${ROOT}"/deploy/docker/Dockerfile.*
}

# Prints a free TCP port on 127.0.0.1.
free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0));
print(s.getsockname()[1])'
}

step_probe() {
  if [[ ! -x "${SAMPLERD_BIN}" ]]; then
    echo "skipped: no samplerd at ${SAMPLERD_BIN#"${ROOT}"/} (build it first)"
    return "${SAMPLERD_SKIP}"
  fi
  local probe="${ROOT}/deploy/docker/grpc-health-probe.sh" port
  port="$(free_port)" || return
  local -a args=(--backend=cpu --grace_period=1s)
  # The images probe --health_port; a binary without that flag serves health on a TCP listener
  # of the API, which speaks the same protocol.
  local help
  help="$("${SAMPLERD_BIN}" --helpfull 2>&1)"
  # No metrics listener: its default port may be taken on this machine.
  if grep -q -- '--metrics_port' <<<"${help}"; then args+=(--metrics_port=0); fi
  if grep -q -- '--health_port' <<<"${help}"; then
    args+=("--listen=unix://${WORK}/samplerd.sock" "--health_port=${port}")
    echo "samplerd with --health_port=${port}"
  else
    args+=("--listen=unix://${WORK}/samplerd.sock,127.0.0.1:${port}")
    echo "samplerd has no --health_port yet: probing its TCP listener 127.0.0.1:${port}"
  fi
  "${SAMPLERD_BIN}" "${args[@]}" >"${WORK}/server.log" 2>&1 &
  SERVER_PID=$!
  local rc=0 i
  for ((i = 0; i < 50; i++)); do
    bash "${probe}" "127.0.0.1:${port}" >/dev/null 2>&1 && break
    sleep 0.2
  done
  if bash "${probe}" "127.0.0.1:${port}"; then
    echo "ok: SERVING"
  else
    echo "FAILED: the probe did not see SERVING within 10 s; server log:"
    cat "${WORK}/server.log"
    rc=1
  fi
  if bash "${probe}" "127.0.0.1:${port}" no.such.Service 2>/dev/null; then
    echo "FAILED: the probe passed for an unknown service"
    rc=1
  else
    echo "ok: fails for an unknown service"
  fi
  kill -TERM "${SERVER_PID}" && wait "${SERVER_PID}"
  SERVER_PID=""
  if bash "${probe}" "127.0.0.1:${port}" 2>/dev/null; then
    echo "FAILED: the probe passed with the server stopped"
    rc=1
  else
    echo "ok: fails with the server stopped"
  fi
  return "${rc}"
}

step_packages() {
  if [[ ! -x "${SAMPLERD_BIN}" ]]; then
    echo "skipped: no samplerd at ${SAMPLERD_BIN#"${ROOT}"/} (build it first)"
    return "${SAMPLERD_SKIP}"
  fi
  local packages
  packages="$(bash "${ROOT}/deploy/docker/runtime-packages.sh" "${SAMPLERD_BIN}")" || return
  echo "runtime packages: $(tr '\n' ' ' <<<"${packages}")"
  grep -qx 'libgrpc++1.51' <<<"${packages}" ||
    { echo "FAILED: libgrpc++1.51 missing from the list"; return 1; }
}

main() {
  samplerd::run_steps deploy tools render schemas invariants dockerfiles probe packages
}

main "$@"
