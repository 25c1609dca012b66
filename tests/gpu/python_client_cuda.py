#!/usr/bin/env python3
"""The Python client with CUDA tensors (GPU IPC), against a GPU server and a CPU server.

Every token is checked against the CPU server sampling the same logits inline. Checks: fp32 and
bf16 tensors, a non-contiguous tensor, regions cached per allocation across fresh tensors, the
ready event ordering the read (no synchronize by the caller), stream steps, PyTorch's IPC counter
given back after each call, "never" / "auto" / "always" against a CPU server, close() leaving no
region behind, a dead producer's regions unregistered by the next producer, the fallback under
expandable segments (in child processes), and a CUDA int32 token bitmask (with logit bias and
penalties) sent by GPU IPC.

    python3 python_client_cuda.py --gpu unix:///tmp/g.sock --cpu unix:///tmp/c.sock --py DIR

DIR holds the `samplerd` package with its generated stubs (prepare_carry.sh puts it in ./py).
"""

import argparse
import mmap
import os
import struct
import subprocess
import sys
import time
import warnings

import numpy as np
import torch

FAILURES = []
VOCAB = 151936
PARAMS = dict(temperature=0.9, top_k=50, top_p=0.9)


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        FAILURES.append(what)
    return ok


def seeds(batch):
    return [1000 + 17 * r for r in range(batch)]


def cpu_tokens(cpu, logits, **params):
    """What the CPU server samples from the same logits (inline; numpy or a host tensor)."""
    host = logits.detach().to("cpu")
    return cpu.sample(host, seed=seeds(host.shape[0]), **params).tokens.tolist()


