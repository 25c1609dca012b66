#!/usr/bin/env python3
"""GPU IPC from a PyTorch producer: samplerd samples logits that live in this process's CUDA tensors.

Run by tests/gpu/run_on_gpu.sh on the GPU machine, against a samplerd on the GPU backend and one
on the CPU backend (unix sockets), with the Python stubs that tests/gpu/prepare_carry.sh
generates into the carried folder (py/samplerd/v1/). For fp32 and bf16:

  1. a [B, V] logits tensor at a storage offset inside a larger tensor, itself inside a caching-
     allocator segment: the region is registered with the storage's shareable handle (PyTorch's
     66-byte form) and the storage's offset in the segment, the request names the tensor's byte
     offset in the storage; the tokens must equal the CPU server's on the same logits inline
     (and the GPU server's inline answer);
  2. the same with an IPC ready event: the real logits are written on a side stream behind
     torch.cuda._sleep after the request is sent (a decoy is there before); the server's stream
     must wait for the event;
  3. an output region (a CUDA int32 tensor) with a done event: the reply carries no tokens, a
     fresh stream waits on the done event and reads the tokens from the tensor.

Also: a handle in the expandable-segments form is refused with FAILED_PRECONDITION (a child
process with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True). Prints one line per check; exits
1 on any mismatch, 2 on a setup error.

  python3 ipc_producer.py --gpu unix:///tmp/samplerd-gpu/s.sock --cpu unix:///tmp/samplerd-gpu/cpu.sock
"""
import argparse
import os
import subprocess
import sys
import time

# A handle of the expandable-segments allocator is not a cudaIpcMemHandle; the parent process
# must use the plain caching allocator whatever the environment says.
if "--expandable-child" not in sys.argv:
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:False"

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20
FAILURES = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        FAILURES.append(what)
    return ok


def load_stubs(folder):
    sys.path.insert(0, folder)
    import grpc  # noqa: F401
    from samplerd._pb import pb, pb_grpc  # one namespace over the API's .proto files
    return pb, pb_grpc


class Servers:
    def __init__(self, gpu_target, cpu_target, pb, pbg):
        import grpc
        options = [("grpc.max_send_message_length", 256 * MiB),
                   ("grpc.max_receive_message_length", 256 * MiB)]
        self.grpc = grpc
        self.pb = pb
        self.gpu = pbg.SamplerServiceStub(grpc.insecure_channel(gpu_target, options=options))
        self.cpu = (pbg.SamplerServiceStub(grpc.insecure_channel(cpu_target, options=options))
                    if cpu_target else None)

    def call(self, stub, method, request, timeout=300):
        """Returns (response, None) or (None, (code name, message))."""
        try:
            return getattr(stub, method)(request, timeout=timeout), None
        except self.grpc.RpcError as e:
            return None, (e.code().name, e.details())


# --- PyTorch side -------------------------------------------------------------------------------

def torch_device_for(info_device):
    """The torch CUDA index of the server's device, matched by UUID (else by PCI bus id)."""
    want_uuid = info_device.uuid.lower().removeprefix("gpu-")
    want_bus = info_device.pci_bus_id.lower()
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        uuid = str(getattr(p, "uuid", "")).lower().removeprefix("gpu-")
        if uuid and uuid == want_uuid:
            return i
        if hasattr(p, "pci_bus_id") and hasattr(p, "pci_device_id"):
            bus = "%04x:%02x:%02x.0" % (getattr(p, "pci_domain_id", 0), p.pci_bus_id, p.pci_device_id)
            if bus == want_bus:
                return i
    if torch.cuda.device_count() == 1:
        print("note: matched the only CUDA device without a UUID or bus id to compare")
        return 0
    return None


