"""The self-test of the rules: breaks in-memory copies of the rendered overlays and of the
Dockerfiles, one way per mutation, and requires the named rule to fail on each. A rule without a
mutation, or a mutation that no longer applies, is a failure too.
"""

import copy

from dockerfile_rules import DOCKERFILE_RULES, dockerfile_failures, read_dockerfiles
from pod_rules import POD_RULES, pod_failures


# Helpers for the mutations below.
def containers(docs, name):
    spec = [d for d in docs if d["kind"] == "Deployment"][0]["spec"]["template"]["spec"]
    for c in (spec.get("initContainers") or []) + spec["containers"]:
        if c["name"] == name:
            return c
    raise KeyError(name)


def pod_spec(docs):
    return [d for d in docs if d["kind"] == "Deployment"][0]["spec"]["template"]["spec"]


def set_arg(docs, flag, value):
    c = containers(docs, "samplerd")
    c["args"] = [a for a in c["args"] if not a.startswith(f"--{flag}=")] + [f"--{flag}={value}"]


def drop_arg(docs, flag):
    c = containers(docs, "samplerd")
    c["args"] = [a for a in c["args"] if not a.startswith(f"--{flag}=")]


# (overlay, rule expected to fail, what the mutation does, the mutation)
POD_MUTATIONS = [
    ("nvidia", "native-sidecar", "sidecar without restartPolicy Always",
     lambda d: containers(d, "samplerd").pop("restartPolicy")),
    ("amd", "backend", "--backend=auto on a GPU overlay", lambda d: set_arg(d, "backend", "auto")),
    ("cpu", "backend", "--backend=gpu on the cpu overlay", lambda d: set_arg(d, "backend", "gpu")),
    ("nvidia", "gpu-claim", "engine without the claim",
     lambda d: containers(d, "engine")["resources"].pop("claims")),
    ("amd", "gpu-claim", "sidecar names another claim",
     lambda d: containers(d, "samplerd")["resources"].update(claims=[{"name": "other"}])),
    ("nvidia", "gpu-claim", "pod claim points at a template that is not rendered",
     lambda d: pod_spec(d)["resourceClaims"][0].update(resourceClaimTemplateName="gone")),
    ("cpu", "gpu-claim", "a claim left in the cpu overlay",
     lambda d: pod_spec(d).update(resourceClaims=[{"name": "gpu",
                                                  "resourceClaimTemplateName": "x"}])),
    ("amd", "device-class", "NVIDIA's DeviceClass in the amd overlay",
     lambda d: [t for t in d if t["kind"] == "ResourceClaimTemplate"][0]["spec"]["spec"]
     ["devices"]["requests"][0]["exactly"].update(deviceClassName="gpu.nvidia.com")),
    ("nvidia", "device-class", "two GPUs requested",
     lambda d: [t for t in d if t["kind"] == "ResourceClaimTemplate"][0]["spec"]["spec"]
     ["devices"]["requests"][0]["exactly"].update(count=2)),
    ("nvidia", "socket", "engine's SAMPLERD_SOCKET differs from --listen",
     lambda d: containers(d, "engine")["env"][0].update(value="/run/samplerd/other.sock")),
    ("cpu", "socket", "--listen on TCP", lambda d: set_arg(d, "listen", "0.0.0.0:50051")),
    ("amd", "socket", "engine mounts the socket volume elsewhere",
     lambda d: [m for m in containers(d, "engine")["volumeMounts"]
                if m["mountPath"] == "/run/samplerd"][0].update(mountPath="/sock")),
    ("nvidia", "dev-shm", "/dev/shm on disk",
     lambda d: [v for v in pod_spec(d)["volumes"] if v["name"] == "dshm"][0]["emptyDir"]
     .pop("medium")),
    ("cpu", "dev-shm", "engine without /dev/shm",
     lambda d: containers(d, "engine").update(volumeMounts=[
         m for m in containers(d, "engine")["volumeMounts"] if m["mountPath"] != "/dev/shm"])),
    ("nvidia", "probes", "readiness probe on another port",
     lambda d: containers(d, "samplerd")["readinessProbe"]["grpc"].update(port=8082)),
    ("amd", "probes", "liveness probe over TCP instead of gRPC",
     lambda d: containers(d, "samplerd").update(livenessProbe={"tcpSocket": {"port": 8081}})),
    ("cpu", "probes", "--health_port changed without the probes",
     lambda d: set_arg(d, "health_port", "9091")),
    ("nvidia", "metrics", "annotation on another port",
     lambda d: d[0]["spec"]["template"]["metadata"]["annotations"].update(
         {"prometheus.io/port": "9091"})),
    ("cpu", "metrics", "--metrics_port=0", lambda d: set_arg(d, "metrics_port", "0")),
    ("amd", "process-namespace", "no shared process namespace",
     lambda d: pod_spec(d).pop("shareProcessNamespace")),
    ("nvidia", "security-context", "engine may escalate privileges",
     lambda d: containers(d, "engine")["securityContext"].update(allowPrivilegeEscalation=True)),
    ("cpu", "security-context", "sidecar adds a capability",
     lambda d: containers(d, "samplerd")["securityContext"]["capabilities"].update(
         add=["SYS_PTRACE"])),
    ("amd", "security-context", "pod without seccomp",
     lambda d: pod_spec(d)["securityContext"].pop("seccompProfile")),
    ("nvidia", "security-context", "writable root filesystem",
     lambda d: containers(d, "samplerd")["securityContext"].update(readOnlyRootFilesystem=False)),
    ("nvidia", "resources", "sidecar without a memory limit",
     lambda d: containers(d, "samplerd")["resources"]["limits"].pop("memory")),
    ("amd", "images", "CUDA image in the amd overlay",
     lambda d: containers(d, "samplerd").update(image="registry.example.com/samplerd:0.1.0-cuda")),
    ("nvidia", "images", "the base's placeholder DeviceClass left in",
     lambda d: [t for t in d if t["kind"] == "ResourceClaimTemplate"][0]["spec"]["spec"]
     ["devices"]["requests"][0]["exactly"].update(deviceClassName="gpu.example.com")),
    ("nvidia", "memory-budget", "a 1 GiB --max_inflight_bytes in a 1Gi limit",
     lambda d: set_arg(d, "max_inflight_bytes", str(1 << 30))),
    ("cpu", "memory-budget", "--max_inflight_bytes=0 (no limit) with 256 MiB messages",
     lambda d: (set_arg(d, "max_inflight_bytes", "0"),
                set_arg(d, "max_message_bytes", str(256 << 20)))),
    ("nvidia", "memory-budget",
     "no --max_inflight_bytes and the server's default of 256 requests in flight",
     lambda d: (drop_arg(d, "max_inflight_bytes"), set_arg(d, "max_inflight", "256"))),
    ("cpu", "memory-budget", "no --max_inflight_bytes and 256 MiB messages",
     lambda d: (drop_arg(d, "max_inflight_bytes"),
                set_arg(d, "max_message_bytes", str(256 << 20)))),
    ("amd", "memory-budget", "no --max_inflight_bytes nor --max_inflight (0 is no limit)",
     lambda d: (drop_arg(d, "max_inflight_bytes"), drop_arg(d, "max_inflight"))),
    # The budget does not count messages received before admission: these fit the budget and
    # receive terms alone and fail only with the stream messages added.
    ("cpu", "memory-budget", "the budget set, with 4 x 64 MiB messages received beside it",
     lambda d: set_arg(d, "max_inflight", "4")),
    ("cpu", "memory-budget", "no --max_receive_bytes: a burst of unary requests is held whole",
     lambda d: drop_arg(d, "max_receive_bytes")),
    ("nvidia", "memory-budget", "--max_receive_bytes below --max_message_bytes",
     lambda d: set_arg(d, "max_receive_bytes", str(8 << 20))),
    ("amd", "memory-budget", "a 512 MiB --max_receive_bytes in a 1Gi limit",
     lambda d: set_arg(d, "max_receive_bytes", str(512 << 20))),
    ("nvidia", "memory-budget", "the budget set, with 8 x 256 MiB messages received beside it",
     lambda d: set_arg(d, "max_message_bytes", str(256 << 20))),
    ("amd", "memory-budget", "the budget set, without --max_message_bytes (256 MiB by default)",
     lambda d: drop_arg(d, "max_message_bytes")),
    ("nvidia", "memory-budget", "no --max_host_session_bytes: its 8 GiB default in a 1Gi limit",
     lambda d: drop_arg(d, "max_host_session_bytes")),
    ("cpu", "memory-budget", "--max_host_session_bytes=0 (no limit)",
     lambda d: set_arg(d, "max_host_session_bytes", "0")),
    ("amd", "memory-budget", "a 256 MiB --max_host_session_bytes beside the budgets",
     lambda d: set_arg(d, "max_host_session_bytes", str(256 << 20))),
    ("cpu", "grace-period", "sidecar drain longer than the pod's budget",
     lambda d: set_arg(d, "grace_period", "90s")),
    ("amd", "image-user", "pod runs as another UID than the images",
     lambda d: pod_spec(d)["securityContext"].update(runAsUser=1000)),
    ("nvidia-mps", "mps", "pipe directory not shared: the engine mounts another volume there",
     lambda d: [m for m in containers(d, "engine")["volumeMounts"]
                if m["mountPath"] == "/run/nvidia-mps"][0].update(name="engine-tmp")),
    ("nvidia-mps", "mps", "samplerd without CUDA_MPS_PIPE_DIRECTORY",
     lambda d: containers(d, "samplerd").pop("env")),
    ("nvidia-mps", "mps", "engine's CUDA_MPS_PIPE_DIRECTORY points elsewhere",
     lambda d: [e for e in containers(d, "engine")["env"]
                if e["name"] == "CUDA_MPS_PIPE_DIRECTORY"][0].update(value="/tmp/mps")),
    ("nvidia-mps", "mps", "daemon started after samplerd",
     lambda d: pod_spec(d)["initContainers"].reverse()),
    ("nvidia-mps", "mps", "daemon not a native sidecar",
     lambda d: containers(d, "mps-control").pop("restartPolicy")),
    ("nvidia-mps", "mps", "daemon in the background (-d) instead of the foreground",
     lambda d: containers(d, "mps-control").update(command=["nvidia-cuda-mps-control", "-d"])),
    ("nvidia-mps", "mps", "pipe volume on disk",
     lambda d: [v for v in pod_spec(d)["volumes"] if v["name"] == "nvidia-mps-pipe"][0]
     ["emptyDir"].pop("medium")),
    ("nvidia-mps", "mps", "daemon image not samplerd's (the overlay's images entry dropped)",
     lambda d: containers(d, "mps-control").update(image="samplerd")),
    ("nvidia-mps", "mps", "daemon without the GPU claim",
     lambda d: containers(d, "mps-control")["resources"].pop("claims")),
    ("nvidia", "mps", "MPS environment in the plain nvidia overlay",
     lambda d: containers(d, "engine")["env"].append(
         {"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/run/nvidia-mps"})),
]

