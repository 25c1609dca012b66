"""Fault checks of device_session_cuda.py: engine_kill (an engine process SIGKILLed mid-session)
and server_kill (a dedicated server SIGKILLed while the engine's stream waits), with the child
processes' entry points (device_session_cuda.py --engine-child / --server-kill-child)."""

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import torch

from session_common import (HERE, VOCAB, Params, Tally, check, exact_for, gpu_memory_mib, health,
                            make_logits, open_sessions)

ENTRY = os.path.join(HERE, "device_session_cuda.py")  # the children run the entry point again


def samplerd_error():
    import samplerd
    return samplerd.SamplerError


def child_command(args, *extra):
    return [sys.executable, "-u", ENTRY, "--gpu", args.gpu, "--py", args.py, *extra]


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

