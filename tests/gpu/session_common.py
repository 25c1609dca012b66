"""Shared pieces of device_session_cuda.py: the run's constants and PASS/FAIL record, the server
probes (health, open_sessions, nvidia-smi memory), random per-row parameters, the session-vs-unary
tally and random logits."""

import os
import subprocess
import sys
import time
import traceback

import numpy as np
import torch

VOCAB = 151936
MAX_BATCH = 64
PLANES = ("gpu", "host")
CHECKS = ("eager", "auto", "closed", "graph", "invalid", "concurrent", "processors",
          "engine_kill", "server_kill", "bench", "processors_bench")
RESULTS = []  # (name, passed, detail)
HERE = os.path.dirname(os.path.abspath(__file__))
DEADLINE = [float("inf")]  # time.monotonic() by which the run must end (--deadline)


def time_left():
    return DEADLINE[0] - time.monotonic()


def check(ok, name, detail=""):
    """Records and prints one PASS/FAIL line."""
    ok = bool(ok)
    print("%s  %s%s" % ("PASS" if ok else "FAIL", name, ("  (" + detail + ")") if detail else ""),
          flush=True)
    RESULTS.append((name, ok, detail))
    return ok


def guarded(name, fn, *args):
    """Runs one check function; an exception fails it (with its traceback) and the run goes on."""
    t0 = time.monotonic()
    print("--- %s" % name, flush=True)
    if time_left() < 15:
        check(False, name, "not run: the --deadline leaves %.0f s" % max(time_left(), 0))
        return
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 -- any failure of a check is reported, not fatal
        traceback.print_exc()
        sys.stdout.flush()
        check(False, name, "raised %s: %s" % (type(e).__name__, str(e)[:300]))
    print("    (%s: %.1f s)" % (name, time.monotonic() - t0), flush=True)


# --- server probes ------------------------------------------------------------------------------

def health(target, timeout=2.0):
    """grpc.health.v1.Health/Check for the whole server: "SERVING", "NOT_SERVING", ... or the
    error. Hand-encoded (request: empty; response: field 1 varint), so no grpc_health package."""
    import grpc
    try:
        with grpc.insecure_channel(target) as channel:
            call = channel.unary_unary("/grpc.health.v1.Health/Check",
                                       request_serializer=lambda b: b,
                                       response_deserializer=lambda b: b)
            reply = call(b"", timeout=timeout)
    except grpc.RpcError as e:
        return "error %s" % e.code().name
    names = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}
    status = reply[1] if len(reply) >= 2 and reply[0] == 0x08 else 0
    return names.get(status, "status %d" % status)


def open_sessions(client):
    return int(client.server_info().device_sessions.open_sessions)


