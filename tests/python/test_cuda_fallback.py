"""How the Python client routes CUDA tensors when GPU IPC cannot serve them (no GPU needed).

A stand-in `torch` module (tests/python/fake_torch) gives tensors that claim to be on a CUDA
device; the real server runs on the CPU backend, so "auto" must fall back to a host copy with one
warning saying why, "always" must raise FAILED_PRECONDITION before sending anything, and "never"
must copy without asking the server. The GPU path itself is checked on a GPU machine by
tests/gpu/python_client_cuda.py.
"""

import os
import subprocess
import sys
import unittest

import numpy as np

from server import ROOT, Server  # first: puts client/python on sys.path

_server = None
HERE = os.path.dirname(os.path.abspath(__file__))


def setUpModule():
    global _server
    _server = Server().start()


def tearDownModule():
    if _server is not None:
        _server.stop()


def run_child(mode):
    """Runs fallback_child.py with the fake torch first on sys.path; returns its stdout lines."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(HERE, "fake_torch"), os.path.join(ROOT, "client", "python")]))
    out = subprocess.run([sys.executable, os.path.join(HERE, "fallback_child.py"), _server.target,
                          mode], env=env, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise AssertionError("child failed (%d):\n%s\n%s" % (out.returncode, out.stdout, out.stderr))
    return out.stdout.split("\n")


class CudaFallbackTest(unittest.TestCase):
    def test_auto_falls_back_with_one_warning(self):
        lines = run_child("auto")
        self.assertIn("tokens [3, 1] [3, 1]", lines)
        self.assertIn("warnings 1", lines)
        self.assertTrue(any(l.startswith("reason the server samples on the CPU") for l in lines), lines)
        self.assertIn("regions []", lines)

    def test_always_raises_failed_precondition(self):
        lines = run_child("always")
        self.assertTrue(any(l.startswith("error FAILED_PRECONDITION GPU IPC: the server samples on the CPU")
                            for l in lines), lines)

    def test_never_copies_without_asking(self):
        lines = run_child("never")
        self.assertIn("tokens [3, 1] [3, 1]", lines)
        self.assertIn("warnings 0", lines)
        self.assertIn("server_info calls 0", lines)

    def test_bad_mode_is_refused(self):
        import samplerd

        with self.assertRaisesRegex(ValueError, "cuda_ipc: expected one of"):
            samplerd.Client(_server.target, cuda_ipc="sometimes")


if __name__ == "__main__":
    np.set_printoptions(threshold=10)
    unittest.main()
