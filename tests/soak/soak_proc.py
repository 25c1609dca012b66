"""The soak's view of processes: the server's RSS, threads, fds and soak mappings from /proc, a
sampler thread that keeps their peak, the server process itself, and the client processes."""

import json
import os
import subprocess
import sys
import threading
import time

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))

from samplerd._pb import pb, pb_grpc  # noqa: E402

PYTHON = "/usr/bin/python3"  # Debian's, with python3-grpcio and python3-numpy
CLIENT = os.path.join(HERE, "soak_client.py")


# gRPC's own pools that grow on demand and keep their threads: the default executor (up to 2 per
# core) and the global timer threads. Every other thread must come back exactly.
ELASTIC_THREADS = ("default-executo", "grpc_global_tim")


def snapshot(pid: int) -> dict:
    """RSS (KiB), threads (all, and those of gRPC's elastic pools) and open fds of `pid`, and
    how many of its mappings are soak shm objects."""
    rss = threads = elastic = 0
    names = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/comm") as f:
                name = f.read().strip()
            names[name] = names.get(name, 0) + 1
            elastic += name in ELASTIC_THREADS
        except FileNotFoundError:
            pass  # the thread ended
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    with open(f"/proc/{pid}/maps") as f:
        soak_maps = sum("samplerd-soak-" in line for line in f)
    return {"rss_kib": rss, "threads": threads, "elastic_threads": elastic, "fds": fds,
            "soak_maps": soak_maps, "thread_names": names}


class PeakSampler:
    """Samples snapshot(pid) every `period` seconds on a thread; `peak` holds each maximum."""

    def __init__(self, pid: int, period: float = 0.1) -> None:
        self.pid, self.period = pid, period
        self.peak = {k: v for k, v in snapshot(pid).items() if isinstance(v, int)}
        self.samples = 0
        self.rss_series = []  # (seconds since start, RSS KiB) of every sample
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                s = snapshot(self.pid)
            except OSError:
                return  # the server exited
            self.samples += 1
            self.rss_series.append((time.monotonic() - self._start, s["rss_kib"]))
            for k, v in s.items():
                if isinstance(v, int):
                    self.peak[k] = max(self.peak[k], v)

    def rss_at(self, fraction: float) -> int:
        """RSS (KiB) of the sample taken `fraction` of the way through."""
        if not self.rss_series:
            return self.peak["rss_kib"]
        return self.rss_series[min(len(self.rss_series) - 1,
                                   int(fraction * len(self.rss_series)))][1]

    def __enter__(self) -> "PeakSampler":
        self._start = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


class Server:
    """samplerd (CPU backend) on a unix socket in `tmp`; its log is tmp/NAME.log."""

    def __init__(self, binary: str, tmp: str, name: str, *flags: str) -> None:
        self.target = f"unix://{tmp}/{name}.sock"
        self.log_path = f"{tmp}/{name}.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [binary, f"--listen={self.target}", "--backend=cpu", *flags],
                stdout=log, stderr=subprocess.STDOUT)
        self.pid = self.process.pid
        # One channel for the soak's own calls, open from start to stop, so that its connection
        # is part of every fd count.
        self.channel = grpc.insecure_channel(self.target)
        self.stub = pb_grpc.SamplerServiceStub(self.channel)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=2, wait_for_ready=True)
                return
            except grpc.RpcError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"samplerd did not start:\n{self.log_tail()}")

    def regions(self) -> list:
        return [r.name for r in self.stub.ListRegions(pb.ListRegionsRequest(), timeout=5).regions]

    def settle(self, baseline: dict, seconds: float = 10) -> dict:
        """Waits (up to `seconds`) for fds and threads to come back to `baseline`; returns the
        last snapshot. Closed connections are noticed by the server asynchronously."""
        deadline = time.monotonic() + seconds
        while True:
            s = snapshot(self.pid)
            fixed = s["threads"] - s["elastic_threads"]
            if (s["fds"] <= baseline["fds"] and
                fixed <= baseline["threads"] - baseline["elastic_threads"]) or \
                    time.monotonic() > deadline:
                return s
            time.sleep(0.05)

    def terminate(self, timeout: float) -> tuple:
        """SIGTERM; returns (exit code or None if still running after `timeout`, seconds)."""
        self.channel.close()
        start = time.monotonic()
        self.process.terminate()
        try:
            rc = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        elapsed = time.monotonic() - start
        if rc is None:
            self.process.kill()
            self.process.wait()
        return rc, elapsed

    def log_tail(self, chars: int = 3000) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()[-chars:]


class Client:
    """One soak_client.py process; its stdout is read on a thread (progress lines, then the
    final JSON), its stderr goes to tmp/client-NAME.err."""

    def __init__(self, tmp: str, name: str, target: str, *args: str) -> None:
        self.name = name
        self.err_path = f"{tmp}/client-{name}.err"
        with open(self.err_path, "wb") as err:
            self.process = subprocess.Popen(
                [PYTHON, CLIENT, f"--target={target}", *args],
                stdout=subprocess.PIPE, stderr=err, text=True)
        self.progress = 0
        self.progressed = threading.Event()
        self.result = None
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            if line.startswith("progress "):
                self.progress = max(self.progress, int(line.split()[1]))
                self.progressed.set()
            elif line.startswith("{"):
                self.result = json.loads(line)

    def wait_progress(self, steps: int, timeout: float) -> bool:
        """Waits until the client reported `steps` steps on one stream, or exited."""
        deadline = time.monotonic() + timeout
        while self.progress < steps and self.process.poll() is None:
            if time.monotonic() > deadline:
                return False
            self.progressed.wait(0.05)
            self.progressed.clear()
        return self.progress >= steps

    def wait(self, timeout: float) -> dict:
        """The client's JSON result; raises when it fails, hangs or prints none."""
        try:
            rc = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise RuntimeError(f"client {self.name} did not finish in {timeout:.0f} s")
        self._thread.join()
        if rc != 0 or self.result is None:
            with open(self.err_path, errors="replace") as f:
                raise RuntimeError(f"client {self.name} exited {rc}:\n{f.read()[-3000:]}")
        return self.result

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self._thread.join()


def merge(results: list) -> dict:
    """Sums the clients' results (counters, per-code counts, latencies)."""
    total = {}
    for r in results:
        for k, v in r.items():
            if isinstance(v, dict):
                d = total.setdefault(k, {})
                for kk, vv in v.items():
                    d[kk] = d.get(kk, 0) + vv
            elif isinstance(v, list):
                total.setdefault(k, []).extend(v)
            else:
                total[k] = total.get(k, 0) + v
    return total


def percentile(values: list, q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]
