#!/usr/bin/env python3
"""Regions bound to their owner, on the GPU server: a producer process registers a GPU IPC region
(a CUDA tensor shared by PyTorch) and a host shm region, and is SIGKILLed.

Run by tests/gpu/run_on_gpu.sh (step ipc_owner, group ipc) on the GPU machine, against the
samplerd --backend=gpu it started, with the Python stubs of the carried py/ folder. Checks:

  1. ListRegions names the producer's pid as the owner of both regions, watched;
  2. after SIGKILL both regions are gone within 1 s;
  3. the server's descriptors (/proc/PID/fd) and its mappings of the shm object (/proc/PID/maps)
     are back to their baseline within 2 s, and the GPU's used memory (nvidia-smi: the server's
     own when listed, and the whole GPU's, which holds the dead producer's allocation while the
     server maps it) within --memory-wait seconds;
  4. the server still answers (GetServerInfo).

The baseline is taken after this process registered and unregistered a GPU IPC and a host shm
region of its own, so that what the server makes once (the owner watcher, the CUDA IPC state)
is there already. Exits 1 on a failed check, 2 on a setup error.

  python3 ipc_owner_kill.py --gpu unix:///tmp/samplerd-gpu/s.sock --server-pid PID --stubs py
"""
import argparse
import os
import signal
import subprocess
import sys
import time

import ipc_producer as ipc  # also pins the plain caching allocator (no expandable segments)
import torch
from session_common import gpu_memory_mib

MiB = 1 << 20
SHM_BYTES = 1 * MiB
GPU_BYTES = 256 * MiB  # large enough to see in nvidia-smi


def shm_key(tag):
    return "/samplerd-owner-gpu-%d-%s" % (os.getpid(), tag)


def make_shm(key, size):
    fd = os.open("/dev/shm" + key, os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, size)
    os.close(fd)


