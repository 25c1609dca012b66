#!/usr/bin/env python3
"""Where the decode loop's forward loses time under CUDA MPS (issue 10): kernel by kernel.

Builds decode_loop.py's random-weight decoder, captures its step as a CUDA graph as the loop
does, times replays with CUDA events, then traces a few replays with the PyTorch profiler
(CUPTI: every kernel of the graph with its GPU start and duration). Run it once plainly and once
under an MPS daemon, then compare the two reports:

    mps_forward_profile.py --batch 1 --json plain.json
    (under MPS) mps_forward_profile.py --batch 1 --json mps.json
    mps_forward_profile.py --compare plain.json mps.json

A replay's time splits into kernel time (the sum of its kernels' durations) and gaps (from one
kernel's end to the next one's start). The comparison shows which of the two grew, and which
kernels grew most.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from decode_loop import Config, Decoder  # noqa: E402


def model_args(batch):
    """decode_loop.py's default model shape."""
    return argparse.Namespace(hidden=896, layers=24, heads=14, kv_heads=2, ffn=4864,
                              vocab=151936, batch=batch)


def replay_ms(model, reps):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        model.graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def traced_kernels(model, reps):
    """The kernels of `reps` replays, [(name, start_us, dur_us)] per replay."""
    from torch.profiler import ProfilerActivity, profile
    replays = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(reps):
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                model.graph.replay()
                torch.cuda.synchronize()
            path = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(path)
            with open(path) as f:
                events = json.load(f).get("traceEvents", [])
            kernels = sorted((e["ts"], e["dur"], e["name"]) for e in events
                             if e.get("cat") == "kernel" and "dur" in e)
            replays.append([(name, ts, dur) for ts, dur, name in kernels])
    return replays


def summarize(replays):
    spans, busy, gaps, counts = [], [], [], []
    by_name = {}
    for kernels in replays:
        if not kernels:
            continue
        first = kernels[0][1]
        last = max(ts + dur for _, ts, dur in kernels)
        total = sum(dur for _, _, dur in kernels)
        spans.append(last - first)
        busy.append(total)
        counts.append(len(kernels))
        between = [kernels[i + 1][1] - (kernels[i][1] + kernels[i][2])
                   for i in range(len(kernels) - 1)]
        gaps.append(statistics.median(between) if between else 0.0)
        for name, _, dur in kernels:
            by_name.setdefault(name, []).append(dur)
    n = max(len(spans), 1)
    return {
        "kernels": statistics.median(counts) if counts else 0,
        "span_us": statistics.median(spans) if spans else 0.0,
        "kernel_us": statistics.median(busy) if busy else 0.0,
        "gap_median_us": statistics.median(gaps) if gaps else 0.0,
        # per kernel name: count per replay, median duration, total per replay
        "by_name": {name: {"per_replay": len(d) / n, "median_us": statistics.median(d),
                           "total_us": sum(d) / n} for name, d in by_name.items()},
    }


LAYER_PARTS = ("rms", "qkv", "rope", "kv_write", "sdpa", "wo", "mlp_gemv", "silu")


