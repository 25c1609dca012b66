#!/usr/bin/env python3
"""Kernel benchmark: samplerd's GPU sampler vs the PyTorch-native algorithm vLLM uses.

Both run in this process on the same logits tensors (ours through libsamplerd_capi.so and
ctypes). Each measurement is a CUDA-graph replay timed with CUDA events, after a 512 MiB write
that flushes L2, so neither side benefits from cached inputs or pays Python launch costs. The
read bandwidth is measured in the same run; the floor of a shape is one read of its logits.

Usage: bench_kernels.py --lib build/cuda/tests/bench/gpu/libsamplerd_capi.so [--quick]
         [--json out.json] [--markdown out.md]
"""
import argparse
import ctypes
import json
import math
import statistics
import sys
import time

import torch

DISTS = ["randn3", "peaked", "flat", "zipf", "engine"]  # "engine": only when asked (--dists)
DTYPES = {"fp32": (torch.float32, 0), "bf16": (torch.bfloat16, 2)}
# name: (temperature, top_k, top_p); 0 = disabled.
SETTINGS = {
    "top_k_50": (1.0, 50, 1.0),
    "top_p_0.95": (1.0, 0, 0.95),
    "top_k_50_top_p_0.9": (1.0, 50, 0.9),
    "temperature_0.8": (0.8, 0, 1.0),
    "greedy": (0.0, 0, 1.0),
}
# Settings run only when named with --settings: filters at T != 1, where the passes compare x
# with thresholds found by a search (NOTES.md v13) instead of dividing every token.
EXTRA_SETTINGS = {
    "top_k_50_t0.7": (0.7, 50, 1.0),
    "top_p_0.95_t0.7": (0.7, 0, 0.95),
}


def torch_native(logits, temperature, top_k, top_p, greedy):
    """vLLM's PyTorch-native sampler: temperature, sort, top-k mask, softmax, cumsum, top-p
    mask, scatter back, softmax, exponential race (written here from that description)."""
    if greedy:
        return logits.argmax(dim=-1)
    x = logits.float() / temperature.unsqueeze(1)
    if top_k is not None or top_p is not None:
        x_sort, x_idx = x.sort(dim=-1, descending=False)
        if top_k is not None:
            kth = x_sort.gather(1, (x_sort.size(1) - top_k.long()).unsqueeze(1))
            x_sort.masked_fill_(x_sort < kth, -float("inf"))
        if top_p is not None:
            probs_sort = x_sort.softmax(dim=-1)
            cum = torch.cumsum(probs_sort, dim=-1)
            mask = cum <= 1 - top_p.unsqueeze(1)
            mask[:, -1] = False
            x_sort.masked_fill_(mask, -float("inf"))
        x = x_sort.scatter(dim=-1, index=x_idx, src=x_sort)
    probs = x.softmax(dim=-1)
    q = torch.empty_like(probs).exponential_()
    return probs.div_(q).argmax(dim=-1)


