"""One client process of the soak (tests/soak/soak.py starts several): SampleStream load over
grpc.aio on the repo's generated stubs, with every reply checked.

    soak_client.py --target unix:///... --mode load|victim|drain|saturate|regions [options]

Modes:
  load      --streams K streams x --steps M steps, each stream keeping --window steps in flight.
  victim    as load, but prints "progress N" lines (as drain does) so that soak.py can SIGKILL it
            mid-stream.
  drain     as load until the server drains: after the first UNAVAILABLE step it sends no more
            and half-closes (with --hold it keeps the stream open, for the server to end); a
            stream ended by the server (UNAVAILABLE, CANCELLED) is a clear error for every step
            it leaves unanswered.
  saturate  as load with a large window and top-p sampling (slower steps; a reply is checked
            for B tokens in [0, V)), against a server with a small --max_inflight:
            RESOURCE_EXHAUSTED steps are expected, and the stream must stay open.
  regions   one stream whose steps read a host shm region; the region is unregistered while
            steps naming it are in flight (a cycle per region, until --stop_file exists).

Every step is greedy on logits whose argmax is known, so each reply is checked for its own step:
request_id (order), token ids (content), status. At the end one JSON line goes to stdout:
steps sent, replies, per-code counts, out-of-order and unknown replies, steps lost (a stream that
ended OK with steps unanswered), steps ended by a stream error, wrong tokens, latencies (µs).
"""

import argparse
import asyncio
import collections
import json
import mmap
import os
import sys
import time

import grpc

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))

from samplerd._pb import pb, pb_grpc  # noqa: E402

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]
RESOURCE_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
NOT_FOUND = grpc.StatusCode.NOT_FOUND.value[0]


def expected_token(stream: int, step: int, row: int, vocab: int) -> int:
    """The argmax the soak puts in row `row` of step `step` of stream `stream`."""
    return (stream * 7919 + step * 31 + row * 13) % vocab


class Logits:
    """B x V fp32 rows in [0, 1) from a fixed pattern, with one logit of 5.0 per row at
    expected_token: built by patching 4 bytes per row of one base buffer."""

    def __init__(self, batch: int, vocab: int) -> None:
        import numpy as np

        rng = np.random.default_rng(12345)
        self.batch, self.vocab = batch, vocab
        self.base = rng.random((batch, vocab), dtype=np.float32).tobytes()
        self.peak = np.float32(5.0).tobytes()

    def bytes_for(self, stream: int, step: int) -> bytes:
        data = bytearray(self.base)
        for r in range(self.batch):
            at = (r * self.vocab + expected_token(stream, step, r, self.vocab)) * 4
            data[at:at + 4] = self.peak
        return bytes(data)


class Stats:
    def __init__(self) -> None:
        self.sent = 0
        self.replies = 0
        self.codes = collections.Counter()  # step status code -> count
        self.stream_ends = collections.Counter()  # final stream status name -> count
        self.out_of_order = 0
        self.unknown = 0  # a reply naming no step in flight (duplicate or foreign)
        self.lost = 0  # steps unanswered on a stream that ended OK
        self.ended_by_stream_error = 0  # steps unanswered on a stream that ended non-OK
        self.wrong_token = 0
        self.busy_message_bad = 0  # RESOURCE_EXHAUSTED without the documented message
        self.ok_after_unregister = 0  # regions: a step sent after Unregister returned, answered OK
        self.unregisters = 0
        self.in_flight_at_unregister = 0  # regions: steps in flight when Unregister returned
        self.latencies_us = []

    def as_json(self) -> str:
        d = dict(vars(self))
        d["codes"] = {str(k): v for k, v in self.codes.items()}
        d["stream_ends"] = dict(self.stream_ends)
        return json.dumps(d)


