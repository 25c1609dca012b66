"""The Python client's encoding of the logits processors (client/python/samplerd/_processors.py,
_options.py): token bitmask, logit bias, penalties and token histories, checked on the request
messages alone (no server; the behaviour is test_processors_e2e.py's).

    client/python/generate.sh && /usr/bin/python3 -m unittest -v test_processors  # in tests/python
"""

import os
import subprocess
import sys
import unittest

import numpy as np

from server import ROOT  # first: puts client/python on sys.path

import samplerd  # noqa: E402
from samplerd._encoding import _inline_tensor  # noqa: E402
from samplerd._options import SampleOptions  # noqa: E402
from samplerd._pb import pb  # noqa: E402
from samplerd._processors import history_entries  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def request(batch=2, vocab=40, **options):
    return SampleOptions(**options).request(_inline_tensor(np.zeros((batch, vocab), np.float32)))


def words_of(message):
    return np.frombuffer(message.token_bitmask.inline_words, dtype="<i4")


class TokenBitmaskEncodingTest(unittest.TestCase):
    def test_int32_words_travel_inline_as_little_endian_bytes(self):
        mask = np.array([[1, -1], [0x10, 0]], dtype=np.int32)
        r = request(token_bitmask=mask)
        self.assertEqual(r.token_bitmask.WhichOneof("data"), "inline_words")
        np.testing.assert_array_equal(words_of(r), mask.reshape(-1))
        big_endian = mask.astype(">i4")
        np.testing.assert_array_equal(words_of(request(token_bitmask=big_endian)), mask.ravel())

    def test_uint32_words_are_the_same_bits(self):
        mask = np.array([[0xFFFFFFFF, 1], [2, 3]], dtype=np.uint32)
        np.testing.assert_array_equal(words_of(request(token_bitmask=mask)).view(np.uint32),
                                      mask.ravel())

    def test_bool_mask_is_packed_bit_t_of_word_t_over_32(self):
        allowed = np.zeros((2, 40), bool)
        allowed[0, [0, 31, 32, 39]] = True
        allowed[1, 5] = True
        words = words_of(request(token_bitmask=allowed)).view(np.uint32).reshape(2, 2)
        np.testing.assert_array_equal(words, [[1 | 1 << 31, 1 | 1 << 7], [1 << 5, 0]])

    def test_one_row_may_be_one_dimensional(self):
        r = request(batch=1, vocab=33, token_bitmask=np.array([7, 1], np.int32))
        np.testing.assert_array_equal(words_of(r), [7, 1])

    def test_wrong_shape_or_dtype_is_a_value_error_before_sending(self):
        for mask, needle in (
            (np.zeros((2, 1), np.int32), "[2, 2]"),  # V = 40 needs 2 words a row
            (np.zeros((3, 2), np.int32), "[2, 2]"),
            (np.zeros((2, 2), np.int64), "int64"),
            (np.zeros((2, 2), np.float32), "float32"),
            (np.zeros((2, 39), bool), "[2, 40]"),
        ):
            with self.assertRaises(ValueError) as caught:
                request(token_bitmask=mask)
            self.assertIn(needle, str(caught.exception))
            self.assertIn("token_bitmask", str(caught.exception))

    def test_a_prepared_region_slice_is_sent_as_is(self):
        mask = pb.TokenBitmask(region=pb.RegionSlice(region="masks", offset=64))
        r = request(token_bitmask=mask)
        self.assertEqual(r.token_bitmask.region.region, "masks")
        self.assertEqual(r.token_bitmask.region.offset, 64)

    def test_no_processor_given_sends_none(self):
        r = request(temperature=0)
        for name in ("token_bitmask", "logit_bias", "token_history"):
            self.assertFalse(r.HasField(name), name)
        self.assertFalse(r.params[0].HasField("repetition_penalty"))
        self.assertEqual(r.params[0].presence_penalty, 0)

    def test_a_fake_cuda_tensor_is_copied_inline_when_ipc_is_off(self):
        # The CUDA path itself needs a GPU (tests/gpu); here a stand-in torch (fake_torch/)
        # claims a CUDA int32 tensor: make_request copies it to the host.
        code = (
            "import numpy as np, torch, samplerd\n"
            "from samplerd._processors import host_bitmask\n"
            "m = torch.Tensor(np.array([[3, 0]], np.int32))\n"
            "print(list(np.frombuffer(host_bitmask(m, 1, 64).inline_words, '<i4')))\n"
            "try:\n"
            "    host_bitmask(torch.Tensor(np.zeros((1, 2), np.int64)), 1, 64)\n"
            "except ValueError as e:\n"
            "    print('refused', 'int32' in str(e))\n"
        )
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [os.path.join(HERE, "fake_torch"), os.path.join(ROOT, "client", "python")]))
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.split("\n")[:2], ["[3, 0]", "refused True"])


