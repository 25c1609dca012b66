"""A device session's logits processors: the capacities asked for at open, and the bytes of its
processors buffer (proto/samplerd/v1/device_session.h) from sample()'s Python values.

The processors buffer holds, for max_batch M and the capacities NB (bias entries) and NH
(history entries) of all rows: float32 repetition / presence / frequency penalties [M], the
logit-bias lists (uint32 row offsets [M + 1], int32 token ids [NB], float32 biases [NB]) and the
token histories (uint32 row offsets [M + 1], int32 token ids [NH], uint32 output counts [NH],
uint8 in_prompt [NH]). Each row's token ids are sorted and unique (the server checks it: an
unsorted row gets status 4), which pack() guarantees. The server checks ranges per row on
every step (bad row: status 4, token -1); pack() checks only what it must to write the bytes:
row counts and the capacities.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from . import _session_layout as lay
from ._processors import _rows, history_entries, token_id_array

#: processors=True: this many bias and history entries per row of max_batch (at most V each).
DEFAULT_BIAS_PER_ROW = 64
DEFAULT_HISTORY_PER_ROW = 2048


def capacities(processors: Any, max_batch: int, vocab: int) -> Optional[Tuple[int, int]]:
    """(NB, NH) for device_session(processors=...): False / None = no processors buffer; True =
    the defaults per row; a dict {"logit_bias": NB, "token_history": NH} or a pair (NB, NH)."""
    if processors is None or processors is False:
        return None
    if processors is True:
        per_row = (min(DEFAULT_BIAS_PER_ROW, vocab), min(DEFAULT_HISTORY_PER_ROW, vocab))
        return per_row[0] * max_batch, per_row[1] * max_batch
    if isinstance(processors, dict):
        unknown = set(processors) - {"logit_bias", "token_history"}
        if unknown:
            raise ValueError("processors: expected keys 'logit_bias' and 'token_history', got "
                             f"{sorted(unknown)}")
        nb, nh = processors.get("logit_bias", 0), processors.get("token_history", 0)
    else:
        try:
            nb, nh = processors
        except (TypeError, ValueError):
            raise ValueError("processors: expected False, True, (NB, NH) or a dict of "
                             f"capacities, got {processors!r}") from None
    nb, nh = int(nb), int(nh)
    if nb < 0 or nh < 0:
        raise ValueError(f"processors: expected capacities >= 0, got ({nb}, {nh})")
    return nb, nh


def _per_row(value: Any, name: str, batch: int) -> np.ndarray:
    arr = np.asarray(value, np.float32)
    if arr.ndim == 0:
        return np.full(batch, arr, np.float32)
    if arr.shape != (batch,):
        raise ValueError(f"{name}: expected a scalar or {batch} values, got shape {arr.shape}")
    return arr


def _bias_rows(bias: Any, batch: int):
    """B (sorted token ids, biases) pairs of a logit_bias argument (a dict for every row, or B
    dicts / None)."""
    if bias is None:
        rows = [None] * batch
    elif isinstance(bias, dict):
        rows = [bias] * batch
    else:
        rows = list(bias)
        if len(rows) != batch:
            raise ValueError(
                f"logit_bias: expected a dict for every row or {batch} dicts, got {len(rows)}")
    out = []
    for i, row in enumerate(rows):
        if row is not None and not isinstance(row, dict):
            raise ValueError(
                f"logit_bias: expected a dict {{token: bias}} for row {i}, got "
                f"{type(row).__name__}")
        row = row or {}
        tokens = token_id_array("logit_bias", list(row)).tolist()
        items = sorted(zip(tokens, (float(b) for b in row.values())))
        out.append((np.asarray([t for t, _ in items], np.int64),
                    np.asarray([b for _, b in items], np.float32)))
    return out


def pack(layout: lay.Layout, batch: int, logit_bias: Any = None, repetition_penalty: Any = 1.0,
         presence_penalty: Any = 0.0, frequency_penalty: Any = 0.0,
         prompt_token_ids: Any = None, output_token_ids: Any = None) -> np.ndarray:
    """The processors buffer (uint8, processors_bytes(M, NB, NH)) for rows [0, B): penalties
    (scalars or B values), logit_bias (as Client.sample takes it) and the token histories of
    B prompts and outputs (as Client.sample takes them). Rows [B, M) are empty. Raises
    ValueError for a wrong number of rows or lists longer than the session's capacities."""
    if layout.processors is None:
        raise ValueError("processors: expected a session opened with processors=..., got one "
                         "without a processors buffer")
    m, nb, nh = layout.max_batch, layout.bias_capacity, layout.history_capacity
    at = lay.processors_offsets(m, nb, nh)
    buf = np.zeros(at["total"], np.uint8)

    def view(name: str, dtype: Any, count: int) -> np.ndarray:
        return buf[at[name]:at[name] + count * np.dtype(dtype).itemsize].view(dtype)

    view("repetition", "<f4", m)[:] = 1.0
    view("repetition", "<f4", m)[:batch] = _per_row(repetition_penalty, "repetition_penalty",
                                                      batch)
    view("presence", "<f4", m)[:batch] = _per_row(presence_penalty, "presence_penalty", batch)
    view("frequency", "<f4", m)[:batch] = _per_row(frequency_penalty, "frequency_penalty", batch)

    def lists(prefix: str, rows: list, fields: Tuple[Tuple[str, str], ...], capacity: int,
              what: str) -> None:
        """Row offsets and the concatenated fields of B rows of parallel arrays."""
        counts = np.asarray([len(row[0]) for row in rows], np.int64)
        n = int(counts.sum())
        if n > capacity:
            raise ValueError(f"{what}: expected at most {capacity} entries over all rows (the "
                             f"session's capacity), got {n}")
        offsets = view(prefix + "_offsets", "<u4", m + 1)
        offsets[1:batch + 1] = np.cumsum(counts)
        offsets[batch + 1:] = offsets[batch]
        for i, (name, dtype) in enumerate(fields):
            if n:
                view(name, dtype, capacity)[:n] = np.concatenate([row[i] for row in rows])

    lists("bias", _bias_rows(logit_bias, batch), (("bias_tokens", "<i4"), ("biases", "<f4")),
          nb, "logit_bias")
    prompts = _rows("prompt_token_ids", prompt_token_ids, batch)
    outputs = _rows("output_token_ids", output_token_ids, batch)
    lists("history", [history_entries(p, o) for p, o in zip(prompts, outputs)],
          (("history_tokens", "<i4"), ("output_counts", "<u4"), ("in_prompt", "u1")), nh,
          "prompt_token_ids, output_token_ids (distinct tokens per row)")
    return buf
