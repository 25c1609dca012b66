"""The benchmark of device_session_cuda.py: a session step on the engine's stream against the
bare kernels (libsamplerd_capi.so through bench_kernels.py) and the server's unary compute time."""

import json
import os
import statistics
import sys
import time

import torch

from session_common import HERE, VOCAB, check


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

