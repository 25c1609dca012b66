#!/usr/bin/env python3
"""Engine decode-loop benchmark: a decoder LM generating tokens, sampling in-process with the
PyTorch-native algorithm (vLLM's) vs through samplerd over GPU IPC with the Python client.

The model is a Qwen2-0.5B-shaped decoder with random bf16 weights (24 layers, hidden 896, 14
query / 2 KV heads, MLP 4864, vocab 151,936, tied embeddings: 494 M parameters) and a static KV
cache. Its decode step is captured once as a CUDA graph, as serving engines do, so the step time
is the GPU's and not Python's. Each step: forward (graph replay) -> fp32 logits [B, V] -> sample
-> the next tokens (on the host too, as an engine needs them for stop checks and detokenizing).

Per batch size and sampling setting, both samplers run in the same process on the same model,
alternating, and the report gives tokens/s of each, their ratio, and the share of the step time
spent sampling (from a second pass that synchronizes after the forward to time it alone).

    decode_loop.py --target unix:///tmp/samplerd-gpu.sock --py DIR [--batches 1,32,128]
                   [--steps 64] [--json out.json] [--markdown out.md]

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

    def forward(self):
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
        return (self._rms(x, self.norm) @ self.embed.t()).float()  # [B, V] fp32, as vLLM samples

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

    def __init__(self, batch, setting, device):
        t, k, p = setting
        self.temperature = torch.full((batch,), t, device=device)
        self.top_k = torch.full((batch,), k, device=device, dtype=torch.int32) if k else None
        self.top_p = torch.full((batch,), p, device=device) if p < 1 else None

    def __call__(self, logits, step):
        gpu = torch_native(logits, self.temperature, self.top_k, self.top_p, greedy=False)
        return gpu, gpu.cpu()  # an engine reads the tokens on the host every step


class SamplerdSampler:
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


def run_loop(model, sampler, batch, steps, timed_split, device):
    """Generates ``steps`` tokens per row; returns (seconds, per-step forward s, per-step sample s)."""
    tokens = torch.randint(0, model.cfg.vocab, (batch,), device=device)
    forward_s, sample_s = [], []
    torch.cuda.synchronize()
    start = time.perf_counter()
    for step in range(steps):
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="the samplerd GPU server")
    ap.add_argument("--py", required=True, help="folder holding the samplerd package")
    ap.add_argument("--batches", default="1,32,128")
    ap.add_argument("--settings", default=",".join(SETTINGS))
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
    sys.path.insert(0, args.py)
    import samplerd

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    cfg = Config(args)
    # The client's default orders the server's read with an IPC event; "sync" synchronizes first.
    client = samplerd.Client(args.target, cuda_ipc="always", timeout=60)
    client_sync = samplerd.Client(args.target, cuda_ipc="always", cuda_ready="sync", timeout=60)
    info = client.server_info()
    print("device %s, torch %s, samplerd %s (%s); model %.0f M parameters, vocab %d"
          % (torch.cuda.get_device_name(device), torch.__version__, info.version,
             info.devices[0].name if info.devices else "?", cfg.params() / 1e6, cfg.vocab), flush=True)

    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        model = Decoder(cfg, batch, args.steps + 1, device)
        model.capture()
        for setting_name in args.settings.split(","):
            setting = SETTINGS[setting_name]
            samplers = [NativeSampler(batch, setting, device),
                        SamplerdSampler("samplerd", client, batch, setting),
                        SamplerdSampler("samplerd_sync", client_sync, batch, setting)]
            if args.stream:
                samplers.append(SamplerdStreamSampler("samplerd_stream", client, batch, setting))
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
            row = dict(batch=batch, setting=setting_name, steps=args.steps)
            for name, r in result.items():
                seconds = statistics.median(r["total"])
                fwd, smp = statistics.median(r["forward"]), statistics.median(r["sample"])
                row[name] = dict(tokens_per_s=batch * args.steps / seconds,
                                 step_ms=seconds / args.steps * 1e3, forward_ms=fwd * 1e3,
                                 sample_ms=smp * 1e3, sample_share=smp / (fwd + smp))
            row["speedup"] = row["samplerd"]["tokens_per_s"] / row["pytorch"]["tokens_per_s"]
            row["speedup_sync"] = row["samplerd_sync"]["tokens_per_s"] / row["pytorch"]["tokens_per_s"]
            if "samplerd_stream" in row:
                row["speedup_stream"] = (row["samplerd_stream"]["tokens_per_s"]
                                         / row["pytorch"]["tokens_per_s"])
                print("    stream session: %.0f tok/s (x%.2f), sample %.2f ms"
                      % (row["samplerd_stream"]["tokens_per_s"], row["speedup_stream"],
                         row["samplerd_stream"]["sample_ms"]), flush=True)
                for s in samplers:
                    if isinstance(s, SamplerdStreamSampler):
                        s.session.close()
            rows.append(row)
            print("B=%-4d %-20s pytorch %9.0f tok/s (sample %5.2f ms, %4.1f%%)  samplerd %9.0f tok/s "
                  "(sample %5.2f ms, %4.1f%%)  x%.2f  (sync: %.0f tok/s, x%.2f)"
                  % (batch, setting_name, row["pytorch"]["tokens_per_s"], row["pytorch"]["sample_ms"],
                     100 * row["pytorch"]["sample_share"], row["samplerd"]["tokens_per_s"],
                     row["samplerd"]["sample_ms"], 100 * row["samplerd"]["sample_share"],
                     row["speedup"], row["samplerd_sync"]["tokens_per_s"], row["speedup_sync"]),
                  flush=True)
        del model
        torch.cuda.empty_cache()
        client.release_cuda_regions()
        client_sync.release_cuda_regions()
    client.close()
    client_sync.close()

    meta = dict(device=torch.cuda.get_device_name(device), torch=torch.__version__,
                samplerd=info.version, params_m=round(cfg.params() / 1e6), vocab=cfg.vocab,
                steps=args.steps, rounds=args.rounds, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("| B | sampling | PyTorch tok/s | samplerd tok/s | speedup | samplerd sync tok/s "
                    "(speedup) | PyTorch forward / sample ms (share) | samplerd forward / sample ms "
                    "(share) |\n|---|---|---|---|---|---|---|---|\n")
            for r in rows:
                p, s, y = r["pytorch"], r["samplerd"], r["samplerd_sync"]
                f.write("| %d | %s | %.0f | %.0f | %.2f× | %.0f (%.2f×) | %.2f / %.2f (%.0f%%) | "
                        "%.2f / %.2f (%.0f%%) |\n"
                        % (r["batch"], r["setting"], p["tokens_per_s"], s["tokens_per_s"], r["speedup"],
                           y["tokens_per_s"], r["speedup_sync"], p["forward_ms"], p["sample_ms"],
                           100 * p["sample_share"], s["forward_ms"], s["sample_ms"],
                           100 * s["sample_share"]))
    return 0 if all(math.isfinite(r["speedup"]) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
