"""Correctness checks of device_session_cuda.py: eager, auto, closed, graph, invalid and
concurrent sessions, every token against the same server's unary Sample."""

import threading
import time
import traceback

import numpy as np
import torch

from session_common import (MAX_BATCH, VOCAB, Params, Tally, check, exact_for, make_logits,
                            open_sessions, time_left)


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
        split = s.host_plane_max_batch
    print("    auto picked: %s (host_plane_max_batch %d)" % (sorted(set(planes)), split), flush=True)
    mps = client._cached_server_info().device_sessions.mps
    check(split == (0 if mps else 1), "auto: host_plane_max_batch defaults to 1 without MPS, 0 "
          "under it", "got %d with mps %s" % (split, mps))
    wrong = [(b, pl) for b, pl in planes if pl != ("host" if b <= split else "gpu")]
    check(not wrong, "auto: B <= host_plane_max_batch on the host plane, larger B on the GPU "
          "plane", "got %s" % wrong[:5])
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
