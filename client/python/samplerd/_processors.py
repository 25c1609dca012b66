"""The logits processors of a request (processors.proto) from Python values: the allowed-token
bitmask, logit bias and the token histories of the penalties.

The server applies them per row, before temperature and every filter: logit bias, then the
repetition / presence / frequency penalties on the row's token history, then the bitmask
(docs/DESIGN.md, "Logits processors"). Here they are only encoded; the server checks ranges
(token ids in [0, V), penalty values) and answers INVALID_ARGUMENT with its own message. What is
checked here is what only the client can see: shapes, dtypes and counts of rows, and token ids
that are not integers (encoding them would change them: int(1.5) is 1, int(True) is 1).

A CUDA bitmask tensor is not encoded here: Client sends it as a GPU IPC region slice (_cuda.py).
Bias lists and histories may also lie in a registered region: packed_lists gives the bytes to
write there, and a LogitBias / TokenHistory message naming the slice is sent as is.
"""

from __future__ import annotations

import numbers
from typing import Any, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ._encoding import _is_torch_tensor
from ._pb import pb

#: {token id: bias} for every row, or one such mapping (or None) per row.
LogitBias = Union[Mapping[int, float], Sequence[Optional[Mapping[int, float]]]]
#: One sequence of token ids per row (a list of lists, or a 2-D integer array).
TokenIds = Union[Sequence[Sequence[int]], np.ndarray]


def token_id_array(name: str, ids: Any) -> np.ndarray:
    """``ids`` (a sequence or array of token ids; None: none) as a flat int64 array. As for the
    integer options (_options._integer): TypeError for a string, a bool or another non-number
    (a bool or non-numeric array too), ValueError for a fractional value (7.0 is 7) or one
    outside int32, the proto's type; each error names ``name``. The server checks [0, V)."""
    if ids is None:
        return np.zeros(0, np.int64)
    if not isinstance(ids, np.ndarray) and not _is_torch_tensor(ids):
        ids = ids if isinstance(ids, (list, tuple)) else list(ids)
        # Per type, not per value; np.asarray would turn True into 1 among ints.
        for kind in set(map(type, ids)):
            if issubclass(kind, (bool, np.bool_)) or not issubclass(kind, numbers.Real):
                value = next(v for v in ids if type(v) is kind)
                raise TypeError(
                    f"{name}: expected integer token ids, got {kind.__name__} {value!r}"
                )
    arr = np.asarray(ids).reshape(-1)
    if arr.dtype == object:  # Python numbers beyond int64 (or Fractions): checked below
        arr = arr.astype(np.float64)
    if arr.size == 0:
        return np.zeros(0, np.int64)
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"{name}: expected integer token ids, got an array of {arr.dtype}")
    if arr.dtype.kind == "f":
        fractional = ~np.isfinite(arr) | (arr != np.trunc(arr))
        if fractional.any():
            raise ValueError(
                f"{name}: expected integer token ids, got {float(arr[fractional][0])!r}"
            )
    low, high = -(2**31), 2**31 - 1
    for value in (arr.min(), arr.max()):
        if not low <= value <= high:
            raise ValueError(
                f"{name}: expected token ids in [{low}, {high}] (int32), got {int(value)}"
            )
    return arr.astype(np.int64)


def bitmask_words(vocab: int) -> int:
    """Words per row of an allowed-token bitmask: ceil(V / 32)."""
    return (int(vocab) + 31) // 32


def check_bitmask_shape(shape: Tuple[int, ...], batch: int, vocab: int) -> None:
    """Raises ValueError unless ``shape`` is [B, ceil(V / 32)] (or [ceil(V / 32)] when B = 1)."""
    words = bitmask_words(vocab)
    shape = tuple(int(n) for n in shape)
    if shape == (batch, words) or (batch == 1 and shape == (words,)):
        return
    raise ValueError(
        f"token_bitmask: expected int32 words of shape [B, ceil(V / 32)] = [{batch}, {words}] "
        f"for logits [{batch}, {vocab}], got {list(shape)}"
    )


