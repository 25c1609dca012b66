#!/usr/bin/env python3
"""Runs named sampling cases once each between cudaProfilerStart/Stop, for Nsight Compute.

Each case is warmed up first (lazy module loading, allocator) outside the profiled range, so
`ncu --profile-from-start off` sees exactly one launch sequence per case, in the order printed.

  ncu --profile-from-start off --clock-control none --section ... \\
      python3 profile_cases.py --lib libsamplerd_capi.so top_k_50:zipf:128 top_k_50:zipf:128:mask1.0

A case is SETTING:DIST:B[:PROCESSORS], SETTING from bench_kernels.SETTINGS (and
EXTRA_SETTINGS), DIST from bench_kernels.DISTS; PROCESSORS is maskF (an allowed-token bitmask
allowing a share F of the tokens, F in [0, 1]) or penalties (bench_processors.PENALTY_ENTRIES
penalty entries a row), as bench_processors.py builds them. fp32 logits, V = --vocab (default 151,936).
"""
import argparse
import ctypes

import torch

from bench_kernels import DISTS, EXTRA_SETTINGS, SETTINGS, Ours, make_logits
from bench_processors import bind_sample_processed, bitmask_words, penalty_entries


def parse_case(text):
    parts = text.split(":")
    if len(parts) not in (3, 4):
        raise SystemExit(f"expected SETTING:DIST:B[:PROCESSORS], got {text!r}")
    setting, dist, batch = parts[:3]
    settings = {**SETTINGS, **EXTRA_SETTINGS}
    if setting not in settings:
        raise SystemExit(f"expected a setting of {sorted(settings)}, got {setting!r}")
    if dist not in DISTS:
        raise SystemExit(f"expected a distribution of {DISTS}, got {dist!r}")
    procs = parts[3] if len(parts) == 4 else ""
    if procs and not (procs.startswith("mask") or procs == "penalties"):
        raise SystemExit(f"expected maskF or penalties, got {procs!r}")
    return settings[setting], dist, int(batch), procs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("cases", nargs="+")
    args = ap.parse_args()

    ours = Ours(args.lib)
    L = ours.lib
    bind_sample_processed(L)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    v = args.vocab
    ptr = lambda x: ctypes.c_void_p(x.data_ptr() if x is not None else 0)
    runs = []
    for text in args.cases:
        (t, k, p), dist, b, procs = parse_case(text)
        logits = make_logits(b, v, torch.float32, dist, gen)
        state = ours.prepare(b, v, t, k, p, seed=1000)
        params, ws, ws_bytes, tokens, status, hints = state
        mask = offsets = adjusts = None
        if procs.startswith("mask"):
            mask = bitmask_words(b, v, float(procs[4:]), gen)
        elif procs.startswith("penalties"):
            _, (adjusts, offsets) = penalty_entries(b, v, gen)

        def run(logits=logits, state=state, mask=mask, offsets=offsets, adjusts=adjusts, b=b):
            if mask is None and adjusts is None:
                ours.sample(logits, 0, state)
                return
            err = L.samplerd_sample_processed(
                ptr(logits), 0, b, v, ptr(state[0]), ptr(state[3]), ptr(state[4]),
                ptr(state[1]), state[2],
                ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), state[5], ptr(mask),
                ptr(offsets), ptr(adjusts))
            if err != 0:
                raise RuntimeError(L.samplerd_error_string(err))

        for _ in range(2):
            run()
        runs.append((text, run))
    torch.cuda.synchronize()
    for i, (text, run) in enumerate(runs):
        print(f"case {i}: {text}", flush=True)
        torch.cuda.profiler.start()
        run()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