class LogitBiasEncodingTest(unittest.TestCase):
    def test_one_dict_applies_to_every_row(self):
        bias = request(batch=3, logit_bias={5: -1.0, 7: float("inf")}).logit_bias
        self.assertEqual(list(bias.row_offsets), [0, 2, 4, 6])
        self.assertEqual(list(bias.token_ids), [5, 7] * 3)
        self.assertEqual(list(bias.biases), [-1.0, float("inf")] * 3)

    def test_per_row_dicts_are_packed_with_row_offsets(self):
        bias = request(batch=3, logit_bias=[{1: 0.5}, None, {np.int64(2): 2, 3: -3}]).logit_bias
        self.assertEqual(list(bias.row_offsets), [0, 1, 1, 3])
        self.assertEqual(list(bias.token_ids), [1, 2, 3])
        self.assertEqual(list(bias.biases), [0.5, 2.0, -3.0])

    def test_wrong_number_of_rows_is_a_value_error(self):
        with self.assertRaises(ValueError) as caught:
            request(batch=2, logit_bias=[{1: 1.0}])
        self.assertIn("expected a dict for every row or 2 dicts, got 1", str(caught.exception))
        with self.assertRaises(ValueError):
            request(batch=2, logit_bias=[{1: 1.0}, [1, 2]])

    def test_keys_that_are_not_integer_token_ids_raise_naming_logit_bias(self):
        # Regression test: int(key) sent {"5": 1, 6.7: 2, True: 3} as tokens [5, 6, 1].
        for bias, error, message in (
            ({"5": 1.0}, TypeError, "logit_bias: expected integer token ids, got str '5'"),
            ({6.7: 2.0}, ValueError, "logit_bias: expected integer token ids, got 6.7"),
            ({True: 3.0}, TypeError, "logit_bias: expected integer token ids, got bool True"),
            ([{1: 1.0}, {np.bool_(True): 1.0}], TypeError, "got bool_ True"),
            ({2**31: 1.0}, ValueError, "logit_bias: expected token ids in [-2147483648, "),
        ):
            with self.subTest(bias=bias):
                with self.assertRaises(error) as caught:
                    request(logit_bias=bias)
                self.assertIn(message, str(caught.exception))
        # Numpy integers and integral floats are the token ids they hold, as for seeds.
        bias = request(logit_bias={np.int32(3): 1.0, np.uint64(4): 2.0, 5.0: 3.0}).logit_bias
        self.assertEqual(list(bias.token_ids), [3, 4, 5] * 2)

    def test_biases_that_are_not_numbers_raise_naming_logit_bias(self):
        # Regression test: the biases went through float(), so {1: "500"} sent a bias of 500 and
        # {1: True} one of 1 (the options refuse strings and bools as numbers: _options._real).
        for bias, message in (
            ({1: "500"}, "logit_bias: expected a number as the bias of token 1, got str '500'"),
            ([{1: 1.0}, {2: True}], "expected a number as the bias of token 2, got bool True"),
            ({3: None}, "expected a number as the bias of token 3, got NoneType None"),
        ):
            with self.subTest(bias=bias):
                with self.assertRaises(TypeError) as caught:
                    request(batch=2, logit_bias=bias)
                self.assertIn(message, str(caught.exception))
        bias = request(logit_bias={1: np.float32(0.5), 2: 3}).logit_bias
        self.assertEqual(list(bias.biases), [0.5, 3.0, 0.5, 3.0])


