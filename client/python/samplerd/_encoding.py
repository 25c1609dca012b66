"""Logits into a samplerd.v1.Tensor: inline little-endian bytes (numpy arrays, torch tensors
copied to the host) or a slice of a registered region. CUDA tensors shared by GPU IPC are
_cuda.py's; the request around a tensor is SampleOptions.request's (_options.py)."""

from __future__ import annotations

from typing import Any, Tuple

import numpy as np

from ._pb import pb

_DTYPES = {
    np.dtype(np.float32): pb.DTYPE_FP32,
    np.dtype(np.float16): pb.DTYPE_FP16,
}


def _is_torch_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "dtype") and hasattr(x, "dim")


def _tensor_bytes(logits: Any) -> Tuple[int, Tuple[int, int], bytes]:
    """(dtype enum, (B, V), little-endian bytes) of a numpy array or torch tensor."""
    if _is_torch_tensor(logits):
        import torch  # lazily: the package works without torch

        t = logits.detach()
        if t.dim() == 1:
            t = t.unsqueeze(0)
        if t.dim() != 2:
            raise ValueError(f"expected logits of shape [B, V], got {tuple(t.shape)}")
        t = t.contiguous().cpu()
        shape = (int(t.shape[0]), int(t.shape[1]))
        if t.dtype == torch.bfloat16:
            return pb.DTYPE_BF16, shape, t.view(torch.int16).numpy().tobytes()
        logits = t.numpy()
    arr = np.asarray(logits)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2:
        raise ValueError(f"expected logits of shape [B, V], got {arr.shape}")
    # By kind and size, whatever the byte order (">f4" too): made little-endian below.
    dtype = _DTYPES.get(arr.dtype.newbyteorder("="))
    if dtype is None:
        raise TypeError(
            f"expected float32 or float16 logits (bfloat16 as a torch tensor), got {arr.dtype}"
        )
    arr = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
    return dtype, (arr.shape[0], arr.shape[1]), arr.tobytes()


def _inline_tensor(logits: Any) -> Any:
    """A Tensor carrying ``logits`` (numpy, or torch copied to the host) as inline bytes."""
    dtype, (batch, vocab), data = _tensor_bytes(logits)
    return pb.Tensor(dtype=dtype, shape=[batch, vocab], inline_data=data)


def _region_tensor(name: str, offset: int, dtype: int, shape: Tuple[int, int]) -> Any:
    """A Tensor of DType ``dtype`` and shape (B, V) at byte ``offset`` of region ``name``."""
    batch, vocab = shape
    return pb.Tensor(
        dtype=dtype,
        shape=[batch, vocab],
        region=pb.RegionSlice(region=name, offset=int(offset)),
    )


def _region_dtype(dtype: Any) -> Any:
    """The DType enum of a numpy dtype (float32, float16) or of an enum given as is; else None."""
    return dtype if isinstance(dtype, int) else _DTYPES.get(np.dtype(dtype))