def host_bitmask(mask: Any, batch: int, vocab: int) -> Any:
    """A TokenBitmask carrying ``mask`` inline: bit t % 32 of word t / 32 of a row is set when
    token t is allowed (xgrammar's and vLLM's layout).

    ``mask`` is a samplerd.v1.TokenBitmask (sent as is, e.g. a region slice), a numpy int32 /
    uint32 array [B, ceil(V / 32)], a numpy bool array [B, V] (True = allowed; packed here), or a
    torch int32 tensor (a CUDA one is copied to the host). Raises ValueError for another shape
    or dtype.
    """
    if isinstance(mask, pb.TokenBitmask):
        return mask
    words = bitmask_array(mask, batch, vocab)
    return pb.TokenBitmask(inline_words=words.tobytes())


def bitmask_array(mask: Any, batch: int, vocab: int) -> np.ndarray:
    """``mask`` (a numpy int32 / uint32 array [B, ceil(V / 32)], a bool array [B, V], or a torch
    int32 tensor) as little-endian words [B, ceil(V / 32)] (or [ceil(V / 32)] when B = 1 and
    the mask is 1-D). Raises ValueError for another shape or dtype."""
    if _is_torch_tensor(mask):
        import torch  # lazily: a torch tensor means torch is there

        if mask.dtype != torch.int32:
            raise ValueError(f"token_bitmask: expected a torch int32 tensor, got {mask.dtype}")
        check_bitmask_shape(tuple(mask.shape), batch, vocab)
        mask = mask.detach().contiguous().cpu().numpy()
    arr = np.asarray(mask)
    if arr.dtype == np.bool_:
        arr = _pack_bool(arr, batch, vocab)
    if arr.dtype.kind not in "iu" or arr.dtype.itemsize != 4:  # int32 / uint32, any order
        raise ValueError(
            f"token_bitmask: expected int32 words [B, ceil(V / 32)] or bool [B, V], got {arr.dtype}"
        )
    check_bitmask_shape(arr.shape, batch, vocab)
    return np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))


