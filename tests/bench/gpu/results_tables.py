#!/usr/bin/env python3
"""The summary tables of tests/bench/GPU_RESULTS.md from one bench_kernels.py --json run.

    results_tables.py RUN.json > tables.md

Prints "Against the targets" (fp32; each setting's worst distribution counts; the targets and
FlashInfer's times are issue 11's) and "Against PyTorch-native" (every row of the run). The full
table is bench_kernels.py's own --markdown output.
"""
import collections
import json
import sys

# (setting, B, V) -> (FlashInfer µs from issue 11 or None, target µs or None)
TARGETS = [
    ("top_k_50", 1, 151936, 83.7, 12), ("top_k_50", 32, 151936, 198.1, 15),
    ("top_k_50", 128, 151936, 309.8, 35), ("top_p_0.95", 1, 151936, 53.0, 12),
    ("top_p_0.95", 32, 151936, 90.1, 20), ("top_p_0.95", 128, 151936, 184.7, 53),
    ("top_k_50_top_p_0.9", 1, 151936, 93.7, 12), ("top_k_50_top_p_0.9", 32, 151936, None, None),
    ("top_k_50_top_p_0.9", 128, 151936, 326.0, 35), ("temperature_0.8", 1, 151936, None, None),
    ("temperature_0.8", 32, 151936, None, None), ("temperature_0.8", 128, 151936, None, 30),
    ("greedy", 1, 151936, None, 8), ("greedy", 32, 151936, None, None),
    ("greedy", 128, 151936, None, 22), ("top_k_50", 1, 32000, 29.1, 10),
    ("top_p_0.95", 1, 32000, 22.4, 10), ("top_p_0.95", 128, 32000, 44.7, 15),
]


def fmt(x, digits=1):
    return "—" if x is None else f"{x:.{digits}f}"


def main():
    rows = json.load(open(sys.argv[1]))["rows"]
    by = collections.defaultdict(list)
    for r in rows:
        by[(r["setting"], r["dtype"], r["batch"], r["vocab"])].append(r)
    dists = len({r["dist"] for r in rows})
    print(f"| setting | B | V | ours µs, randn × 3 | worst of {dists} dists µs (dist) | PyTorch µs "
          "| × PyTorch (worst) | FlashInfer µs (issue 11) | × FlashInfer (randn × 3) "
          "| floor µs | target µs | met |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for setting, b, v, flashinfer, target in TARGETS:
        group = by.get((setting, "fp32", b, v))
        if not group:
            continue
        randn = next((r for r in group if r["dist"] == "randn3"), None)
        worst = max(group, key=lambda r: r["ours_us"])
        worst_ratio = max(group, key=lambda r: r["x_torch"])
        vs_fi = randn["ours_us"] / flashinfer if randn and flashinfer else None
        met = "" if target is None else ("yes" if worst["ours_us"] <= target else "no")
        print(f"| {setting} | {b} | {v:,} | {fmt(randn and randn['ours_us'])} | "
              f"{worst['ours_us']:.1f} ({worst['dist']}) | {fmt(randn and randn['torch_us'])} | "
              f"{worst_ratio['x_torch']:.3f} ({worst_ratio['dist']}) | {fmt(flashinfer)} | "
              f"{fmt(vs_fi, 2)} | {randn['floor_us']:.1f} | {fmt(target, 0)} | {met} |")
    print()
    print("| setting | rows | best × PyTorch | worst × PyTorch (where) | rows slower than "
          "PyTorch |")
    print("|---|---|---|---|---|")
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    for s in settings:
        group = [r for r in rows if r["setting"] == s]
        best = min(group, key=lambda r: r["x_torch"])
        worst = max(group, key=lambda r: r["x_torch"])
        slower = sum(r["x_torch"] > 1.0 for r in group)
        print(f"| {s} | {len(group)} | {best['x_torch']:.3f} | {worst['x_torch']:.3f} "
              f"({worst['dtype']} {worst['dist']} B {worst['batch']} V {worst['vocab']}) | "
              f"{slower} |")


if __name__ == "__main__":
    main()
