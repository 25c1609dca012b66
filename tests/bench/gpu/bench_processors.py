#!/usr/bin/env python3
"""Logits-processor benchmark (issue 13): what an allowed-token bitmask (10% and 90% of tokens
allowed) and 2,000 penalty entries per row cost inside samplerd's kernels, against the same
setting without processors, and against PyTorch-native doing the same masking and penalties
(vLLM's ops: unpack the bitmask and masked_fill; dense counts and prompt mask, then
where(x > 0, x / r, x * r) and the presence/frequency subtraction) before its sampler.

Same method as bench_kernels.py (imported from it): CUDA-graph replays after an L2 flush, CUDA
events, median; every number of a row comes from the same run.

Usage: bench_processors.py --lib libsamplerd_capi.so [--batches 1,32,128] [--json out.json]
         [--markdown out.md]
"""
import argparse
import ctypes
import json
import sys
import time

import torch

from bench_kernels import SETTINGS, Ours, make_logits, read_bandwidth, time_graph, torch_native

REPETITION, PRESENCE, FREQUENCY = 1.2, 0.5, 0.3
PENALTY_ENTRIES = 2000


def bitmask_words(batch, vocab, allowed_share, gen):
    """int32 [batch, ceil(vocab / 32)]: bit t % 32 of word t / 32 set when token t is allowed."""
    words = (vocab + 31) // 32
    bits = torch.rand(batch, words, 32, device="cuda", generator=gen) < allowed_share
    shifts = torch.arange(32, device="cuda", dtype=torch.int64)
    packed = (bits.to(torch.int64) << shifts).sum(dim=-1)
    return (packed - ((packed >> 31) << 32)).to(torch.int32)  # two's complement wrap


def penalty_entries(batch, vocab, gen):
    """Per row PENALTY_ENTRIES distinct tokens with output counts 0-3 and prompt flags; returns
    the dense (counts, prompt mask) PyTorch uses and samplerd's packed adjusts and offsets."""
    tokens = torch.stack([torch.randperm(vocab, device="cuda", generator=gen)[:PENALTY_ENTRIES]
                          for _ in range(batch)]).sort(dim=1).values
    counts = torch.randint(0, 4, tokens.shape, device="cuda", generator=gen)
    prompt = torch.rand(tokens.shape, device="cuda", generator=gen) < 0.5
    dense_counts = torch.zeros(batch, vocab, device="cuda").scatter_(1, tokens, counts.float())
    dense_prompt = torch.zeros(batch, vocab, device="cuda", dtype=torch.bool).scatter_(
        1, tokens, prompt)
    seen = prompt | (counts > 0)
    # TokenAdjust: int32 token, float bias, repetition, penalty (16 bytes).
    adjusts = torch.zeros(batch * PENALTY_ENTRIES, 4, device="cuda")
    adjusts[:, 0] = tokens.to(torch.int32).view(torch.float32).reshape(-1)
    adjusts[:, 2] = torch.where(seen, REPETITION, 1.0).reshape(-1)
    cf = counts.float()
    adjusts[:, 3] = (FREQUENCY * cf + PRESENCE * (counts > 0).float()).reshape(-1)
    offsets = torch.arange(0, batch + 1, device="cuda", dtype=torch.int32) * PENALTY_ENTRIES
    return (dense_counts, dense_prompt), (adjusts, offsets)


def bind_sample_processed(lib):
    """Declares samplerd_sample_processed's ctypes signature (sample.h)."""
    lib.samplerd_sample_processed.argtypes = [
        ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64] + [ctypes.c_void_p] * 4 + [
        ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int] + [ctypes.c_void_p] * 3


