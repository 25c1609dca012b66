"""The processors benchmark of device_session_cuda.py (check `processors_bench`): what a token
bitmask and a processors buffer add to a GPU-plane session step, on the engine's stream.

Per B: the step without processors (a session opened without them), with a dense bitmask
(half the tokens allowed), and with the bitmask plus 16 bias and 2,000 history entries per row
(repetition, presence and frequency penalties on), each given as fixed CUDA tensors (as in a
captured graph). V = 151,936 fp32, top-k 50 + top-p 0.9 at T = 0.8."""

import json
import os

import numpy as np
import torch

from session_checks_bench import session_step_us, sleep_cycles_per_us
from session_common import VOCAB, check

WORDS = (VOCAB + 31) // 32
HISTORY = 2000
BIAS = 16


def _inputs(s, batch, rng, device):
    """A half-dense mask [B, W] and the packed processors of B rows, as CUDA tensors."""
    allowed = rng.random((batch, VOCAB)) < 0.5
    packed = np.zeros((batch, WORDS * 4), np.uint8)
    packed[:, :(VOCAB + 7) // 8] = np.packbits(allowed, axis=1, bitorder="little")
    mask = torch.from_numpy(packed.view("<i4").copy()).to(device)
    prompts, outputs, bias = [], [], []
    for _ in range(batch):
        tokens = rng.choice(VOCAB, HISTORY, replace=False)
        prompts.append(tokens[:HISTORY // 2].tolist())
        outputs.append(np.concatenate([tokens[HISTORY // 2:], tokens[-100:]]).tolist())
        bias.append({int(t): float(rng.normal()) for t in rng.choice(VOCAB, BIAS, replace=False)})
    procs = s.pack_processors(batch, logit_bias=bias, repetition_penalty=1.2,
                              presence_penalty=0.5, frequency_penalty=0.3,
                              prompt_token_ids=prompts, output_token_ids=outputs)
    return mask, torch.from_numpy(procs).to(device)


def check_processors_bench(client, args, device):
    batches = [int(b) for b in args.bench_batches.split(",")]
    m = max(batches)
    steps = args.bench_steps
    cycles_per_us = sleep_cycles_per_us(device)
    rng = np.random.default_rng(8)
    gen = torch.Generator(device=device).manual_seed(8)
    rows, all_ok = [], True
    with client.device_session(max_batch=m, vocab=VOCAB, dtype="float32", plane="gpu",
                               device=device) as plain, \
            client.device_session(max_batch=m, vocab=VOCAB, dtype="float32", plane="gpu",
                                  device=device, token_bitmask=True,
                                  processors={"logit_bias": m * BIAS,
                                              "token_history": m * HISTORY}) as s:
        for batch in batches:
            logits = torch.randn(batch, VOCAB, device=device, generator=gen) * 3
            kwargs = dict(temperature=0.8, top_k=50, top_p=0.9,
                          seeds=torch.arange(1, batch + 1, dtype=torch.int64, device=device))
            mask, procs = _inputs(s, batch, rng, device)
            empty = torch.from_numpy(s.pack_processors(batch)).to(device)
            row = dict(batch=batch)
            for name, session, extra in (
                    ("none", plain, {}),
                    ("mask", s, dict(token_bitmask=mask, processors=empty)),
                    ("mask_2000", s, dict(token_bitmask=mask, processors=procs))):
                kw = dict(kwargs, **extra)
                session_step_us(session, logits, kw, 20, cycles_per_us, False)  # warm-up
                p50, p90, ok = session_step_us(session, logits, kw, steps, cycles_per_us, False)
                row[name + "_p50_us"], row[name + "_p90_us"] = p50, p90
                all_ok &= ok
            rows.append(row)
            print("    B=%d: none %.1f, mask %.1f, mask + 2,000 entries %.1f µs (p50)"
                  % (batch, row["none_p50_us"], row["mask_p50_us"], row["mask_2000_p50_us"]),
                  flush=True)
    lines = ["| B | no processors p50 / p90 µs | half-dense mask p50 / p90 µs (+%) | mask + 16 "
             "bias + 2,000 history entries a row p50 / p90 µs (+%) |", "|---|---|---|---|"]
    for r in rows:
        base = r["none_p50_us"]
        lines.append("| %d | %.1f / %.1f | %.1f / %.1f (%+.0f%%) | %.1f / %.1f (%+.0f%%) |" % (
            r["batch"], base, r["none_p90_us"], r["mask_p50_us"], r["mask_p90_us"],
            100 * (r["mask_p50_us"] / base - 1), r["mask_2000_p50_us"], r["mask_2000_p90_us"],
            100 * (r["mask_2000_p50_us"] / base - 1)))
    title = ("GPU-plane session step with processors (%s, V = %d fp32, top-k 50 top-p 0.9 T 0.8, "
             "%d steps, stream time)\n\n" % (torch.cuda.get_device_name(device), VOCAB, steps))
    table = "\n".join(lines) + "\n"
    print(title + table, flush=True)
    if args.results:
        with open(os.path.join(args.results, "processors_bench.md"), "w") as out:
            out.write(title + table)
        with open(os.path.join(args.results, "processors_bench.json"), "w") as out:
            json.dump(rows, out, indent=1)
    check(rows and all_ok, "processors_bench: every benchmarked row had status OK",
          "%d batch sizes" % len(rows))
