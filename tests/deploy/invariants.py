#!/usr/bin/python3
"""The deployment's invariants: what must hold for samplerd to work beside an engine.

    /usr/bin/python3 tests/deploy/invariants.py RENDER_DIR

RENDER_DIR holds one `kubectl kustomize` output per overlay (amd.yaml, nvidia.yaml,
nvidia-mps.yaml, cpu.yaml; any other NAME.yaml is checked as the overlay whose name it starts
with, e.g. the renamed nvidia-prefixed.yaml). The Dockerfiles are read from deploy/docker.

Two sets of rules:
  - pod rules, per rendered overlay: native sidecar, one shared GPU claim (GPU overlays) or none
    (cpu), shared socket and /dev/shm volumes, the engine's SAMPLERD_SOCKET, gRPC probes on
    --health_port, the metrics annotation on --metrics_port, a restrictive securityContext, the
    MPS daemon of nvidia-mps (a native sidecar before samplerd, its pipe directory shared)...
  - Dockerfile rules: build and runtime stages, non-root numeric USER, HEALTHCHECK through the
    bundled probe on the health port, ENTRYPOINT/CMD, apt hygiene, build dependencies in step
    with deploy/local/install_deps.sh, and agreement with the manifests (UID, ports).

Then a self-test breaks copies of the inputs in memory, one mutation per rule at least, and
requires the rule to fail on each: a rule that cannot fail is reported as a failure.

The rules are in pod_rules.py and dockerfile_rules.py, the mutations in mutations.py.

Prints PASS/FAIL lines and ends with "N passed, N failed"; exit status 1 on any failure.
Needs python3-yaml (Debian).
"""

import pathlib
import sys

import yaml

from dockerfile_rules import DOCKERFILE_RULES, dockerfile_failures, read_dockerfiles
from mutations import self_test
from pod_rules import OVERLAYS, POD_RULES, overlay_of, pod_failures


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    render_dir = pathlib.Path(argv[1])
    rendered, passed, failed = {}, 0, 0

    def report(ok, line):
        nonlocal passed, failed
        print(("PASS  " if ok else "FAIL  ") + line)
        passed, failed = passed + ok, failed + (not ok)

    for path in sorted(render_dir.glob("*.yaml")):
        overlay = overlay_of(path.stem)
        if overlay is None:
            report(False, f"{path.name}: unknown overlay; add its expectations to OVERLAYS")
            continue
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        if path.stem == overlay:
            rendered[overlay] = docs
        failures = pod_failures(overlay, docs)
        rules = list(POD_RULES) if "structure" not in failures else ["structure"]
        for rule in rules:
            report(rule not in failures,
                   f"{path.stem:<16} {rule}" + (f": {failures[rule]}" if rule in failures else ""))
    for overlay in OVERLAYS:
        if overlay not in rendered:
            report(False, f"no rendered {overlay}.yaml in {render_dir}")

    for name, text in read_dockerfiles().items():
        failures = dockerfile_failures(name, text)
        for rule in DOCKERFILE_RULES:
            report(rule not in failures,
                   f"{name:<16} {rule}" + (f": {failures[rule]}" if rule in failures else ""))

    if len(rendered) == len(OVERLAYS):
        problems, count = self_test(rendered)
        for problem in problems:
            report(False, f"self-test: {problem}")
        report(not problems, f"self-test: {count} mutations, each caught by its rule")

    print(f"invariants: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