class Shared:
    """One storage's `_share_cuda_()` fields; release() gives torch's ref counter back."""

    def __init__(self, tensor):
        storage = tensor.untyped_storage()
        fields = storage._share_cuda_()
        if len(fields) != 8:
            raise RuntimeError("expected 8 fields from _share_cuda_(), got %d" % len(fields))
        self.handle = bytes(fields[1])          # version byte, 'c' (or 'e'), 64-byte handle
        self.storage_bytes = int(fields[2])
        self.offset_in_segment = int(fields[3])
        self._ref = (fields[4], int(fields[5]))
        self._released = False

    def release(self):
        """Decrements the counter _share_cuda_ incremented (what a consumer would do), so that
        torch may reuse the block and does not warn at exit. Call after the server let go."""
        if self._released:
            return
        self._released = True
        handle, offset = self._ref
        release = getattr(torch.UntypedStorage, "_release_ipc_counter_cuda", None)
        if release is not None:
            release(handle, offset)
        else:  # older spelling
            torch.UntypedStorage._release_ipc_counter(handle, offset, device="cuda")


def host_bytes(t):
    return t.contiguous().view(torch.uint8).numpy().tobytes()


# --- requests -----------------------------------------------------------------------------------

def row_params(pb, batch):
    settings = [dict(temperature=0.0), dict(temperature=0.8), dict(temperature=1.0, top_k=50),
                dict(temperature=1.0, top_p=0.9), dict(temperature=1.0, top_k=50, top_p=0.9),
                dict(temperature=1.0, min_p=0.1)]
    return [pb.SamplingParams(seed=4242 + 7919 * r, position=3 * r + 1, **settings[r % len(settings)])
            for r in range(batch)]


def request(pb, dtype, batch, vocab, inline=None, region=None, offset=0):
    t = pb.Tensor(dtype=dtype, shape=[batch, vocab])
    if inline is not None:
        t.inline_data = inline
    else:
        t.region.region = region
        t.region.offset = offset
    return pb.SampleRequest(logits=t, params=row_params(pb, batch))


# --- the checks ---------------------------------------------------------------------------------

