#!/usr/bin/env python3
"""The share of top-p-alone rows that kernels v48 draw without pass 2, computed on the CPU.

Level 0 of the top-p draw (kernels/common/inverse_cdf.h) takes the head for certain when
u0 x (W_H + the boundary bin's mass) < W_H, so a row of the GPU's mass path skips pass 2 with
probability W_H / (W_H + bin mass): W_H the mass of the 1/8-logit bins (absolute grid,
floor(8 z)) above the boundary bin, the bin the first from the top where the mass reaches
p x total (kernels/gpu/mass_plan.h, PlanMassRow). This prints that probability's mean over a few
rows of bench_kernels.py's distributions (flat rows: 1, their tail is empty), in double and
pure Python (no GPU, no numpy):

    level0_share.py [--vocab 151936] [--rows 8] [--top-p 0.95]
"""
import argparse
import math
import random
import struct


def bf16(x):
    """x rounded to bfloat16 (nearest, ties to even), as a float."""
    b = struct.unpack("<I", struct.pack("<f", x))[0]
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", b))[0]


def make_row(dist, vocab, rng):
    """One row of bench_kernels.py's make_logits(dist) (the same shapes, Python's generator)."""
    if dist == "engine":
        return [bf16(0.6 * rng.gauss(0, 1)) for _ in range(vocab)]
    if dist == "randn3":
        return [3.0 * rng.gauss(0, 1) for _ in range(vocab)]
    if dist == "peaked":
        x = [rng.gauss(0, 1) for _ in range(vocab)]
        x[rng.randrange(vocab)] += 12.0
        return x
    if dist == "zipf":
        ranks = list(range(vocab))
        rng.shuffle(ranks)
        return [-1.5 * math.log1p(r) + 0.1 * rng.gauss(0, 1) for r in ranks]
    raise ValueError(dist)


def head_share(x, top_p):
    """W_H / (W_H + the boundary bin's mass) of one row at T = 1."""
    top = max(x)
    bins = {}
    for v in x:
        b = math.floor(8.0 * v)
        bins[b] = bins.get(b, 0.0) + math.exp(v - top)
    target = top_p * sum(bins.values())
    above = 0.0
    for b in sorted(bins, reverse=True):
        if above + bins[b] >= target:
            return above / (above + bins[b])
        above += bins[b]
    return 1.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--top-p", type=float, default=0.95)
    args = ap.parse_args()
    rng = random.Random(7)
    print("| rows | P(no pass 2) mean | min | max |")
    print("|---|---|---|---|")
    for dist in ("engine", "randn3", "peaked", "zipf"):
        s = [head_share(make_row(dist, args.vocab, rng), args.top_p) for _ in range(args.rows)]
        print("| %s | %.4f | %.4f | %.4f |" % (dist, sum(s) / len(s), min(s), max(s)))


if __name__ == "__main__":
    main()
