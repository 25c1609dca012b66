#!/usr/bin/python3
"""How much memory a burst of large requests costs the server before admission.

Starts build/default/service/samplerd (CPU backend; --bin for another) on a private unix socket
(or 127.0.0.1:0 with --tcp), opens a "bystander" SampleStream as an engine would and sends it a
small step, then has --procs client processes send K requests whose inline logits fill
--max_message_bytes, from --channels connections, at one instant: unary Sample calls, or with
--stream one SampleStream call each carrying one step. Reports the server's idle and peak RSS
(VmHWM), how every call ended, and whether the bystander and a fresh Sample are answered
afterwards. Requests are serialized by hand and sent as raw bytes: no generated stubs needed.

    /usr/bin/python3 tests/bench/receive_burst.py --k 32 --channels 8 --procs 4 \
        --server-arg=--max_inflight=2 --server-arg=--max_receive_bytes=134217728

Debian 12: /usr/bin/python3 with python3-grpcio. Results: tests/bench/RECEIVE_BURST_RESULTS.md.
"""

import argparse
import collections
import json
import os
import queue
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time

import grpc

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SAMPLE = "/samplerd.v1.SamplerService/Sample"
STREAM = "/samplerd.v1.SamplerService/SampleStream"
INFO = "/samplerd.v1.SamplerService/GetServerInfo"


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field(number: int, wire_type: int, payload: bytes) -> bytes:
    key = varint(number << 3 | wire_type)
    if wire_type == 2:
        return key + varint(len(payload)) + payload
    return key + payload


def sample_request(batch: int, vocab: int, top_p: float = 0.0) -> bytes:
    """A serialized samplerd.v1.SampleRequest: fp32 logits [batch, vocab] inline (token 1 of
    every row largest), one SamplingParams: greedy, or temperature 1 with `top_p` (slower)."""
    row = bytearray(vocab * 4)
    struct.pack_into("<f", row, 4, 1.0)
    shape = varint(batch) + varint(vocab)
    tensor = field(1, 0, varint(1)) + field(2, 2, shape) + field(4, 2, bytes(row) * batch)
    if top_p:
        params = field(1, 5, struct.pack("<f", 1.0)) + field(3, 5, struct.pack("<f", top_p))
    else:
        params = field(1, 5, struct.pack("<f", 0.0))  # temperature 0: greedy
    return field(2, 2, tensor) + field(3, 2, params)


def status_of(pid: int) -> dict:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) // 1024  # MiB
    return out


def wait_ready(target: str, deadline: float) -> None:
    with grpc.insecure_channel(target) as channel:
        info = channel.unary_unary(INFO)
        while True:
            try:
                info(b"", timeout=2, wait_for_ready=True)
                return
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise


