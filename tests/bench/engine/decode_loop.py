#!/usr/bin/env python3
"""Engine decode-loop benchmark: a decoder LM generating tokens, sampling in-process with the
PyTorch-native algorithm (vLLM's) vs through samplerd (unary calls over GPU IPC, or a device
session) with the Python client.

The model is a Qwen2-0.5B-shaped decoder with random bf16 weights (24 layers, hidden 896, 14
query / 2 KV heads, MLP 4864, vocab 151,936, tied embeddings: 494 M parameters) and a static KV
cache. Its decode step is captured once as a CUDA graph, as serving engines do, so the step time
is the GPU's and not Python's. Each step: forward (graph replay) -> fp32 logits [B, V] -> sample
-> the next tokens (on the host too, as an engine needs them for stop checks and detokenizing).

Samplers (--samplers, comma-separated; "pytorch" always runs, as the baseline):
  pytorch             in-process PyTorch-native sampling
  samplerd            unary Sample over GPU IPC, the read ordered by an IPC event
  samplerd_sync       the same, synchronizing before the call instead
  session-host        a device session on the host plane (eager): the engine's stream copies the
                      logits to pinned shm, rings and waits; the server samples on its CPUs
  session-gpu         a device session on the GPU plane (eager): flags in device memory
  session-host-graph  forward + host-plane session step captured in one CUDA graph (the sampled
  session-gpu-graph   tokens are fed back to the next step's input inside the graph)
  session-gpu-graph-inplace  the same on the GPU plane, with the forward's fp32 logits written
                      straight into the session's logits buffer (no copy in the step)
The two session samplers of a plane share one session.

Per batch size and sampling setting, the samplers run in the same process on the same model,
alternating, and the report gives tokens/s of each, their ratio to PyTorch's, and the share of
the step time spent sampling (from a second pass that synchronizes after the forward to time it
alone; for a graph sampler the forward alone is replayed first, and the sampling time is the
whole step's time less the forward's).

    decode_loop.py --target unix:///tmp/samplerd-gpu.sock --py DIR [--batches 1,32,128]
                   [--steps 64] [--samplers pytorch,session-gpu] [--json out.json]
                   [--markdown out.md]

DIR holds the `samplerd` package with its generated stubs; bench_kernels.py (for the PyTorch-native
sampler) is looked up next to this file, then in ../gpu.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
for folder in (HERE, os.path.join(HERE, "..", "gpu")):
    if os.path.exists(os.path.join(folder, "bench_kernels.py")):
        sys.path.insert(0, folder)
        break
from bench_kernels import torch_native  # noqa: E402

# name: (temperature, top_k, top_p)
SETTINGS = {
    "top_k_50_top_p_0.9": (0.8, 50, 0.9),
    "top_p_0.95": (1.0, 0, 0.95),
}


class Config:
    def __init__(self, args):
        self.hidden = args.hidden
        self.layers = args.layers
        self.heads = args.heads
        self.kv_heads = args.kv_heads
        self.ffn = args.ffn
        self.vocab = args.vocab
        self.head_dim = self.hidden // self.heads

    def params(self):
        h, kv = self.hidden, self.kv_heads * self.head_dim
        per_layer = h * h * 2 + h * kv * 2 + 3 * h * self.ffn + 2 * h
        return self.layers * per_layer + self.vocab * h + h


class Decoder:
    """Random-weight decoder with a static KV cache of ``max_len`` positions per row."""

    def __init__(self, cfg, batch, max_len, device, seed=0):
        g = torch.Generator(device=device).manual_seed(seed)
        dt = torch.bfloat16

        def w(*shape):
            return (torch.randn(*shape, generator=g, device=device) * 0.02).to(dt)

        self.cfg = cfg
        kv = cfg.kv_heads * cfg.head_dim
        self.embed = w(cfg.vocab, cfg.hidden)
        self.layers = []
        for _ in range(cfg.layers):
            self.layers.append(dict(
                ln1=torch.ones(cfg.hidden, device=device, dtype=dt),
                wq=w(cfg.hidden, cfg.hidden), wk=w(kv, cfg.hidden), wv=w(kv, cfg.hidden),
                wo=w(cfg.hidden, cfg.hidden),
                ln2=torch.ones(cfg.hidden, device=device, dtype=dt),
                gate=w(cfg.ffn, cfg.hidden), up=w(cfg.ffn, cfg.hidden), down=w(cfg.hidden, cfg.ffn),
            ))
        self.norm = torch.ones(cfg.hidden, device=device, dtype=dt)
        shape = (cfg.layers, batch, cfg.kv_heads, max_len, cfg.head_dim)
        self.k_cache = torch.zeros(shape, device=device, dtype=dt)
        self.v_cache = torch.zeros(shape, device=device, dtype=dt)
        inv = 1.0 / (10000 ** (torch.arange(0, cfg.head_dim, 2, device=device).float() / cfg.head_dim))
        angles = torch.arange(max_len, device=device).float()[:, None] * inv[None, :]
        self.cos, self.sin = angles.cos().to(dt), angles.sin().to(dt)
        self.positions = torch.arange(max_len, device=device)
        # Static inputs and output of the captured step.
        self.tokens = torch.zeros(batch, dtype=torch.long, device=device)
        self.pos = torch.zeros((), dtype=torch.long, device=device)
        self.logits = None
        self.graph = None

    @staticmethod
    def _rms(x, weight):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * weight

    def _rope(self, x):  # x [B, H, 1, D]
        cos = self.cos.index_select(0, self.pos.view(1))[None, None]
        sin = self.sin.index_select(0, self.pos.view(1))[None, None]
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)

    def forward(self, out=None):
        """The step's fp32 logits [B, V]; written into ``out`` when given (say a device session's
        logits buffer, so that sampling copies nothing)."""
        cfg, batch = self.cfg, self.tokens.shape[0]
        x = self.embed.index_select(0, self.tokens)  # [B, H]
        visible = (self.positions <= self.pos)[None, None, None, :]  # [1, 1, 1, T]
        for i, p in enumerate(self.layers):
            h = self._rms(x, p["ln1"])
            q = (h @ p["wq"].t()).view(batch, cfg.heads, 1, cfg.head_dim)
            k = (h @ p["wk"].t()).view(batch, cfg.kv_heads, 1, cfg.head_dim)
            v = (h @ p["wv"].t()).view(batch, cfg.kv_heads, 1, cfg.head_dim)
            q, k = self._rope(q), self._rope(k)
            self.k_cache[i].index_copy_(2, self.pos.view(1), k)
            self.v_cache[i].index_copy_(2, self.pos.view(1), v)
            attn = F.scaled_dot_product_attention(q, self.k_cache[i], self.v_cache[i],
                                                  attn_mask=visible, enable_gqa=True)
            x = x + attn.reshape(batch, cfg.hidden) @ p["wo"].t()
            h = self._rms(x, p["ln2"])
            x = x + (F.silu(h @ p["gate"].t()) * (h @ p["up"].t())) @ p["down"].t()
        logits = self._rms(x, self.norm) @ self.embed.t()
        if out is None:
            return logits.float()  # [B, V] fp32, as vLLM samples
        return out.copy_(logits)  # the same conversion kernel, writing into ``out``

    def capture(self):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.forward()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self.forward()

    def step(self, tokens, position):
        self.tokens.copy_(tokens, non_blocking=True)
        self.pos.fill_(position)
        self.graph.replay()
        return self.logits


class NativeSampler:
    name = "pytorch"
    fused = False

    def __init__(self, batch, setting, device):
        t, k, p = setting
        self.temperature = torch.full((batch,), t, device=device)
        self.top_k = torch.full((batch,), k, device=device, dtype=torch.int32) if k else None
        self.top_p = torch.full((batch,), p, device=device) if p < 1 else None

    def __call__(self, logits, step):
        gpu = torch_native(logits, self.temperature, self.top_k, self.top_p, greedy=False)
        return gpu, gpu.cpu()  # an engine reads the tokens on the host every step


class SamplerdSampler:
    fused = False

    def __init__(self, name, client, batch, setting):
        t, k, p = setting
        self.name = name
        self.client = client
        self.kwargs = dict(temperature=t, top_k=k, top_p=p, seed=list(range(1, batch + 1)))

    def __call__(self, logits, step):
        host = torch.from_numpy(self.client.sample(logits, position=step, **self.kwargs).tokens)
        return host.to(logits.device, non_blocking=True), host


class SamplerdStreamSampler(SamplerdSampler):
    """One SampleStream session for the loop, one step per decode step."""

    def __init__(self, name, client, batch, setting):
        super().__init__(name, client, batch, setting)
        self.session = client.stream()

    def __call__(self, logits, step):
        host = torch.from_numpy(self.session.step(logits, position=step, **self.kwargs).tokens)
        return host.to(logits.device, non_blocking=True), host

    def close(self):
        self.session.close()


class SessionSampler:
    """A device session, eager: sample() enqueues the step on the current stream and returns the
    tokens as a CUDA tensor (the next step's input); the engine reads them on the host too."""

    fused = False

    def __init__(self, name, session, batch, setting, device):
        t, k, p = setting
        self.name = name
        self.session = session
        self.seeds = torch.arange(1, batch + 1, dtype=torch.int64, device=device)
        self.kwargs = dict(temperature=t, top_k=k, top_p=p, seeds=self.seeds)

    def __call__(self, logits, step):
        tokens, _ = self.session.sample(logits, positions=step, **self.kwargs)
        return tokens, tokens.cpu()


class SessionGraphSampler(SessionSampler):
    """Forward + device-session step + feeding the tokens back, captured in one CUDA graph. Per
    step the host sets the position (of the model and of the rows' draws) and replays."""

    fused = True

    def __init__(self, name, session, batch, setting, device, model, in_place=False):
        super().__init__(name, session, batch, setting, device)
        self.model = model
        # In place: the forward's fp32 conversion writes straight into the session's logits
        # buffer (README, "fastest path"), so the step has no logits copy (B = 128: 78 MB).
        out = session.logits_buffer[:batch] if in_place else None
        self.positions = torch.zeros(batch, dtype=torch.int64, device=device)
        self.kwargs["positions"] = self.positions
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up outside the capture (lazy init, allocator blocks)
                self.session.sample(model.forward(out), **self.kwargs)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            tokens, _ = self.session.sample(model.forward(out), **self.kwargs)
            model.tokens.copy_(tokens)  # the next step's input, inside the graph
        self.tokens = tokens  # the graph's output (a view of the session's token buffer)

    def step(self, tokens, position):
        """One decode step: forward + sample by one graph replay; (CUDA tokens, host tokens)."""
        if tokens is not self.tokens:
            self.model.tokens.copy_(tokens, non_blocking=True)  # the loop's first step
        self.model.pos.fill_(position)
        self.positions.fill_(position)
        self.graph.replay()
        return self.tokens, self.tokens.cpu()

    def close(self):
        self.graph = None  # the session itself is closed by its owner


SAMPLERS = ("pytorch", "samplerd", "samplerd_sync", "session-host", "session-gpu",
            "session-host-graph", "session-gpu-graph", "session-gpu-graph-inplace")


def run_loop(model, sampler, batch, steps, timed_split, device):
    """Generates ``steps`` tokens per row; returns (seconds, per-step forward s, per-step sample s)."""
    tokens = torch.randint(0, model.cfg.vocab, (batch,), device=device)
    forward_s, sample_s = [], []
    torch.cuda.synchronize()
    start = time.perf_counter()
    for step in range(steps):
        if sampler.fused:  # forward and sampling in one graph
            if timed_split:  # the forward alone first (it rewrites the same KV-cache entries)
                t0 = time.perf_counter()
                model.step(tokens, step)
                torch.cuda.synchronize()
                forward = time.perf_counter() - t0
            t1 = time.perf_counter()
            tokens, host = sampler.step(tokens, step)
            if timed_split:
                forward_s.append(forward)
                sample_s.append(max(0.0, time.perf_counter() - t1 - forward))
        else:
            t0 = time.perf_counter()
            logits = model.step(tokens, step)
            if timed_split:
                torch.cuda.synchronize()
                t1 = time.perf_counter()
            tokens, host = sampler(logits, step)
            if timed_split:
                t2 = time.perf_counter()
                forward_s.append(t1 - t0)
                sample_s.append(t2 - t1)
        if int(host.min()) < 0 or int(host.max()) >= model.cfg.vocab:
            raise RuntimeError("%s sampled an out-of-range token" % sampler.name)
    torch.cuda.synchronize()
    return time.perf_counter() - start, forward_s, sample_s


def make_samplers(names, batch, setting, model, clients, sessions, device):
    """The samplers of one (batch, setting), in the order of ``names`` (pytorch first)."""
    out = [NativeSampler(batch, setting, device)]
    for name in names:
        if name == "samplerd":
            out.append(SamplerdSampler(name, clients["event"], batch, setting))
        elif name == "samplerd_sync":
            out.append(SamplerdSampler(name, clients["sync"], batch, setting))
        elif name == "samplerd_stream":
            out.append(SamplerdStreamSampler(name, clients["event"], batch, setting))
        elif name in ("session-host", "session-gpu"):
            out.append(SessionSampler(name, sessions[name.split("-")[1]], batch, setting, device))
        elif name in ("session-host-graph", "session-gpu-graph", "session-gpu-graph-inplace"):
            out.append(SessionGraphSampler(name, sessions[name.split("-")[1]], batch, setting,
                                           device, model, in_place=name.endswith("-inplace")))
    return out


def write_markdown(path, rows, names):
    with open(path, "w") as f:
        if "samplerd" in names and "samplerd_sync" in names:  # the table of earlier runs
            f.write("| B | sampling | PyTorch tok/s | samplerd tok/s | speedup | samplerd sync tok/s "
                    "(speedup) | PyTorch forward / sample ms (share) | samplerd forward / sample ms "
                    "(share) |\n|---|---|---|---|---|---|---|---|\n")
            for r in rows:
                p, s, y = r["pytorch"], r["samplerd"], r["samplerd_sync"]
                f.write("| %d | %s | %.0f | %.0f | %.2f× | %.0f (%.2f×) | %.2f / %.2f (%.0f%%) | "
                        "%.2f / %.2f (%.0f%%) |\n"
                        % (r["batch"], r["setting"], p["tokens_per_s"], s["tokens_per_s"],
                           r["speedup"], y["tokens_per_s"], r["speedup_sync"], p["forward_ms"],
                           p["sample_ms"], 100 * p["sample_share"], s["forward_ms"], s["sample_ms"],
                           100 * s["sample_share"]))
            f.write("\n")
        # Every sampler, one line each.
        f.write("| B | sampling | sampler | tok/s | speedup | step ms | forward / sample ms "
                "(share) |\n|---|---|---|---|---|---|---|\n")
        for r in rows:
            for name in ["pytorch"] + names:
                x = r[name]
                f.write("| %d | %s | %s | %.0f | %.2f× | %.2f | %.2f / %.2f (%.0f%%) |\n"
                        % (r["batch"], r["setting"], name, x["tokens_per_s"],
                           x["tokens_per_s"] / r["pytorch"]["tokens_per_s"], x["step_ms"],
                           x["forward_ms"], x["sample_ms"], 100 * x["sample_share"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="the samplerd GPU server")
    ap.add_argument("--py", required=True, help="folder holding the samplerd package")
    ap.add_argument("--batches", default="1,32,128")
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--samplers", default=",".join(SAMPLERS),
                    help="comma-separated, from %s (pytorch always runs)" % ",".join(SAMPLERS))
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per sampler")
    ap.add_argument("--hidden", type=int, default=896)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--heads", type=int, default=14)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=4864)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--stream", action="store_true",
                    help="also sample through one SampleStream session (reported in the log and JSON)")
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    args = ap.parse_args()
    names = [n for n in args.samplers.split(",") if n and n != "pytorch"]
    unknown = [n for n in names if n not in SAMPLERS]
    if unknown:
        ap.error("--samplers: expected names from %s, got %s" % (",".join(SAMPLERS), unknown))
    if args.stream:
        names.append("samplerd_stream")
    sys.path.insert(0, args.py)
    import samplerd

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    cfg = Config(args)
    # The client's default orders the server's read with an IPC event; "sync" synchronizes first.
    client = samplerd.Client(args.target, cuda_ipc="always", timeout=60)
    client_sync = samplerd.Client(args.target, cuda_ipc="always", cuda_ready="sync", timeout=60)
    clients = dict(event=client, sync=client_sync)
    info = client.server_info()
    mps = bool(getattr(getattr(info, "device_sessions", None), "mps", False))
    print("device %s, torch %s, samplerd %s (%s); model %.0f M parameters, vocab %d; MPS %s; "
          "samplers %s"
          % (torch.cuda.get_device_name(device), torch.__version__, info.version,
             info.devices[0].name if info.devices else "?", cfg.params() / 1e6, cfg.vocab,
             "on" if mps else "off", ",".join(["pytorch"] + names)), flush=True)

    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        model = Decoder(cfg, batch, args.steps + 1, device)
        model.capture()
        # One device session per plane for this B, shared by its eager and graph samplers.
        sessions = {}
        for plane in ("host", "gpu"):
            if any(n.startswith("session-%s" % plane) for n in names):
                sessions[plane] = client.device_session(max_batch=batch, vocab=cfg.vocab,
                                                        dtype="float32", plane=plane, device=device)
        for setting_name in args.settings.split(","):
            setting = SETTINGS[setting_name]
            samplers = make_samplers(names, batch, setting, model, clients, sessions, device)
            for s in samplers:  # warm-up: kernels, allocator blocks, the GPU IPC region
                run_loop(model, s, batch, 4, False, device)
            result = {s.name: dict(total=[], forward=[], sample=[]) for s in samplers}
            for _ in range(args.rounds):
                for s in samplers:
                    seconds, _, _ = run_loop(model, s, batch, args.steps, False, device)
                    _, fwd, smp = run_loop(model, s, batch, args.steps, True, device)
                    result[s.name]["total"].append(seconds)
                    result[s.name]["forward"] += fwd
                    result[s.name]["sample"] += smp
            for s in samplers:
                if hasattr(s, "close"):
                    s.close()
            row = dict(batch=batch, setting=setting_name, steps=args.steps)
            for name, r in result.items():
                seconds = statistics.median(r["total"])
                fwd, smp = statistics.median(r["forward"]), statistics.median(r["sample"])
                row[name] = dict(tokens_per_s=batch * args.steps / seconds,
                                 step_ms=seconds / args.steps * 1e3, forward_ms=fwd * 1e3,
                                 sample_ms=smp * 1e3, sample_share=smp / (fwd + smp))
            base = row["pytorch"]["tokens_per_s"]
            for name in names:
                row["speedup_" + name.replace("-", "_")] = row[name]["tokens_per_s"] / base
            if "samplerd" in row:
                row["speedup"] = row["samplerd"]["tokens_per_s"] / base
            if "samplerd_sync" in row:
                row["speedup_sync"] = row["samplerd_sync"]["tokens_per_s"] / base
            if "samplerd_stream" in row:
                row["speedup_stream"] = row["samplerd_stream"]["tokens_per_s"] / base
            rows.append(row)
            print("B=%-4d %-20s pytorch %9.0f tok/s (sample %5.2f ms, %4.1f%%)"
                  % (batch, setting_name, base, row["pytorch"]["sample_ms"],
                     100 * row["pytorch"]["sample_share"]), flush=True)
            for name in names:
                x = row[name]
                print("       %-20s %-18s %9.0f tok/s (sample %5.2f ms, %4.1f%%)  x%.2f"
                      % ("", name, x["tokens_per_s"], x["sample_ms"], 100 * x["sample_share"],
                         x["tokens_per_s"] / base), flush=True)
        for session in sessions.values():
            session.close()
        del model
        torch.cuda.empty_cache()
        client.release_cuda_regions()
        client_sync.release_cuda_regions()
    client.close()
    client_sync.close()

    meta = dict(device=torch.cuda.get_device_name(device), torch=torch.__version__,
                samplerd=info.version, params_m=round(cfg.params() / 1e6), vocab=cfg.vocab,
                steps=args.steps, rounds=args.rounds, mps=mps, samplers=["pytorch"] + names,
                date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
    if args.markdown:
        write_markdown(args.markdown, rows, names)
    speedups = [r[k] for r in rows for k in r if k.startswith("speedup")]
    return 0 if rows and all(math.isfinite(x) for x in speedups) else 1


if __name__ == "__main__":
    sys.exit(main())
