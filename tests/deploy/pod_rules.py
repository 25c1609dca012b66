"""Pod rules: what must hold in each rendered overlay for samplerd to work beside the engine.

Each rule takes a Pod (the rendered objects of one overlay) and raises Broken. pod_failures()
runs them all; mutations.py proves that each can fail.
"""

import json
import re

from dockerfile_rules import dockerfile_user, read_dockerfiles
from rules_common import Broken, expect, parse_flags

# What each overlay must be: the DRA DeviceClass (None: no GPU claim at all), samplerd's
# --backend, the suffix of its image tag (which Dockerfile it was built from), and whether it
# runs a pod-local CUDA MPS control daemon.
OVERLAYS = {
    "nvidia": {"device_class": "gpu.nvidia.com", "backend": "gpu", "image_suffix": "-cuda",
               "mps": False},
    "nvidia-mps": {"device_class": "gpu.nvidia.com", "backend": "gpu", "image_suffix": "-cuda",
                   "mps": True},
    "amd": {"device_class": "gpu.amd.com", "backend": "gpu", "image_suffix": "-rocm",
            "mps": False},
    "cpu": {"device_class": None, "backend": "cpu", "image_suffix": "-cpu", "mps": False},
}

# The MPS daemon's container name and command (overlays/nvidia-mps).
MPS_CONTAINER = "mps-control"
MPS_COMMAND = ["nvidia-cuda-mps-control", "-f"]


class Pod:
    """The rendered objects of one overlay, with the parts the rules look at."""

    def __init__(self, overlay, docs):
        self.overlay = overlay
        self.expected = OVERLAYS[overlay]
        self.docs = docs
        deployments = [d for d in docs if d.get("kind") == "Deployment"]
        expect(len(deployments) == 1, f"expected 1 Deployment, got {len(deployments)}")
        self.deployment = deployments[0]
        self.template = self.deployment["spec"]["template"]
        self.spec = self.template["spec"]
        self.sidecar = self._container("initContainers", "samplerd")
        self.engine = self._container("containers", "engine")
        self.flags = parse_flags(self.sidecar.get("args", []))

    def _container(self, field, name):
        found = [c for c in self.spec.get(field) or [] if c.get("name") == name]
        expect(len(found) == 1, f"expected one {field} entry named {name}, got {len(found)}")
        return found[0]

    def flag(self, name):
        expect(name in self.flags, f"samplerd args lack --{name}=")
        return self.flags[name]

    def port_flag(self, name):
        value = self.flag(name)
        expect(value.isdigit() and 0 < int(value) < 65536,
               f"expected --{name} a TCP port (not 0), got {value!r}")
        return int(value)

    def volume(self, name):
        found = [v for v in self.spec.get("volumes") or [] if v.get("name") == name]
        expect(len(found) == 1, f"expected one volume named {name}, got {len(found)}")
        return found[0]

    def claim_templates(self):
        return [d for d in self.docs if d.get("kind") == "ResourceClaimTemplate"]


def mount_of(container, path):
    mounts = [m for m in container.get("volumeMounts") or [] if m.get("mountPath") == path]
    expect(len(mounts) == 1, f"expected container {container['name']} to mount {path}")
    return mounts[0]


def rule_native_sidecar(pod):
    expect(pod.sidecar.get("restartPolicy") == "Always",
           "expected samplerd's init container to have restartPolicy Always (native sidecar), "
           f"got {pod.sidecar.get('restartPolicy')!r}")
    names = [c.get("name") for c in pod.spec.get("containers") or []]
    expect("samplerd" not in names, "samplerd must not also be a regular container")


def rule_backend(pod):
    backend = pod.flag("backend")
    expect(backend == pod.expected["backend"],
           f"expected --backend={pod.expected['backend']}, got {backend}")


def rule_gpu_claim(pod):
    claims = pod.spec.get("resourceClaims") or []
    templates = pod.claim_templates()
    if pod.expected["device_class"] is None:
        expect(not claims and not templates,
               "expected no resourceClaims and no ResourceClaimTemplate in the cpu overlay")
        for c in (pod.sidecar, pod.engine):
            expect(not (c.get("resources") or {}).get("claims"),
                   f"expected no claims in container {c['name']} (cpu overlay)")
        return
    expect(len(claims) == 1, f"expected the pod to declare 1 resource claim, got {len(claims)}")
    claim = claims[0]
    template_names = [t["metadata"]["name"] for t in templates]
    expect(claim.get("resourceClaimTemplateName") in template_names,
           f"expected the pod's claim to use one of the rendered templates {template_names}, "
           f"got {claim.get('resourceClaimTemplateName')!r}")
    for c in (pod.sidecar, pod.engine):
        refs = [r.get("name") for r in (c.get("resources") or {}).get("claims") or []]
        expect(refs == [claim["name"]],
               f"expected container {c['name']} to use claim {claim['name']!r}, got {refs}")