def ipc_counter(tensor):
    """PyTorch's IPC reference count of the tensor's block, other than the one this call takes."""
    fields = tensor.untyped_storage()._share_cuda_()
    name, index = fields[4], int(fields[5])
    name = name.decode() if isinstance(name, bytes) else name
    with open("/dev/shm/" + name.lstrip("/"), "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        value = struct.unpack_from("<q", mm, 64 + 8 * index)[0]
        mm.close()
    release = getattr(torch.UntypedStorage, "_release_ipc_counter_cuda", None)
    release(fields[4], index)
    return value - 1


def server_regions(client):
    return [r.name for r in client.list_regions() if r.name.startswith("torch-%d-" % os.getpid())]


def run(args, samplerd):
    dev = torch.device("cuda", 0)
    gpu = samplerd.Client(args.gpu, timeout=60)
    cpu = samplerd.Client(args.cpu, timeout=60)
    gen = torch.Generator(device=dev).manual_seed(7)
    batch = args.batch

    # 1. fp32 and bf16 tensors, sent by GPU IPC (a region appears), tokens == CPU.
    for dtype in (torch.float32, torch.bfloat16):
        logits = (torch.randn(batch, VOCAB, device=dev, generator=gen) * 3).to(dtype)
        got = gpu.sample(logits, seed=seeds(batch), **PARAMS).tokens.tolist()
        check(got == cpu_tokens(cpu, logits, **PARAMS), "%s: GPU IPC tokens == CPU tokens" % dtype)
    check(len(gpu.cuda_regions) >= 1 and gpu.cuda_ipc_off_reason is None,
          "the CUDA tensors went by GPU IPC (%d regions, off reason %r)"
          % (len(gpu.cuda_regions), gpu.cuda_ipc_off_reason))

    # 2. A non-contiguous tensor (the last position of [B, T, V]).
    seq = torch.randn(batch, 3, VOCAB, device=dev, generator=gen) * 2
    last = seq[:, -1, :]
    got = gpu.sample(last, seed=seeds(batch), **PARAMS).tokens.tolist()
    check(not last.is_contiguous() and got == cpu_tokens(cpu, last, **PARAMS),
          "a non-contiguous tensor: tokens == CPU tokens")

    # 3. A decode loop that allocates its logits anew each step: the regions reach a steady state
    # (the caching allocator hands the same few blocks back), they do not grow with the steps.
    gpu.release_cuda_regions()

    def decode(steps):
        ok = True
        for step in range(steps):
            logits = torch.randn(batch, VOCAB, device=dev, generator=gen) * 3
            got = gpu.sample(logits, seed=seeds(batch), position=step, **PARAMS).tokens.tolist()
            if step % 6 == 0:
                ok &= got == cpu_tokens(cpu, logits, position=step, **PARAMS)
        return ok, logits

    ok, _ = decode(24)
    first = len(gpu.cuda_regions)
    ok2, logits = decode(48)
    second = len(gpu.cuda_regions)
    check(ok and ok2, "fresh tensors each step: tokens == CPU tokens")
    check(1 <= first <= 8 and first <= second <= 8,
          "72 fresh tensors of one shape: %d region(s) after 24 steps, %d after 48 more (bounded)"
          % (first, second))
    check(sorted(server_regions(gpu)) == sorted(gpu.cuda_regions),
          "the server lists exactly the client's regions")
    check(ipc_counter(logits) == 0, "PyTorch's IPC counter of the block is back to 0 after the call")

    # 4. The read is ordered after the engine's writes: decoy in place, real logits written
    # behind a GPU sleep on the current stream, and no synchronize before sample(); both ways.
    real = torch.randn(batch, VOCAB, device=dev, generator=gen) * 3
    want = cpu_tokens(cpu, real, **PARAMS)
    for mode in ("sync", "event"):
        with samplerd.Client(args.gpu, cuda_ready=mode, cuda_ipc="always") as c:
            target = torch.full((batch, VOCAB), -50.0, device=dev)
            target[:, 11] = 50.0
            torch.cuda.synchronize(dev)
            torch.cuda._sleep(50_000_000)
            target.copy_(real)
            got = c.sample(target, seed=seeds(batch), **PARAMS).tokens.tolist()
            check(got == want, "cuda_ready=%r orders the read (no synchronize by the caller)" % mode)

    # 4. (cont.) With the stream idle the event has completed: the request carries none. The
    # client records the event and queries it at once, and the record is itself enqueued, so on
    # an idle stream the query can still find it pending (once in session 31, H100): the idle
    # call gets three tries, one of which must go without an event.
    sent = []
    real_sample_request = gpu.sample_request
    gpu.sample_request = lambda request: sent.append(bytes(request.ready_event)) or \
        real_sample_request(request)
    idle = torch.randn(batch, VOCAB, device=dev, generator=gen)
    idle_got = []
    for _ in range(3):
        torch.cuda.synchronize(dev)
        idle_got.append(gpu.sample(idle, seed=seeds(batch), **PARAMS).tokens.tolist())
        if sent[-1] == b"":
            break
    idle_sent = list(sent)
    torch.cuda._sleep(50_000_000)  # now busy: the event is still pending when sent
    busy = gpu.sample(idle, seed=seeds(batch), **PARAMS).tokens.tolist()
    del gpu.sample_request
    want = cpu_tokens(cpu, idle, **PARAMS)
    check(all(g == want for g in idle_got) and busy == want and idle_sent[-1] == b"" and
          len(sent[-1]) == 64,
          "ready event sent only while the stream is busy (sizes %s), tokens == CPU"
          % [len(x) for x in sent])

    # 4a. The same storage again (a CUDA graph's static output): no new _share_cuda_(), and the
    # server reads the storage's new contents.
    shares = []
    real_shared = samplerd._cuda.SharedStorage

    def counting(*a, **k):
        shares.append(1)
        return real_shared(*a, **k)

    samplerd._cuda.SharedStorage = counting
    try:
        static = torch.randn(batch, VOCAB, device=dev, generator=gen)
        ok = True
        for step in range(4):
            static.copy_(torch.randn(batch, VOCAB, device=dev, generator=gen) * 3)
            got = gpu.sample(static, seed=seeds(batch), position=step, **PARAMS).tokens.tolist()
            ok &= got == cpu_tokens(cpu, static, position=step, **PARAMS)
        other = torch.randn(batch, VOCAB, device=dev, generator=gen)
        ok &= (gpu.sample(other, seed=seeds(batch), **PARAMS).tokens.tolist()
               == cpu_tokens(cpu, other, **PARAMS))
    finally:
        samplerd._cuda.SharedStorage = real_shared
    check(ok and len(shares) == 2,
          "one storage 4 times, then another: %d _share_cuda_() calls (expected 2), tokens == CPU"
          % len(shares))

    # 4b. Two clients of one process, both with CUDA tensors (region names must not collide).
    with samplerd.Client(args.gpu, cuda_ipc="always") as other:
        logits = torch.randn(batch, VOCAB, device=dev, generator=gen)
        got = other.sample(logits, seed=seeds(batch), **PARAMS).tokens.tolist()
        got2 = gpu.sample(logits, seed=seeds(batch), **PARAMS).tokens.tolist()
        want = cpu_tokens(cpu, logits, **PARAMS)
        check(got == want and got2 == want and not set(other.cuda_regions) & set(gpu.cuda_regions),
              "two clients in one process: distinct regions, tokens == CPU tokens")

    # 5. Stream steps with CUDA tensors.
    with gpu.stream() as s:
        ok = True
        for step in range(4):
            logits = torch.randn(batch, VOCAB, device=dev, generator=gen)
            got = s.step(logits, seed=seeds(batch), position=step, **PARAMS).tokens.tolist()
            ok &= got == cpu_tokens(cpu, logits, position=step, **PARAMS)
    check(ok, "stream steps with CUDA tensors: tokens == CPU tokens")

    # 6. cuda_ipc="never" copies; a CPU server makes "auto" fall back (one warning) and "always"
    # raise FAILED_PRECONDITION.
    logits = torch.randn(batch, VOCAB, device=dev, generator=gen)
    want = cpu_tokens(cpu, logits, **PARAMS)
    with samplerd.Client(args.gpu, cuda_ipc="never") as never:
        got = never.sample(logits, seed=seeds(batch), **PARAMS).tokens.tolist()
        check(got == want and not never.cuda_regions, "cuda_ipc='never': inline, same tokens")
    with samplerd.Client(args.cpu) as auto, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = auto.sample(logits, seed=seeds(batch), **PARAMS).tokens.tolist()
        got2 = auto.sample(logits, seed=seeds(batch), **PARAMS).tokens.tolist()
        check(got == want and got2 == want and len(caught) == 1
              and "CPU" in str(caught[0].message),
              "cuda_ipc='auto' with a CPU server: one warning (%s), same tokens"
              % [str(w.message) for w in caught])
    with samplerd.Client(args.cpu, cuda_ipc="always") as always:
        try:
            always.sample(logits, seed=seeds(batch), **PARAMS)
            check(False, "cuda_ipc='always' with a CPU server raises")
        except samplerd.SamplerError as e:
            check(e.code.name == "FAILED_PRECONDITION", "cuda_ipc='always' with a CPU server: %s" % e)

    # 7. close() unregisters everything.
    names = gpu.cuda_regions
    gpu.close()
    with samplerd.Client(args.gpu) as probe:
        left = [r.name for r in probe.list_regions() if r.name in names]
    check(names and not left, "close() unregistered the client's %d region(s) %s" % (len(names), left))
    cpu.close()


def check_processors(args, samplerd):
    """A grammar bitmask as a CUDA int32 tensor goes by GPU IPC (cuda_ipc="always": no copy),
    with a logit bias and penalties: tokens == the CPU server's with the same mask inline."""
    dev = torch.device("cuda", 0)
    gen = torch.Generator(device=dev).manual_seed(11)
    batch, words = args.batch, (VOCAB + 31) // 32
    rng = np.random.default_rng(11)
    host_mask = rng.integers(-2**31, 2**31, (batch, words), dtype=np.int64).astype(np.int32)
    host_mask[0] = 0
    host_mask[0, 5] = 1 << 3  # row 0 allows token 163 only
    mask = torch.from_numpy(host_mask).to(dev, non_blocking=True)
    extra = dict(logit_bias={7: -float("inf")}, repetition_penalty=1.3, frequency_penalty=0.5,
                 prompt_token_ids=[[1, 2, 3]] * batch, output_token_ids=[[4, 4, 9]] * batch)
    with samplerd.Client(args.gpu, timeout=60, cuda_ipc="always") as gpu, \
            samplerd.Client(args.cpu, timeout=60) as cpu:
        logits = torch.randn(batch, VOCAB, device=dev, generator=gen) * 3
        got = gpu.sample(logits, seed=seeds(batch), token_bitmask=mask, **extra, **PARAMS)
        want = cpu_tokens(cpu, logits, token_bitmask=host_mask, **extra, **PARAMS)
        check(got.tokens.tolist() == want and int(got.tokens[0]) == 163,
              "a CUDA bitmask by GPU IPC with bias and penalties: tokens == CPU tokens")
        check(len(gpu.cuda_regions) >= 2,
              "the logits and the bitmask are GPU IPC regions (%d)" % len(gpu.cuda_regions))


def check_lists_by_gpu_ipc(args, samplerd):
    """A logit-bias list and a token history packed into CUDA tensors (GPU IPC regions, read by
    the server after the request's ready event) give the tokens and processed logprobs of the
    same lists inline, and the lists change the result."""
    from samplerd._options import SampleOptions  # the request the inline options make
    from samplerd._pb import pb

    dev = torch.device("cuda", 0)
    gen = torch.Generator(device=dev).manual_seed(12)
    batch = args.batch
    # Row r's token 7r + 1 gets +30; no prompt or output token is one of them, so the repetition
    # penalty does not divide the boost (it would with token 1 in row 0's prompt).
    options = dict(seed=seeds(batch), top_p=0.9, logprobs=(3, "processed"),
                   repetition_penalty=1.4, frequency_penalty=0.3,
                   logit_bias=[{7 * r + 1: 30.0, 163: -float("inf")} for r in range(batch)],
                   prompt_token_ids=[[2, 3, 1000 + r] for r in range(batch)],
                   output_token_ids=[[2, 2, 9]] * batch)
    inline = SampleOptions(**options).request(pb.Tensor(shape=[batch, VOCAB]))
    with samplerd.Client(args.gpu, timeout=60, cuda_ipc="always") as gpu, \
            samplerd.Client(args.cpu, timeout=60) as cpu:
        logits = torch.randn(batch, VOCAB, device=dev, generator=gen) * 3
        want = gpu.sample(logits, **options)
        reference = cpu_tokens(cpu, logits, **{k: v for k, v in options.items() if k != "seed"})
        plain = gpu.sample(logits, seed=options["seed"], top_p=0.9)
        # The packed lists, written on the current stream before the logits' ready event.
        bias = torch.from_numpy(samplerd.packed_lists(inline.logit_bias)).to(dev)
        history = torch.from_numpy(samplerd.packed_lists(inline.token_history)).to(dev)
        bias_slice, _, bias_lease = gpu._cuda.share(bias)
        history_slice, _, history_lease = gpu._cuda.share(history)
        try:
            region_options = dict(options, logit_bias=pb.LogitBias(region=bias_slice),
                                  token_history=pb.TokenHistory(region=history_slice),
                                  prompt_token_ids=None, output_token_ids=None)
            got = gpu.sample(logits, **region_options)
        finally:
            bias_lease.release()
            history_lease.release()
    same_logprobs = all(g.top_token_ids.tolist() == w.top_token_ids.tolist()
                        for g, w in zip(got.logprobs, want.logprobs))
    check(got.tokens.tolist() == want.tokens.tolist() and same_logprobs,
          "a bias list and a token history in CUDA tensors (GPU IPC): tokens and top logprobs "
          "== the same lists inline (%d rows)" % batch)
    check(want.tokens.tolist() == reference,
          "the same lists inline: GPU tokens %s == CPU server tokens %s"
          % (want.tokens.tolist(), reference))
    check(got.tokens.tolist() == [7 * r + 1 for r in range(batch)]
          and plain.tokens.tolist() != got.tokens.tolist(),
          "the lists from GPU memory took effect (every row's +30 token won: %s; without the "
          "lists %s)" % (got.tokens.tolist(), plain.tokens.tolist()))


def leave_region_child(args, samplerd):
    """Registers a CUDA region, prints its names, and dies without closing the client."""
    client = samplerd.Client(args.gpu, cuda_ipc="always")
    logits = torch.randn(4, VOCAB, device=torch.device("cuda", 0))
    client.sample(logits, seed=seeds(4), **PARAMS)
    print(" ".join(client.cuda_regions), flush=True)
    os._exit(0)  # no atexit, no close: as a crash would


def fresh_client_child(args, samplerd):
    """A new producer process: its first registration reaps the dead producers' regions."""
    with samplerd.Client(args.gpu, cuda_ipc="always") as client:
        logits = torch.randn(4, VOCAB, device=torch.device("cuda", 0))
        client.sample(logits, seed=seeds(4), **PARAMS)
    return 0


def check_stale_regions_are_reaped(args, samplerd):
    def child(flag):
        return subprocess.run([sys.executable, os.path.abspath(__file__), "--gpu", args.gpu,
                               "--cpu", args.cpu, "--py", args.py, flag],
                              capture_output=True, text=True, timeout=120)

    left = child("--leave-region-child")
    names = left.stdout.split()
    with samplerd.Client(args.gpu) as probe:
        listed = [r.name for r in probe.list_regions()]
        if args.gpu.startswith("unix"):
            # Over a unix socket the server binds the regions to their producer's pid and
            # releases them when it exits (issue 12, item 5).
            deadline = time.monotonic() + 1.0
            while any(n in listed for n in names) and time.monotonic() < deadline:
                time.sleep(0.05)
                listed = [r.name for r in probe.list_regions()]
            check(left.returncode == 0 and names and not any(n in listed for n in names),
                  "a producer that died without closing: the server released its regions %s "
                  "within 1 s (left: %s)" % (names, [n for n in names if n in listed]))
        else:
            check(left.returncode == 0 and names and all(n in listed for n in names),
                  "a producer that died without closing left its regions %s registered (TCP: "
                  "unowned)" % names)
        fresh = child("--fresh-client-child")
        listed = [r.name for r in probe.list_regions()]
        check(fresh.returncode == 0 and not any(n in listed for n in names),
              "the next producer registers and samples; none of the dead one's regions are "
              "left (left: %s) %s" % ([n for n in names if n in listed], fresh.stderr[-500:]))


def expandable_child(args, samplerd):
    """Under expandable segments: "auto" falls back to inline with a warning saying why."""
    dev = torch.device("cuda", 0)
    logits = torch.randn(4, VOCAB, device=dev) * 3
    with samplerd.Client(args.gpu) as gpu, samplerd.Client(args.cpu) as cpu, \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = gpu.sample(logits, seed=seeds(4), **PARAMS).tokens.tolist()
        want = cpu_tokens(cpu, logits, **PARAMS)
        print("warnings: %s" % [str(w.message) for w in caught])
        if gpu.cuda_ipc_off_reason is None:
            print("this PyTorch shares CUDA IPC handles under expandable segments: nothing to check")
            return 3
        return 0 if got == want and "expandable" in gpu.cuda_ipc_off_reason else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", required=True)
    ap.add_argument("--cpu", required=True)
    ap.add_argument("--py", required=True, help="folder holding the samplerd package")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--expandable-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--leave-region-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--fresh-client-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, args.py)
    import samplerd

    if args.expandable_child:
        return expandable_child(args, samplerd)
    if args.leave_region_child:
        return leave_region_child(args, samplerd)
    if args.fresh_client_child:
        return fresh_client_child(args, samplerd)
    run(args, samplerd)
    try:
        check_processors(args, samplerd)
    except Exception as e:  # noqa: BLE001 - one failed check, the others still run
        check(False, "logits processors with a CUDA bitmask: %s: %s" % (type(e).__name__, e))
    try:
        check_lists_by_gpu_ipc(args, samplerd)
    except Exception as e:  # noqa: BLE001 - one failed check, the others still run
        check(False, "bias and history lists by GPU IPC: %s: %s" % (type(e).__name__, e))
    check_stale_regions_are_reaped(args, samplerd)
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    child = subprocess.run([sys.executable, os.path.abspath(__file__), "--gpu", args.gpu, "--cpu",
                            args.cpu, "--py", args.py, "--expandable-child"],
                           env=env, capture_output=True, text=True, timeout=120)
    sys.stdout.write("".join("    | %s\n" % line for line in (child.stdout + child.stderr).splitlines()))
    if child.returncode == 3:
        print("note: no fallback to check under expandable segments")
    else:
        check(child.returncode == 0, "expandable segments: 'auto' falls back inline, same tokens")
    if FAILURES:
        print("%d check(s) failed" % len(FAILURES))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    np.set_printoptions(threshold=20)
    sys.exit(main())