def torch_processors(logits, mask, dense):
    x = logits.float()
    if mask is not None:
        shifts = torch.arange(32, device="cuda", dtype=torch.int32)
        allowed = ((mask.unsqueeze(-1) >> shifts) & 1).bool().view(x.shape[0], -1)
        x = x.masked_fill(~allowed[:, : x.shape[1]], -float("inf"))
    if dense is not None:
        counts, prompt = dense
        r = torch.where(prompt | (counts > 0), REPETITION, 1.0)
        x = torch.where(x > 0, x / r, x * r)
        x = x - FREQUENCY * counts - PRESENCE * (counts > 0).float()
    return x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--batches", default="1,32,128")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--settings", default="top_k_50,top_p_0.95")
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    args = ap.parse_args()

    ours = Ours(args.lib)
    L = ours.lib
    bind_sample_processed(L)
    assert L.samplerd_token_adjust_bytes() == 16
    flush = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    bw = read_bandwidth(flush)
    dev = torch.cuda.get_device_properties(0)
    print(f"device: {dev.name}, torch {torch.__version__}, read bandwidth {bw / 1e12:.2f} TB/s",
          flush=True)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    v = args.vocab
    rows = []
    print(f"{'setting':<12} {'processors':<12} {'B':>4} {'plain us':>9} {'ours us':>9} "
          f"{'torch us':>9} {'x plain':>8} {'x torch':>8}", flush=True)
    for name in args.settings.split(","):
        t, k, p = SETTINGS[name]
        for b in [int(x) for x in args.batches.split(",")]:
            logits = make_logits(b, v, torch.float32, "zipf", gen)
            state = ours.prepare(b, v, t, k, p, seed=1000)
            params, ws, ws_bytes, tokens, status, hints = state
            temp = torch.full((b,), max(t, 1e-6), device="cuda")
            kk = torch.full((b,), k, device="cuda", dtype=torch.int32) if k else None
            pp = torch.full((b,), p, device="cuda") if p < 1.0 else None
            plain = time_graph(lambda: ours.sample(logits, 0, state), flush, args.iters)
            for kind in ("mask_10%", "mask_90%", "penalties_2000"):
                mask = dense = adjusts = offsets = None
                if kind.startswith("mask"):
                    mask = bitmask_words(b, v, 0.1 if kind == "mask_10%" else 0.9, gen)
                else:
                    dense, (adjusts, offsets) = penalty_entries(b, v, gen)
                ptr = lambda x: ctypes.c_void_p(x.data_ptr() if x is not None else 0)

                def run_ours():
                    err = L.samplerd_sample_processed(
                        ptr(logits), 0, b, v, ptr(params), ptr(tokens), ptr(status), ptr(ws),
                        ws_bytes, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream),
                        hints, ptr(mask), ptr(offsets), ptr(adjusts))
                    if err != 0:
                        raise RuntimeError(L.samplerd_error_string(err))

                us = time_graph(run_ours, flush, args.iters)
                us_torch = time_graph(
                    lambda: torch_native(torch_processors(logits, mask, dense), temp, kk, pp,
                                         t == 0.0), flush, args.iters)
                row = dict(setting=name, processors=kind, batch=b, vocab=v, plain_us=plain,
                           ours_us=us, torch_us=us_torch, x_plain=us / plain,
                           x_torch=us / us_torch)
                rows.append(row)
                print(f"{name:<12} {kind:<12} {b:>4} {plain:>9.1f} {us:>9.1f} {us_torch:>9.1f} "
                      f"{us / plain:>8.3f} {us / us_torch:>8.3f}", flush=True)
    meta = dict(device=dev.name, torch=torch.__version__, read_bandwidth_tbs=bw / 1e12,
                date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), iters=args.iters,
                vocab=v, dist="zipf", dtype="fp32")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(f"device {meta['device']}, {meta['date']}, fp32 zipf V = {v}\n\n")
            f.write("| setting | processors | B | without µs | with µs | PyTorch µs | × without "
                    "| × PyTorch |\n|---|---|---|---|---|---|---|---|\n")
            for r in rows:
                f.write(f"| {r['setting']} | {r['processors']} | {r['batch']} | "
                        f"{r['plain_us']:.1f} | {r['ours_us']:.1f} | {r['torch_us']:.1f} | "
                        f"{r['x_plain']:.3f} | {r['x_torch']:.3f} |\n")


if __name__ == "__main__":
    sys.exit(main())
