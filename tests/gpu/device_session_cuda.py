#!/usr/bin/env python3
"""Device sessions on the GPU machine: the Python client's sessions against a GPU server.

Every session token is checked against the same server's unary Sample of the same CUDA tensor
with the same parameters, seeds and positions. The GPU server's unary path runs the GPU plane's
kernels, so GPU-plane tokens must be identical; the host plane samples with the CPU fast
sampler, so greedy rows and row statuses must be identical and seeded rows >= 99.9% (every
mismatch is printed). Checks, each printed PASS/FAIL:

  eager        per plane: >= 1,000 fp32 steps and a bf16 run, B in 1..64, V = 151,936, random
               parameters per row (greedy rows included), parameters as lists and CUDA tensors
  auto         plane="auto": the plane it picks, tokens equal to unary
  closed       open_sessions back to 0 after close()
  graph        per plane: torch.cuda.graph capture of a stand-in forward (writes the logits) +
               the session step, replayed >= 200 times with new inputs, parameters and positions
  invalid      per plane: an invalid parameter row mid-batch: status 4, token -1, neighbours
               equal to unary
  concurrent   per plane: two sessions stepped from two threads (own streams) at once
  engine_kill  per plane: an engine process SIGKILLed while its stream waits mid-session: the
               server stays SERVING (grpc.health.v1), open_sessions returns to 0 within 2 s, the
               server's GPU memory (nvidia-smi) returns to its baseline, a new session works
  server_kill  per plane: a dedicated server (--samplerd) SIGKILLed while the engine's stream
               waits: the stream completes and the next sample() raises, each within 1 s
  bench        per plane, B in 1, 32, 128: median / p90 of a session step on the engine's stream
               (CUDA events, 300 steps) against the bare kernel time (libsamplerd_capi.so
               through bench_kernels.py, --capi) and the server's compute time of unary calls;
               a markdown table on stdout and in --results (device_session_bench.{md,json})

    python3 device_session_cuda.py --gpu unix:///tmp/g.sock --py DIR [--samplerd BIN
        --lib-dir DIR] [--server-pid PID] [--capi libsamplerd_capi.so] [--results DIR]

DIR holds the `samplerd` package with its generated stubs (prepare_carry.sh puts it in ./py).
Exit status 0 when every check passed.
"""

import argparse
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback

import numpy as np
import torch

VOCAB = 151936
MAX_BATCH = 64
PLANES = ("gpu", "host")
CHECKS = ("eager", "auto", "closed", "graph", "invalid", "concurrent", "engine_kill",
          "server_kill", "bench")
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


# --- checks -------------------------------------------------------------------------------------