def gpu_memory_mib(pid):
    """(the process's GPU memory, the whole GPU's used memory) in MiB from nvidia-smi; the first
    is None when the process is not listed (another PID namespace, or under MPS, where the MPS
    server holds the memory)."""
    def smi(*query):
        out = subprocess.run(["nvidia-smi", *query, "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30)
        return out.stdout
    mine = None
    if pid:
        for line in smi("--query-compute-apps=pid,used_memory").splitlines():
            fields = [f.strip() for f in line.split(",")]
            if len(fields) == 2 and fields[0] == str(pid) and fields[1].isdigit():
                mine = int(fields[1])
    total = smi("--query-gpu=memory.used", "-i", "0").split()
    return mine, int(total[0]) if total and total[0].isdigit() else None


# --- parameters ---------------------------------------------------------------------------------

class Params:
    """One step's per-row parameters, for the session and for the equivalent unary call."""

    def __init__(self, rng, batch, greedy_share=0.2):
        b = batch
        self.batch = b
        self.temperature = np.where(rng.random(b) < greedy_share, 0.0,
                                    rng.uniform(0.3, 1.6, b)).astype(np.float32)
        top_k = rng.integers(1, 300, b)
        top_k = np.where(rng.random(b) < 0.4, 0, top_k)
        self.top_k = np.where(rng.random(b) < 0.1, -1, top_k).astype(np.int32)
        self.top_p = np.where(rng.random(b) < 0.4, 1.0,
                              rng.uniform(0.3, 0.99, b)).astype(np.float32)
        self.min_p = np.where(rng.random(b) < 0.7, 0.0,
                              rng.uniform(0.01, 0.3, b)).astype(np.float32)
        self.seeds = rng.integers(0, 1 << 62, b, dtype=np.int64)
        self.positions = rng.integers(0, 1 << 30, b, dtype=np.int64)
        self.joint = bool(rng.random() < 0.3)

    @property
    def greedy(self):
        return self.temperature < 1e-5

    def session_kwargs(self, as_tensors, device):
        """Keyword arguments of DeviceSession.sample(): numpy arrays, or CUDA tensors."""
        if as_tensors:
            t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
        else:
            t = lambda a: a  # noqa: E731
        return dict(temperature=t(self.temperature), top_k=t(self.top_k), top_p=t(self.top_p),
                    min_p=t(self.min_p), seeds=t(self.seeds), positions=t(self.positions),
                    top_p_mode="joint" if self.joint else "top_k_first")

    def unary_kwargs(self):
        """Keyword arguments of Client.sample() with the same meaning."""
        return dict(temperature=self.temperature.tolist(), top_k=self.top_k.tolist(),
                    top_p=self.top_p.tolist(), min_p=self.min_p.tolist(),
                    seed=[int(s) for s in self.seeds], position=[int(p) for p in self.positions],
                    joint_top_p=self.joint)


class Tally:
    """Session tokens vs unary tokens over many steps. ``exact``: every token must match."""

    def __init__(self, exact):
        self.exact = exact
        self.steps = self.rows = self.greedy = self.greedy_bad = 0
        self.seeded = self.seeded_bad = self.status_bad = 0
        self.examples = []

    def add(self, step, tokens, status, want_tokens, want_status, greedy, note=""):
        tokens, status = np.asarray(tokens), np.asarray(status)
        want_tokens, want_status = np.asarray(want_tokens), np.asarray(want_status)
        self.steps += 1
        self.rows += len(tokens)
        for r in range(len(tokens)):
            bad_status = status[r] != want_status[r]
            bad_token = tokens[r] != want_tokens[r]
            self.status_bad += int(bad_status)
            if greedy[r]:
                self.greedy += 1
                self.greedy_bad += int(bad_token)
            else:
                self.seeded += 1
                self.seeded_bad += int(bad_token)
            if (bad_status or bad_token) and len(self.examples) < 12:
                kind = " greedy" if greedy[r] else ""
                self.examples.append(
                    "step %d row %d/%d%s%s: session token %d status %d, unary token %d status %d"
                    % (step, r, len(tokens), kind, note, tokens[r], status[r], want_tokens[r],
                       want_status[r]))

    def ok(self):
        if self.rows == 0 or self.greedy_bad or self.status_bad:
            return False
        if self.exact:
            return self.seeded_bad == 0
        return self.seeded_bad <= 0.001 * max(self.seeded, 1)

    def summary(self):
        return ("%d steps, %d rows: greedy %d/%d equal, seeded %d/%d equal, %d status mismatches"
                % (self.steps, self.rows, self.greedy - self.greedy_bad, self.greedy,
                   self.seeded - self.seeded_bad, self.seeded, self.status_bad))

    def report(self, name):
        for e in self.examples:
            print("    mismatch: " + e, flush=True)
        return check(self.ok(), name, self.summary())


def make_logits(gen, batch, dtype, rng, device):
    """Random logits [batch, VOCAB]: N(0, s^2) for a random scale s, sometimes peaked."""
    x = torch.randn(batch, VOCAB, device=device, generator=gen) * float(rng.choice([1.0, 3.0, 8.0]))
    if rng.random() < 0.3:
        rows = torch.arange(batch, device=device)
        peak = torch.randint(0, VOCAB, (batch,), device=device, generator=gen)
        x[rows, peak] += 12.0
    return x.to(dtype)


def exact_for(plane):
    return plane == "gpu"
