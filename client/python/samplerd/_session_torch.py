"""What both torch planes of a device session share: parameters into device views, the stream
operations of a step (device_session.h, steps 1-4), typed views of a uint8 buffer, and pinning
host shm for the engine's GPU.

Nothing here imports torch: the planes pass the module in (numpy sessions need no torch).
"""

from __future__ import annotations

from typing import Any, Dict

import grpc
import numpy as np

from . import _session_layout as lay
from ._encoding import _is_torch_tensor
from ._errors import SamplerError


class _TorchSteps:
    """What both torch planes share: parameters into device views, and the stream operations."""

    def __init__(self, torch: Any, index: int) -> None:
        from ._stream_ops import stream_ops

        self.torch = torch
        self.index = index
        self.ops = stream_ops()
        with torch.cuda.device(index):
            torch.cuda.current_stream().synchronize()  # creates the device's primary context

    def fill(self, view: Any, value: Any, name: str, batch: int) -> None:
        """view[:batch] = value, enqueued on the current stream (no allocation for scalars and
        tensors)."""
        torch = self.torch
        dst = view[:batch]
        if _is_torch_tensor(value):
            v = value.reshape(-1)
            if v.numel() not in (1, batch):
                raise ValueError(f"{name}: expected a scalar or {batch} values, got {v.numel()}")
            if name == "seed" and v.dtype == getattr(torch, "uint64", None):
                v = v.view(torch.int64)
            dst.copy_(v if v.numel() == batch else v.expand(batch), non_blocking=True)
            return
        if isinstance(value, (int, float, np.integer, np.floating)):
            if name in ("seed", "position"):
                value = int(value)
                if value >= 1 << 63:
                    value -= 1 << 64
            dst.fill_(value)
            return
        arr = np.asarray(value)
        if arr.ndim == 0:
            self.fill(view, arr.item(), name, batch)
            return
        if arr.shape != (batch,):
            raise ValueError(f"{name}: expected a scalar or {batch} values, got shape {arr.shape}")
        if name in ("seed", "position"):
            arr = arr.astype(np.uint64).view(np.int64)
        dst.copy_(torch.from_numpy(np.ascontiguousarray(arr)).to(dst.dtype))  # eager only

    def stream(self) -> int:
        return int(self.torch.cuda.current_stream(self.index).cuda_stream)

    def ring_and_wait(self, stream: int, control: int, batch: int) -> None:
        """Steps 1-4 of device_session.h on ``stream``: batch, doorbell, wait done, reset done."""
        self.ops.write32(stream, control + lay.BATCH, batch)
        self.ops.write32(stream, control + lay.DOORBELL, lay.RING)
        self.ops.wait_eq32(stream, control + lay.DONE_WORD, lay.DONE)
        self.ops.write32(stream, control + lay.DONE_WORD, 0)

    def check_logits(self, logits: Any, batch: int, vocab: int, dtype: Any) -> Any:
        if not getattr(logits, "is_cuda", False):
            raise TypeError("logits: a torch device session takes CUDA tensors, got "
                            f"{type(logits).__name__} on {getattr(logits, 'device', 'the host')}")
        if logits.dim() == 1:
            logits = logits.unsqueeze(0)
        if tuple(logits.shape) != (batch, vocab):
            raise ValueError(f"logits: expected shape [B, {vocab}], got {tuple(logits.shape)}")
        if logits.dtype != dtype:
            raise TypeError(f"logits: expected {dtype} (the session's dtype), got {logits.dtype}")
        return logits


