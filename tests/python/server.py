"""The real samplerd binary (CPU backend) on a unix socket in a fresh temporary folder, for tests.

    server = Server().start()     # SAMPLERD_BIN, default build/default/service/samplerd
    samplerd.Client(server.target) ...
    server.stop()
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))

import samplerd  # noqa: E402

BIN = os.environ.get("SAMPLERD_BIN", os.path.join(ROOT, "build", "default", "service", "samplerd"))


class Server:
    def __init__(self, *flags: str) -> None:
        self.flags = list(flags)
        self.tmp = tempfile.mkdtemp(prefix="samplerd-py.")
        self.target = "unix://" + os.path.join(self.tmp, "s.sock")
        self.log = os.path.join(self.tmp, "server.log")
        self.process = None

    def start(self) -> "Server":
        """Starts the server and waits until it answers GetServerInfo (30 s at most)."""
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [BIN, "--listen=" + self.target, "--backend=cpu", "--threads=2", *self.flags],
                stdout=log, stderr=log,
            )
        deadline = time.time() + 30
        with samplerd.Client(self.target, timeout=2) as client:
            while True:
                try:
                    client.server_info()
                    return self
                except samplerd.SamplerError:
                    if self.process.poll() is not None or time.time() > deadline:
                        with open(self.log) as f:
                            raise RuntimeError("samplerd did not start:\n" + f.read()[-4000:])
                    time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 s; removes the temporary folder."""
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)