def rule_device_class(pod):
    if pod.expected["device_class"] is None:
        return
    for template in pod.claim_templates():
        expect(template.get("apiVersion") == "resource.k8s.io/v1",
               f"expected resource.k8s.io/v1, got {template.get('apiVersion')}")
        requests = template["spec"]["spec"]["devices"]["requests"]
        expect(len(requests) == 1, f"expected 1 device request, got {len(requests)}")
        exactly = requests[0].get("exactly") or {}
        expect(exactly.get("deviceClassName") == pod.expected["device_class"],
               f"expected deviceClassName {pod.expected['device_class']}, "
               f"got {exactly.get('deviceClassName')!r}")
        expect(exactly.get("allocationMode", "ExactCount") == "ExactCount" and
               exactly.get("count", 1) == 1, "expected exactly one device")


def rule_socket(pod):
    listen = pod.flag("listen")
    expect(re.fullmatch(r"unix:///[^,]+", listen),
           f"expected --listen to be one unix:///abs/path socket, got {listen!r}")
    socket = listen[len("unix://"):]
    directory = socket.rsplit("/", 1)[0]
    sidecar_mount = mount_of(pod.sidecar, directory)
    engine_mount = mount_of(pod.engine, directory)
    expect(sidecar_mount["name"] == engine_mount["name"],
           f"expected both containers to mount the same volume at {directory}")
    expect(not engine_mount.get("readOnly") and not sidecar_mount.get("readOnly"),
           "the socket directory must be writable (connect needs write permission)")
    expect("emptyDir" in pod.volume(sidecar_mount["name"]),
           f"expected the socket volume {sidecar_mount['name']} to be an emptyDir")
    env = {e.get("name"): e.get("value") for e in pod.engine.get("env") or []}
    expect(env.get("SAMPLERD_SOCKET") == socket,
           f"expected the engine's SAMPLERD_SOCKET={socket} (from --listen), "
           f"got {env.get('SAMPLERD_SOCKET')!r}")


def rule_dev_shm(pod):
    sidecar_mount = mount_of(pod.sidecar, "/dev/shm")
    engine_mount = mount_of(pod.engine, "/dev/shm")
    expect(sidecar_mount["name"] == engine_mount["name"],
           "expected both containers to mount the same volume at /dev/shm")
    empty_dir = pod.volume(sidecar_mount["name"]).get("emptyDir")
    expect(isinstance(empty_dir, dict) and empty_dir.get("medium") == "Memory",
           "expected /dev/shm to be an emptyDir with medium Memory")


def rule_probes(pod):
    port = pod.port_flag("health_port")
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = pod.sidecar.get(kind)
        expect(probe, f"expected samplerd to have a {kind}")
        grpc = probe.get("grpc")
        expect(grpc and set(probe) & {"httpGet", "tcpSocket", "exec"} == set(),
               f"expected {kind} to be a gRPC probe")
        expect(grpc.get("port") == port,
               f"expected {kind} on --health_port {port}, got {grpc.get('port')!r}")
    ports = [p.get("containerPort") for p in pod.sidecar.get("ports") or []]
    expect(port in ports, f"expected containerPort {port} (health) on samplerd, got {ports}")


def rule_metrics(pod):
    port = pod.port_flag("metrics_port")
    expect(port != pod.port_flag("health_port"), "metrics and health ports must differ")
    annotations = pod.template.get("metadata", {}).get("annotations") or {}
    expect(annotations.get("prometheus.io/scrape") == "true",
           "expected the pod annotation prometheus.io/scrape: \"true\"")
    expect(annotations.get("prometheus.io/port") == str(port),
           f"expected prometheus.io/port: \"{port}\" (--metrics_port), "
           f"got {annotations.get('prometheus.io/port')!r}")
    expect(annotations.get("prometheus.io/path", "/metrics") == "/metrics",
           "expected prometheus.io/path /metrics")
    ports = [p.get("containerPort") for p in pod.sidecar.get("ports") or []]
    expect(port in ports, f"expected containerPort {port} (metrics) on samplerd, got {ports}")


def rule_process_namespace(pod):
    expect(pod.spec.get("shareProcessNamespace") is True,
           "expected shareProcessNamespace: true (GPU IPC needs the producer's process)")