def fd_count(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def shm_mappings(pid, key):
    with open("/proc/%d/maps" % pid) as maps:
        return sum(1 for line in maps if ("/dev/shm" + key) in line)


def wait_for(done, timeout, period=0.005):
    """Seconds until done() held, or None after `timeout` seconds."""
    start = time.monotonic()
    while not done():
        if time.monotonic() - start > timeout:
            return None
        time.sleep(period)
    return time.monotonic() - start


def register(s, pb, name, shared=None, key=None, device=""):
    if shared is not None:
        req = pb.RegisterRegionRequest(name=name, gpu_ipc=pb.GpuIpcRegion(
            memory_handle=shared.handle, offset=shared.offset_in_segment,
            byte_size=shared.storage_bytes, device=device))
    else:
        req = pb.RegisterRegionRequest(name=name, host_shm=pb.HostShmRegion(
            key=key, offset=0, byte_size=SHM_BYTES))
    return s.call(s.gpu, "RegisterRegion", req)


def server_device(s, pb):
    info, err = s.call(s.gpu, "GetServerInfo", pb.GetServerInfoRequest())
    if err is not None or info.backend != pb.BACKEND_GPU or not info.devices:
        return None, None
    index = ipc.torch_device_for(info.devices[0])
    return info.devices[0], (torch.device("cuda", index) if index is not None else None)


def owner_child(args, pb, pbg):
    """The producer: registers one GPU IPC and one host shm region, says READY, then sleeps."""
    s = ipc.Servers(args.gpu, None, pb, pbg)
    d, dev = server_device(s, pb)
    if dev is None:
        print("SETUP no GPU server or no matching CUDA device", flush=True)
        return 2
    t = torch.ones(GPU_BYTES // 4, dtype=torch.float32, device=dev)
    torch.cuda.synchronize(dev)
    shared = ipc.Shared(t)
    for name, kwargs in (("gpu", dict(shared=shared, device=d.pci_bus_id)),
                         ("shm", dict(key=args.key))):
        _, err = register(s, pb, "owner-%d-%s" % (os.getpid(), name), **kwargs)
        if err is not None:
            print("SETUP RegisterRegion %s: %s" % (name, err), flush=True)
            return 2
    print("READY %d" % os.getpid(), flush=True)
    time.sleep(3600)  # until SIGKILLed; regions deliberately left registered
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", required=True, help="target of the samplerd --backend=gpu server")
    ap.add_argument("--server-pid", type=int, required=True, help="that server's pid")
    ap.add_argument("--stubs", default=os.path.join(ipc.HERE, "py"))
    ap.add_argument("--memory-wait", type=float, default=10.0)
    ap.add_argument("--memory-slack-mib", type=int, default=16)
    ap.add_argument("--owner-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--key", help=argparse.SUPPRESS)
    args = ap.parse_args()
    pb, pbg = ipc.load_stubs(args.stubs)
    if args.owner_child:
        return owner_child(args, pb, pbg)
    check = ipc.check
    s = ipc.Servers(args.gpu, None, pb, pbg)
    d, dev = server_device(s, pb)
    if dev is None:
        print("no GPU server at %s, or no CUDA device of this process matches it" % args.gpu)
        return 2
    torch.cuda.set_device(dev)
    spid = args.server_pid
    key = shm_key("child")
    make_shm(key, SHM_BYTES)
    warm_key = shm_key("warm")
    make_shm(warm_key, SHM_BYTES)
    child = None
    try:
        # Warm-up (see the docstring), then the baseline.
        warm = torch.ones(MiB, dtype=torch.float32, device=dev)
        torch.cuda.synchronize(dev)
        warm_shared = ipc.Shared(warm)
        for name, kwargs in (("gpu", dict(shared=warm_shared, device=d.pci_bus_id)),
                             ("shm", dict(key=warm_key))):
            region = "owner-warm-%d-%s" % (os.getpid(), name)
            info, err = register(s, pb, region, **kwargs)
            if not check(err is None, "warm-up: RegisterRegion %s %s" % (name, err or "")):
                return 1
            check(info.region.owner_pid == os.getpid() and info.region.owner_watched,
                  "warm-up: this process owns %s, watched (owner_pid %d, watched %s)"
                  % (region, info.region.owner_pid, info.region.owner_watched))
            _, err = s.call(s.gpu, "UnregisterRegion", pb.UnregisterRegionRequest(name=region))
            check(err is None, "warm-up: UnregisterRegion %s %s" % (name, err or ""))
        warm_shared.release()  # Unregister closed the server's mapping before it answered
        fds_before = fd_count(spid)
        pid_mib_before, total_mib_before = gpu_memory_mib(spid)
        print("baseline: server fds %d, server GPU %s MiB, whole GPU %s MiB"
              % (fds_before, pid_mib_before, total_mib_before), flush=True)

        child = subprocess.Popen([sys.executable, "-u", os.path.abspath(__file__), "--gpu",
                                  args.gpu, "--server-pid", str(spid), "--stubs", args.stubs,
                                  "--owner-child", "--key", key],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = ""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line or line.startswith(("READY", "SETUP")):
                break
            print("    child| " + line.rstrip(), flush=True)
        if not line.startswith("READY"):
            print("the producer did not get ready: %r" % line)
            return 2
        cpid = child.pid
        listed, err = s.call(s.gpu, "ListRegions", pb.ListRegionsRequest())
        owned = {r.name: r for r in listed.regions if r.owner_pid == cpid} if listed else {}
        check(sorted(owned) == ["owner-%d-gpu" % cpid, "owner-%d-shm" % cpid]
              and all(r.owner_watched for r in owned.values()),
              "ListRegions names the producer (pid %d) as the owner of its 2 regions, watched %s"
              % (cpid, sorted(owned)))
        with_child = (fd_count(spid), shm_mappings(spid, key), gpu_memory_mib(spid))
        print("with the producer: server fds %d, shm mappings %d, GPU (server, whole) %s MiB"
              % with_child, flush=True)

        os.kill(cpid, signal.SIGKILL)
        child.wait(timeout=30)

        def gone():
            listed, err = s.call(s.gpu, "ListRegions", pb.ListRegionsRequest())
            return err is None and not any(r.owner_pid == cpid for r in listed.regions)

        took = wait_for(gone, 1.0)
        check(took is not None, "the producer's regions are gone within 1 s of SIGKILL (%s s)"
              % ("%.3f" % took if took is not None else "> 1"))
        took = wait_for(lambda: shm_mappings(spid, key) == 0, 2.0)
        check(took is not None, "the server no longer maps the shm object (%s)"
              % ("%.3f s" % took if took is not None else "%d mappings" % shm_mappings(spid, key)))
        took = wait_for(lambda: fd_count(spid) == fds_before, 2.0)
        check(took is not None, "the server's descriptors are back to %d (now %d)"
              % (fds_before, fd_count(spid)))
        slack = args.memory_slack_mib

        def memory_back():
            pid_now, total_now = gpu_memory_mib(spid)
            ok = total_now is not None and total_now <= total_mib_before + slack
            return ok and (pid_mib_before is None or
                           (pid_now is not None and pid_now <= pid_mib_before + slack))

        took = wait_for(memory_back, args.memory_wait, period=0.25)
        check(took is not None, "GPU memory back to its baseline within %.0f s (%s -> %s MiB)"
              % (args.memory_wait, (pid_mib_before, total_mib_before), gpu_memory_mib(spid)))
        info, err = s.call(s.gpu, "GetServerInfo", pb.GetServerInfoRequest())
        check(err is None, "the server still answers %s" % (err or ""))
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
        for k in (key, warm_key):
            try:
                os.unlink("/dev/shm" + k)
            except FileNotFoundError:
                pass
    if ipc.FAILURES:
        print("%d check(s) failed" % len(ipc.FAILURES))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
