"""Dockerfile rules: build and runtime stages, non-root numeric USER, HEALTHCHECK through the
bundled probe on the health port, ENTRYPOINT/CMD, apt hygiene, build dependencies in step with
deploy/local/install_deps.sh, and agreement with the manifests.

Each rule takes (file name, text) and raises Broken. dockerfile_failures() runs them all;
mutations.py proves that each can fail. (Syntax is dockerfile_syntax.mjs's business.)
"""

import json
import re
import shlex

import yaml

from rules_common import ROOT, Broken, expect, parse_flags

DOCKER_DIR = ROOT / "deploy" / "docker"
INSTALL_DEPS = ROOT / "deploy" / "local" / "install_deps.sh"
DOCKERFILES = {  # file name -> the -DSAMPLERD_GPU value its build stage must use
    "Dockerfile.cpu": "off",
    "Dockerfile.cuda": "cuda",
    "Dockerfile.rocm": "hip",
}
SAMPLERD_BIN = "/usr/local/bin/samplerd"
PROBE_SCRIPT = "/usr/local/lib/samplerd/grpc-health-probe.sh"
# install_deps.sh packages a build stage needs: every -dev package but the test-only (GoogleTest,
# benchmark, the fuzzer and sanitizer runtimes of libclang-rt) and Go ones, and these tools when
# listed there.
BUILD_TOOLS = {"g++", "cmake", "ninja-build", "pkg-config", "protobuf-compiler",
               "protobuf-compiler-grpc", "grpc-proto", "civetweb", "hipcc"}
NOT_FOR_IMAGES = re.compile(r"^(libgtest-dev|libgmock-dev|libbenchmark-dev|libclang-rt-.*-dev|"
                            r"golang-.*|protoc-gen-go.*|python3-.*)$")


def instructions(text):
    """[(KEYWORD, arguments)] with continuation lines joined and comment lines dropped."""
    result, pending = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = (pending + stripped).strip()
        pending = ""
        if full:
            keyword, _, rest = full.partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def stages(text):
    """[[instructions of one stage]] in order; each starts with its FROM."""
    result = []
    for keyword, args in instructions(text):
        if keyword == "FROM":
            result.append([])
        if result:
            result[-1].append((keyword, args))
    return result


def exec_form(args, what):
    try:
        value = json.loads(args)
    except ValueError:
        value = None
    expect(isinstance(value, list) and all(isinstance(v, str) for v in value),
           f"expected {what} in exec (JSON array) form, got {args!r}")
    return value


def dockerfile_user(text):
    users = [a for k, a in stages(text)[-1] if k == "USER"]
    expect(len(users) == 1, f"expected one USER in the runtime stage, got {len(users)}")
    match = re.fullmatch(r"(\d+):(\d+)", users[0])
    expect(match, f"expected USER UID:GID, both numeric, got {users[0]!r}")
    return int(match.group(1)), int(match.group(2))


def final_stage(text):
    return stages(text)[-1]


def default_flags(text):
    cmds = [a for k, a in final_stage(text) if k == "CMD"]
    expect(len(cmds) == 1, "expected one CMD in the runtime stage")
    return parse_flags(exec_form(cmds[0], "CMD"))


def apt_packages(run_args):
    """Package names given to `apt-get install` in one RUN."""
    packages = []
    for command in re.split(r"&&|;|\|\|", run_args):
        words = shlex.split(command)
        if "apt-get" in words and "install" in words:
            after = words[words.index("install") + 1:]
            packages += [w for w in after if not w.startswith("-")]
    return packages


def rule_stages(name, text):
    all_stages = stages(text)
    expect(len(all_stages) >= 2, "expected a build stage and a runtime stage")
    first = all_stages[0][0][1].split()
    expect(len(first) == 3 and first[1].upper() == "AS" and first[2] == "build",
           f"expected the first stage named build, got FROM {' '.join(first)}")
    final = all_stages[-1]
    expect(final[0][1].split()[0] == "debian:12-slim",
           f"expected the runtime stage FROM debian:12-slim, got {final[0][1]}")
    expect(not any(k == "RUN" and re.search(r"\b(cmake|g\+\+|nvcc|hipcc)\b", a) for k, a in final),
           "the runtime stage must not compile")
    copies = [a for k, a in final if k == "COPY" and a.startswith("--from=build ")]
    expect(any(a.split()[-1] == SAMPLERD_BIN for a in copies),
           f"expected the runtime stage to COPY --from=build the binary to {SAMPLERD_BIN}")
    for stage in all_stages:
        image = stage[0][1].split()[0]
        expect(":" in image and not image.endswith(":latest"),
               f"expected a pinned base image tag, got {image}")


def rule_user(name, text):
    uid, _ = dockerfile_user(text)
    expect(uid != 0, "expected a non-root USER")
    keywords = [k for k, _ in final_stage(text)]
    expect(keywords.index("USER") < keywords.index("ENTRYPOINT"),
           "expected USER before ENTRYPOINT")
    owned = [a for k, a in final_stage(text) if k == "RUN" and "/run/samplerd" in a]
    expect(any(re.search(rf"-o {uid}\b", a) for a in owned),
           f"expected the runtime stage to create /run/samplerd owned by UID {uid}")