def rule_security_context(pod):
    ctx = pod.spec.get("securityContext") or {}
    expect(ctx.get("runAsNonRoot") is True, "expected pod runAsNonRoot: true")
    expect(isinstance(ctx.get("runAsUser"), int) and ctx["runAsUser"] > 0,
           "expected a non-zero pod runAsUser")
    expect((ctx.get("seccompProfile") or {}).get("type") == "RuntimeDefault",
           "expected pod seccompProfile RuntimeDefault")
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        expect(not pod.spec.get(field), f"expected no {field}")
    expect(pod.spec.get("automountServiceAccountToken") is False,
           "expected automountServiceAccountToken: false")
    for c in (pod.sidecar, pod.engine):
        sc = c.get("securityContext") or {}
        name = c["name"]
        expect(sc.get("allowPrivilegeEscalation") is False,
               f"expected {name}: allowPrivilegeEscalation false")
        expect(sc.get("readOnlyRootFilesystem") is True,
               f"expected {name}: readOnlyRootFilesystem true")
        expect(not sc.get("privileged"), f"expected {name}: not privileged")
        caps = sc.get("capabilities") or {}
        expect("ALL" in (caps.get("drop") or []) and not caps.get("add"),
               f"expected {name}: capabilities drop [ALL], add none")
        expect(sc.get("runAsUser", 1) != 0 and sc.get("runAsNonRoot", True) is not False,
               f"expected {name}: not to run as root")


def rule_resources(pod):
    for c in (pod.sidecar, pod.engine):
        res = c.get("resources") or {}
        requests, limits = res.get("requests") or {}, res.get("limits") or {}
        expect("cpu" in requests and "memory" in requests,
               f"expected cpu and memory requests on {c['name']}")
        expect("memory" in limits, f"expected a memory limit on {c['name']}")


# What samplerd holds at its peak per inline message being received, as a multiple of its bytes:
# gRPC's received bytes and the parsed request (2.5x measured with VmHWM on the CPU backend for 64
# and 128 MiB requests, deploy/README.md). The peak comes with the parse, before admission, so a
# message refused as over --max_inflight or --max_inflight_bytes reaches it too. Once parsed, the
# received bytes are freed: admitted work holds its logits once. BASE_MEMORY_MIB is what the
# server needs besides (threads, the GPU runtime's host allocations).
INLINE_PEAK_FACTOR = 2.5
BASE_MEMORY_MIB = 256
MEMORY_UNITS = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024 * 1024}


def memory_mib(quantity):
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti)", str(quantity))
    expect(match, f"expected a memory quantity such as 1Gi or 512Mi, got {quantity!r}")
    return int(match.group(1)) * MEMORY_UNITS[match.group(2)]


def positive_flag(pod, name, what):
    value = pod.flag(name)
    expect(value.isdigit() and int(value) > 0, f"expected --{name} a positive {what}, got {value!r}")
    return int(value)


def rule_memory_budget(pod):
    """The sidecar's memory limit holds BASE_MEMORY_MIB, the admitted inline bytes once, and
    INLINE_PEAK_FACTOR x the messages samplerd can be receiving at once (deploy/README.md,
    "Memory", says why):

      256 MiB + max_inflight_bytes + 2.5 x (max_receive_bytes + max_inflight x max_message_bytes)
              + max_host_session_bytes

    --max_inflight_bytes bounds the logits of admitted work, chunked SampleStream steps included
    (which no other flag bounds; 0 or unset: no limit, counted as 0). --max_receive_bytes bounds
    the unary requests being received however many arrive, and must be set: without it a burst of
    requests is held whole; below --max_message_bytes the server refuses to start. The last term
    is the stream messages, one per stream at a time, which the engine keeps to --max_inflight.
    The server's defaults (256 requests of 256 MiB, no budgets) would get it OOM-killed, so
    --max_message_bytes and --max_inflight must be set in every case. So must
    --max_host_session_bytes (0 is no limit; its default, 8 GiB, is above any sidecar's limit
    here): the host-plane device sessions' copies of a step's logits, held while they are open."""
    limit = memory_mib(((pod.sidecar.get("resources") or {}).get("limits") or {}).get("memory"))
    budget = pod.flags.get("max_inflight_bytes", "0")
    expect(budget.isdigit(),
           f"expected --max_inflight_bytes a byte count (0 is no limit), got {budget!r}")
    message = positive_flag(pod, "max_message_bytes", "byte count")
    receive = positive_flag(pod, "max_receive_bytes", "byte count (0 is no limit)")
    expect(receive >= message,
           f"expected --max_receive_bytes ({receive}) at least --max_message_bytes ({message}): "
           "samplerd refuses to start with less")
    inflight = positive_flag(pod, "max_inflight", "count (0 is no limit)")
    sessions = positive_flag(pod, "max_host_session_bytes", "byte count (0 is no limit)")
    budget_mib = int(budget) / 2**20
    receive_mib = receive / 2**20
    messages_mib = inflight * message / 2**20
    sessions_mib = sessions / 2**20
    worst = (BASE_MEMORY_MIB + budget_mib + INLINE_PEAK_FACTOR * (receive_mib + messages_mib) +
             sessions_mib)
    budget_text = (f"--max_inflight_bytes={budget} ({budget_mib:.0f} MiB) of admitted logits, "
                   if budget_mib else "")
    expect(worst <= limit,
           f"expected samplerd's memory limit ({limit:.0f} MiB) to hold {budget_text}"
           f"--max_receive_bytes={receive} ({receive_mib:.0f} MiB) of unary requests and "
           f"{inflight} stream messages of {message / 2**20:.0f} MiB being received, at "
           f"{INLINE_PEAK_FACTOR}x, --max_host_session_bytes={sessions} ({sessions_mib:.0f} MiB) "
           f"of host-plane session copies, and {BASE_MEMORY_MIB} MiB besides "
           f"({worst:.0f} MiB), got less")