class PenaltyEncodingTest(unittest.TestCase):
    def test_history_entries_are_distinct_tokens_with_output_counts_and_prompt_flags(self):
        tokens, counts, in_prompt = history_entries([9, 4, 4], [4, 7, 7, 7])
        self.assertEqual(tokens.tolist(), [4, 7, 9])
        self.assertEqual(counts.tolist(), [1, 3, 0])
        self.assertEqual(in_prompt.tolist(), [True, False, True])

    def test_histories_are_packed_per_batch(self):
        r = request(batch=3, repetition_penalty=1.2,
                    prompt_token_ids=[[1, 2], [], np.array([5])],
                    output_token_ids=[[2, 2, 3], [8], None])
        h = r.token_history
        self.assertEqual(list(h.row_offsets), [0, 3, 4, 5])
        self.assertEqual(list(h.token_ids), [1, 2, 3, 8, 5])
        self.assertEqual(list(h.output_counts), [0, 2, 1, 1, 0])
        self.assertEqual(list(h.in_prompt), [True, True, False, False, True])

    def test_only_outputs_or_a_2d_array_are_enough(self):
        h = request(batch=2, output_token_ids=np.array([[3, 3], [1, 2]])).token_history
        self.assertEqual(list(h.row_offsets), [0, 1, 3])
        self.assertEqual(list(h.output_counts), [2, 1, 1])
        self.assertEqual(list(h.in_prompt), [False, False, False])

    def test_token_ids_that_are_not_integers_raise_naming_the_option(self):
        # Regression test: np.asarray(..., dtype=np.int64) sent [[1.5, 2.9]] as [1, 2] and
        # [[True, 7.99]] as [1, 7].
        for options, error, message in (
            (dict(output_token_ids=[[1.5, 2.9], [1]]), ValueError,
             "output_token_ids: expected integer token ids, got 1.5"),
            (dict(prompt_token_ids=[[True, 7.99], []]), TypeError,
             "prompt_token_ids: expected integer token ids, got bool True"),
            (dict(prompt_token_ids=[[4, True], []]), TypeError, "got bool True"),
            (dict(prompt_token_ids=[["7"], []]), TypeError, "got str '7'"),
            (dict(output_token_ids=np.array([[2.0], [1.5]])), ValueError, "got 1.5"),
            (dict(output_token_ids=np.ones((2, 1), bool)), TypeError, "got an array of bool"),
            (dict(output_token_ids=[[2**40], [1]]), ValueError,
             "output_token_ids: expected token ids in [-2147483648, 2147483647] (int32), "
             "got 1099511627776"),
        ):
            with self.subTest(options=options):
                with self.assertRaises(error) as caught:
                    request(**options)
                self.assertIn(message, str(caught.exception))
        # Numpy integers and integral floats are the token ids they hold, as for seeds.
        h = request(prompt_token_ids=[[7.0, np.int64(3)], np.array([2.0])],
                    output_token_ids=[np.array([4], np.uint32), []]).token_history
        self.assertEqual(list(h.token_ids), [3, 4, 7, 2])

    def test_scalar_penalties_share_one_params_entry(self):
        r = request(batch=4, temperature=0, repetition_penalty=1.3, frequency_penalty=0.5)
        self.assertEqual(len(r.params), 1)
        self.assertAlmostEqual(r.params[0].repetition_penalty, 1.3, places=6)
        self.assertEqual(r.params[0].frequency_penalty, 0.5)
        self.assertEqual(r.params[0].presence_penalty, 0)

    def test_per_row_penalties_give_one_params_entry_per_row(self):
        r = request(batch=3, seed=[1, 2, 3], presence_penalty=[0.0, 1.0, -1.0])
        self.assertEqual([p.presence_penalty for p in r.params], [0.0, 1.0, -1.0])
        self.assertEqual([p.seed for p in r.params], [1, 2, 3])
        self.assertFalse(any(p.HasField("repetition_penalty") for p in r.params))

    def test_wrong_number_of_rows_is_a_value_error(self):
        with self.assertRaises(ValueError) as caught:
            request(batch=2, output_token_ids=[[1], [2], [3]])
        self.assertIn("output_token_ids: expected 2 rows of token ids, got 3",
                      str(caught.exception))
        # A shorter one beside a full one is refused too, not read as rows without tokens.
        with self.assertRaises(ValueError) as caught:
            request(batch=2, prompt_token_ids=[[1], [2]], output_token_ids=[[3]])
        self.assertIn("output_token_ids: expected 2 rows of token ids, got 1",
                      str(caught.exception))
        with self.assertRaises(ValueError):  # a flat list is not B rows
            request(batch=2, prompt_token_ids=[1, 2])
        with self.assertRaises(ValueError):
            request(batch=2, repetition_penalty=[1.0, 1.1, 1.2])


