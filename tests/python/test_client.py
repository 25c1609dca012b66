"""Tests of the Python client (client/python) against the real samplerd binary (CPU backend).

    client/python/generate.sh && /usr/bin/python3 -m unittest discover -s tests/python -v

Starts SAMPLERD_BIN (default build/default/service/samplerd) on a unix socket in a fresh
temporary directory, once for the module. deploy/local/test.sh python-client runs this.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import grpc
import numpy as np

from server import ROOT, Server  # first: puts client/python on sys.path

import samplerd  # noqa: E402

_server = None
TARGET = ""


def setUpModule():
    global _server, TARGET
    _server = Server().start()
    TARGET = _server.target


def tearDownModule():
    if _server is not None:
        _server.stop()


def random_logits(batch, vocab, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal((batch, vocab)).astype(dtype)


class ClientTest(unittest.TestCase):
    def setUp(self):
        self.client = samplerd.Client(TARGET)

    def tearDown(self):
        self.client.close()

    def test_server_info(self):
        info = self.client.server_info()
        self.assertEqual(info.backend, samplerd.v1.sampler_pb2.BACKEND_CPU)
        self.assertGreater(info.limits.max_batch, 0)
        self.assertEqual(info.limits.max_regions, 4096)  # --max_regions' default
        self.assertTrue(info.version)

    def test_greedy_matches_argmax(self):
        for dtype in (np.float32, np.float16):
            logits = random_logits(8, 1000, seed=1, dtype=dtype)
            result = self.client.sample(logits, temperature=0.0, request_id="greedy")
            self.assertEqual(result.tokens.dtype, np.int32)
            np.testing.assert_array_equal(result.tokens, np.argmax(logits, axis=1))
            np.testing.assert_array_equal(result.row_status, np.ones(8, dtype=np.int32))
            self.assertEqual(result.request_id, "greedy")

    def test_one_dimensional_logits_are_one_row(self):
        logits = random_logits(1, 64, seed=2)[0]
        result = self.client.sample(logits, temperature=0)
        self.assertEqual(result.tokens.tolist(), [int(np.argmax(logits))])

    def test_torch_is_not_imported_eagerly(self):
        code = "import sys, samplerd; assert 'torch' not in sys.modules"
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "client", "python"))
        subprocess.run([sys.executable, "-c", code], check=True, env=env)

    def test_torch_bfloat16(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed")
        logits = torch.randn(4, 256, dtype=torch.bfloat16)
        result = self.client.sample(logits, temperature=0)
        np.testing.assert_array_equal(result.tokens, logits.float().argmax(dim=1).numpy())

    def test_seeded_sampling_is_reproducible(self):
        logits = random_logits(16, 500, seed=3)
        a = self.client.sample(logits, temperature=1.0, top_k=50, seed=1234, position=7)
        b = self.client.sample(logits, temperature=1.0, top_k=50, seed=1234, position=7)
        np.testing.assert_array_equal(a.tokens, b.tokens)
        self.assertTrue(np.all(a.seeds == 1234))
        # Server-chosen seeds are returned and replay the draw.
        c = self.client.sample(logits, temperature=1.0)
        d = self.client.sample(logits, temperature=1.0, seed=c.seeds)
        np.testing.assert_array_equal(c.tokens, d.tokens)

    def test_per_row_parameters(self):
        logits = random_logits(4, 300, seed=4)
        result = self.client.sample(
            logits,
            temperature=np.array([0.0, 1.0, 0.0, 1.0]),
            top_k=[0, 1, 0, 1],  # top-k 1 is greedy too
            seed=[1, 2, 3, 4],
        )
        np.testing.assert_array_equal(result.tokens, np.argmax(logits, axis=1))
        np.testing.assert_array_equal(result.seeds, np.array([1, 2, 3, 4], dtype=np.uint64))
        with self.assertRaises(ValueError):
            self.client.sample(logits, temperature=[0.0, 1.0])

    def test_values_int_and_float_would_change_raise_naming_the_field(self):
        # int(1.5) is 1 and float("0.5") is 0.5: the client refuses both instead of sending a
        # different request, and names the field in range errors (protobuf's do not).
        logits = random_logits(2, 300, seed=5)
        cases = (
            (dict(seed=1.5), ValueError, "seed"),
            (dict(seed=[1, 2.5]), ValueError, "seed"),
            (dict(seed=-1), ValueError, r"seed: expected an integer in \[0, "),
            (dict(seed=2**64), ValueError, "seed"),
            (dict(position=-1), ValueError, "position"),
            (dict(top_k=2.7), ValueError, "top_k"),
            (dict(top_k=2**40), ValueError, "top_k"),
            (dict(top_k=[1, "2"]), TypeError, "top_k"),
            (dict(temperature="0.5"), TypeError, "temperature"),
            (dict(top_p=True), TypeError, "top_p"),
            (dict(top_p=[0.5, b"x"]), TypeError, "top_p"),
            (dict(logprobs=-1), ValueError, r"logprobs: expected an integer in \[0, 4294967295\]"),
            (dict(logprobs=True), TypeError, "logprobs"),  # top_n 1 before
            (dict(logprobs=2.5), ValueError, "logprobs"),
            (dict(logprobs=(True, "raw")), TypeError, "logprobs"),
        )
        for kwargs, error, field in cases:
            with self.subTest(kwargs=kwargs):
                with self.assertRaisesRegex(error, field):
                    self.client.sample(logits, **kwargs)
        # Integral floats and numpy scalars are the numbers they hold.
        result = self.client.sample(logits, temperature=0.0, seed=np.uint64(2**64 - 1),
                                    position=7.0, top_k=np.int32(5))
        np.testing.assert_array_equal(result.tokens, np.argmax(logits, axis=1))

    def test_per_row_seeds_and_positions_travel_packed_and_draw_the_same(self):
        logits = random_logits(16, 500, seed=6)
        seeds, positions = list(range(100, 116)), list(range(7, 23))
        request = self.client.make_request(logits, top_k=20, seed=seeds, position=positions)
        self.assertEqual(len(request.params), 1)  # filters shared: one message
        self.assertEqual(list(request.row_seeds), seeds)
        self.assertEqual(list(request.row_positions), positions)
        packed = self.client.sample(logits, top_k=20, seed=seeds, position=positions)
        # Per-row filters force B SamplingParams carrying the seeds and positions themselves.
        messages = self.client.sample(logits, top_k=[20] * 16, seed=seeds, position=positions)
        np.testing.assert_array_equal(packed.tokens, messages.tokens)
        np.testing.assert_array_equal(packed.seeds, np.array(seeds, dtype=np.uint64))
        with self.client.stream() as s:
            step = s.step(logits, top_k=20, seed=seeds, position=positions)
        np.testing.assert_array_equal(step.tokens, packed.tokens)

    def test_a_server_ignoring_row_seeds_is_refused(self):
        # What a server predating row_seeds answers: seeds of its own.
        request = self.client.make_request(random_logits(2, 10), seed=[1, 2])
        reply = samplerd.v1.sampler_pb2.SampleResponse(token_ids=[0, 0], row_status=[1, 1],
                                                       seeds=[77, 78])
        with self.assertRaises(samplerd.SamplerError) as caught:
            samplerd._results._checked(request, samplerd.SampleResult._from_pb(reply))
        self.assertEqual(caught.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("predates row_seeds", caught.exception.message)

    def test_logprobs(self):
        logits = random_logits(3, 200, seed=5)
        result = self.client.sample(logits, temperature=0, logprobs=5)
        self.assertEqual(len(result.logprobs), 3)
        ref = logits.astype(np.float64)
        ref = ref - ref.max(axis=1, keepdims=True)
        ref = ref - np.log(np.exp(ref).sum(axis=1, keepdims=True))
        for i, lp in enumerate(result.logprobs):
            self.assertEqual(lp.sampled_rank, 1)
            self.assertAlmostEqual(lp.sampled_logprob, ref[i].max(), places=4)
            np.testing.assert_array_equal(lp.top_token_ids, np.argsort(-ref[i], kind="stable")[:5])
            np.testing.assert_allclose(lp.top_logprobs, np.sort(ref[i])[::-1][:5], atol=1e-4)
        self.assertIsNone(self.client.sample(logits, temperature=0).logprobs)

    def test_top_logprobs_past_the_vocabulary_are_padded_with_minus_one(self):
        # sampler.proto, RowLogprobs.top_token_ids: always top_n entries; id -1 and -inf past V
        # and in an invalid row (a caller must not index its vocabulary with them).
        logits = np.array([[0.5, 1, 3, 2], [np.nan, 1, 2, 3]], np.float32)
        result = self.client.sample(logits, temperature=0, logprobs=6)
        np.testing.assert_array_equal(result.logprobs[0].top_token_ids, [2, 3, 1, 0, -1, -1])
        self.assertTrue(np.isneginf(result.logprobs[0].top_logprobs[4:]).all())
        np.testing.assert_array_equal(result.logprobs[1].top_token_ids, [-1] * 6)
        self.assertTrue(np.isneginf(result.logprobs[1].top_logprobs).all())

    def test_invalid_request_raises(self):
        logits = random_logits(2, 10, seed=6)
        with self.assertRaises(samplerd.SamplerError) as ctx:
            self.client.sample(logits, top_p=1.5)
        self.assertEqual(ctx.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("expected", ctx.exception.message)
        with self.assertRaises(TypeError):
            self.client.sample(logits.astype(np.float64))

    def test_big_endian_logits_are_sent_little_endian(self):
        # A non-native byte order is a layout, not another dtype: the client converts it.
        logits = random_logits(3, 50, seed=8)
        for dtype in (">f4", ">f2"):
            swapped = logits.astype(dtype)
            result = self.client.sample(swapped, temperature=0)
            np.testing.assert_array_equal(result.tokens, np.argmax(swapped, axis=1))

    def test_stream_steps_in_order(self):
        logits = [random_logits(4, 128, seed=10 + i) for i in range(5)]
        with self.client.stream() as session:
            for i, step in enumerate(logits):
                result = session.step(step, temperature=0, request_id=f"step-{i}")
                self.assertEqual(result.request_id, f"step-{i}")
                np.testing.assert_array_equal(result.tokens, np.argmax(step, axis=1))
            # A rejected step raises; the session stays usable.
            with self.assertRaises(samplerd.SamplerError) as ctx:
                session.step(logits[0], top_k=-5)
            self.assertEqual(ctx.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            result = session.step(logits[1], temperature=0, request_id="after")
            self.assertEqual(result.request_id, "after")

    def test_a_stream_step_over_the_message_limit_is_refused_and_the_stream_stays_open(self):
        # Regression test: grpc failed the whole call for such a step ("Sent message larger than
        # max"), and every later step raised "stream session is closed".
        big = random_logits(1, 32 << 10, seed=14)  # 128 KiB of logits
        logits = random_logits(2, 16, seed=15)
        with samplerd.Client(TARGET, max_message_bytes=64 << 10) as client:
            with client.stream() as session:
                with self.assertRaises(samplerd.SamplerError) as caught:
                    session.step(big, temperature=0)
                self.assertEqual(caught.exception.code, grpc.StatusCode.RESOURCE_EXHAUSTED)
                self.assertRegex(caught.exception.message,
                                 r"^expected a step message of at most 65536 bytes "
                                 r"\(max_message_bytes\), got 131\d{3} bytes")
                result = session.step(logits, temperature=0)
                np.testing.assert_array_equal(result.tokens, np.argmax(logits, axis=1))

    def test_stream_chunk_bytes_splits_large_steps_keeping_every_field(self):
        # 128 KiB steps in 16 KiB chunks pass a 64 KiB message limit, and sample as unary calls
        # do: the processors, seeds and positions travel with the first chunk.
        batch, vocab = 2, 16 << 10
        logits = random_logits(batch, vocab, seed=16)
        mask = np.full((batch, vocab // 32), -1, np.int32)
        mask[0] = 0
        mask[0, 0] = 1 << 7  # row 0: token 7 only
        banned = int(np.argmax(logits[1]))
        options = dict(top_k=50, seed=[11, 22], position=[5, 6], token_bitmask=mask,
                       logit_bias=[None, {banned: -float("inf")}], repetition_penalty=1.5,
                       output_token_ids=[[1, 2], [3]], logprobs=2, request_id="chunked")
        unary = self.client.sample(logits, **options)
        with samplerd.Client(TARGET, max_message_bytes=64 << 10,
                             stream_chunk_bytes=16 << 10) as client:
            with client.stream() as session:
                for step in range(2):  # the second step follows the first's chunks
                    result = session.step(logits, **options)
                    np.testing.assert_array_equal(result.tokens, unary.tokens)
                    self.assertEqual(result.request_id, "chunked")
                    for got, want in zip(result.logprobs, unary.logprobs):
                        np.testing.assert_array_equal(got.top_token_ids, want.top_token_ids)
        self.assertEqual(unary.tokens[0], 7)
        self.assertNotEqual(unary.tokens[1], banned)
        np.testing.assert_array_equal(unary.seeds, [11, 22])
        with self.assertRaises(ValueError):
            samplerd.Client(TARGET, stream_chunk_bytes=-1)

    def test_host_shm_region_equals_inline(self):
        logits = random_logits(6, 400, seed=7)
        region = self.client.register_host_shm("pytest-shm", logits)
        try:
            names = [r.name for r in self.client.list_regions()]
            self.assertIn("pytest-shm", names)
            for position in range(3):
                inline = self.client.sample(logits, seed=99, position=position, top_p=0.9)
                shm = self.client.sample_region(region, seed=99, position=position, top_p=0.9)
                np.testing.assert_array_equal(inline.tokens, shm.tokens)
            # Reuse: write new logits into the mapped array, sample again.
            region.array[...] = random_logits(6, 400, seed=8)
            shm = self.client.sample_region(region, temperature=0)
            np.testing.assert_array_equal(shm.tokens, np.argmax(region.array, axis=1))
            # By name, at an offset: rows 2.. of the object.
            row_bytes = 400 * 4
            part = self.client.sample_region(
                "pytest-shm", shape=(4, 400), dtype=np.float32, offset=2 * row_bytes, temperature=0
            )
            np.testing.assert_array_equal(part.tokens, np.argmax(region.array[2:], axis=1))
            key = region.key
        finally:
            self.client.unregister("pytest-shm")
        self.assertFalse(os.path.exists("/dev/shm" + key))
        self.assertNotIn("pytest-shm", [r.name for r in self.client.list_regions()])


    def test_host_shm_region_is_registered_again_after_the_server_forgot_it(self):
        logits = random_logits(2, 300, seed=9)
        region = self.client.register_host_shm("pytest-shm-again", logits)
        try:
            # What a server restart does to the registry: the name is gone, the object is not.
            self.client._unregister_rpc("pytest-shm-again")
            self.assertNotIn("pytest-shm-again", [r.name for r in self.client.list_regions()])
            result = self.client.sample_region(region, temperature=0)
            np.testing.assert_array_equal(result.tokens, np.argmax(logits, axis=1))
            self.assertIn("pytest-shm-again", [r.name for r in self.client.list_regions()])
            # A name that was never this client's object is not guessed at: NOT_FOUND.
            with self.assertRaises(samplerd.SamplerError) as ctx:
                self.client.sample_region("pytest-no-such-region", shape=(1, 300), dtype=np.float32)
            self.assertEqual(ctx.exception.code, grpc.StatusCode.NOT_FOUND)
        finally:
            self.client.unregister("pytest-shm-again")


class PackagingTest(unittest.TestCase):
    """`pip install client/python` gives a working package, stubs included."""

    def test_pip_install_then_sample(self):
        import importlib.util

        if not all(importlib.util.find_spec(m) for m in ("pip", "setuptools", "wheel")):
            self.skipTest("needs python3-pip, python3-setuptools and python3-wheel")
        target = tempfile.mkdtemp(prefix="samplerd-pip.")
        try:
            subprocess.run(
                [sys.executable, "-m", "pip", "install", "--quiet", "--root-user-action=ignore", "--no-build-isolation",
                 "--no-deps", "--no-index", "--target", target, os.path.join(ROOT, "client", "python")],
                check=True, capture_output=True, timeout=120,
                # Debian 12's setuptools with its patched distutils needs the stdlib one.
                env=dict(os.environ, SETUPTOOLS_USE_DISTUTILS="stdlib"),
            )
            program = (
                "import numpy as np, samplerd, sys\n"
                "assert samplerd.__file__.startswith(sys.argv[1]), samplerd.__file__\n"
                "logits = np.zeros((2, 5), np.float32); logits[0, 3] = logits[1, 1] = 9\n"
                "print(samplerd.Client(sys.argv[2]).sample(logits, temperature=0).tokens.tolist())\n"
            )
            env = dict(os.environ, PYTHONPATH=target)  # not client/python: the installed copy
            out = subprocess.run([sys.executable, "-c", program, target, TARGET], env=env,
                                 capture_output=True, text=True, timeout=60)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertEqual(out.stdout.strip(), "[3, 1]")
            self.assertTrue(os.path.exists(os.path.join(target, "samplerd", "v1", "sampler_pb2.pyi")))
        finally:
            shutil.rmtree(target, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