def run_dtype(s, pb, info_device, dev, name, torch_dtype, pb_dtype, batch, vocab, seed, cleanup):
    elem = torch.tensor([], dtype=torch_dtype).element_size()
    gen = torch.Generator().manual_seed(seed)
    real_host = (torch.randn(batch, vocab, generator=gen) * 3).to(torch_dtype)
    decoy_host = torch.full((batch, vocab), -50.0).to(torch_dtype)
    decoy_host[:, 17] = 50.0
    real_bytes = host_bytes(real_host)

    # A used-then-freed 96 MiB block, so that the caching allocator splits it: the logits' storage
    # then starts inside a segment (field 3 != 0, usually 8 MiB), and the tensor at an element
    # offset inside its storage.
    del_me = torch.empty(96 * MiB, dtype=torch.uint8, device=dev)
    del del_me
    spacer = torch.empty(8 * MiB, dtype=torch.uint8, device=dev)
    pad = 1000
    big = torch.full((pad + batch * vocab + 4096,), 1000.0, dtype=torch_dtype, device=dev)
    logits = big[pad:pad + batch * vocab].view(batch, vocab)
    logits.copy_(real_host.to(dev))
    torch.cuda.synchronize(dev)
    shared = Shared(logits)
    cleanup.append(shared)
    print("%s: handle %d bytes (form %r), storage %d bytes at %d in its segment, tensor at element %d"
          % (name, len(shared.handle), shared.handle[1:2], shared.storage_bytes,
             shared.offset_in_segment, logits.storage_offset()))
    if not check(len(shared.handle) == 66 and shared.handle[1:2] == b"c",
                 "%s: _share_cuda_ gives the 66-byte 'c' form" % name):
        return
    region = "py-%d-%s" % (os.getpid(), name)
    slice_offset = logits.storage_offset() * elem
    reg = pb.RegisterRegionRequest(name=region, gpu_ipc=pb.GpuIpcRegion(
        memory_handle=shared.handle, offset=shared.offset_in_segment,
        byte_size=shared.storage_bytes, device=info_device.pci_bus_id))
    resp, err = s.call(s.gpu, "RegisterRegion", reg)
    if not check(err is None, "%s: RegisterRegion %s" % (name, err or "")):
        return
    cleanup.append(("unregister", region))

    cpu, err = s.call(s.cpu, "Sample", request(pb, pb_dtype, batch, vocab, inline=real_bytes))
    if not check(err is None, "%s: CPU server inline %s" % (name, err or "")):
        return
    cpu_tokens = list(cpu.token_ids)
    gpu_inline, err = s.call(s.gpu, "Sample", request(pb, pb_dtype, batch, vocab, inline=real_bytes))
    check(err is None and list(gpu_inline.token_ids) == cpu_tokens,
          "%s: GPU server inline == CPU %s" % (name, err or ""))

    # 1. From the region, producer synchronized before sending.
    got, err = s.call(s.gpu, "Sample", request(pb, pb_dtype, batch, vocab, region=region,
                                               offset=slice_offset))
    check(err is None and list(got.token_ids) == cpu_tokens,
          "%s: region tokens == CPU inline tokens %s" % (name, err or (list(got.token_ids), cpu_tokens)))

    # 2. With a ready event: decoy in place, real logits written behind a ~50 ms GPU sleep.
    logits.copy_(decoy_host.to(dev))
    real_dev = real_host.to(dev)
    torch.cuda.synchronize(dev)
    side = torch.cuda.Stream(dev)
    ready = torch.cuda.Event(interprocess=True)
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)
        logits.copy_(real_dev)
        ready.record(side)
    req = request(pb, pb_dtype, batch, vocab, region=region, offset=slice_offset)
    req.ready_event = bytes(ready.ipc_handle())
    t0 = time.perf_counter()
    got, err = s.call(s.gpu, "Sample", req)
    ms = (time.perf_counter() - t0) * 1e3
    check(err is None and list(got.token_ids) == cpu_tokens,
          "%s: ready event orders the read (reply after %.1f ms) %s"
          % (name, ms, err or (list(got.token_ids), cpu_tokens)))
    torch.cuda.synchronize(dev)

    # 3. Output region + done event (and a ready event behind a sleep, so the kernels are late).
    out_all = torch.full((64,), -7, dtype=torch.int32, device=dev)
    out = out_all[16:16 + batch]
    torch.cuda.synchronize(dev)
    out_shared = Shared(out)
    cleanup.append(out_shared)
    out_region = region + "-out"
    reg = pb.RegisterRegionRequest(name=out_region, gpu_ipc=pb.GpuIpcRegion(
        memory_handle=out_shared.handle, offset=out_shared.offset_in_segment,
        byte_size=out_shared.storage_bytes, device=info_device.pci_bus_id))
    resp, err = s.call(s.gpu, "RegisterRegion", reg)
    if not check(err is None, "%s: RegisterRegion (output) %s" % (name, err or "")):
        return
    cleanup.append(("unregister", out_region))
    logits.copy_(decoy_host.to(dev))
    torch.cuda.synchronize(dev)
    ready2 = torch.cuda.Event(interprocess=True)
    done = torch.cuda.Event(interprocess=True)
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)
        logits.copy_(real_dev)
        ready2.record(side)
    req = request(pb, pb_dtype, batch, vocab, region=region, offset=slice_offset)
    req.ready_event = bytes(ready2.ipc_handle())
    req.output.region = out_region
    req.output.offset = out.storage_offset() * 4
    req.done_event = bytes(done.ipc_handle())
    t0 = time.perf_counter()
    got, err = s.call(s.gpu, "Sample", req)
    ms = (time.perf_counter() - t0) * 1e3
    if check(err is None, "%s: output + done event accepted (reply after %.2f ms) %s" % (name, ms, err or "")):
        check(len(got.token_ids) == 0, "%s: the done-event reply carries no tokens" % name)
        reader = torch.cuda.Stream(dev)  # never delayed: only the done event orders its read
        reader.wait_event(done)
        with torch.cuda.stream(reader):
            tokens = out.to("cpu").tolist()
        check(tokens == cpu_tokens, "%s: output tensor after the done event == CPU tokens %s"
              % (name, (tokens, cpu_tokens)))
    torch.cuda.synchronize(dev)
    del spacer