def _pack_bool(allowed: np.ndarray, batch: int, vocab: int) -> np.ndarray:
    """uint32 words [B, ceil(V / 32)] of a bool mask [B, V] (or [V] when B = 1)."""
    if allowed.ndim == 1 and batch == 1:
        allowed = allowed[None, :]
    if allowed.shape != (batch, vocab):
        raise ValueError(
            f"token_bitmask: expected a bool mask of shape [B, V] = [{batch}, {vocab}], "
            f"got {list(allowed.shape)}"
        )
    words = bitmask_words(vocab)
    packed = np.zeros((batch, words * 4), np.uint8)
    packed[:, : (vocab + 7) // 8] = np.packbits(allowed, axis=1, bitorder="little")
    return packed.view("<u4")


def logit_bias_message(bias: LogitBias, batch: int) -> Any:
    """The LogitBias of ``bias``: a mapping {token id: bias} applied to every row, or B mappings
    (None or {} for a row without bias). Raises ValueError for a wrong number of rows."""
    if isinstance(bias, pb.LogitBias):
        return bias
    if isinstance(bias, Mapping):
        rows: Sequence[Optional[Mapping[int, float]]] = [bias] * batch
    else:
        rows = list(bias)
        if len(rows) != batch:
            raise ValueError(
                f"logit_bias: expected a dict for every row or {batch} dicts, got {len(rows)}"
            )
    message = pb.LogitBias()
    offsets, tokens, values = [0], [], []
    for i, row in enumerate(rows):
        if row is not None and not isinstance(row, Mapping):
            raise ValueError(
                f"logit_bias: expected a dict {{token: bias}} for row {i}, got {type(row).__name__}"
            )
        row = row or {}
        tokens.extend(token_id_array("logit_bias", list(row)).tolist())
        for token, value in row.items():
            # As for the options (_options._real): float("500") or float(True) would pass.
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
                raise TypeError(
                    f"logit_bias: expected a number as the bias of token {token!r}, got "
                    f"{type(value).__name__} {value!r}"
                )
            values.append(float(value))
        offsets.append(len(tokens))
    message.row_offsets.extend(offsets)
    message.token_ids.extend(tokens)
    message.biases.extend(values)
    return message


def history_entries(
    prompt: Optional[Sequence[int]], output: Optional[Sequence[int]]
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One row's sparse penalty entries: (token ids, sorted and unique; their output counts;
    whether each is in the prompt) of the tokens in ``prompt`` or ``output``. Raises TypeError
    or ValueError for token ids that are not integers (token_id_array)."""
    p = np.unique(token_id_array("prompt_token_ids", prompt))
    o, counts = np.unique(token_id_array("output_token_ids", output), return_counts=True)
    tokens = np.union1d(p, o)
    output_counts = np.zeros(tokens.shape, np.uint32)
    output_counts[np.searchsorted(tokens, o)] = counts
    return tokens, output_counts, np.isin(tokens, p)


def _rows(name: str, ids: Optional[TokenIds], batch: int) -> Sequence[Any]:
    """``ids`` as B rows (B Nones when not given); ValueError for another number of rows."""
    if ids is None:
        return [None] * batch
    if isinstance(ids, np.ndarray) and ids.ndim == 2:
        rows = list(ids)
    else:
        rows = list(ids)
        for i, row in enumerate(rows):
            if row is not None and np.ndim(row) != 1:
                raise ValueError(
                    f"{name}: expected one sequence of token ids per row, got "
                    f"{type(row).__name__} for row {i}"
                )
    if len(rows) != batch:
        raise ValueError(f"{name}: expected {batch} rows of token ids, got {len(rows)}")
    return rows


def token_history_message(
    prompt_token_ids: Optional[TokenIds], output_token_ids: Optional[TokenIds], batch: int
) -> Any:
    """The TokenHistory of B prompts and B outputs (either may be None: no tokens). Each row's
    entries are its distinct tokens with their output count and whether the prompt has them.
    Raises ValueError for a wrong number of rows."""
    prompts = _rows("prompt_token_ids", prompt_token_ids, batch)
    outputs = _rows("output_token_ids", output_token_ids, batch)
    entries = [history_entries(p, o) for p, o in zip(prompts, outputs)]
    offsets = np.zeros(batch + 1, np.int64)
    offsets[1:] = np.cumsum([len(t) for t, _, _ in entries])
    message = pb.TokenHistory()
    message.row_offsets.extend(offsets.tolist())
    if entries and offsets[-1]:
        message.token_ids.extend(np.concatenate([t for t, _, _ in entries]).tolist())
        message.output_counts.extend(np.concatenate([c for _, c, _ in entries]).tolist())
        message.in_prompt.extend(np.concatenate([p for _, _, p in entries]).tolist())
    return message


def packed_lists(message: Any) -> np.ndarray:
    """The bytes (uint8) of a LogitBias or TokenHistory message's lists packed as its ``region``
    field expects (processors.proto): uint32 row_offsets[B + 1], int32 token_ids[N], then
    float32 biases[N], or uint32 output_counts[N] and uint8 in_prompt[N]; little-endian. Write
    them at a 4-aligned offset of a registered region, e.g.
    ``client.register_host_shm(name, packed_lists(message))``."""
    parts = [np.asarray(message.row_offsets, "<u4"), np.asarray(message.token_ids, "<i4")]
    if isinstance(message, pb.LogitBias):
        parts.append(np.asarray(message.biases, "<f4"))
    else:
        parts += [np.asarray(message.output_counts, "<u4"), np.asarray(message.in_prompt, "u1")]
    return np.concatenate([p.view(np.uint8) for p in parts])