class StreamRun:
    """One SampleStream: a writer keeps up to `window` steps in flight, the reader checks each
    reply against the oldest step in flight."""

    def __init__(self, stub, args, stats: Stats, stream_id: int, logits: Logits) -> None:
        self.stub, self.args, self.stats = stub, args, stats
        self.stream_id, self.logits = stream_id, logits
        self.pending = collections.OrderedDict()  # step -> (send time, sent after unregister)
        self.window = asyncio.Semaphore(args.window)
        self.stop = False
        # regions mode: set once the region is unregistered (later steps name a gone region)
        self.unregistered_at_step = None

    def request(self, step: int, region=None) -> "pb.SampleStreamRequest":
        b, v = self.logits.batch, self.logits.vocab
        tensor = pb.Tensor(dtype=pb.DTYPE_FP32, shape=[b, v])
        if region is None:
            tensor.inline_data = self.logits.bytes_for(self.stream_id, step)
        else:
            tensor.region.region, tensor.region.offset = region
        if self.args.mode == "saturate":  # top-p sorts: slower steps, so that steps queue up
            params = pb.SamplingParams(temperature=1.0, top_p=0.9, seed=step)
        else:
            params = pb.SamplingParams(temperature=0.0)
        return pb.SampleStreamRequest(request=pb.SampleRequest(
            request_id=f"{self.stream_id}-{step}", logits=tensor, params=[params]))

    async def send(self, call, step: int, region=None) -> None:
        await self.window.acquire()
        self.pending[step] = (time.perf_counter(), self.unregistered_at_step is not None)
        self.stats.sent += 1
        await call.write(self.request(step, region))

    async def writer(self, call) -> None:
        step = 0
        try:
            while not self.stop and (self.args.steps == 0 or step < self.args.steps):
                await self.send(call, step)
                step += 1
                if self.args.mode in ("victim", "drain") and step % 100 == 0:
                    print(f"progress {step}", flush=True)
            if self.args.hold:
                await asyncio.Event().wait()  # never half-close: the server ends the stream
            await call.done_writing()
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            pass  # the stream ended; the reader accounts for what was in flight

    def on_reply(self, msg) -> None:
        stats = self.stats
        stats.replies += 1
        code = msg.status.code
        stats.codes[code] += 1
        try:
            step = int(msg.response.request_id.rsplit("-", 1)[1])
        except (IndexError, ValueError):
            step = None
        if step is None or step not in self.pending:
            stats.unknown += 1
            return
        if step != next(iter(self.pending)):
            stats.out_of_order += 1
        sent_at, after_unregister = self.pending.pop(step)
        stats.latencies_us.append(int((time.perf_counter() - sent_at) * 1e6))
        self.window.release()
        if code == 0:
            if after_unregister:
                stats.ok_after_unregister += 1
            tokens = list(msg.response.token_ids)
            if self.args.mode == "saturate":  # sampled: any token of the vocabulary
                if len(tokens) != self.logits.batch or \
                        not all(0 <= t < self.logits.vocab for t in tokens):
                    stats.wrong_token += 1
            elif tokens != [expected_token(self.stream_id, step, r, self.logits.vocab)
                            for r in range(self.logits.batch)]:
                stats.wrong_token += 1
        elif code == RESOURCE_EXHAUSTED and "server busy" not in msg.status.message:
            stats.busy_message_bad += 1
        elif code == UNAVAILABLE and self.args.mode == "drain":
            self.stop = True

    async def reader(self, call) -> None:
        while True:
            msg = await call.read()
            if msg is grpc.aio.EOF:
                return
            self.on_reply(msg)

    def account_end(self, code: grpc.StatusCode) -> None:
        self.stats.stream_ends[code.name] += 1
        if code == grpc.StatusCode.OK:
            self.stats.lost += len(self.pending)
        else:
            self.stats.ended_by_stream_error += len(self.pending)
        self.pending.clear()

    async def run(self) -> None:
        call = self.stub.SampleStream()
        writer = asyncio.ensure_future(self.writer(call))
        try:
            await self.reader(call)
            code = await call.code()
        except grpc.aio.AioRpcError as e:
            code = e.code()
        self.stop = True
        for _ in range(self.args.window):
            self.window.release()  # unblock a writer waiting for room
        writer.cancel()
        self.account_end(code)


async def run_regions(stub, args, stats: Stats, logits: Logits) -> None:
    """Cycles: create a shm object holding `slots` steps, register it, send a burst of steps
    naming it, unregister while they are in flight, send more (now NOT_FOUND), drain, unlink."""
    slots, step_bytes = 32, logits.batch * logits.vocab * 4
    run = StreamRun(stub, args, stats, stream_id=1_000_000 + os.getpid() % 1000, logits=logits)
    call = stub.SampleStream()
    reader = asyncio.ensure_future(run.reader(call))
    deadline = time.monotonic() + args.seconds
    cycle, step = 0, 0
    try:
        while time.monotonic() < deadline and not (
                args.stop_file and os.path.exists(args.stop_file)) and not reader.done():
            name = f"soak-{os.getpid()}-{cycle}"
            path = f"/dev/shm/samplerd-{name}"
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            try:
                os.ftruncate(fd, slots * step_bytes)
                with mmap.mmap(fd, slots * step_bytes) as m:
                    for s in range(slots):
                        at = s * step_bytes
                        m[at:at + step_bytes] = logits.bytes_for(run.stream_id, step + s)
                await stub.RegisterRegion(pb.RegisterRegionRequest(
                    name=name, host_shm=pb.HostShmRegion(key="/samplerd-" + name,
                                                         byte_size=slots * step_bytes)))
                run.unregistered_at_step = None
                for s in range(slots):  # a burst: up to --window in flight
                    if s == slots // 2:
                        await stub.UnregisterRegion(pb.UnregisterRegionRequest(name=name))
                        stats.unregisters += 1
                        stats.in_flight_at_unregister += len(run.pending)
                        run.unregistered_at_step = step
                    await run.send(call, step, (name, s * step_bytes))
                    step += 1
                # The cycle's replies, before the object goes.
                while run.pending and not reader.done():
                    await asyncio.sleep(0.001)
            finally:
                os.close(fd)
                os.unlink(path)
            cycle += 1
    finally:
        await call.done_writing()
        await reader
        run.account_end(await call.code())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--mode", choices=["load", "victim", "drain", "saturate", "regions"],
                   default="load")
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--steps", type=int, default=1000, help="per stream; 0 = until stopped")
    p.add_argument("--window", type=int, default=2, help="steps in flight per stream")
    p.add_argument("--first_stream", type=int, default=0, help="id of this process's first stream")
    p.add_argument("--hold", action="store_true",
                   help="drain mode: keep the stream open (no half-close) after the last step")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--seconds", type=float, default=600,
                   help="regions mode: cycle at most this long")
    p.add_argument("--stop_file", help="regions mode: stop cycling once this file exists")
    args = p.parse_args()

    async def go() -> Stats:
        stats = Stats()
        logits = Logits(args.batch, args.vocab)
        async with grpc.aio.insecure_channel(args.target) as channel:
            stub = pb_grpc.SamplerServiceStub(channel)
            if args.mode == "regions":
                await run_regions(stub, args, stats, logits)
            else:
                runs = [StreamRun(stub, args, stats, args.first_stream + i, logits)
                        for i in range(args.streams)]
                await asyncio.gather(*(r.run() for r in runs))
        return stats

    print(asyncio.run(go()).as_json(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