def _write_processors(torch: Any, views: Dict[str, Any], procs: Dict[str, Any],
                      batch: int) -> None:
    """Writes a step's token_bitmask rows [0, B) and processors buffer into ``views`` (CUDA
    tensors), enqueued on the current stream: CUDA tensors by copy_ (capturable), a missing
    bitmask as all ones (fill_, capturable), numpy bytes by a host-to-device copy (eager only).
    """
    if "token_bitmask" in views:
        dst = views["token_bitmask"][:batch]
        mask = procs.get("token_bitmask")
        if mask is None:
            dst.fill_(-1)
        elif _is_torch_tensor(mask) and mask.is_cuda:
            if mask.dtype != torch.int32 or tuple(mask.reshape(batch, -1).shape) != tuple(dst.shape):
                raise ValueError(f"token_bitmask: expected a CUDA int32 tensor of shape "
                                 f"{list(dst.shape)}, got {mask.dtype} {list(mask.shape)}")
            dst.copy_(mask.reshape(batch, -1), non_blocking=True)
        else:
            dst.copy_(torch.from_numpy(np.ascontiguousarray(mask).view(np.int32)).reshape(
                dst.shape))
    if "processors" in views:
        packed = procs["processors"]
        dst = views["processors"]
        if _is_torch_tensor(packed):
            if packed.dtype != torch.uint8 or packed.numel() != dst.numel():
                raise ValueError(f"processors: expected a uint8 tensor of {dst.numel()} bytes "
                                 f"(session.pack_processors), got {packed.dtype} "
                                 f"{list(packed.shape)}")
            dst.copy_(packed.reshape(-1), non_blocking=True)
        else:
            dst.copy_(torch.from_numpy(np.ascontiguousarray(packed)))


def _torch_views(torch: Any, buf: Any, layout: lay.Layout, dtype: Any) -> Dict[str, Any]:
    """Typed views of one uint8 tensor (CPU or CUDA) laid out as ``layout`` (the data buffers;
    the stream operations address the control block themselves)."""
    m, v = layout.max_batch, layout.vocab
    views = {
        "logits": buf[layout.logits:layout.logits + m * v * layout.itemsize].view(dtype).view(m, v),
        "params": buf[layout.params:layout.params + lay.params_bytes(m)],
        "token_ids": buf[layout.token_ids:layout.token_ids + 4 * m].view(torch.int32),
        "row_status": buf[layout.row_status:layout.row_status + 4 * m].view(torch.int32),
    }
    if layout.sampled_logprobs is not None:
        at = layout.sampled_logprobs
        views["sampled_logprobs"] = buf[at:at + 4 * m].view(torch.float32)
    if layout.token_bitmask is not None:
        at, w = layout.token_bitmask, lay.bitmask_words(v)
        views["token_bitmask"] = buf[at:at + 4 * m * w].view(torch.int32).view(m, w)
    if layout.processors is not None:
        at = layout.processors
        views["processors"] = buf[at:at + lay.processors_bytes(m, *layout.capacities)]
    return views


def _param_views(torch: Any, params: Any, max_batch: int) -> Dict[str, Any]:
    """Typed views of a params buffer (uint8 tensor); seeds and positions as int64."""
    kinds = {"seed": torch.int64, "position": torch.int64, "temperature": torch.float32,
             "top_k": torch.int32, "top_p": torch.float32, "min_p": torch.float32,
             "top_p_mode": torch.int32}
    offsets = lay.params_offsets(max_batch)
    out = {}
    for name, kind in kinds.items():
        size = max_batch * (8 if kind == torch.int64 else 4)
        out[name] = params[offsets[name]:offsets[name] + size].view(kind)
    return out


def _pin(steps: "_TorchSteps", address: int, nbytes: int, what: str) -> int:
    """Page-locks host memory for every GPU (cudaHostRegister, portable and mapped) and returns
    its device address on the session's GPU. Undo with _unpin."""
    from ._stream_ops import HOST_REGISTER_PORTABLE_MAPPED

    torch = steps.torch
    rc = torch.cuda.cudart().cudaHostRegister(address, nbytes, HOST_REGISTER_PORTABLE_MAPPED)
    if int(rc) != 0:
        raise SamplerError(grpc.StatusCode.FAILED_PRECONDITION,
                           f"cudaHostRegister of {what}: expected cudaSuccess, got {rc}")
    try:
        with torch.cuda.device(steps.index):
            return steps.ops.host_device_pointer(address)
    except BaseException:
        torch.cuda.cudart().cudaHostUnregister(address)
        raise


def _unpin(steps: "_TorchSteps", address: int) -> None:
    steps.torch.cuda.cudart().cudaHostUnregister(address)


def _device_index(torch: Any, device: Any) -> int:
    if device is None:
        return int(torch.cuda.current_device())
    if isinstance(device, int):
        return device
    d = torch.device(device)
    if d.type != "cuda":
        raise ValueError(f"device: expected a CUDA device, got {device!r}")
    return int(d.index) if d.index is not None else int(torch.cuda.current_device())
