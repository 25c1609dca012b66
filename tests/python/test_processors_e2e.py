"""The logits processors through the Python client against the real samplerd binary (CPU
backend): what a bitmask, a logit bias and the penalties do to the sampled tokens (the encoding
alone is test_processors.py's).

    client/python/generate.sh && /usr/bin/python3 -m unittest -v test_processors_e2e  # tests/python
"""

import os
import subprocess
import sys
import unittest

import grpc
import numpy as np

from server import ROOT, Server  # first: puts client/python on sys.path

import samplerd  # noqa: E402
from samplerd._pb import pb  # noqa: E402

_server = None
TARGET = ""
OK, NO_ALLOWED = pb.ROW_STATUS_OK, pb.ROW_STATUS_INVALID_NO_ALLOWED


def setUpModule():
    global _server, TARGET
    _server = Server().start()
    TARGET = _server.target


def tearDownModule():
    if _server is not None:
        _server.stop()


def random_logits(batch, vocab, seed=0):
    return np.random.default_rng(seed).standard_normal((batch, vocab)).astype(np.float32)


def bitmask(allowed_rows, vocab):
    """int32 words [B, ceil(V / 32)] allowing the token ids of each row."""
    words = np.zeros((len(allowed_rows), (vocab + 31) // 32), np.uint32)
    for row, allowed in enumerate(allowed_rows):
        for t in allowed:
            words[row, t // 32] |= np.uint32(1 << (t % 32))
    return words.view(np.int32)


class ProcessorsTest(unittest.TestCase):
    def setUp(self):
        self.client = samplerd.Client(TARGET)

    def tearDown(self):
        self.client.close()

    def test_a_bitmask_allowing_one_token_always_gives_that_token(self):
        vocab = 1000
        logits = random_logits(4, vocab, seed=1)
        allowed = [[7], [999], [32], [0]]
        mask = bitmask(allowed, vocab)
        for seed in range(5):
            result = self.client.sample(logits, seed=seed, top_k=50, top_p=0.9, token_bitmask=mask)
            self.assertEqual(result.tokens.tolist(), [7, 999, 32, 0])
            np.testing.assert_array_equal(result.row_status, [OK] * 4)

    def test_greedy_with_a_bitmask_is_the_argmax_of_the_allowed_tokens(self):
        vocab = 300
        logits = random_logits(3, vocab, seed=2)
        rng = np.random.default_rng(3)
        allowed = [sorted(rng.choice(vocab, 20, replace=False).tolist()) for _ in range(3)]
        result = self.client.sample(logits, temperature=0,
                                    token_bitmask=bitmask(allowed, vocab))
        want = [a[int(np.argmax(logits[i, a]))] for i, a in enumerate(allowed)]
        self.assertEqual(result.tokens.tolist(), want)
        bools = np.zeros((3, vocab), bool)
        for i, a in enumerate(allowed):
            bools[i, a] = True
        again = self.client.sample(logits, temperature=0, token_bitmask=bools)
        self.assertEqual(again.tokens.tolist(), want)

    def test_a_row_with_nothing_allowed_gets_no_allowed_and_its_neighbours_are_sampled(self):
        vocab = 100
        logits = random_logits(3, vocab, seed=4)
        mask = bitmask([[5], [], [6]], vocab)
        result = self.client.sample(logits, temperature=0, token_bitmask=mask)
        self.assertEqual(result.tokens.tolist(), [5, -1, 6])
        self.assertEqual(result.row_status.tolist(), [OK, NO_ALLOWED, OK])

    def test_minus_inf_bias_bans_a_token_and_plus_inf_forces_one(self):
        logits = random_logits(2, 200, seed=5)
        top = np.argmax(logits, axis=1)
        banned = self.client.sample(logits, temperature=0,
                                    logit_bias={int(top[0]): -np.inf, int(top[1]): -np.inf})
        second = np.argsort(-logits, axis=1, kind="stable")[:, 1]
        self.assertEqual(banned.tokens.tolist(), second.tolist())
        for seed in range(5):
            forced = self.client.sample(logits, seed=seed, logit_bias=[{17: np.inf}, {180: np.inf}])
            self.assertEqual(forced.tokens.tolist(), [17, 180])

    def test_a_finite_bias_moves_the_argmax(self):
        logits = np.zeros((2, 10), np.float32)
        logits[:, 3] = 1.0
        result = self.client.sample(logits, temperature=0, logit_bias=[{8: 2.0}, {8: 0.5}])
        self.assertEqual(result.tokens.tolist(), [8, 3])

    def test_repetition_penalty_divides_positive_and_multiplies_negative_logits(self):
        logits = np.array([[2.0, 1.5, -5.0], [-1.0, -1.5, -5.0]], np.float32)
        history = [[0], [0]]
        # Row 0: 2 / 2 = 1 < 1.5. Row 1: -1 * 2 = -2 < -1.5. Both move to token 1.
        result = self.client.sample(logits, temperature=0, repetition_penalty=2.0,
                                    prompt_token_ids=history)
        self.assertEqual(result.tokens.tolist(), [1, 1])
        same = self.client.sample(logits, temperature=0, repetition_penalty=2.0,
                                  output_token_ids=history)
        self.assertEqual(same.tokens.tolist(), [1, 1])
        off = self.client.sample(logits, temperature=0, repetition_penalty=[1.0, 1.0],
                                 prompt_token_ids=history)
        self.assertEqual(off.tokens.tolist(), [0, 0])

    def test_presence_and_frequency_penalties_count_output_tokens_only(self):
        logits = np.array([[3.0, 2.0, 0.0]] * 3, np.float32)
        # Token 0 seen twice in the output: 3 - 0.6 * 2 = 1.8 < 2 with frequency 0.6.
        result = self.client.sample(
            logits, temperature=0, frequency_penalty=[0.6, 0.0, 0.6], presence_penalty=0.0,
            prompt_token_ids=[[], [], [0, 0, 0]], output_token_ids=[[0, 0], [0, 0], []],
        )
        self.assertEqual(result.tokens.tolist(), [1, 0, 0])
        presence = self.client.sample(logits, temperature=0, presence_penalty=1.5,
                                      output_token_ids=[[0], [2], [0, 0, 0]])
        self.assertEqual(presence.tokens.tolist(), [1, 0, 1])

    def test_processed_logprobs_reflect_the_processors_and_raw_ones_do_not(self):
        logits = random_logits(1, 64, seed=6)
        mask = bitmask([[10, 20]], 64)
        result = self.client.sample(logits, seed=1, token_bitmask=mask,
                                    logprobs=(2, "processed"))
        lp = result.logprobs[0]
        self.assertEqual(sorted(lp.top_token_ids.tolist()), [10, 20])
        self.assertAlmostEqual(float(np.exp(lp.top_logprobs).sum()), 1.0, places=5)
        raw = self.client.sample(logits, temperature=0, token_bitmask=mask, logprobs=(2, "raw"))
        self.assertEqual(raw.logprobs[0].top_token_ids.tolist(),
                         np.argsort(-logits[0], kind="stable")[:2].tolist())

    def test_stream_steps_carry_the_processors(self):
        logits = random_logits(2, 128, seed=7)
        mask = bitmask([[3], [100]], 128)
        with self.client.stream() as session:
            step = session.step(logits, temperature=0, token_bitmask=mask,
                                logit_bias={3: -1.0}, repetition_penalty=1.1,
                                output_token_ids=[[3], [4]])
        self.assertEqual(step.tokens.tolist(), [3, 100])

    def test_lists_in_a_host_shm_region_give_the_inline_tokens_and_logprobs(self):
        from samplerd._options import SampleOptions

        logits = random_logits(3, 500, seed=9)
        options = dict(seed=[1, 2, 3], top_p=0.9, logprobs=(3, "processed"),
                       repetition_penalty=1.4, frequency_penalty=0.3,
                       logit_bias=[{7: 3.0, 8: -np.inf}, {}, {499: 2.5}],
                       prompt_token_ids=[[1, 2], [3], []], output_token_ids=[[2, 2], [], [9]])
        want = self.client.sample(logits, **options)
        inline = SampleOptions(**options).request(pb.Tensor(shape=[3, 500]))
        bias = samplerd.packed_lists(inline.logit_bias)
        history = samplerd.packed_lists(inline.token_history)
        region = self.client.register_host_shm("py-lists", 4096)
        try:
            region.array[:len(bias)] = bias
            region.array[1024:1024 + len(history)] = history
            options.update(
                logit_bias=pb.LogitBias(region=pb.RegionSlice(region="py-lists")),
                token_history=pb.TokenHistory(region=pb.RegionSlice(region="py-lists",
                                                                    offset=1024)),
                prompt_token_ids=None, output_token_ids=None)
            got = self.client.sample(logits, **options)
        finally:
            self.client.unregister("py-lists")
        self.assertEqual(got.tokens.tolist(), want.tokens.tolist())
        for g, w in zip(got.logprobs, want.logprobs):
            self.assertEqual(g.top_token_ids.tolist(), w.top_token_ids.tolist())
            self.assertEqual(g.top_logprobs.tobytes(), w.top_logprobs.tobytes())

    def test_the_server_checks_token_ids_against_the_vocabulary(self):
        logits = random_logits(2, 50, seed=8)
        for options in ({"logit_bias": {50: 1.0}}, {"output_token_ids": [[1], [-1]]}):
            with self.assertRaises(samplerd.SamplerError) as caught:
                self.client.sample(logits, repetition_penalty=1.2, **options)
            self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn("expected", caught.exception.message)
        with self.assertRaises(samplerd.SamplerError) as caught:
            self.client.sample(logits, repetition_penalty=0.0)
        self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)

    def test_a_cuda_bitmask_falls_back_to_a_host_copy_when_ipc_cannot_serve_it(self):
        # A stand-in torch (fake_torch/) claims CUDA tensors; the CPU server cannot read GPU
        # IPC regions, so "auto" sends the mask inline after one warning (the GPU path itself:
        # tests/gpu). Logits on the host and on the "GPU" alike.
        code = (
            "import sys, warnings, numpy as np, torch, samplerd\n"
            "client = samplerd.Client(sys.argv[1])\n"
            "logits = np.zeros((2, 40), np.float32)\n"
            "mask = torch.Tensor(np.array([[1 << 3, 0], [0, 1 << 2]], np.int32))\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    a = client.sample(logits, temperature=0, token_bitmask=mask).tokens.tolist()\n"
            "    b = client.sample(torch.Tensor(logits), temperature=0,\n"
            "                      token_bitmask=mask).tokens.tolist()\n"
            "print(a, b, len(caught), client.cuda_regions)\n"
            "client.close()\n"
        )
        here = os.path.dirname(os.path.abspath(__file__))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [os.path.join(here, "fake_torch"), os.path.join(ROOT, "client", "python")]))
        out = subprocess.run([sys.executable, "-c", code, TARGET], env=env, capture_output=True,
                             text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(), "[3, 34] [3, 34] 1 []")


if __name__ == "__main__":
    unittest.main()