def chain_us(op, nodes, reps):
    """µs a node of a CUDA-graph chain of `nodes` calls of `op` (median of `reps` replays)."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            op()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(nodes):
            op()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / nodes)
    return statistics.median(times)


def op_chains(nodes=200, reps=21, pairs=False):
    """Per-op time of CUDA-graph chains of one PyTorch op at the forward's B = 1 shapes (µs a
    node): which kinds of kernel MPS slows, without the rest of the forward. With `pairs`, also
    one whole layer, and each pair of two single ops in turn (a node is then the pair)."""
    h = torch.randn(1, 896, device="cuda", dtype=torch.bfloat16)
    idx = torch.zeros(1, dtype=torch.long, device="cuda")
    table = torch.randn(151936, 896, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(896, 896, device="cuda", dtype=torch.bfloat16)
    ops = {
        "add_ (bf16, 896)": lambda: h.add_(1.0),
        "mul (bf16, 896)": lambda: h * h,
        "float() (896)": lambda: h.float(),
        "mean (fp32, 896)": lambda: h.float().pow(2).mean(-1, keepdim=True),
        "index_select (embedding row)": lambda: table.index_select(0, idx),
        "matmul (1x896 @ 896x896)": lambda: h @ w.t(),
    }
    # Pieces of the forward (one layer's parts at B = 1; decode_loop.Decoder), each repeated in
    # the chain: does the penalty need the forward's mix of kernels?
    model = Decoder(Config(model_args(1)), 1, max_len=128, device="cuda")
    layer = model.layers[0]

    def mlp():
        x = model._rms(h, layer["ln2"])
        return h + (torch.nn.functional.silu(x @ layer["gate"].t()) * (x @ layer["up"].t())) @ \
            layer["down"].t()

    def attention_block():
        x = model._rms(h, layer["ln1"])
        q = (x @ layer["wq"].t()).view(1, model.cfg.heads, 1, model.cfg.head_dim)
        k = (x @ layer["wk"].t()).view(1, model.cfg.kv_heads, 1, model.cfg.head_dim)
        v = (x @ layer["wv"].t()).view(1, model.cfg.kv_heads, 1, model.cfg.head_dim)
        q, k = model._rope(q), model._rope(k)
        model.k_cache[0].index_copy_(2, model.pos.view(1), k)
        model.v_cache[0].index_copy_(2, model.pos.view(1), v)
        visible = (model.positions <= model.pos)[None, None, None, :]
        attn = torch.nn.functional.scaled_dot_product_attention(
            q, model.k_cache[0], model.v_cache[0], attn_mask=visible, enable_gqa=True)
        return h + attn.reshape(1, model.cfg.hidden) @ layer["wo"].t()

    singles = list(ops.items())
    q0 = torch.randn(1, model.cfg.heads, 1, model.cfg.head_dim, device="cuda", dtype=torch.bfloat16)
    k0 = torch.randn(1, model.cfg.kv_heads, 1, model.cfg.head_dim, device="cuda",
                     dtype=torch.bfloat16)
    # RoPE alone (session 42: leaving it out of a layer's chain took half of MPS's growth).
    ops["rope of q and k"] = lambda: (model._rope(q0), model._rope(k0))
    ops["mlp block (9 kernels)"] = mlp
    ops["attention block (~30 kernels)"] = attention_block
    if pairs:
        # One layer as the forward runs it (attention, then MLP), and every pair of two single
        # ops in turn: does MPS make a change of kernel kind cost what a kind alone does not?
        ops["layer (attention + mlp)"] = lambda: (attention_block(), mlp())
        for i, (name_a, op_a) in enumerate(singles):
            for name_b, op_b in singles[i + 1:]:
                ops[f"pair: {name_a} / {name_b}"] = \
                    lambda op_a=op_a, op_b=op_b: (op_a(), op_b())
    return {name: chain_us(op, nodes, reps) for name, op in ops.items()}


def layer_chains(nodes=200, reps=21):
    """Chains of one whole layer at B = 1 (decode_loop.Decoder's), then the same layer with one
    part left out at a time (µs a node): which part makes MPS's penalty on a layer."""
    model = Decoder(Config(model_args(1)), 1, max_len=128, device="cuda")
    cfg, p = model.cfg, model.layers[0]
    h = torch.randn(1, cfg.hidden, device="cuda", dtype=torch.bfloat16)
    visible = (model.positions <= model.pos)[None, None, None, :]

    def layer(skip):
        def heads(t, n):
            return t[:, :n * cfg.head_dim].reshape(1, n, 1, cfg.head_dim)
        x = h
        y = x if "rms" in skip else model._rms(x, p["ln1"])
        if "qkv" in skip:
            q, k, v = heads(y, cfg.heads), heads(y, cfg.kv_heads), heads(y, cfg.kv_heads)
        else:
            q = (y @ p["wq"].t()).view(1, cfg.heads, 1, cfg.head_dim)
            k = (y @ p["wk"].t()).view(1, cfg.kv_heads, 1, cfg.head_dim)
            v = (y @ p["wv"].t()).view(1, cfg.kv_heads, 1, cfg.head_dim)
        if "rope" not in skip:
            q, k = model._rope(q), model._rope(k)
        if "kv_write" not in skip:
            model.k_cache[0].index_copy_(2, model.pos.view(1), k)
            model.v_cache[0].index_copy_(2, model.pos.view(1), v)
        if "sdpa" in skip:
            attn = q
        else:
            attn = torch.nn.functional.scaled_dot_product_attention(
                q, model.k_cache[0], model.v_cache[0], attn_mask=visible, enable_gqa=True)
        attn = attn.reshape(1, cfg.hidden)
        x = x + (attn if "wo" in skip else attn @ p["wo"].t())
        y = x if "rms" in skip else model._rms(x, p["ln2"])
        if "mlp_gemv" in skip:
            gate = up = y
        else:
            gate, up = y @ p["gate"].t(), y @ p["up"].t()
        act = gate if "silu" in skip else torch.nn.functional.silu(gate) * up
        return x + (act if "mlp_gemv" in skip else act @ p["down"].t())

    results = {"layer": chain_us(lambda: layer(()), nodes, reps)}
    for part in LAYER_PARTS:
        results[f"layer without {part}"] = chain_us(lambda part=part: layer((part,)), nodes, reps)
    return results


def run(args):
    torch.manual_seed(0)
    cfg = Config(model_args(args.batch))
    model = Decoder(cfg, args.batch, max_len=128, device="cuda")
    if args.shared_weights:  # every layer reads layer 0's weights: ~40 MB a step, not ~1 GB
        model.layers = [model.layers[0]] * len(model.layers)
    model.capture()
    for _ in range(5):
        model.graph.replay()
    torch.cuda.synchronize()
    report = {
        "batch": args.batch,
        "shared_weights": args.shared_weights,
        "mps": bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")),
        "replay_ms": replay_ms(model, args.reps),
        **summarize(traced_kernels(model, args.trace_reps)),
        "op_chains_us": op_chains(pairs=args.pair_chains)
        if args.op_chains or args.pair_chains else {},
        "layer_chains_us": layer_chains() if args.layer_chains else {},
    }
    print(f"batch {args.batch}, MPS {report['mps']}, shared weights {args.shared_weights}: replay {report['replay_ms']:.3f} ms; traced: "
          f"{report['kernels']} kernels, span {report['span_us']:.0f} us, kernels "
          f"{report['kernel_us']:.0f} us, median gap {report['gap_median_us']:.2f} us")
    for name, us in {**report["op_chains_us"], **report["layer_chains_us"]}.items():
        print(f"  graph chain of {name}: {us:.3f} us a node")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


def compare(a_path, b_path, top):
    with open(a_path) as f:
        a = json.load(f)
    with open(b_path) as f:
        b = json.load(f)
    print(f"{'':34} {'A':>10} {'B':>10} {'B - A':>10}")
    for key, label in [("replay_ms", "replay ms (events)"), ("span_us", "traced span us"),
                       ("kernel_us", "sum of kernel durations us"),
                       ("gap_median_us", "median gap between kernels us"),
                       ("kernels", "kernels a replay")]:
        print(f"{label:34} {a[key]:10.3f} {b[key]:10.3f} {b[key] - a[key]:10.3f}")
    for key in ("op_chains_us", "layer_chains_us"):
        for name, us in b.get(key, {}).items():
            ua = a.get(key, {}).get(name)
            if ua is None:
                continue
            print(f"{'chain: ' + name:34} {ua:10.3f} {us:10.3f} {us - ua:10.3f}")
    rows = []
    for name, sb in b["by_name"].items():
        sa = a["by_name"].get(name)
        if sa is None:
            continue
        rows.append((sb["total_us"] - sa["total_us"], name, sa, sb))
    rows.sort(reverse=True)
    print(f"\nkernels whose time a replay grew most (A -> B), top {top}:")
    print(f"{'growth us':>10} {'count':>6} {'median A':>9} {'median B':>9}  name")
    for growth, name, sa, sb in rows[:top]:
        print(f"{growth:10.1f} {sb['per_replay']:6.0f} {sa['median_us']:9.2f} "
              f"{sb['median_us']:9.2f}  {name[:90]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--reps", type=int, default=50, help="timed replays")
    ap.add_argument("--trace-reps", type=int, default=5, help="traced replays")
    ap.add_argument("--shared-weights", action="store_true",
                    help="every layer uses layer 0's weights (the same kernels, far less memory)")
    ap.add_argument("--op-chains", action="store_true",
                    help="also time graph chains of single ops (µs a node)")
    ap.add_argument("--pair-chains", action="store_true",
                    help="--op-chains, plus one whole layer and every pair of two single ops")
    ap.add_argument("--layer-chains", action="store_true",
                    help="time chains of one whole layer, and of it without each of its parts")
    ap.add_argument("--json")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"))
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    if args.compare:
        compare(*args.compare, args.top)
    else:
        run(args)


if __name__ == "__main__":
    main()