def rule_images(pod):
    image = pod.sidecar.get("image", "")
    suffix = pod.expected["image_suffix"]
    expect(re.search(re.escape(suffix) + r"$", image),
           f"expected samplerd's image tag to end in {suffix} for {pod.overlay}, got {image!r}")
    expect("gpu.example.com" not in json.dumps(pod.docs),
           "the base's placeholder DeviceClass gpu.example.com is still there")


def rule_grace_period(pod):
    match = re.fullmatch(r"(\d+)s", pod.flag("grace_period"))
    expect(match, f"expected --grace_period in whole seconds (e.g. 20s), got "
                  f"{pod.flag('grace_period')!r}")
    budget = pod.spec.get("terminationGracePeriodSeconds", 30)
    expect(budget > int(match.group(1)),
           f"expected terminationGracePeriodSeconds ({budget}) above samplerd's --grace_period "
           f"({match.group(1)}s): the sidecar drains after the engine has stopped")


def rule_image_user(pod):
    uids = {dockerfile_user(text)[0] for text in read_dockerfiles().values()}
    gids = {dockerfile_user(text)[1] for text in read_dockerfiles().values()}
    ctx = pod.spec.get("securityContext") or {}
    expect(uids == {ctx.get("runAsUser")},
           f"expected pod runAsUser {uids} (the images' USER), got {ctx.get('runAsUser')}")
    expect(gids == {ctx.get("fsGroup")} and gids == {ctx.get("runAsGroup")},
           f"expected pod runAsGroup and fsGroup {gids} (the images' group)")