def eager_run(client, args, plane, dtype, steps, seed, name, device):
    """``steps`` eager session steps with random B, parameters and logits, each against unary."""
    dtype_name = {torch.float32: "float32", torch.bfloat16: "bfloat16"}[dtype]
    rng = np.random.default_rng(seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    tally = Tally(exact_for(plane))
    batches = set()
    start = time.monotonic()
    ran = 0
    with client.device_session(max_batch=MAX_BATCH, vocab=VOCAB, dtype=dtype_name,
                               plane=plane, device=device) as s:
        check(s.plane == plane, name + ": the session's plane", "s.plane = %r" % s.plane)
        for step in range(steps):
            # A time budget, so that a slow plane cannot starve the later checks.
            if time.monotonic() - start > args.eager_seconds or time_left() < 30:
                break
            ran += 1
            # Every B at least once (1..64 in the first 64 steps), then random.
            batch = step + 1 if step < MAX_BATCH else int(rng.integers(1, MAX_BATCH + 1))
            batches.add(batch)
            p = Params(rng, batch)
            logits = make_logits(gen, batch, dtype, rng, device)
            note = ""
            if step % 97 == 50:  # a NaN row and an all -inf row now and then: their statuses
                logits[0, 5] = float("nan")
                if batch > 1:
                    logits[batch - 1] = float("-inf")
                note = " (NaN / -inf rows in the step)"
            as_tensors = step % 2 == 1
            tokens, status = s.sample(logits, **p.session_kwargs(as_tensors, device))
            tokens, status = tokens.clone(), status.clone()
            want = client.sample(logits, **p.unary_kwargs())
            tally.add(step, tokens[:batch].cpu().numpy(), status[:batch].cpu().numpy(),
                      want.tokens, want.row_status, p.greedy, note)
    elapsed = time.monotonic() - start
    check(ran == steps and len(batches) == MAX_BATCH,
          name + ": %d steps, every B in 1..%d" % (steps, MAX_BATCH),
          "%d steps in %.1f s (budget %.0f s), %d distinct B" % (ran, elapsed, args.eager_seconds,
                                                                 len(batches)))
    tally.report(name + ": tokens and statuses equal to unary")


def check_eager(client, args, plane, device):
    eager_run(client, args, plane, torch.float32, args.steps, 1000 + len(plane),
              "eager %s fp32" % plane, device)
    eager_run(client, args, plane, torch.bfloat16, args.bf16_steps, 2000 + len(plane),
              "eager %s bf16" % plane, device)


def check_auto(client, args, device):
    """plane="auto": the plane chosen per call; tokens equal to unary (host-plane tolerance)."""
    rng = np.random.default_rng(31)
    gen = torch.Generator(device=device).manual_seed(31)
    tally = Tally(exact=False)
    planes = []
    with client.device_session(max_batch=MAX_BATCH, vocab=VOCAB, dtype="float32",
                               plane="auto", device=device) as s:
        for step in range(40):
            batch = (1, 2, 8, 33, MAX_BATCH)[step % 5]
            p = Params(rng, batch)
            logits = make_logits(gen, batch, torch.float32, rng, device)
            tokens, status = s.sample(logits, **p.session_kwargs(False, device))
            tokens, status = tokens.clone(), status.clone()
            planes.append((batch, s.plane))
            want = client.sample(logits, **p.unary_kwargs())
            tally.add(step, tokens[:batch].cpu().numpy(), status[:batch].cpu().numpy(),
                      want.tokens, want.row_status, p.greedy)
    print("    auto picked: %s" % sorted(set(planes)), flush=True)
    tally.report("auto: tokens equal to unary")


def check_closed(client, args, device):
    deadline = time.monotonic() + 2.0
    n = open_sessions(client)
    while n != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
        n = open_sessions(client)
    check(n == 0, "closed: open_sessions is 0 once every session is closed",
          "open_sessions = %d" % n)


def check_graph(client, args, plane, device):
    """A stand-in forward (writes the logits from an input) and the session step, captured in one
    CUDA graph per B and replayed with new inputs, parameters and positions."""
    rng = np.random.default_rng(77 + len(plane))
    gen = torch.Generator(device=device).manual_seed(77)
    tally = Tally(exact_for(plane))
    batches = (1, 23, MAX_BATCH)
    per_graph = -(-args.graph_replays // len(batches))
    with client.device_session(max_batch=MAX_BATCH, vocab=VOCAB, dtype="float32",
                               plane=plane, device=device) as s:
        for batch in batches:
            x = torch.randn(batch, VOCAB, device=device, generator=gen)
            scale = torch.ones(batch, 1, device=device)
            logits = torch.empty(batch, VOCAB, device=device)
            p0 = Params(rng, batch)
            static = {k: v for k, v in p0.session_kwargs(True, device).items()
                      if isinstance(v, torch.Tensor)}
            out_tokens = torch.empty(batch, dtype=torch.int32, device=device)
            out_status = torch.empty(batch, dtype=torch.int32, device=device)

            def step():
                torch.mul(x, scale, out=logits)  # the stand-in forward writes the logits
                tokens, status = s.sample(logits, top_p_mode="top_k_first", **static)
                out_tokens.copy_(tokens[:batch])
                out_status.copy_(status[:batch])

            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    step()  # warm-up (lazy init, allocator) outside the capture
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            for replay in range(per_graph):
                p = Params(rng, batch)
                p.joint = False
                x.copy_(torch.randn(batch, VOCAB, device=device, generator=gen))
                scale.fill_(float(rng.choice([1.0, 3.0, 8.0])))
                for key, value in p.session_kwargs(True, device).items():
                    if key in static:
                        static[key].copy_(value)
                graph.replay()
                tokens, status = out_tokens.cpu().numpy(), out_status.cpu().numpy()
                want = client.sample(logits, **p.unary_kwargs())
                tally.add(replay, tokens, status, want.tokens, want.row_status, p.greedy,
                          " (graph B=%d)" % batch)
            del graph
    check(tally.steps >= args.graph_replays, "graph %s: replays" % plane,
          "%d replays over B in %s" % (tally.steps, list(batches)))
    tally.report("graph %s: replayed forward + session step, tokens equal to unary" % plane)


INVALID_CASES = (  # (field, bad value): each must give row status 4 and token -1
    ("temperature", -1.0), ("temperature", float("nan")), ("top_k", -2), ("top_p", 0.0),
    ("top_p", 1.5), ("top_p", float("nan")), ("min_p", -0.1), ("min_p", 1.5),
)


def check_invalid(client, args, plane, device):
    """One invalid parameter row mid-batch per step, given as CUDA tensors (the device checks)."""
    rng = np.random.default_rng(5)
    gen = torch.Generator(device=device).manual_seed(5)
    batch = 8
    problems = []
    tally = Tally(exact_for(plane))
    with client.device_session(max_batch=MAX_BATCH, vocab=VOCAB, dtype="float32",
                               plane=plane, device=device) as s:
        for i, (field, bad) in enumerate(INVALID_CASES):
            row = 1 + i % (batch - 2)
            p = Params(rng, batch)
            logits = make_logits(gen, batch, torch.float32, rng, device)
            kwargs = p.session_kwargs(True, device)
            kwargs[field][row] = bad
            tokens, status = s.sample(logits, **kwargs)
            tokens, status = tokens[:batch].cpu().numpy(), status[:batch].cpu().numpy()
            if status[row] != 4 or tokens[row] != -1:
                problems.append("%s = %r in row %d: status %d, token %d (expected 4, -1)"
                                % (field, bad, row, status[row], tokens[row]))
            want = client.sample(logits, **p.unary_kwargs())  # the row with its valid values
            keep = [r for r in range(batch) if r != row]
            tally.add(i, tokens[keep], status[keep], want.tokens[keep], want.row_status[keep],
                      p.greedy[keep], " (neighbour of an invalid row)")
    for problem in problems:
        print("    " + problem, flush=True)
    check(not problems, "invalid %s: an invalid row gets status 4 and token -1" % plane,
          "%d cases: %s" % (len(INVALID_CASES), ", ".join("%s=%r" % c for c in INVALID_CASES)))
    tally.report("invalid %s: the neighbours equal unary" % plane)


def check_concurrent(client, args, plane, device):
    """Two sessions of one plane stepped at once from two threads, each on its own stream."""
    tallies = [Tally(exact_for(plane)), Tally(exact_for(plane))]
    errors = []

    def worker(i):
        try:
            torch.cuda.set_device(device)
            rng = np.random.default_rng(900 + i)
            gen = torch.Generator(device=device).manual_seed(900 + i)
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream), client.device_session(
                    max_batch=32, vocab=VOCAB, dtype="float32", plane=plane, device=device) as s:
                for step in range(args.concurrent_steps):
                    batch = int(rng.integers(1, 33))
                    p = Params(rng, batch)
                    logits = make_logits(gen, batch, torch.float32, rng, device)
                    tokens, status = s.sample(logits, **p.session_kwargs(step % 2 == 0, device))
                    tokens, status = tokens[:batch].cpu().numpy(), status[:batch].cpu().numpy()
                    want = client.sample(logits, **p.unary_kwargs())
                    tallies[i].add(step, tokens, status, want.tokens, want.row_status, p.greedy,
                                   " (thread %d)" % i)
        except Exception as e:  # noqa: BLE001 -- reported below
            errors.append("thread %d: %s: %s" % (i, type(e).__name__, e))
            traceback.print_exc()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    alive = [t for t in threads if t.is_alive()]
    check(not errors and not alive, "concurrent %s: two sessions at once ran to the end" % plane,
          "; ".join(errors) or ("%d thread(s) still running after 180 s" % len(alive) if alive
                                else "%d steps each" % args.concurrent_steps))
    for i, tally in enumerate(tallies):
        tally.report("concurrent %s: session %d tokens equal to unary" % (plane, i))


def samplerd_error():
    import samplerd
    return samplerd.SamplerError


def child_command(args, *extra):
    return [sys.executable, "-u", os.path.abspath(__file__), "--gpu", args.gpu, "--py", args.py,
            *extra]


def check_engine_kill(client, args, plane, device):
    """An engine process opens a session, enqueues a step behind a long GPU sleep (its stream
    waits; the server's step is enqueued ahead) and is SIGKILLed."""
    name = "engine_kill %s" % plane
    sessions_before = open_sessions(client)
    torch.cuda.synchronize(device)
    pid_before, total_before = gpu_memory_mib(args.server_pid)
    child = subprocess.Popen(child_command(args, "--engine-child", plane), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    lines = queue.Queue()  # the child's output lines, read by a thread (readline may block)

    def read():
        for line in child.stdout:
            lines.put(line.rstrip())
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen = []
    ready = False
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            seen.append(line)
            if line.startswith("WAITING"):
                ready = True
                break
        if ready:
            sessions_open = open_sessions(client)
            time.sleep(0.2)  # the server's side is waiting on the doorbell by now
        child.kill()
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    for line in seen[-15:]:
        print("    child| " + line, flush=True)
    if not check(ready, name + ": the engine child opened a session and waits",
                 "exit %s" % child.returncode):
        return
    killed = time.monotonic()
    print("    open_sessions before %d, with the child %d" % (sessions_before, sessions_open))
    n = open_sessions(client)
    while n != sessions_before and time.monotonic() < killed + 2.0:
        time.sleep(0.05)
        n = open_sessions(client)
    freed_s = time.monotonic() - killed
    check(n == sessions_before and sessions_open == sessions_before + 1,
          name + ": open_sessions back to %d within 2 s" % sessions_before,
          "%d open with the child, %d after %.2f s" % (sessions_open, n, freed_s))
    state = health(args.gpu)
    check(state == "SERVING", name + ": the server stays SERVING", "health: %s" % state)

    # GPU memory: the server's own (nvidia-smi by pid) when listed, and the whole GPU's (the
    # child's context and the allocation the server imported must be gone too). Nothing else
    # on the GPU changes meanwhile: this process allocates nothing during the check.
    slack = args.memory_slack_mib

    def back():
        pid_now, total_now = gpu_memory_mib(args.server_pid)
        ok = total_now is not None and total_now <= total_before + slack
        ok &= pid_before is None or (pid_now is not None and pid_now <= pid_before + slack)
        return ok, pid_now, total_now

    deadline = time.monotonic() + args.memory_wait
    ok, pid_after, total_after = back()
    while not ok and time.monotonic() < deadline:
        time.sleep(0.25)
        ok, pid_after, total_after = back()
    check(ok, name + ": GPU memory back to its baseline",
          "server pid %s: %s -> %s MiB; whole GPU: %s -> %s MiB; slack %d MiB, waited up to "
          "%.0f s" % (args.server_pid or "?", pid_before, pid_after, total_before, total_after,
                      slack, args.memory_wait))
    # The dead engine's regions: still registered? (They outlive its session unless the server
    # or the next producer reaps them.) Reported, then unregistered so later checks start clean.
    tag = "-%d-" % child.pid
    left = [r.name for r in client.list_regions() if tag in r.name]
    print("    regions of the dead engine (pid %d) still registered: %s" % (child.pid, left or
                                                                           "none"), flush=True)
    if left:
        for region in left:
            try:
                client.unregister(region)
            except samplerd_error() as e:
                print("    unregister %s: %s" % (region, e), flush=True)
        time.sleep(1.0)
        pid_now, total_now = gpu_memory_mib(args.server_pid)
        print("    after unregistering them: server pid %s MiB, whole GPU %s MiB"
              % (pid_now, total_now), flush=True)
    # The server still samples: a fresh session, tokens equal to unary.
    rng = np.random.default_rng(11)
    gen = torch.Generator(device=device).manual_seed(11)
    tally = Tally(exact_for(plane))
    with client.device_session(max_batch=16, vocab=VOCAB, dtype="float32", plane=plane,
                               device=device) as s:
        for step in range(20):
            p = Params(rng, 16)
            logits = make_logits(gen, 16, torch.float32, rng, device)
            tokens, status = s.sample(logits, **p.session_kwargs(False, device))
            tokens, status = tokens[:16].cpu().numpy(), status[:16].cpu().numpy()
            want = client.sample(logits, **p.unary_kwargs())
            tally.add(step, tokens, status, want.tokens, want.row_status, p.greedy)
    tally.report(name + ": a new session afterwards samples correctly")


def engine_child(args, samplerd, plane):
    """The engine of check_engine_kill: prints WAITING with its stream blocked mid-session."""
    device = torch.device("cuda", 0)
    client = samplerd.Client(args.gpu, timeout=60)
    s = client.device_session(max_batch=16, vocab=VOCAB, dtype="float32", plane=plane,
                              device=device)
    logits = torch.randn(16, VOCAB, device=device)
    seeds = list(range(1, 17))
    for step in range(5):
        tokens, _ = s.sample(logits, temperature=0.8, top_k=50, seeds=seeds, positions=step)
    torch.cuda.synchronize(device)
    print("stepped 5 times, last tokens %s" % tokens[:4].tolist(), flush=True)
    torch.cuda._sleep(20_000_000_000)  # ~10 s of GPU time before the next ring
    s.sample(logits, temperature=0.8, top_k=50, seeds=seeds, positions=5)
    print("WAITING", flush=True)
    time.sleep(120)
    return 0


def start_server(args, tag):
    """A dedicated samplerd --backend=gpu on a fresh unix socket: (process, target, log path)."""
    sock_dir = "/tmp/samplerd-ds-%d" % os.getpid()
    os.makedirs(sock_dir, exist_ok=True)
    sock = os.path.join(sock_dir, "%s.sock" % tag)
    if os.path.exists(sock):
        os.unlink(sock)
    target = "unix://" + sock
    log_path = os.path.join(args.results, "server_%s.log" % tag)
    env = dict(os.environ)
    if args.lib_dir:
        env["LD_LIBRARY_PATH"] = args.lib_dir + (":" + env["LD_LIBRARY_PATH"]
                                                 if env.get("LD_LIBRARY_PATH") else "")
    with open(log_path, "w") as log:
        proc = subprocess.Popen([args.samplerd, "--backend=gpu", "--listen=" + target],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("expected the dedicated server to serve, got exit code %d; see %s"
                               % (proc.returncode, log_path))
        if os.path.exists(sock) and health(target, timeout=1.0) == "SERVING":
            return proc, target, log_path
        time.sleep(0.2)
    proc.kill()
    proc.wait()
    raise RuntimeError("expected the dedicated server to serve within 60 s; see %s" % log_path)


def check_server_kill(client, args, plane, device):
    """A dedicated server is stopped (SIGSTOP) while the engine (a child process) steps, until
    the engine's stream waits on it; then SIGKILLed. The stream must complete, and the next
    sample() raise, within 1 s each."""
    name = "server_kill %s" % plane
    if not args.samplerd:
        check(False, name, "not run: --samplerd not given")
        return
    proc, target, log_path = start_server(args, "kill_" + plane)
    try:
        out = subprocess.run(child_command(args, "--server-kill-child", plane, "--child-target",
                                           target, "--child-server-pid", str(proc.pid)),
                             capture_output=True, text=True, timeout=90)
        text, rc = out.stdout + out.stderr, out.returncode
    except subprocess.TimeoutExpired as e:  # its output comes as bytes even with text=True
        text = e.stdout or ""
        if isinstance(text, bytes):
            text = text.decode(errors="replace")
        rc = "timeout (90 s): the engine hung"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        sock = target[len("unix://"):]
        if os.path.exists(sock):
            os.unlink(sock)
    for line in text.splitlines()[-20:]:
        print("    child| " + line, flush=True)
    result = None
    for line in text.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
    if not check(result is not None, name + ": the engine child ran to the end", "exit %s" % rc):
        return
    if not result["waited"]:
        print("    note: no step was left waiting while the server was stopped (the server had "
              "enough steps enqueued ahead); the raise is still checked", flush=True)
    released = result["released_s"]
    check(released is not None and released <= 1.0,
          name + ": the engine's waiting stream completes within 1 s of the kill",
          "waited %s, released after %s s, %d steps before" % (result["waited"], released,
                                                              result["steps"]))
    check(result["raised"] and result["raise_s"] <= 1.0,
          name + ": the next sample() raises within 1 s",
          "raised %s after %.3f s: %s" % (result["raised"], result["raise_s"], result["error"]))


def server_kill_child(args, samplerd, plane):
    """The engine of check_server_kill (a child process, so that a hang cannot stall the run)."""
    device = torch.device("cuda", 0)
    client = samplerd.Client(args.child_target, timeout=30)
    s = client.device_session(max_batch=8, vocab=VOCAB, dtype="float32", plane=plane,
                              device=device)
    logits = torch.randn(8, VOCAB, device=device)
    seeds = list(range(1, 9))
    steps = 0
    for _ in range(5):
        s.sample(logits, temperature=0.8, seeds=seeds, positions=steps)
        steps += 1
    torch.cuda.synchronize(device)
    pid = args.child_server_pid
    os.kill(pid, signal.SIGSTOP)
    waiting = None
    for _ in range(16):  # until a step's event no longer completes (the server's queue is used)
        s.sample(logits, temperature=0.8, seeds=seeds, positions=steps)
        steps += 1
        event = torch.cuda.Event()
        event.record()
        until = time.monotonic() + 0.3
        while not event.query() and time.monotonic() < until:
            time.sleep(0.001)
        if not event.query():
            waiting = event
            break
    print("server stopped; %d steps; stream waiting: %s" % (steps, waiting is not None), flush=True)
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    released_s = None
    event = waiting
    if event is None:
        event = torch.cuda.Event()
        event.record()
    while time.monotonic() < killed + 10:
        if event.query():
            released_s = time.monotonic() - killed
            break
        time.sleep(0.0005)
    print("stream completed %s s after the kill" % released_s, flush=True)
    raised, error, raise_s = False, "", None
    deadline = killed + 10
    while time.monotonic() < deadline:  # the watcher marks the session broken; sample() raises
        try:
            s.sample(logits, temperature=0.8, seeds=seeds, positions=steps)
            steps += 1
            if released_s is None:  # do not pile up steps on a stuck stream
                break
            time.sleep(0.01)
        except samplerd.SamplerError as e:
            raised, error = True, "%s: %s" % (e.code.name, str(e)[:200])
            break
        except Exception as e:  # noqa: BLE001 -- any exception counts as raising, reported
            raised, error = True, "%s: %s" % (type(e).__name__, str(e)[:200])
            break
    raise_s = time.monotonic() - killed
    print("RESULT " + json.dumps(dict(waited=waiting is not None, released_s=released_s,
                                      raised=raised, raise_s=raise_s, error=error, steps=steps)),
          flush=True)
    os._exit(0)  # a stuck stream must not hold up interpreter exit


# --- benchmark ----------------------------------------------------------------------------------

def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def sleep_cycles_per_us(device):
    """GPU clock cycles per µs of torch.cuda._sleep, measured."""
    torch.cuda._sleep(1_000_000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return 10_000_000 / max(start.elapsed_time(end) * 1000.0, 1.0)


def bare_kernel_us(capi, batch, logits, setting, steps):
    """(p50, p90) µs of the kernels alone (a CUDA-graph replay through libsamplerd_capi.so)."""
    temperature, top_k, top_p = setting
    state = capi.prepare(batch, VOCAB, temperature, top_k, top_p, 1)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            capi.sample(logits, 0, state)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        capi.sample(logits, 0, state)
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times), pct(times, 0.9)


def session_step_us(s, logits, kwargs, steps, cycles_per_us, wall):
    """(p50, p90) µs per session step. Stream time: CUDA events around sample(), behind a GPU
    sleep so that Python's enqueueing is hidden (as behind a forward). Wall: sample() + sync."""
    times = []
    statuses_ok = True
    for step in range(steps):
        if wall:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            tokens, status = s.sample(logits, positions=step, **kwargs)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e6)
        else:
            torch.cuda._sleep(int(300 * cycles_per_us))
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            tokens, status = s.sample(logits, positions=step, **kwargs)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000.0)
        if step % 50 == 0:
            statuses_ok &= bool((status[:logits.shape[0]] == 1).all())
    return statistics.median(times), pct(times, 0.9), statuses_ok


def check_bench(client, args, device):
    setting = (0.8, 50, 0.9)  # temperature, top_k, top_p
    capi = None
    if args.capi:
        for folder in (HERE, os.path.join(HERE, "..", "bench", "gpu")):
            if os.path.exists(os.path.join(folder, "bench_kernels.py")):
                sys.path.insert(0, folder)
                break
        from bench_kernels import Ours
        capi = Ours(args.capi)
    cycles_per_us = sleep_cycles_per_us(device)
    info = client.server_info()
    gen = torch.Generator(device=device).manual_seed(3)
    rows = []
    all_ok = True
    batches = [int(b) for b in args.bench_batches.split(",")]
    for plane in args.planes:
        with client.device_session(max_batch=max(batches), vocab=VOCAB, dtype="float32",
                                   plane=plane, device=device) as s:
            for batch in batches:
                logits = torch.randn(batch, VOCAB, device=device, generator=gen) * 3
                seeds = torch.arange(1, batch + 1, dtype=torch.int64, device=device)
                kwargs = dict(temperature=setting[0], top_k=setting[1], top_p=setting[2],
                              seeds=seeds)
                session_step_us(s, logits, kwargs, 20, cycles_per_us, False)  # warm-up
                p50, p90, ok1 = session_step_us(s, logits, kwargs, args.bench_steps, cycles_per_us,
                                                False)
                w50, w90, ok2 = session_step_us(s, logits, kwargs, args.bench_steps, cycles_per_us,
                                                True)
                row = dict(plane=plane, batch=batch, stream_p50_us=p50, stream_p90_us=p90,
                           wall_p50_us=w50, wall_p90_us=w90)
                buffer = getattr(s, "logits_buffer", None) if plane == "gpu" else None
                if isinstance(buffer, torch.Tensor) and buffer.is_cuda:
                    view = buffer[:batch]
                    view.copy_(logits.to(view.dtype))
                    b50, b90, ok3 = session_step_us(s, view, kwargs, args.bench_steps,
                                                    cycles_per_us, False)
                    row.update(in_buffer_p50_us=b50, in_buffer_p90_us=b90)
                    ok2 &= ok3
                compute = []
                for i in range(30):
                    r = client.sample(logits, temperature=setting[0], top_k=setting[1],
                                      top_p=setting[2], seed=list(range(1, batch + 1)), position=i)
                    compute.append(r.compute_ns / 1000.0)
                row["server_compute_p50_us"] = statistics.median(compute[5:])
                if capi is not None:
                    k50, k90 = bare_kernel_us(capi, batch, logits, setting, args.bench_steps)
                    row.update(kernel_p50_us=k50, kernel_p90_us=k90,
                               overhead_p50_us=p50 - k50)
                row["statuses_ok"] = ok1 and ok2
                all_ok &= row["statuses_ok"]
                rows.append(row)
                print("    %s B=%d: stream p50 %.1f / p90 %.1f µs, wall p50 %.1f µs, "
                      "kernel %s µs" % (plane, batch, p50, p90, w50,
                         "%.1f" % row["kernel_p50_us"] if "kernel_p50_us" in row else "-"),
                      flush=True)
    f = lambda row, key: "%.1f" % row[key] if key in row else "-"  # noqa: E731
    lines = ["| plane | B | kernel p50 / p90 µs | server compute p50 µs | session step p50 / "
             "p90 µs | over kernel p50 µs | logits in logits_buffer p50 / p90 µs | "
             "sample()+sync wall p50 / p90 µs |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append("| %s | %d | %s / %s | %s | %s / %s | %s | %s / %s | %s / %s |" % (
            r["plane"], r["batch"], f(r, "kernel_p50_us"), f(r, "kernel_p90_us"),
            f(r, "server_compute_p50_us"), f(r, "stream_p50_us"), f(r, "stream_p90_us"),
            f(r, "overhead_p50_us"), f(r, "in_buffer_p50_us"), f(r, "in_buffer_p90_us"),
            f(r, "wall_p50_us"), f(r, "wall_p90_us")))
    table = "\n".join(lines) + "\n"
    mps = bool(info.device_sessions.mps)
    title = ("Device-session step on the engine's stream (%s, V = %d fp32, top-k 50 top-p 0.9 "
             "T 0.8, %d steps, %s MPS)\n\n" % (torch.cuda.get_device_name(device), VOCAB,
                                                args.bench_steps, "with" if mps else "without"))
    print(title + table, flush=True)
    meta = dict(device=torch.cuda.get_device_name(device), torch=torch.__version__,
                samplerd=info.version, mps=mps, vocab=VOCAB, steps=args.bench_steps,
                setting=dict(temperature=setting[0], top_k=setting[1], top_p=setting[2]),
                date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                note="stream: CUDA events around sample() behind a 300 µs GPU sleep; wall: "
                     "perf_counter around sample() + synchronize; kernel: libsamplerd_capi.so "
                     "graph replay; server compute: unary Sample timings.compute_ns")
    if args.results:
        with open(os.path.join(args.results, "device_session_bench.json"), "w") as out:
            json.dump(dict(meta=meta, rows=rows), out, indent=1)
        with open(os.path.join(args.results, "device_session_bench.md"), "w") as out:
            out.write(title + table)
    check(rows and all_ok, "bench: every benchmarked step had row status OK",
          "%d rows" % len(rows))


