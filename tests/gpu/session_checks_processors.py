"""Device sessions with logits processors (device_session_cuda.py's `processors` check): a
session opened with a token bitmask and a processors buffer, every token and row status against
the same server's unary Sample with the same processors, eager and in a CUDA graph; a bad
processor row mid-batch (checked on the device on the GPU plane) gets status 4 and leaves its
neighbours equal to unary; rows with nothing allowed get status 5."""

import numpy as np
import torch

from session_common import MAX_BATCH, VOCAB, Params, Tally, check, exact_for, make_logits

WORDS = (VOCAB + 31) // 32
CAPACITIES = {"logit_bias": MAX_BATCH * 16, "token_history": MAX_BATCH * 256}


class Processors:
    """One step's processors: a random bitmask (row 0 allows one token, row 1 none when B >= 3),
    logit bias with +-inf, penalties and token histories, for the session and for unary."""

    def __init__(self, rng, batch, device):
        density = float(rng.choice([0.01, 0.1, 0.5, 0.9]))
        allowed = rng.random((batch, VOCAB)) < density
        allowed[0] = False
        self.only = int(rng.integers(VOCAB))
        allowed[0, self.only] = True
        if batch >= 3:
            allowed[1] = False
        self.allowed = allowed
        packed = np.zeros((batch, WORDS * 4), np.uint8)
        packed[:, :(VOCAB + 7) // 8] = np.packbits(allowed, axis=1, bitorder="little")
        self.words = packed.view("<i4")
        self.mask = torch.from_numpy(self.words.copy()).to(device)
        self.lists = dict(
            logit_bias=[{int(t): float(rng.choice([-np.inf, np.inf, rng.normal() * 3]))
                         for t in rng.choice(VOCAB, int(rng.integers(0, 8)), replace=False)}
                        for _ in range(batch)],
            repetition_penalty=rng.uniform(0.5, 2.0, batch).astype(np.float32),
            presence_penalty=rng.uniform(-1.5, 1.5, batch).astype(np.float32),
            frequency_penalty=rng.uniform(-1.5, 1.5, batch).astype(np.float32),
            prompt_token_ids=[rng.integers(0, VOCAB, int(rng.integers(0, 120))).tolist()
                              for _ in range(batch)],
            output_token_ids=[rng.integers(0, VOCAB, int(rng.integers(0, 120))).tolist()
                              for _ in range(batch)],
        )

    def unary_kwargs(self):
        return dict(token_bitmask=self.mask, **self.lists)


def _allowed_ok(proc, tokens, status):
    """Rows sampled OK picked an allowed token; row 0 its only one; row 1 (B >= 3) status 5."""
    ok = status == 1
    rows = np.flatnonzero(ok)
    good = bool(np.all(proc.allowed[rows, tokens[rows]]))
    if status[0] == 1:
        good = good and tokens[0] == proc.only
    if len(status) >= 3:
        good = good and status[1] == 5 and tokens[1] == -1
    return good


def check_processors(client, args, plane, device):
    """Eager steps with the processors as Python values, then one CUDA graph per B holding the
    bitmask and the packed processors as fixed CUDA tensors, then bad rows."""
    rng = np.random.default_rng(600 + len(plane))
    gen = torch.Generator(device=device).manual_seed(600)
    tally = Tally(exact_for(plane))
    masks_ok = True
    statuses = set()
    steps = 30 if args.quick else 120
    with client.device_session(max_batch=MAX_BATCH, vocab=VOCAB, dtype="float32", plane=plane,
                               device=device, token_bitmask=True, processors=CAPACITIES) as s:
        check(s.plane == plane, "processors %s: the session's plane" % plane, s.plane)
        for step in range(steps):
            batch = int(rng.integers(1, MAX_BATCH + 1))
            p = Params(rng, batch)
            proc = Processors(rng, batch, device)
            logits = make_logits(gen, batch, torch.float32, rng, device)
            tokens, status = s.sample(logits, **p.session_kwargs(step % 2 == 1, device),
                                      **proc.unary_kwargs())
            tokens, status = tokens[:batch].cpu().numpy(), status[:batch].cpu().numpy()
            want = client.sample(logits, **p.unary_kwargs(), **proc.unary_kwargs())
            tally.add(step, tokens, status, want.tokens, want.row_status, p.greedy, " (eager)")
            masks_ok = masks_ok and _allowed_ok(proc, tokens, status)
            statuses.update(status.tolist())

        for batch in (1, 17, MAX_BATCH):
            logits = torch.empty(batch, VOCAB, device=device)
            mask = torch.full((batch, WORDS), -1, dtype=torch.int32, device=device)
            procs = torch.from_numpy(s.pack_processors(batch)).to(device)
            p0 = Params(rng, batch)
            static = {k: v for k, v in p0.session_kwargs(True, device).items()
                      if isinstance(v, torch.Tensor)}
            out = (torch.empty(batch, dtype=torch.int32, device=device),
                   torch.empty(batch, dtype=torch.int32, device=device))

            def step():
                tokens, status = s.sample(logits, top_p_mode="top_k_first", token_bitmask=mask,
                                          processors=procs, **static)
                out[0].copy_(tokens[:batch])
                out[1].copy_(status[:batch])

            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                step()  # warm-up outside the capture
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            for replay in range(8 if args.quick else 30):
                p = Params(rng, batch)
                p.joint = False
                proc = Processors(rng, batch, device)
                logits.copy_(make_logits(gen, batch, torch.float32, rng, device))
                mask.copy_(proc.mask)
                procs.copy_(torch.from_numpy(s.pack_processors(batch, **proc.lists)))
                for key, value in p.session_kwargs(True, device).items():
                    if key in static:
                        static[key].copy_(value)
                graph.replay()
                tokens, status = out[0].cpu().numpy(), out[1].cpu().numpy()
                want = client.sample(logits, **p.unary_kwargs(), **proc.unary_kwargs())
                tally.add(replay, tokens, status, want.tokens, want.row_status, p.greedy,
                          " (graph B=%d)" % batch)
                masks_ok = masks_ok and _allowed_ok(proc, tokens, status)
                statuses.update(status.tolist())
            del graph

        bad_rows_ok, bad_detail = _check_bad_rows(client, s, rng, gen, plane, device, tally)
    check(masks_ok and 5 in statuses and 1 in statuses,
          "processors %s: sampled tokens allowed by the mask, status 5 for empty masks" % plane,
          "statuses seen %s" % sorted(statuses))
    check(bad_rows_ok, "processors %s: a bad processor row gets status 4, token -1" % plane,
          bad_detail)
    tally.report("processors %s: tokens and statuses equal to unary (eager, graph, neighbours "
                 "of bad rows)" % plane)


def _check_bad_rows(client, s, rng, gen, plane, device, tally):
    """Each rule broken in one row of a packed buffer passed as a CUDA tensor (so the device,
    or the host plane, checks it): that row gets status 4 and token -1, the others equal unary
    with the unbroken processors."""
    from samplerd import _session_layout as lay

    batch = 6
    m, nb, nh = MAX_BATCH, CAPACITIES["logit_bias"], CAPACITIES["token_history"]
    at = lay.processors_offsets(m, nb, nh)
    lists = dict(logit_bias=[{7: 2.0, 11: -1.0}] * batch, repetition_penalty=1.4,
                 presence_penalty=0.3, frequency_penalty=0.2,
                 prompt_token_ids=[[1, 2, 3]] * batch, output_token_ids=[[3, 4, 4]] * batch)
    packed = s.pack_processors(batch, **lists)

    def put(name, dtype, count, index, value):
        def apply(b):
            b[at[name]:at[name] + count * np.dtype(dtype).itemsize].view(dtype)[index] = value
        return apply

    # Row r: bias entries [2r, 2r + 2), history [4r, 4r + 4); offsets broken at the last row.
    last = batch - 1
    breaks = (
        ("repetition 0", 2, put("repetition", "<f4", m, 2, 0.0)),
        ("presence NaN", 2, put("presence", "<f4", m, 2, np.nan)),
        ("frequency 2.5", 2, put("frequency", "<f4", m, 2, 2.5)),
        ("bias token V", 2, put("bias_tokens", "<i4", nb, 5, VOCAB)),
        ("bias unsorted", 2, put("bias_tokens", "<i4", nb, 5, 1)),
        ("bias NaN", 2, put("biases", "<f4", nb, 4, np.nan)),
        ("bias offsets decreasing", last, put("bias_offsets", "<u4", m + 1, batch, 2 * last - 1)),
        ("history past capacity", last, put("history_offsets", "<u4", m + 1, batch, nh + 1)),
        ("history token -1", 2, put("history_tokens", "<i4", nh, 8, -1)),
        ("in_prompt 2", 2, lambda b: b.__setitem__(at["in_prompt"] + 9, 2)),
    )
    problems = []
    for i, (name, row, apply) in enumerate(breaks):
        p = Params(rng, batch)
        logits = make_logits(gen, batch, torch.float32, rng, device)
        bad = packed.copy()
        apply(bad)
        tokens, status = s.sample(logits, **p.session_kwargs(True, device),
                                  processors=torch.from_numpy(bad).to(device))
        tokens, status = tokens[:batch].cpu().numpy(), status[:batch].cpu().numpy()
        if status[row] != 4 or tokens[row] != -1:
            problems.append("%s (row %d): status %d, token %d" % (name, row, status[row],
                                                                 tokens[row]))
        want = client.sample(logits, **p.unary_kwargs(), **lists)
        keep = [r for r in range(batch) if r != row]
        tally.add(i, tokens[keep], status[keep], want.tokens[keep], want.row_status[keep],
                  p.greedy[keep], " (neighbour of a bad processor row: %s)" % name)
    return not problems, "; ".join(problems) or "%d rules" % len(breaks)