def rule_mps(pod):
    """nvidia-mps: a native-sidecar MPS control daemon, started before samplerd, whose pipe
    directory samplerd and the engine share (CUDA_MPS_PIPE_DIRECTORY on one Memory emptyDir).
    Other overlays: no MPS daemon and no MPS environment."""
    init = pod.spec.get("initContainers") or []
    daemons = [c for c in init if c.get("name") == MPS_CONTAINER]
    everyone = init + (pod.spec.get("containers") or [])
    if not pod.expected["mps"]:
        expect(not daemons, f"expected no {MPS_CONTAINER} container in {pod.overlay}")
        for c in everyone:
            env = {e.get("name") for e in c.get("env") or []}
            expect("CUDA_MPS_PIPE_DIRECTORY" not in env,
                   f"expected no CUDA_MPS_PIPE_DIRECTORY in {c['name']} ({pod.overlay})")
        return
    expect(len(daemons) == 1, f"expected one init container {MPS_CONTAINER}, got {len(daemons)}")
    daemon = daemons[0]
    expect((daemon.get("command") or []) + (daemon.get("args") or []) == MPS_COMMAND,
           f"expected {MPS_CONTAINER} to run {' '.join(MPS_COMMAND)} (foreground), got "
           f"{(daemon.get('command') or []) + (daemon.get('args') or [])}")
    expect(daemon.get("restartPolicy") == "Always",
           f"expected {MPS_CONTAINER} to be a native sidecar (restartPolicy Always), got "
           f"{daemon.get('restartPolicy')!r}")
    names = [c.get("name") for c in init]
    expect(names.index(MPS_CONTAINER) < names.index("samplerd"),
           f"expected {MPS_CONTAINER} before samplerd in initContainers, got {names}")
    expect(daemon.get("startupProbe"),
           f"expected a startupProbe on {MPS_CONTAINER}, so that samplerd waits for the daemon")
    expect(daemon.get("image") == pod.sidecar.get("image"),
           f"expected {MPS_CONTAINER} to run samplerd's image {pod.sidecar.get('image')!r}, got "
           f"{daemon.get('image')!r}")

    def env_of(c):
        return {e.get("name"): e.get("value") for e in c.get("env") or []}

    pipe = env_of(daemon).get("CUDA_MPS_PIPE_DIRECTORY")
    expect(pipe and pipe.startswith("/"),
           f"expected an absolute CUDA_MPS_PIPE_DIRECTORY on {MPS_CONTAINER}, got {pipe!r}")
    log = env_of(daemon).get("CUDA_MPS_LOG_DIRECTORY")
    expect(log and log.startswith("/"),
           f"expected an absolute CUDA_MPS_LOG_DIRECTORY on {MPS_CONTAINER}, got {log!r}")
    mount_of(daemon, log)  # writable: the root filesystem is read-only
    volume_name = mount_of(daemon, pipe)["name"]
    for c in (pod.sidecar, pod.engine):
        expect(env_of(c).get("CUDA_MPS_PIPE_DIRECTORY") == pipe,
               f"expected CUDA_MPS_PIPE_DIRECTORY={pipe} in {c['name']}, got "
               f"{env_of(c).get('CUDA_MPS_PIPE_DIRECTORY')!r}")
        mount = mount_of(c, pipe)
        expect(mount["name"] == volume_name and not mount.get("readOnly"),
               f"expected {c['name']} to mount the daemon's pipe volume {volume_name} writable "
               f"at {pipe}, got {mount['name']}")
    empty_dir = pod.volume(volume_name).get("emptyDir")
    expect(isinstance(empty_dir, dict) and empty_dir.get("medium") == "Memory",
           f"expected the MPS pipe volume {volume_name} to be an emptyDir with medium Memory")
    claims = [r.get("name") for r in (daemon.get("resources") or {}).get("claims") or []]
    pod_claims = [c.get("name") for c in pod.spec.get("resourceClaims") or []]
    expect(claims == pod_claims and claims,
           f"expected {MPS_CONTAINER} to use the pod's GPU claim {pod_claims}, got {claims}")
    sc = daemon.get("securityContext") or {}
    expect(sc.get("allowPrivilegeEscalation") is False and sc.get("readOnlyRootFilesystem")
           is True and "ALL" in ((sc.get("capabilities") or {}).get("drop") or []) and
           not (sc.get("capabilities") or {}).get("add") and not sc.get("privileged") and
           sc.get("runAsUser", 1) != 0,
           f"expected {MPS_CONTAINER} as restricted as samplerd (no escalation, read-only root, "
           "capabilities drop [ALL], not root)")
    expect("memory" in ((daemon.get("resources") or {}).get("limits") or {}),
           f"expected a memory limit on {MPS_CONTAINER}")


POD_RULES = {
    "native-sidecar": rule_native_sidecar,
    "backend": rule_backend,
    "gpu-claim": rule_gpu_claim,
    "device-class": rule_device_class,
    "socket": rule_socket,
    "dev-shm": rule_dev_shm,
    "probes": rule_probes,
    "metrics": rule_metrics,
    "process-namespace": rule_process_namespace,
    "security-context": rule_security_context,
    "resources": rule_resources,
    "memory-budget": rule_memory_budget,
    "images": rule_images,
    "grace-period": rule_grace_period,
    "image-user": rule_image_user,
    "mps": rule_mps,
}


def overlay_of(file_name):
    """The overlay a rendered file belongs to: its own name, else the longest overlay name it
    starts with ("nvidia-mps-x" is nvidia-mps, "nvidia-prefixed" is nvidia)."""
    if file_name in OVERLAYS:
        return file_name
    matches = [o for o in OVERLAYS if file_name.startswith(o + "-")]
    return max(matches, key=len) if matches else None


def pod_failures(overlay, docs):
    """{rule: message} for the rules that fail on these objects."""
    try:
        pod = Pod(overlay, docs)
    except (Broken, KeyError, TypeError) as e:
        return {"structure": f"{type(e).__name__}: {e}"}
    failures = {}
    for rule, check in POD_RULES.items():
        try:
            check(pod)
        except Broken as e:
            failures[rule] = str(e)
        except (KeyError, TypeError, AttributeError) as e:
            failures[rule] = f"unexpected shape: {type(e).__name__}: {e}"
    return failures
