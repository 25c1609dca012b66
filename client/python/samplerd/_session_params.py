"""A device session's parameters: dtypes, logprob sources, the params fields and their values.

What the public DeviceSession checks before it opens anything (dtype names, logprob sources),
the per-row parameter fields of device_session.h with their numpy types, and the conversion of
sample()'s arguments (top_p_mode names, scalars or B values into a numpy params view). The torch
planes fill their device views with _TorchSteps.fill (_session_torch.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _session_layout as lay
from ._pb import pb

# name -> (DType enum, bytes per element, numpy dtype of the logits buffer). A numpy bfloat16
# session's logits buffer holds the raw bf16 bits (uint16).
_DTYPES = {
    "float32": (pb.DTYPE_FP32, 4, np.dtype(np.float32)),
    "float16": (pb.DTYPE_FP16, 2, np.dtype(np.float16)),
    "bfloat16": (pb.DTYPE_BF16, 2, np.dtype(np.uint16)),
}
_LOGPROB_SOURCES = {True: pb.LOGPROB_SOURCE_RAW, "raw": pb.LOGPROB_SOURCE_RAW,
                    "processed": pb.LOGPROB_SOURCE_PROCESSED}
# The params fields: (name in device_session.h, numpy dtype of the shm view).
_FIELDS = (
    ("seed", np.uint64),
    ("position", np.uint64),
    ("temperature", np.float32),
    ("top_k", np.int32),
    ("top_p", np.float32),
    ("min_p", np.float32),
    ("top_p_mode", np.int32),
)


def _dtype_name(dtype: Any) -> str:
    name = str(dtype).replace("torch.", "")
    name = {"float": "float32", "half": "float16", "fp32": "float32", "fp16": "float16",
            "bf16": "bfloat16"}.get(name, name)
    if name not in _DTYPES:
        raise ValueError(f"dtype: expected one of {sorted(_DTYPES)}, got {dtype!r}")
    return name


def _top_p_mode(value: Any) -> Any:
    """TopPMode number(s) of a name, a number, or a per-row sequence of either."""
    if isinstance(value, str):
        if value not in lay.TOP_P_MODES:
            raise ValueError(
                f"top_p_mode: expected one of {sorted(lay.TOP_P_MODES)}, got {value!r}")
        return lay.TOP_P_MODES[value]
    if isinstance(value, (list, tuple)):
        return [_top_p_mode(v) for v in value]
    return value


def _fill_np(view: np.ndarray, value: Any, name: str, batch: int) -> None:
    arr = np.asarray(value)
    if not (arr.ndim == 0 or arr.shape == (batch,)):
        raise ValueError(f"{name}: expected a scalar or {batch} values, got shape {arr.shape}")
    _check_values(arr, view.dtype, name)
    view[:batch] = arr


def _check_values(arr: np.ndarray, dtype: np.dtype, name: str) -> None:
    """Refuses what numpy's assignment would silently change: strings and bools, fractional
    values for an integer field, and integers outside its range (they would wrap)."""
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"{name}: expected numbers, got {arr.dtype} values")
    if dtype.kind not in "iu":
        return
    if arr.dtype.kind == "f" and not np.all(np.isfinite(arr) & (arr == np.floor(arr))):
        raise ValueError(f"{name}: expected integers, got {arr.reshape(-1)[:8].tolist()}")
    info = np.iinfo(dtype)
    values = [int(v) for v in arr.reshape(-1).tolist()]
    bad = [v for v in values if not info.min <= v <= info.max]
    if bad:
        raise ValueError(f"{name}: expected integers in [{info.min}, {info.max}], got {bad[0]}")