# (Dockerfile, rule expected to fail, what the mutation does, old text, new text)
DOCKERFILE_MUTATIONS = [
    ("Dockerfile.cpu", "stages", "single stage (runtime FROM the build image)",
     "FROM debian:12-slim", "FROM debian:12"),
    ("Dockerfile.cuda", "stages", "unpinned base",
     "FROM debian:12 AS build", "FROM debian AS build"),
    ("Dockerfile.rocm", "user", "USER root", "USER 65532:65532", "USER 0:0"),
    ("Dockerfile.cpu", "user", "USER by name", "USER 65532:65532", "USER samplerd"),
    ("Dockerfile.cuda", "healthcheck", "no HEALTHCHECK", "HEALTHCHECK --interval=30s --timeout=5s",
     "LABEL x=y"),
    ("Dockerfile.rocm", "healthcheck", "HEALTHCHECK on the metrics port",
     '"127.0.0.1:8081"]', '"127.0.0.1:9090"]'),
    ("Dockerfile.cpu", "entrypoint", "shell-form ENTRYPOINT",
     'ENTRYPOINT ["/usr/local/bin/samplerd"]', "ENTRYPOINT /usr/local/bin/samplerd"),
    ("Dockerfile.cuda", "entrypoint", "metrics port not exposed",
     "EXPOSE 8081 9090", "EXPOSE 8081"),
    ("Dockerfile.rocm", "apt", "apt lists kept in the runtime image",
     "rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt", "rm -f /tmp/runtime-packages.txt"),
    ("Dockerfile.cpu", "apt", "recommends installed",
     "apt-get install -y --no-install-recommends \\", "apt-get install -y \\"),
    ("Dockerfile.cuda", "build-dependencies", "a build dependency dropped",
     " libabsl-dev ", " "),
    ("Dockerfile.rocm", "backend-build", "ROCm image built without HIP",
     "-DSAMPLERD_GPU=hip", "-DSAMPLERD_GPU=off"),
    ("Dockerfile.cpu", "ports-match-manifests", "image listens elsewhere than the manifests",
     '"--listen=unix:///run/samplerd/samplerd.sock"', '"--listen=unix:///run/s.sock"'),
]


def self_test(rendered):
    """Failure messages for mutations that their rule did not catch, and untested rules."""
    problems = []
    for overlay, rule, what, mutate in POD_MUTATIONS:
        docs = copy.deepcopy(rendered[overlay])
        mutate(docs)
        if rule not in pod_failures(overlay, docs):
            problems.append(f"rule {rule} did not catch: {what} ({overlay})")
    originals = read_dockerfiles()
    for name, rule, what, old, new in DOCKERFILE_MUTATIONS:
        if old not in originals[name]:
            problems.append(f"mutation '{what}' no longer applies to {name}: update it")
            continue
        if rule not in dockerfile_failures(name, originals[name].replace(old, new, 1)):
            problems.append(f"rule {rule} did not catch: {what} ({name})")
    tried = {m[1] for m in POD_MUTATIONS} | {m[1] for m in DOCKERFILE_MUTATIONS}
    for rule in list(POD_RULES) + list(DOCKERFILE_RULES):
        if rule not in tried:
            problems.append(f"rule {rule} has no mutation showing that it can fail")
    return problems, len(POD_MUTATIONS) + len(DOCKERFILE_MUTATIONS)