class Ours:
    def __init__(self, path, greedy_hint=True):
        self.lib = ctypes.CDLL(path)
        self.greedy_hint = greedy_hint
        L = self.lib
        L.samplerd_row_params_bytes.restype = ctypes.c_int64
        L.samplerd_workspace_bytes.restype = ctypes.c_size_t
        L.samplerd_workspace_bytes.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int32]
        L.samplerd_write_params.argtypes = [ctypes.c_int64] + [ctypes.c_void_p] * 8
        L.samplerd_sample.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64,
                                      ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                                      ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                      ctypes.c_void_p]
        L.samplerd_error_string.restype = ctypes.c_char_p

    def prepare(self, batch, vocab, temperature, top_k, top_p, seed):
        n = batch
        arr = lambda t, ct: (ct * n)(*t)
        params = torch.empty(n * self.lib.samplerd_row_params_bytes(), dtype=torch.uint8,
                             device="cuda")
        err = self.lib.samplerd_write_params(
            n, arr([temperature] * n, ctypes.c_float), arr([top_k] * n, ctypes.c_int32),
            arr([top_p] * n, ctypes.c_float), arr([0.0] * n, ctypes.c_float),
            arr([0] * n, ctypes.c_uint8), arr([seed + i for i in range(n)], ctypes.c_uint64),
            arr([7] * n, ctypes.c_uint64), ctypes.c_void_p(params.data_ptr()))
        assert err == 0, self.lib.samplerd_error_string(err)
        ws_bytes = self.lib.samplerd_workspace_bytes(batch, vocab, -1)
        ws = torch.zeros(max(ws_bytes, 1), dtype=torch.uint8, device="cuda")  # sample.h asks it
        tokens = torch.empty(batch, dtype=torch.int32, device="cuda")
        status = torch.empty(batch, dtype=torch.uint8, device="cuda")
        # As the server passes HasTopPRows and AllGreedy of its host params: top-p as the only
        # filter, and every row greedy (bit 1; an older library has no such bit).
        hints = int(temperature > 0.0 and not (0 < top_k < vocab) and 0.0 < top_p < 1.0)
        if temperature == 0.0 and self.greedy_hint and hasattr(self.lib,
                                                                 "samplerd_all_greedy_hint"):
            hints |= self.lib.samplerd_all_greedy_hint()
        return params, ws, ws_bytes, tokens, status, hints

    def sample(self, logits, code, state):
        params, ws, ws_bytes, tokens, status, hints = state
        err = self.lib.samplerd_sample(
            ctypes.c_void_p(logits.data_ptr()), code, logits.shape[0], logits.shape[1],
            ctypes.c_void_p(params.data_ptr()), ctypes.c_void_p(tokens.data_ptr()),
            ctypes.c_void_p(status.data_ptr()), ctypes.c_void_p(ws.data_ptr()), ws_bytes,
            ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), hints)
        if err != 0:
            raise RuntimeError(self.lib.samplerd_error_string(err))
        return tokens