class RegionListsTest(unittest.TestCase):
    def test_lists_pack_as_the_region_layout(self):
        bias = request(batch=2, logit_bias=[{3: 1.5}, {1: -2.0, 7: 0.25}]).logit_bias
        packed = samplerd.packed_lists(bias)
        self.assertEqual(packed.dtype, np.uint8)
        self.assertEqual(packed[:12].view("<u4").tolist(), [0, 1, 3])
        self.assertEqual(packed[12:24].view("<i4").tolist(), [3, 1, 7])
        self.assertEqual(packed[24:].view("<f4").tolist(), [1.5, -2.0, 0.25])
        history = request(batch=2, prompt_token_ids=[[4], []],
                          output_token_ids=[[4, 4], [9]]).token_history
        packed = samplerd.packed_lists(history)
        self.assertEqual(len(packed), (3 + 2 * 2) * 4 + 2)
        self.assertEqual(packed[20:28].view("<u4").tolist(), [2, 1])
        self.assertEqual(packed[28:].tolist(), [1, 0])

    def test_region_slices_are_sent_as_is(self):
        r = request(logit_bias=pb.LogitBias(region=pb.RegionSlice(region="lists", offset=8)),
                    token_history=pb.TokenHistory(region=pb.RegionSlice(region="lists")))
        self.assertEqual(r.logit_bias.region.offset, 8)
        self.assertEqual(len(r.logit_bias.token_ids), 0)
        self.assertEqual(r.token_history.region.region, "lists")

    def test_a_token_history_message_excludes_token_ids(self):
        history = pb.TokenHistory(region=pb.RegionSlice(region="lists"))
        with self.assertRaises(ValueError) as caught:
            request(token_history=history, output_token_ids=[[1], [2]])
        self.assertIn("got TokenHistory with them", str(caught.exception))
        with self.assertRaises(ValueError):
            request(token_history=[[1], [2]])


class SignatureTest(unittest.TestCase):
    def test_processors_are_keyword_only_in_every_sampling_method(self):
        import inspect

        for method in (samplerd.Client.sample, samplerd.Client.make_request,
                       samplerd.Client.sample_region, samplerd.StreamSession.step):
            params = inspect.signature(method).parameters
            for name in ("token_bitmask", "logit_bias", "repetition_penalty",
                         "presence_penalty", "frequency_penalty", "prompt_token_ids",
                         "output_token_ids", "token_history"):
                self.assertEqual(params[name].kind, inspect.Parameter.KEYWORD_ONLY, name)


if __name__ == "__main__":
    unittest.main()