def rule_healthcheck(name, text):
    checks = [a for k, a in final_stage(text) if k == "HEALTHCHECK"]
    expect(len(checks) == 1, "expected one HEALTHCHECK in the runtime stage")
    cmd = re.search(r"\bCMD\s+(\[.*\])\s*$", checks[0])
    expect(cmd, "expected HEALTHCHECK ... CMD [exec form]")
    argv = exec_form(cmd.group(1), "HEALTHCHECK CMD")
    port = default_flags(text).get("health_port")
    expect(PROBE_SCRIPT in argv and f"127.0.0.1:{port}" in argv,
           f"expected HEALTHCHECK to run {PROBE_SCRIPT} against 127.0.0.1:{port} "
           f"(--health_port), got {argv}")
    copies = [a for k, a in final_stage(text) if k == "COPY"]
    expect(any(a.split()[-1] == PROBE_SCRIPT and "grpc-health-probe.sh" in a for a in copies),
           f"expected deploy/docker/grpc-health-probe.sh copied to {PROBE_SCRIPT}")


def rule_entrypoint(name, text):
    entrypoints = [a for k, a in final_stage(text) if k == "ENTRYPOINT"]
    expect(len(entrypoints) == 1, "expected one ENTRYPOINT")
    expect(exec_form(entrypoints[0], "ENTRYPOINT") == [SAMPLERD_BIN],
           f"expected ENTRYPOINT [\"{SAMPLERD_BIN}\"]")
    flags = default_flags(text)
    expect(flags.get("listen") == "unix:///run/samplerd/samplerd.sock",
           f"expected CMD --listen=unix:///run/samplerd/samplerd.sock, got {flags.get('listen')}")
    exposed = " ".join(a for k, a in final_stage(text) if k == "EXPOSE").split()
    for flag in ("health_port", "metrics_port"):
        expect(flags.get(flag, "0").isdigit() and flags.get(flag, "0") != "0",
               f"expected CMD --{flag}=PORT")
        expect(flags[flag] in exposed, f"expected EXPOSE {flags[flag]} (--{flag})")


def rule_apt(name, text):
    for keyword, args in instructions(text):
        if keyword != "RUN" or "apt-get" not in args:
            continue
        if "apt-get update" in args:
            expect("apt-get install" in args, "apt-get update without apt-get install in one RUN")
            expect(re.search(r"rm -rf /var/lib/apt/lists/\*", args),
                   "apt-get update without rm -rf /var/lib/apt/lists/* in the same RUN")
        for command in re.split(r"&&|;", args):
            if "apt-get install" in command:
                expect(re.search(r"\s-y\b", command), f"apt-get install without -y: {command}")
                expect("--no-install-recommends" in command,
                       f"apt-get install without --no-install-recommends: {command}")


def rule_build_dependencies(name, text):
    listed = re.search(r"APT_PACKAGES=\(([^)]*)\)", INSTALL_DEPS.read_text())
    expect(listed, f"cannot find APT_PACKAGES in {INSTALL_DEPS}")
    words = re.sub(r"#[^\n]*", "", listed.group(1)).split()
    needed = {p for p in words if not NOT_FOR_IMAGES.match(p) and
              (p.endswith("-dev") or p in BUILD_TOOLS)}
    build = stages(text)[0]
    have = {p for k, a in build if k == "RUN" for p in apt_packages(a)}
    missing = sorted(needed - have)
    expect(not missing, f"the build stage lacks {missing} (listed in deploy/local/install_deps.sh)")


def rule_backend_build(name, text):
    gpu = DOCKERFILES[name]
    build = " ".join(a for k, a in stages(text)[0] if k == "RUN")
    expect(re.search(rf"-DSAMPLERD_GPU={gpu}\b", build),
           f"expected {name} to configure with -DSAMPLERD_GPU={gpu}")
    expect("-DSAMPLERD_BUILD_TESTS=OFF" in build, "expected -DSAMPLERD_BUILD_TESTS=OFF")
    expect("runtime-packages.sh" in build,
           "expected the build stage to list the runtime packages (runtime-packages.sh)")


def rule_ports_match_manifests(name, text):
    flags = default_flags(text)
    base = ROOT / "deploy" / "k8s" / "base" / "deployment.yaml"
    deployment = yaml.safe_load(base.read_text())
    sidecar = [c for c in deployment["spec"]["template"]["spec"]["initContainers"]
               if c["name"] == "samplerd"][0]
    manifest = parse_flags(sidecar["args"])
    for flag in ("listen", "health_port", "metrics_port"):
        expect(flags.get(flag) == manifest.get(flag),
               f"expected the image's --{flag} ({flags.get(flag)}) to match deploy/k8s "
               f"({manifest.get(flag)})")


DOCKERFILE_RULES = {
    "stages": rule_stages,
    "user": rule_user,
    "healthcheck": rule_healthcheck,
    "entrypoint": rule_entrypoint,
    "apt": rule_apt,
    "build-dependencies": rule_build_dependencies,
    "backend-build": rule_backend_build,
    "ports-match-manifests": rule_ports_match_manifests,
}


def read_dockerfiles():
    return {name: (DOCKER_DIR / name).read_text() for name in DOCKERFILES}


def dockerfile_failures(name, text):
    failures = {}
    for rule, check in DOCKERFILE_RULES.items():
        try:
            check(name, text)
        except Broken as e:
            failures[rule] = str(e)
        except (IndexError, ValueError, KeyError) as e:
            failures[rule] = f"unexpected shape: {type(e).__name__}: {e}"
    return failures
