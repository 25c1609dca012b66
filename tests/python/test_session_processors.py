"""Device sessions with logits processors (token bitmask, logit bias, penalties with token
histories) on the host plane, against the real samplerd binary on the CPU backend: every
session token and row status equals unary Sample's with the same processors on the same server,
a bad processor row gets status 4 with its neighbours untouched, and bad opens of the new
buffers fail with their exact codes over gRPC.

    client/python/generate.sh && /usr/bin/python3 -m unittest discover -s tests/python -v

The GPU plane runs the same checks on a GPU machine (tests/gpu/session_checks_correctness.py).
"""

import unittest

import grpc
import numpy as np

from server import Server  # first: puts client/python on sys.path

import samplerd  # noqa: E402
from samplerd import _session_layout as lay  # noqa: E402
from samplerd._pb import pb  # noqa: E402

_server = None
TARGET = ""
VOCAB = 300
WORDS = (VOCAB + 31) // 32
MAX_BATCH = 6
CAPACITIES = {"logit_bias": 40, "token_history": 400}


def setUpModule():
    global _server, TARGET
    _server = Server().start()
    TARGET = _server.target


def tearDownModule():
    if _server is not None:
        _server.stop()


def pack_bool(allowed):
    """int32 words [B, ceil(V / 32)] of a bool mask [B, V]."""
    packed = np.zeros((allowed.shape[0], WORDS * 4), np.uint8)
    packed[:, : (VOCAB + 7) // 8] = np.packbits(allowed, axis=1, bitorder="little")
    return packed.view("<i4")


def random_step(rng, batch):
    """Logits, sampling keywords and processor keywords of one random step. Row 0 of a step
    allows one token, row 1 (B >= 3) none; the others random masks."""
    logits = (rng.standard_normal((batch, VOCAB)) * 3).astype(np.float32)
    density = rng.choice([0.02, 0.3, 0.9])
    allowed = rng.random((batch, VOCAB)) < density
    allowed[0] = False
    allowed[0, rng.integers(VOCAB)] = True
    if batch >= 3:
        allowed[1] = False
    bias = []
    for _ in range(batch):
        tokens = rng.choice(VOCAB, size=int(rng.integers(0, 6)), replace=False)
        row = {int(t): float(rng.choice([-np.inf, np.inf, rng.normal() * 2])) for t in tokens}
        bias.append(row)
    prompts = [rng.integers(0, VOCAB, size=int(rng.integers(0, 30))).tolist() for _ in range(batch)]
    outputs = [rng.integers(0, VOCAB, size=int(rng.integers(0, 30))).tolist() for _ in range(batch)]
    procs = dict(
        token_bitmask=pack_bool(allowed),
        logit_bias=bias,
        repetition_penalty=rng.uniform(0.5, 2.0, batch).astype(np.float32),
        presence_penalty=rng.uniform(-1.0, 1.0, batch).astype(np.float32),
        frequency_penalty=rng.uniform(-1.0, 1.0, batch).astype(np.float32),
        prompt_token_ids=prompts,
        output_token_ids=outputs,
    )
    return logits, allowed, procs


class SessionProcessorsTest(unittest.TestCase):
    def setUp(self):
        self.client = samplerd.Client(TARGET)

    def tearDown(self):
        self.client.close()

    def session(self, **kwargs):
        kwargs.setdefault("max_batch", MAX_BATCH)
        kwargs.setdefault("vocab", VOCAB)
        kwargs.setdefault("token_bitmask", True)
        kwargs.setdefault("processors", CAPACITIES)
        return self.client.device_session(**kwargs)

    def test_200_steps_with_every_processor_match_unary_sample(self):
        rng = np.random.default_rng(20)
        statuses = set()
        rows = equal = 0
        with self.session() as s:
            for step in range(200):
                batch = int(rng.integers(1, MAX_BATCH + 1))
                logits, allowed, procs = random_step(rng, batch)
                seeds = rng.integers(0, 1 << 62, size=batch, dtype=np.uint64)
                greedy = step % 2 == 0
                kw = dict(temperature=0.0) if greedy else dict(temperature=0.9, top_k=40,
                                                               top_p=0.95, min_p=0.01)
                tokens, status = s.sample(logits, seeds=seeds, positions=step, **kw, **procs)
                want = self.client.sample(logits, seed=seeds, position=step, **kw, **procs)
                np.testing.assert_array_equal(status, want.row_status, f"step {step}")
                statuses.update(status.tolist())
                self.assertEqual(tokens[0] if status[0] == 1 else -1,
                                 int(np.flatnonzero(allowed[0])[0]) if status[0] == 1 else -1)
                if batch >= 3:
                    self.assertEqual((status[1], tokens[1]), (lay.ROW_INVALID_NO_ALLOWED, -1))
                ok = status == 1
                self.assertTrue(np.all(allowed[ok, tokens[ok]]), f"step {step}: a banned token")
                if greedy:
                    np.testing.assert_array_equal(tokens, want.tokens, f"step {step}")
                else:
                    rows += batch
                    equal += int(np.sum(tokens == want.tokens))
        self.assertIn(1, statuses)
        self.assertIn(lay.ROW_INVALID_NO_ALLOWED, statuses)
        self.assertGreaterEqual(equal, 0.999 * rows, f"{equal} of {rows} seeded rows equal")

    def test_bias_to_minus_inf_bans_and_penalties_move_the_argmax_as_unary(self):
        logits = np.array([[5.0, 4.0, 3.0, -1.0] + [-9.0] * (VOCAB - 4)] * 3, np.float32)
        with self.session() as s:
            cases = [
                dict(logit_bias={0: -np.inf}),  # token 0 banned: 1 wins
                dict(repetition_penalty=2.0, prompt_token_ids=[[0]] * 3),  # 5 / 2 < 4
                dict(frequency_penalty=1.5, output_token_ids=[[0, 1]] * 3),  # 3.5, 2.5, 3
                dict(presence_penalty=2.0, output_token_ids=[[0]] * 3),  # 3 < 4
                dict(repetition_penalty=0.5, prompt_token_ids=[[3]] * 3,
                     logit_bias={3: 3.0}),  # (-1 + 3) / 0.5 = 4, as token 1
            ]
            for kw in cases:
                tokens, status = s.sample(logits, temperature=0.0, seeds=1, positions=0, **kw)
                want = self.client.sample(logits, temperature=0.0, seed=1, position=0, **kw)
                np.testing.assert_array_equal(tokens, want.tokens, str(kw))
                np.testing.assert_array_equal(status, [1, 1, 1], str(kw))
            self.assertEqual(s.sample(logits, temperature=0.0, seeds=1, positions=0,
                                      logit_bias={0: -np.inf})[0].tolist(), [1, 1, 1])
            # Without processors the next step is unprocessed again.
            self.assertEqual(s.sample(logits, temperature=0.0, seeds=1, positions=0)[0].tolist(),
                             [0, 0, 0])

    def test_a_bad_processor_row_mid_batch_gets_status_4_and_its_neighbours_equal_unary(self):
        rng = np.random.default_rng(21)
        batch = 5
        logits = (rng.standard_normal((batch, VOCAB)) * 3).astype(np.float32)
        good = dict(logit_bias=[{5: 1.0, 9: -2.0}] * batch, repetition_penalty=1.3,
                    presence_penalty=0.5, frequency_penalty=0.25,
                    prompt_token_ids=[[1, 2, 3]] * batch, output_token_ids=[[3, 4, 4]] * batch)
        m, (nb, nh) = MAX_BATCH, (CAPACITIES["logit_bias"], CAPACITIES["token_history"])
        at = lay.processors_offsets(m, nb, nh)

        def field(buf, name, dtype, count):
            return buf[at[name]:at[name] + count * np.dtype(dtype).itemsize].view(dtype)

        # Each row has bias entries [2r, 2r + 2) and history entries [4r, 4r + 4). A break
        # names the row it breaks: offsets are shared by neighbouring rows, so those of the last
        # row of the batch (offsets[B] starts no row of the step) are broken there.
        def put(name, dtype, count, index, value):
            return lambda b: field(b, name, dtype, count).__setitem__(index, value)

        breaks = {
            "repetition 0": (2, put("repetition", "<f4", m, 2, 0.0)),
            "repetition NaN": (2, put("repetition", "<f4", m, 2, np.nan)),
            "presence 3": (2, put("presence", "<f4", m, 2, 3.0)),
            "frequency -inf": (2, put("frequency", "<f4", m, 2, -np.inf)),
            "bias token V": (2, put("bias_tokens", "<i4", nb, 5, VOCAB)),
            "bias token -1": (2, put("bias_tokens", "<i4", nb, 4, -1)),
            "bias unsorted": (2, put("bias_tokens", "<i4", nb, 5, 4)),
            "bias twice": (2, put("bias_tokens", "<i4", nb, 5, 5)),
            "bias NaN": (2, put("biases", "<f4", nb, 4, np.nan)),
            "bias offsets decrease": (4, put("bias_offsets", "<u4", m + 1, 5, 7)),
            "bias past capacity": (4, put("bias_offsets", "<u4", m + 1, 5, nb + 1)),
            "history token V": (2, put("history_tokens", "<i4", nh, 11, VOCAB)),
            "history unsorted": (2, put("history_tokens", "<i4", nh, 9, 0)),
            "in_prompt 2": (2, lambda b: b.__setitem__(at["in_prompt"] + 9, 2)),
            "history offsets decrease": (4, put("history_offsets", "<u4", m + 1, 5, 15)),
            "history past capacity": (4, put("history_offsets", "<u4", m + 1, 5, nh + 1)),
        }
        want = self.client.sample(logits, temperature=0.7, seed=3, position=4, **good)
        with self.session() as s:
            packed = s.pack_processors(batch, **good)
            self.assertEqual(field(packed, "bias_offsets", "<u4", m + 1).tolist(),
                             [0, 2, 4, 6, 8, 10, 10])
            self.assertEqual(field(packed, "history_offsets", "<u4", m + 1).tolist(),
                             [0, 4, 8, 12, 16, 20, 20])
            tokens, status = s.sample(logits, temperature=0.7, seeds=3, positions=4,
                                      processors=packed)
            np.testing.assert_array_equal(tokens, want.tokens)
            np.testing.assert_array_equal(status, [1] * batch)
            for name, (row, apply) in breaks.items():
                bad = packed.copy()
                apply(bad)
                tokens, status = s.sample(logits, temperature=0.7, seeds=3, positions=4,
                                          processors=bad)
                want_status = [1] * batch
                want_status[row] = lay.ROW_INVALID_PARAMS
                self.assertEqual(status.tolist(), want_status, name)
                self.assertEqual(tokens[row], -1, name)
                neighbours = [i for i in range(batch) if i != row]
                np.testing.assert_array_equal(tokens[neighbours], want.tokens[neighbours], name)

    def test_rows_overlapping_a_bad_row_are_rejected_only_past_the_capacity(self):
        # NB = 40, NH = 0. Row 1's bias offsets decrease (30 -> 10), so rows 0 and 2 both claim
        # entries [10, 30): valid each, but their 60 merged entries overrun NB + NH = 40. In row
        # order, row 0's 30 fit and row 2's do not: row 2 gets status 4 too.
        logits = (np.random.default_rng(22).standard_normal((3, VOCAB)) * 3).astype(np.float32)
        with self.session(processors={"logit_bias": 40, "token_history": 0},
                          token_bitmask=False) as s:
            m, at = MAX_BATCH, lay.processors_offsets(MAX_BATCH, 40, 0)
            buf = s.pack_processors(3)
            offsets = buf[at["bias_offsets"]:at["bias_offsets"] + 4 * (m + 1)].view("<u4")
            offsets[:4] = [0, 30, 10, 40]
            tokens = buf[at["bias_tokens"]:at["bias_tokens"] + 4 * 40].view("<i4")
            tokens[:10] = np.arange(10)  # row 0: 0..9, 100..119; row 2: 100..129 (sorted)
            tokens[10:40] = np.arange(100, 130)
            biases = buf[at["biases"]:at["biases"] + 4 * 40].view("<f4")
            biases[:] = 1.0
            got, status = s.sample(logits, temperature=0.0, seeds=1, positions=0, processors=buf)
            self.assertEqual(status.tolist(), [1, 4, 4])
            self.assertEqual(got[1:].tolist(), [-1, -1])
            offsets[:4] = [0, 30, 30, 40]  # the same rows without the overlap: all fit
            got, status = s.sample(logits, temperature=0.0, seeds=1, positions=0, processors=buf)
            self.assertEqual(status.tolist(), [1, 1, 1])

    def test_a_session_without_the_buffers_refuses_processor_arguments(self):
        logits = np.zeros((1, VOCAB), np.float32)
        with self.client.device_session(max_batch=MAX_BATCH, vocab=VOCAB) as s:
            for kw in (dict(token_bitmask=np.full((1, WORDS), -1, np.int32)),
                       dict(logit_bias={1: 1.0}), dict(repetition_penalty=1.2),
                       dict(prompt_token_ids=[[1]])):
                with self.assertRaises(ValueError, msg=str(kw)):
                    s.sample(logits, temperature=0.0, seeds=1, positions=0, **kw)
            # The penalties' off values need no buffer.
            tokens, _ = s.sample(logits, temperature=0.0, seeds=1, positions=0,
                                 repetition_penalty=1.0, presence_penalty=0.0)
            self.assertEqual(tokens.tolist(), [0])
        with self.session(processors={"logit_bias": 2, "token_history": 0}) as s:
            with self.assertRaisesRegex(ValueError, "at most 2 entries"):
                s.sample(logits, temperature=0.0, seeds=1, positions=0,
                         logit_bias={1: 1.0, 2: 1.0, 3: 1.0})

    def test_histories_with_another_number_of_rows_than_the_batch_are_refused(self):
        # One output row for 3 prompts would otherwise be broadcast to every row's offsets.
        with self.session() as s:
            with self.assertRaises(ValueError) as caught:
                s.pack_processors(3, prompt_token_ids=[[1], [2], [3]], output_token_ids=[[4]])
            self.assertIn("output_token_ids: expected 3 rows of token ids, got 1",
                          str(caught.exception))
            with self.assertRaises(ValueError) as caught:
                s.pack_processors(2, prompt_token_ids=[[1], [2], [3]])
            self.assertIn("prompt_token_ids: expected 2 rows of token ids, got 3",
                          str(caught.exception))

    def test_token_ids_that_are_not_integers_raise_as_in_unary_calls(self):
        # Regression test: int() packed the bias key True as token 1 and 2.5 as 2.
        logits = np.zeros((1, VOCAB), np.float32)
        with self.session() as s:
            for kw, error in ((dict(logit_bias={True: 1.0}), TypeError),
                              (dict(logit_bias={2.5: 1.0}), ValueError),
                              (dict(output_token_ids=[[1.5]]), ValueError)):
                with self.subTest(kw=kw), self.assertRaises(error):
                    s.sample(logits, temperature=0.0, seeds=1, positions=0,
                             repetition_penalty=1.2, **kw)
            tokens, _ = s.sample(logits, temperature=0.0, seeds=1, positions=0,
                                 logit_bias={np.int64(3): 1.0, 4.0: 2.0})
            self.assertEqual(tokens.tolist(), [4])

    def test_the_server_says_it_applies_processors_and_the_client_checks_it(self):
        self.assertTrue(self.client.server_info().device_sessions.processors)
        info = pb.GetServerInfoResponse()
        info.CopyFrom(self.client._cached_server_info())
        info.device_sessions.processors = False  # as a server from before processors says
        self.client._cached_server_info = lambda: info
        with self.assertRaises(samplerd.SamplerError) as caught:
            self.session()
        self.assertEqual(caught.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
        with self.client.device_session(max_batch=MAX_BATCH, vocab=VOCAB) as s:  # none asked
            self.assertEqual(s.plane, "host")

    def test_bad_opens_of_the_processor_buffers_have_exact_codes(self):
        layout = lay.Layout.of(MAX_BATCH, VOCAB, 4, False, bitmask=True, capacities=(8, 16))
        name = "procs-bad-open"
        region = self.client.register_host_shm(name, layout.total)
        try:
            def open_with(**changes):
                msg = pb.DeviceSessionOpen(dtype=pb.DTYPE_FP32, max_batch=MAX_BATCH, vocab=VOCAB,
                                           logit_bias_capacity=8, token_history_capacity=16,
                                           **layout.slices(pb, name))
                for key, value in changes.items():
                    if isinstance(value, tuple):
                        getattr(msg, key).offset = value[0]
                    else:
                        setattr(msg, key, value)
                calls = self.client._stub.DeviceSession(
                    iter([pb.DeviceSessionRequest(open=msg)]), timeout=10)
                with self.assertRaises(grpc.RpcError) as caught:
                    for _ in calls:
                        pass
                return caught.exception.code(), caught.exception.details()

            procs_bytes = lay.processors_bytes(MAX_BATCH, 8, 16)
            code, details = open_with(processors=(layout.total - procs_bytes + 4,))
            self.assertEqual(code, grpc.StatusCode.OUT_OF_RANGE, details)
            self.assertIn(f"DeviceSessionOpen.processors (samplerd_processors_bytes(max_batch "
                          f"{MAX_BATCH}, logit_bias_capacity 8, token_history_capacity 16) "
                          f"bytes): expected {procs_bytes} bytes", details)
            code, details = open_with(token_history_capacity=10 ** 6)
            self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, details)
            self.assertIn("token_history_capacity <= max_batch * vocab", details)
            code, details = open_with(token_bitmask=(layout.token_bitmask + 2,))
            self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, details)
            self.assertIn("expected DeviceSessionOpen.token_bitmask aligned to 4 bytes", details)
            code, details = open_with(processors=(layout.logits,))
            self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, details)
            self.assertIn("expected buffers that do not overlap, got DeviceSessionOpen.logits and "
                          "DeviceSessionOpen.processors", details)
        finally:
            region.close()


if __name__ == "__main__":
    unittest.main()
