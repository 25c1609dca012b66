"""Tests of the Python client's device sessions (numpy, host plane) against the real samplerd
binary on the CPU backend.

    client/python/generate.sh && /usr/bin/python3 -m unittest discover -s tests/python -v

Starts SAMPLERD_BIN (default build/default/service/samplerd) once for the module, and a
dedicated one for the test that SIGKILLs it. The torch host and GPU planes are checked on a GPU
machine (tests/gpu). deploy/local/test.sh python-client runs this.
"""

import os
import signal
import threading
import time
import unittest

import grpc
import numpy as np

from server import Server  # first: puts client/python on sys.path

import samplerd  # noqa: E402

_server = None
TARGET = ""
VOCAB = 1000
MAX_BATCH = 8


def setUpModule():
    global _server, TARGET
    _server = Server().start()
    TARGET = _server.target


def tearDownModule():
    if _server is not None:
        _server.stop()


def shm_objects():
    return sorted(f for f in os.listdir("/dev/shm") if f.startswith("samplerd-dsession-"))


class DeviceSessionTest(unittest.TestCase):
    def setUp(self):
        self.client = samplerd.Client(TARGET)

    def tearDown(self):
        self.client.close()

    def session(self, **kwargs):
        kwargs.setdefault("max_batch", MAX_BATCH)
        kwargs.setdefault("vocab", VOCAB)
        return self.client.device_session(**kwargs)

    def test_server_reports_the_host_plane(self):
        support = self.client.server_info().device_sessions
        self.assertTrue(support.host_plane)
        self.assertFalse(support.gpu_plane)

    def test_300_steps_match_unary_sample(self):
        rng = np.random.default_rng(10)
        greedy_rows = seeded_rows = seeded_equal = 0
        with self.session() as s:
            self.assertEqual(s.plane, "host")
            for step in range(300):
                batch = int(rng.integers(1, MAX_BATCH + 1))
                logits = rng.standard_normal((batch, VOCAB)).astype(np.float32) * 3
                seeds = rng.integers(0, 1 << 62, size=batch, dtype=np.uint64)
                greedy = step % 3 == 0
                if greedy:
                    kw = dict(temperature=0.0)
                elif step % 3 == 1:  # shared filters
                    kw = dict(temperature=0.8, top_k=int(rng.choice([0, 20])),
                              top_p=float(rng.choice([1.0, 0.9])), min_p=0.05)
                else:  # per-row filters
                    kw = dict(temperature=rng.uniform(0.5, 1.5, batch).astype(np.float32),
                              top_k=rng.choice([0, 5, 50], batch).astype(np.int32),
                              top_p=rng.choice([1.0, 0.8], batch).astype(np.float32),
                              min_p=0.0)
                joint = step % 7 == 0
                tokens, status = s.sample(logits, seeds=seeds, positions=step,
                                          top_p_mode="joint" if joint else "top_k_first", **kw)
                want = self.client.sample(logits, seed=seeds, position=step, joint_top_p=joint,
                                          **kw)
                self.assertEqual(tokens.dtype, np.int32)
                self.assertEqual(tokens.shape, (batch,))
                np.testing.assert_array_equal(status, np.ones(batch, dtype=np.int32))
                if greedy:
                    np.testing.assert_array_equal(tokens, want.tokens)
                    np.testing.assert_array_equal(tokens, np.argmax(logits, axis=1))
                    greedy_rows += batch
                else:
                    seeded_rows += batch
                    seeded_equal += int(np.sum(tokens == want.tokens))
        self.assertGreater(greedy_rows, 0)
        self.assertGreaterEqual(seeded_equal, 0.999 * seeded_rows,
                                f"{seeded_equal} of {seeded_rows} seeded rows equal unary Sample")
        self.assertEqual(s.steps, 300)

    def test_invalid_params_row_gets_status_4_and_neighbours_are_fine(self):
        logits = np.random.default_rng(11).standard_normal((4, VOCAB)).astype(np.float32)
        with self.session() as s:
            tokens, status = s.sample(logits, temperature=[0.0, 0.0, -1.0, 0.0],
                                      top_k=[0, -2, 0, 0], seeds=1, positions=0)
            self.assertEqual(status.tolist(), [1, 4, 4, 1])
            self.assertEqual(tokens[1], -1)
            self.assertEqual(tokens[2], -1)
            self.assertEqual(tokens[0], np.argmax(logits[0]))
            self.assertEqual(tokens[3], np.argmax(logits[3]))
            tokens, status = s.sample(logits, temperature=0.0, seeds=1, positions=1)
            np.testing.assert_array_equal(tokens, np.argmax(logits, axis=1))
            self.assertEqual(status.tolist(), [1, 1, 1, 1])

    def test_logits_written_into_the_buffer_are_sampled_in_place(self):
        rng = np.random.default_rng(12)
        with self.session() as s:
            buf = s.logits_buffer
            self.assertEqual(buf.shape, (MAX_BATCH, VOCAB))
            for batch in (3, MAX_BATCH, 1):
                buf[:batch] = rng.standard_normal((batch, VOCAB))
                tokens, _ = s.sample(buf[:batch], temperature=0.0, seeds=0, positions=0)
                np.testing.assert_array_equal(tokens, np.argmax(buf[:batch], axis=1))

    def test_float16_session(self):
        logits = np.random.default_rng(13).standard_normal((5, VOCAB)).astype(np.float16)
        with self.session(dtype="float16") as s:
            tokens, status = s.sample(logits, temperature=0.0, seeds=0, positions=0)
            np.testing.assert_array_equal(tokens, np.argmax(logits, axis=1))

    def test_sampled_logprobs_equal_unary_logprobs(self):
        rng = np.random.default_rng(16)
        logits = rng.standard_normal((4, VOCAB)).astype(np.float32)
        seeds = np.arange(4, dtype=np.uint64)
        for source, name in ((True, "raw"), ("processed", "processed")):
            with self.session(logprobs=source) as s:
                tokens, _ = s.sample(logits, temperature=0.7, top_k=20, seeds=seeds, positions=3)
                want = self.client.sample(logits, temperature=0.7, top_k=20, seed=seeds,
                                          position=3, logprobs=(1, name))
                np.testing.assert_array_equal(tokens, want.tokens)
                np.testing.assert_allclose(
                    s.sampled_logprobs, [r.sampled_logprob for r in want.logprobs], rtol=1e-5)

    def test_bad_arguments_raise_before_sending(self):
        with self.session() as s:
            logits = np.zeros((MAX_BATCH + 1, VOCAB), dtype=np.float32)
            with self.assertRaises(ValueError):
                s.sample(logits, seeds=0, positions=0)
            with self.assertRaises(ValueError):
                s.sample(logits[:2], positions=0)  # no seeds
            with self.assertRaises(ValueError):
                s.sample(logits[:2], seeds=[1, 2, 3], positions=0)
            with self.assertRaises(ValueError):
                s.sample(np.zeros((2, VOCAB + 1), dtype=np.float32), seeds=0, positions=0)
            tokens, _ = s.sample(logits[:2], temperature=0.0, seeds=0, positions=0)
            self.assertEqual(tokens.shape, (2,))

    def test_values_numpy_would_change_raise_naming_the_field(self):
        # Assigning into the shm params view would truncate 1.5, wrap -1 and parse "0.5".
        logits = np.zeros((2, VOCAB), dtype=np.float32)
        with self.session() as s:
            cases = (
                (dict(seeds=1.5, positions=0), ValueError, "seed"),
                (dict(seeds=-1, positions=0), ValueError, "seed"),
                (dict(seeds=0, positions=[0, 2**64]), TypeError, "position"),
                (dict(seeds=0, positions=0, top_k=[2.5, 1]), ValueError, "top_k"),
                (dict(seeds=0, positions=0, temperature="0.5"), TypeError, "temperature"),
                (dict(seeds=0, positions=0, top_p=True), TypeError, "top_p"),
            )
            for kwargs, error, field in cases:
                with self.subTest(kwargs=kwargs):
                    with self.assertRaisesRegex(error, field):
                        s.sample(logits, **kwargs)
            tokens, status = s.sample(logits, temperature=0.0, seeds=np.uint64(2**64 - 1),
                                      positions=[3.0, 4], top_k=np.int64(5))
            self.assertEqual(status.tolist(), [1, 1])

    def test_gpu_plane_on_a_cpu_server_is_failed_precondition(self):
        with self.assertRaises(samplerd.SamplerError) as cm:
            self.session(plane="gpu")
        self.assertEqual(cm.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertEqual(self.client.server_info().device_sessions.open_sessions, 0)

    def test_close_ends_the_session_and_frees_everything(self):
        before = shm_objects()
        s = self.session()
        self.assertTrue(s.session_id)
        self.assertEqual(self.client.server_info().device_sessions.open_sessions, 1)
        self.assertEqual(len(shm_objects()), len(before) + 1)
        self.assertEqual(len(self.client.list_regions()), 1)
        s.sample(np.zeros((1, VOCAB), dtype=np.float32), temperature=0.0, seeds=0, positions=0)
        s.close()
        self.assertEqual(s.steps, 1)
        self.assertEqual(self.client.server_info().device_sessions.open_sessions, 0)
        self.assertEqual(shm_objects(), before)
        self.assertEqual(len(self.client.list_regions()), 0)
        with self.assertRaises(samplerd.SamplerError) as cm:
            s.sample(np.zeros((1, VOCAB), dtype=np.float32), seeds=0, positions=0)
        self.assertEqual(cm.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
        s.close()  # idempotent

    def test_client_close_closes_its_sessions(self):
        client = samplerd.Client(TARGET)
        s = client.device_session(max_batch=2, vocab=VOCAB)
        client.close()
        self.assertIsNotNone(s.steps)
        self.assertEqual(self.client.server_info().device_sessions.open_sessions, 0)

    def test_two_sessions_step_independently(self):
        rng = np.random.default_rng(14)
        with self.session() as a, self.session(max_batch=2) as b:
            self.assertNotEqual(a.session_id, b.session_id)
            self.assertEqual(self.client.server_info().device_sessions.open_sessions, 2)
            for step in range(20):
                la = rng.standard_normal((5, VOCAB)).astype(np.float32)
                lb = rng.standard_normal((2, VOCAB)).astype(np.float32)
                ta, _ = a.sample(la, temperature=0.0, seeds=0, positions=step)
                tb, _ = b.sample(lb, temperature=0.0, seeds=0, positions=step)
                np.testing.assert_array_equal(ta, np.argmax(la, axis=1))
                np.testing.assert_array_equal(tb, np.argmax(lb, axis=1))


def all_threads_stopped(pid: int, timeout: float) -> bool:
    """True once every thread of `pid` is in state T (stopped), polling up to `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = []
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except OSError:
                continue  # the thread ended meanwhile
        if states and all(state in ("T", "t") for state in states):
            return True
        time.sleep(0.01)
    return False


class ServerDeathTest(unittest.TestCase):
    """The server SIGKILLed mid-session: a pending step and the next sample() raise within 1 s."""

    def setUp(self):
        self.server = Server().start()
        self.client = samplerd.Client(self.server.target)

    def tearDown(self):
        self.client.close()
        if self.server.process.poll() is None:
            self.server.process.kill()
        self.server.process.wait()
        self.server.stop()

    def test_a_pending_step_and_the_next_raise_within_a_second(self):
        before = shm_objects()
        s = self.client.device_session(max_batch=4, vocab=VOCAB)
        logits = np.random.default_rng(15).standard_normal((4, VOCAB)).astype(np.float32)
        tokens, _ = s.sample(logits, temperature=0.0, seeds=0, positions=0)
        np.testing.assert_array_equal(tokens, np.argmax(logits, axis=1))

        # A step rung while the server is stopped waits; the kill must release it. SIGSTOP
        # reaches the server's threads one by one: ring only once every one has stopped, or
        # the poller may still answer the step.
        os.kill(self.server.process.pid, signal.SIGSTOP)
        self.assertTrue(all_threads_stopped(self.server.process.pid, timeout=5.0))
        outcome = {}

        def step():
            try:
                s.sample(logits, temperature=0.0, seeds=0, positions=1)
                outcome["error"] = None
            except samplerd.SamplerError as e:
                outcome["error"] = e
            outcome["at"] = time.monotonic()

        waiter = threading.Thread(target=step)
        waiter.start()
        time.sleep(0.2)  # the step is rung and spinning (nothing can answer it)
        self.assertNotIn("at", outcome)
        killed_at = time.monotonic()
        os.kill(self.server.process.pid, signal.SIGKILL)
        waiter.join(10)
        self.assertFalse(waiter.is_alive())
        self.assertIsNotNone(outcome["error"])
        self.assertEqual(outcome["error"].code, grpc.StatusCode.ABORTED)
        self.assertLess(outcome["at"] - killed_at, 1.0)

        start = time.monotonic()
        with self.assertRaises(samplerd.SamplerError) as cm:
            s.sample(logits, temperature=0.0, seeds=0, positions=2)
        self.assertLess(time.monotonic() - start, 1.0)
        self.assertEqual(cm.exception.code, grpc.StatusCode.ABORTED)
        self.assertIn("the samplerd server went away", cm.exception.message)
        s.close()  # the server is gone: close still frees the client's side
        self.assertEqual(shm_objects(), before)


if __name__ == "__main__":
    unittest.main()