def expandable_child(args, pb, pbg):
    """In a process with expandable segments: share a tensor, register it, report the code."""
    s = Servers(args.gpu, None, pb, pbg)
    info, err = s.call(s.gpu, "GetServerInfo", pb.GetServerInfoRequest())
    if err is not None:
        print("GetServerInfo: %s" % (err,))
        return 2
    dev = torch.device("cuda", torch_device_for(info.devices[0]) or 0)
    t = torch.ones(4 * MiB, dtype=torch.float32, device=dev)
    torch.cuda.synchronize(dev)
    try:
        shared = Shared(t)
    except Exception as e:  # noqa: BLE001 - any failure means: nothing to test here
        print("_share_cuda_ with expandable segments failed: %s" % e)
        return 3
    print("expandable segments: handle %d bytes, form %r" % (len(shared.handle), shared.handle[1:2]))
    if shared.handle[1:2] != b"e":
        return 3
    reg = pb.RegisterRegionRequest(name="py-%d-expandable" % os.getpid(), gpu_ipc=pb.GpuIpcRegion(
        memory_handle=shared.handle, offset=shared.offset_in_segment,
        byte_size=shared.storage_bytes, device=info.devices[0].pci_bus_id))
    resp, err = s.call(s.gpu, "RegisterRegion", reg)
    shared.release()
    print("RegisterRegion with the 'e' form: %s" % (err,))
    return 0 if err is not None and err[0] == "FAILED_PRECONDITION" else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", required=True, help="target of the samplerd --backend=gpu server")
    ap.add_argument("--cpu", help="target of the samplerd --backend=cpu server")
    ap.add_argument("--stubs", default=os.path.join(HERE, "py"),
                    help="folder holding samplerd/v1/sampler_pb2*.py (default: ./py)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--expandable-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    pb, pbg = load_stubs(args.stubs)
    if args.expandable_child:
        return expandable_child(args, pb, pbg)
    if not args.cpu:
        ap.error("--cpu is required")
    if not torch.cuda.is_available():
        print("no CUDA device visible to PyTorch")
        return 2

    s = Servers(args.gpu, args.cpu, pb, pbg)
    info, err = s.call(s.gpu, "GetServerInfo", pb.GetServerInfoRequest())
    if err is not None or info.backend != pb.BACKEND_GPU or not info.devices:
        print("the GPU server is not a GPU server: %s %s" % (err, info))
        return 2
    d = info.devices[0]
    print("server device: %s %s %s ipc_memory=%s ipc_events=%s"
          % (d.pci_bus_id, d.uuid, d.name, d.ipc_memory, d.ipc_events))
    check(d.ipc_memory and d.ipc_events, "GetServerInfo reports IPC memory and events")
    index = torch_device_for(d)
    if index is None:
        print("no CUDA device of this process matches the server's")
        return 2
    dev = torch.device("cuda", index)
    torch.cuda.set_device(dev)
    print("producer pid %d, torch %s, cuda:%d" % (os.getpid(), torch.__version__, index))

    cleanup = []
    try:
        for name, tdt, pdt, seed in (("fp32", torch.float32, pb.DTYPE_FP32, 5),
                                     ("bf16", torch.bfloat16, pb.DTYPE_BF16, 6)):
            run_dtype(s, pb, d, dev, name, tdt, pdt, args.batch, args.vocab, seed, cleanup)
    finally:
        torch.cuda.synchronize(dev)
        for item in cleanup:
            if isinstance(item, tuple):
                _, err = s.call(s.gpu, "UnregisterRegion", pb.UnregisterRegionRequest(name=item[1]))
                check(err is None, "UnregisterRegion %s %s" % (item[1], err or ""))
        listed, err = s.call(s.gpu, "ListRegions", pb.ListRegionsRequest())
        mine = [r.name for r in listed.regions if r.name.startswith("py-%d-" % os.getpid())] if listed else []
        check(err is None and not mine, "no region of this producer left registered %s" % (mine,))
        for item in cleanup:
            if isinstance(item, Shared):
                item.release()

    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    child = subprocess.run([sys.executable, os.path.abspath(__file__), "--gpu", args.gpu,
                            "--stubs", args.stubs, "--expandable-child"],
                           env=env, capture_output=True, text=True, timeout=120)
    sys.stdout.write("".join("    | " + line + "\n" for line in (child.stdout + child.stderr).splitlines()))
    if child.returncode == 3:
        print("note: this PyTorch gives no 'e'-form handle with expandable segments: not checked")
    else:
        check(child.returncode == 0, "an expandable-segments handle is FAILED_PRECONDITION")

    if FAILURES:
        print("%d check(s) failed" % len(FAILURES))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
