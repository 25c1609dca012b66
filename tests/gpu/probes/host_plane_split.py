#!/usr/bin/env python3
"""Where a host-plane device-session step's stream time goes at B = 1 (issue 10).

Needs a running samplerd GPU server at --target, the carry's Python client (--py gpu_run/py) and
session_checks_bench.py (--here gpu_run). For three settings, the step's stream time (CUDA
events behind a GPU sleep, as session_checks_bench.py measures it) and its wall time; then the
PyTorch profiler's GPU operations over 100 greedy steps (the copies and fills that
samplerd/_session_host.py enqueues); then the same copies and fills alone, without the server.
Greedy's step less the copies alone is the doorbell-to-done handshake plus the CPU's greedy
pick; a setting's step less greedy's is its CPU sampler. Session 30's run and reading:
tests/bench/DEVICE_SESSION_RESULTS.md."""
import argparse
import statistics
import sys
import torch

ap = argparse.ArgumentParser()
ap.add_argument("--target", required=True)
ap.add_argument("--py", required=True)
ap.add_argument("--here", required=True)
args = ap.parse_args()
sys.path.insert(0, args.py)
sys.path.insert(0, args.here)
import samplerd  # noqa: E402

from session_checks_bench import session_step_us, sleep_cycles_per_us  # noqa: E402

V = 151936
dev = torch.device("cuda", 0)
client = samplerd.Client(args.target, timeout=60)
cyc = sleep_cycles_per_us(dev)
gen = torch.Generator(device=dev).manual_seed(5)
logits = torch.randn(1, V, device=dev, generator=gen) * 0.6
seeds = torch.ones(1, dtype=torch.int64, device=dev)
settings = {"top_k_50_top_p_0.9": dict(temperature=1.0, top_k=50, top_p=0.9),
            "top_p_0.95": dict(temperature=1.0, top_p=0.95),
            "greedy": dict(temperature=0.0)}
with client.device_session(max_batch=1, vocab=V, dtype="float32", plane="host", device=dev) as s:
    for name, kw in settings.items():
        kw = dict(kw, seeds=seeds)
        session_step_us(s, logits, kw, 30, cyc, False)
        p50, p90, ok = session_step_us(s, logits, kw, 300, cyc, False)
        w50, w90, _ = session_step_us(s, logits, kw, 300, cyc, True)
        print(f"{name}: stream step p50 {p50:.1f} p90 {p90:.1f} us; "
              f"wall p50 {w50:.1f} p90 {w90:.1f}; ok {ok}")
    kw = dict(settings["greedy"], seeds=seeds)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA,
                                            torch.profiler.ProfilerActivity.CPU]) as prof:
        for step in range(100):
            s.sample(logits, positions=step, **kw)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=20,
                                    max_name_column_width=60))
# The copies alone: 600 KB out to pinned memory, a params-sized copy out, two small copies in.
pinned = torch.empty(V, dtype=torch.float32, pin_memory=True)
small_out = torch.empty(64, dtype=torch.uint8, pin_memory=True)
small_dev = torch.zeros(64, dtype=torch.uint8, device=dev)
tok_host = torch.zeros(1, dtype=torch.int32, pin_memory=True)
tok_dev = torch.zeros(1, dtype=torch.int32, device=dev)


def timed(fn, n=300):
    """Median stream µs of fn's operations, behind a GPU sleep."""
    times = []
    for _ in range(n):
        torch.cuda._sleep(int(300 * cyc))
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    return statistics.median(times)


def all_copies():
    pinned.copy_(logits[0], non_blocking=True)
    for _ in range(7):
        small_dev.fill_(3)
    small_out.copy_(small_dev, non_blocking=True)
    tok_dev.copy_(tok_host, non_blocking=True)
    tok_dev.copy_(tok_host, non_blocking=True)


print("copy 600 KB out: %.1f us" % timed(lambda: pinned.copy_(logits[0], non_blocking=True)))
print("copy 64 B out: %.1f us" % timed(lambda: small_out.copy_(small_dev, non_blocking=True)))
print("copy 4 B in: %.1f us" % timed(lambda: tok_dev.copy_(tok_host, non_blocking=True)))
print("fill: %.1f us" % timed(lambda: small_dev.fill_(3)))
print("600 KB out + 7 fills + 64 B out + 2 x 4 B in: %.1f us" % timed(all_copies))