def run_client(args: argparse.Namespace, request: bytes) -> int:
    """--client: sends args.k requests at args.start_at over args.channels connections and prints
    [code, details, seconds] of each as JSON."""
    opts = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1),
            ("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.insecure_channel(args.client, options=opts) for _ in range(args.channels)]
    for channel in channels:
        grpc.channel_ready_future(channel).result(timeout=30)
    results = [None] * args.k

    step = field(1, 2, request)  # a SampleStreamRequest holding the request

    def call(i: int) -> None:
        channel = channels[i % len(channels)]
        time.sleep(max(0.0, args.start_at - time.time()))
        start = time.monotonic()
        try:
            if args.stream:  # one step on a stream of its own; its answer is a StepStatus or not
                reply = next(channel.stream_stream(STREAM)(iter([step]), timeout=args.timeout))
                if reply[:1] != b"\x0a":  # field 1, the response: anything else is a status
                    raise RuntimeError("step status " + reply.hex()[:40])
            else:
                channel.unary_unary(SAMPLE)(request, timeout=args.timeout)
            results[i] = ("OK", "", time.monotonic() - start)
        except grpc.RpcError as e:
            results[i] = (e.code().name, e.details(), time.monotonic() - start)
        except RuntimeError as e:
            results[i] = ("STEP_ERROR", str(e), time.monotonic() - start)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(args.k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(results))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", default=os.path.join(ROOT, "build/default/service/samplerd"))
    p.add_argument("--k", type=int, default=32, help="concurrent requests")
    p.add_argument("--channels", type=int, default=8, help="connections the requests share")
    p.add_argument("--max_message_bytes", type=int, default=64 << 20)
    p.add_argument("--batch", type=int, default=16, help="rows; V fills the message")
    p.add_argument("--tcp", action="store_true", help="listen on 127.0.0.1:0 instead of a socket")
    p.add_argument("--server-arg", action="append", default=[], help="extra server flag")
    p.add_argument("--timeout", type=float, default=120.0, help="each call's deadline, s")
    p.add_argument("--procs", type=int, default=4, help="client processes")
    p.add_argument("--top_p", type=float, default=0.0,
                   help="sample with temperature 1 and this top-p (slower) instead of greedily")
    p.add_argument("--stream", action="store_true",
                   help="send each request as the one step of a SampleStream call")
    p.add_argument("--client", help=argparse.SUPPRESS)  # a client process's target
    p.add_argument("--start_at", type=float, help=argparse.SUPPRESS)
    args = p.parse_args()

    # Logits bytes that, with the message's few header bytes, stay under the limit.
    vocab = (args.max_message_bytes - 4096) // 4 // args.batch
    request = sample_request(args.batch, vocab, args.top_p)
    if args.client:
        return run_client(args, request)
    small = sample_request(2, 8)
    tmp = tempfile.mkdtemp(prefix="samplerd-burst-")
    log = open(os.path.join(tmp, "server.log"), "w+")
    if args.tcp:
        listen, target = "127.0.0.1:0", None
    else:
        listen = target = f"unix://{tmp}/s.sock"
    server = subprocess.Popen(
        [args.bin, f"--listen={listen}", "--backend=cpu", "--threads=1",
         f"--max_message_bytes={args.max_message_bytes}", "--grace_period=1s"] + args.server_arg,
        stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while target is None:  # TCP: read the bound port from the log
            log.seek(0)
            for line in log:
                if "listening on " in line:
                    target = line.split("listening on ")[1].split()[0].rstrip(",")
            if target is None:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("server did not start:\n" + open(log.name).read())
                time.sleep(0.05)
        wait_ready(target, deadline)
        idle = status_of(server.pid)

        # A bystander: a SampleStream opened before the burst on its own connection, as an
        # engine's long-lived stream would be; it sends one small step before and one after.
        bystander_channel = grpc.insecure_channel(
            target, options=[("grpc.use_local_subchannel_pool", 1)])
        steps = queue.Queue()
        replies = bystander_channel.stream_stream(STREAM)(iter(steps.get, None))
        steps.put(field(1, 2, small))
        next(replies)

        # The clients: --procs processes (a Python process alone sends too slowly to fill the
        # server), each with its share of the channels and requests, released at one instant.
        start_at = time.time() + 3.0
        clients = []
        for p in range(args.procs):
            n = args.k // args.procs + (p < args.k % args.procs)
            c = max(1, args.channels // args.procs + (p < args.channels % args.procs))
            clients.append(subprocess.Popen(
                [sys.executable, __file__, "--client", target, f"--k={n}", f"--channels={c}",
                 f"--max_message_bytes={args.max_message_bytes}", f"--batch={args.batch}",
                 f"--timeout={args.timeout}", f"--start_at={start_at}", f"--top_p={args.top_p}"]
                + (["--stream"] if args.stream else []),
                stdout=subprocess.PIPE, text=True))
        timeline = []
        while time.time() < start_at:
            time.sleep(0.01)
        t0 = time.monotonic()
        while any(c.poll() is None for c in clients):
            timeline.append((round(time.monotonic() - t0, 2), status_of(server.pid)["VmRSS"]))
            time.sleep(0.05)
        burst_s = time.monotonic() - t0
        peak = status_of(server.pid)
        results = []
        for c in clients:
            results += json.loads(c.stdout.read())

        steps.put(field(1, 2, small))
        try:
            next(replies)
            bystander = "OK"
        except grpc.RpcError as e:
            bystander = f"{e.code().name}: {e.details()}"
        steps.put(None)
        bystander_channel.close()

        with grpc.insecure_channel(target) as channel:
            try:
                channel.unary_unary(SAMPLE)(small, timeout=10)
                after = "OK"
            except grpc.RpcError as e:
                after = f"{e.code().name}: {e.details()}"

        codes = collections.Counter(r[0] for r in results)
        details = collections.Counter(f"{r[0]}: {r[1]}" for r in results if r[0] != "OK")
        report = {
            "transport": "tcp" if args.tcp else "unix", "k": args.k, "channels": args.channels,
            "procs": args.procs, "method": "SampleStream" if args.stream else "Sample",
            "message_mib": round(len(request) / 2**20, 2), "server_args": args.server_arg,
            "idle_rss_mib": idle["VmRSS"], "peak_rss_mib": peak["VmHWM"],
            "peak_over_idle_mib": peak["VmHWM"] - idle["VmRSS"],
            "burst_s": round(burst_s, 2), "codes": dict(codes), "errors": dict(details),
            "max_call_s": round(max(r[2] for r in results), 2),
            "sample_after": after, "bystander_stream": bystander,
            "rss_timeline_mib": timeline[:: max(1, len(timeline) // 20)],
        }
        for key, value in report.items():  # one line each
            print(f"{key}: {json.dumps(value)}")
        return 0
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