def time_graph(fn, flush, iters):
    """Median µs of one replay of a graph of fn(), each replay after an L2 flush (flush=None:
    after a ~50 µs sleep kernel instead, so L2 stays warm and the host's launch stays hidden)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()  # warm-up (allocator, lazy init)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    times = []
    for _ in range(iters):
        if flush is None:
            torch.cuda._sleep(100_000)
        else:
            flush.zero_()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times)


def read_bandwidth(flush):
    x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda").view(torch.float32)
    x.fill_(1.0)
    for _ in range(3):
        x.sum()
    times = []
    for _ in range(10):
        flush.zero_()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        x.sum()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000.0)
    del x
    return (2 << 30) / statistics.median(times)


def make_logits(batch, vocab, dtype, dist, gen):
    x = torch.randn(batch, vocab, device="cuda", generator=gen)
    if dist == "randn3":
        x *= 3.0
    elif dist == "peaked":  # one token 12 above N(0, 1) noise
        idx = torch.randint(0, vocab, (batch,), device="cuda", generator=gen)
        x[torch.arange(batch, device="cuda"), idx] += 12.0
    elif dist == "flat":  # every logit equal: one crowded bin for every filter
        x.zero_()
    elif dist == "zipf":
        # Real-model-like: the token of rank r has logit -1.5 ln r (probability ~ r^-1.5, ~96%
        # of the mass in the top 300), ranks shuffled over the vocabulary, plus N(0, 0.1).
        ranks = torch.argsort(torch.rand(batch, vocab, device="cuda", generator=gen), dim=1)
        x = -1.5 * torch.log1p(ranks.float()) + 0.1 * x
    elif dist == "engine":
        # The decode loop's random-weight model (tests/bench/engine/decode_loop.py): N(0, 0.6)
        # computed in bf16 and handed over as fp32, so many tokens tie and top-p 0.95 keeps most
        # of the row.
        x = (0.6 * x).to(torch.bfloat16).float()
    else:
        raise ValueError(f"unknown distribution {dist}")
    return x.to(dtype).contiguous()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--quick", action="store_true", help="a few shapes only")
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--settings", help="comma-separated subset of " +
                    ",".join({**SETTINGS, **EXTRA_SETTINGS}))
    ap.add_argument("--batches", help="comma-separated batch sizes")
    ap.add_argument("--vocabs", help="comma-separated vocabulary sizes")
    ap.add_argument("--dtypes", help="comma-separated subset of fp32,bf16")
    ap.add_argument("--dists", help="comma-separated subset of " + ",".join(DISTS))
    ap.add_argument("--no-flush", action="store_true",
                    help="keep L2 warm between replays (default: flush it before each)")
    ap.add_argument("--ours-only", action="store_true", help="skip the PyTorch baseline")
    ap.add_argument("--no-greedy-hint", action="store_true",
                    help="greedy batches through the general kernels (no all_greedy hint)")
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    args = ap.parse_args()

    ours = Ours(args.lib, greedy_hint=not args.no_greedy_hint)
    flush = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    bw = read_bandwidth(flush)
    dev = torch.cuda.get_device_properties(0)
    print(f"device: {dev.name}, torch {torch.__version__}, read bandwidth {bw / 1e12:.2f} TB/s",
          flush=True)
    batches = [1, 8, 32, 128, 256]
    vocabs = [32000, 128256, 151936, 262144]
    dists = ["randn3", "peaked", "zipf", "flat"]
    settings, dtypes = SETTINGS, DTYPES
    if args.quick:
        batches, vocabs, dists = [1, 128], [151936], ["randn3"]
    if args.batches:
        batches = [int(b) for b in args.batches.split(",")]
    if args.vocabs:
        vocabs = [int(v) for v in args.vocabs.split(",")]
    if args.settings:
        settings = {k: {**SETTINGS, **EXTRA_SETTINGS}[k] for k in args.settings.split(",")}
    if args.dists:
        dists = args.dists.split(",")
    if args.no_flush:
        flush = None
    if args.dtypes:
        dtypes = {k: DTYPES[k] for k in args.dtypes.split(",")}
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    rows = []
    header = (f"{'setting':<20} {'dtype':<5} {'dist':<7} {'B':>4} {'V':>7} {'ours us':>9} "
              f"{'torch us':>9} {'floor us':>8} {'x floor':>8} {'x torch':>8}")
    print(header, flush=True)
    for name, (t, k, p) in settings.items():
        for dname, (dtype, code) in dtypes.items():
            for dist in dists:
                for v in vocabs:
                    for b in batches:
                        logits = make_logits(b, v, dtype, dist, gen)
                        temp = torch.full((b,), max(t, 1e-6), device="cuda")
                        kk = torch.full((b,), k, device="cuda", dtype=torch.int32) if k else None
                        pp = torch.full((b,), p, device="cuda") if p < 1.0 else None
                        state = ours.prepare(b, v, t, k, p, seed=1000)
                        us_ours = time_graph(lambda: ours.sample(logits, code, state), flush,
                                             args.iters)
                        us_torch = float("nan") if args.ours_only else time_graph(
                            lambda: torch_native(logits, temp, kk, pp, t == 0.0), flush,
                            args.iters)
                        floor = logits.numel() * logits.element_size() / bw * 1e6
                        row = dict(setting=name, dtype=dname, dist=dist, batch=b, vocab=v,
                                   ours_us=us_ours, torch_us=us_torch, floor_us=floor,
                                   x_floor=us_ours / floor, x_torch=us_ours / us_torch)
                        rows.append(row)
                        print(f"{name:<20} {dname:<5} {dist:<7} {b:>4} {v:>7} {us_ours:>9.1f} "
                              f"{us_torch:>9.1f} {floor:>8.1f} {us_ours / floor:>8.2f} "
                              f"{us_ours / us_torch:>8.3f}", flush=True)
                        del logits, state
    meta = dict(device=dev.name, torch=torch.__version__, read_bandwidth_tbs=bw / 1e12,
                date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), iters=args.iters,
                l2_flush=not args.no_flush)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(f"device {meta['device']}, read bandwidth {meta['read_bandwidth_tbs']:.2f} "
                    f"TB/s, {meta['date']}\n\n")
            f.write("| setting | dtype | dist | B | V | ours µs | PyTorch µs | floor µs | × floor "
                    "| × PyTorch |\n|---|---|---|---|---|---|---|---|---|---|\n")
            for r in rows:
                f.write(f"| {r['setting']} | {r['dtype']} | {r['dist']} | {r['batch']} | "
                        f"{r['vocab']} | {r['ours_us']:.1f} | {r['torch_us']:.1f} | "
                        f"{r['floor_us']:.1f} | {r['x_floor']:.2f} | {r['x_torch']:.3f} |\n")


if __name__ == "__main__":
    sys.exit(main())