# --- main ---------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", required=True, help="the GPU server's target")
    ap.add_argument("--py", required=True, help="folder holding the samplerd package")
    ap.add_argument("--samplerd", help="the samplerd binary (server_kill starts its own server)")
    ap.add_argument("--lib-dir", help="LD_LIBRARY_PATH for --samplerd")
    ap.add_argument("--server-pid", type=int, default=0,
                    help="the GPU server's pid, for its GPU memory in nvidia-smi")
    ap.add_argument("--capi", help="libsamplerd_capi.so, for the bare kernel time in the benchmark")
    ap.add_argument("--results", default="", help="folder for the benchmark's JSON and markdown")
    ap.add_argument("--planes", default="gpu,host")
    ap.add_argument("--checks", default=",".join(CHECKS), help="subset of " + ",".join(CHECKS))
    ap.add_argument("--steps", type=int, default=1000, help="fp32 eager steps per plane")
    ap.add_argument("--eager-seconds", type=float, default=45,
                    help="time budget of each eager run (fewer steps fail the step-count check)")
    ap.add_argument("--deadline", type=float, default=0,
                    help="seconds the whole run may take; later checks are not run (FAIL) "
                         "when less than 15 s are left (0: no limit)")
    ap.add_argument("--bf16-steps", type=int, default=300, help="bf16 eager steps per plane")
    ap.add_argument("--graph-replays", type=int, default=210)
    ap.add_argument("--concurrent-steps", type=int, default=150)
    ap.add_argument("--bench-steps", type=int, default=300)
    ap.add_argument("--bench-batches", default="1,32,128")
    ap.add_argument("--memory-slack-mib", type=int, default=2)
    ap.add_argument("--memory-wait", type=float, default=5.0)
    ap.add_argument("--expect-mps", action="store_true",
                    help="the server must report that it runs under MPS")
    ap.add_argument("--quick", action="store_true", help="fewer steps everywhere")
    ap.add_argument("--engine-child", choices=PLANES, help=argparse.SUPPRESS)
    ap.add_argument("--server-kill-child", choices=PLANES, help=argparse.SUPPRESS)
    ap.add_argument("--child-target", help=argparse.SUPPRESS)
    ap.add_argument("--child-server-pid", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, args.py)
    import samplerd

    if args.engine_child:
        return engine_child(args, samplerd, args.engine_child)
    if args.server_kill_child:
        return server_kill_child(args, samplerd, args.server_kill_child)

    if args.quick:
        args.steps, args.bf16_steps, args.graph_replays = 200, 64, 60
        args.concurrent_steps, args.bench_steps = 40, 100
    args.planes = [p for p in args.planes.split(",") if p]
    checks = set(args.checks.split(","))
    unknown = checks - set(CHECKS)
    if unknown or any(p not in PLANES for p in args.planes):
        ap.error("expected --checks from %s and --planes from %s, got %s / %s"
                 % (CHECKS, PLANES, sorted(unknown), args.planes))
    if args.results:
        os.makedirs(args.results, exist_ok=True)
    if args.deadline > 0:
        DEADLINE[0] = time.monotonic() + args.deadline
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    client = samplerd.Client(args.gpu, timeout=60, cuda_ipc="always")
    info = client.server_info()
    support = info.device_sessions
    print("device %s, torch %s, samplerd %s, backend %d; device sessions: gpu_plane %s, "
          "host_plane %s, mps %s, open %d, max %d"
          % (torch.cuda.get_device_name(device), torch.__version__, info.version, info.backend,
             support.gpu_plane, support.host_plane, support.mps, support.open_sessions,
             info.limits.max_device_sessions), flush=True)
    check(support.gpu_plane and support.host_plane,
          "server_info: the GPU server serves both planes",
          "gpu_plane %s, host_plane %s" % (support.gpu_plane, support.host_plane))
    if args.expect_mps:
        check(support.mps, "server_info: the server reports MPS (--expect-mps)",
              "mps %s, CUDA_MPS_PIPE_DIRECTORY %s" % (support.mps,
                                                      os.environ.get("CUDA_MPS_PIPE_DIRECTORY")))

    for plane in args.planes:
        if "eager" in checks:
            guarded("eager %s" % plane, check_eager, client, args, plane, device)
    if "auto" in checks:
        guarded("auto", check_auto, client, args, device)
    if "closed" in checks:
        guarded("closed", check_closed, client, args, device)
    for plane in args.planes:
        if "graph" in checks:
            guarded("graph %s" % plane, check_graph, client, args, plane, device)
        if "invalid" in checks:
            guarded("invalid %s" % plane, check_invalid, client, args, plane, device)
        if "concurrent" in checks:
            guarded("concurrent %s" % plane, check_concurrent, client, args, plane, device)
    for plane in args.planes:
        if "engine_kill" in checks:
            guarded("engine_kill %s" % plane, check_engine_kill, client, args, plane, device)
        if "server_kill" in checks:
            guarded("server_kill %s" % plane, check_server_kill, client, args, plane, device)
    if "bench" in checks:
        guarded("bench", check_bench, client, args, device)
    client.close()

    failed = [(name, detail) for name, ok, detail in RESULTS if not ok]
    print("\n==== device_session_cuda.py: %d checks, %d passed, %d failed ===="
          % (len(RESULTS), len(RESULTS) - len(failed), len(failed)))
    for name, detail in failed:
        print("FAILED: %s  (%s)" % (name, detail))
    print("all checks passed" if not failed and RESULTS else "%d check(s) failed" % len(failed),
          flush=True)
    return 0 if RESULTS and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
