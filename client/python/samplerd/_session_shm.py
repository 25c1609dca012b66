"""Host shm objects of a device session: a session layout in one host shm region with numpy
views, the control block's word indices, and the ordered stores that release a pending wait.

The control block is host memory in both planes (the host plane's shm object, the GPU plane's
one-page control shm: _session_gpu.py), so an abort is two plain stores from any thread, with
a sequentially consistent store for ``done`` on CPUs that reorder plain stores (libatomic).
"""

from __future__ import annotations

import ctypes
import itertools
import os
import platform
from typing import Any, Optional

import numpy as np

from . import _session_layout as lay
from ._host_shm import SHM_PREFIX
from ._session_params import _FIELDS

#: Numbers this process's session shm objects (the buffers here and the GPU plane's control shm).
_SERIAL = itertools.count(1)
# Indices of the control words in a uint32 view of the control block.
_W_DOORBELL, _W_BATCH = lay.DOORBELL // 4, lay.BATCH // 4
_W_DONE, _W_STEP_STATUS = lay.DONE_WORD // 4, lay.STEP_STATUS // 4


class _Atomics:
    """Sequentially consistent 4-byte stores and acquire loads (libatomic), for CPUs that
    reorder plain stores (aarch64). None on x86, whose plain stores are already in order."""

    SEQ_CST, ACQUIRE = 5, 2

    def __init__(self) -> None:
        lib = ctypes.CDLL("libatomic.so.1")
        self.store = getattr(lib, "__atomic_store_4")  # getattr: no name mangling
        self.store.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int]
        self.store.restype = None
        self.load = getattr(lib, "__atomic_load_4")
        self.load.argtypes = [ctypes.c_void_p, ctypes.c_int]
        self.load.restype = ctypes.c_uint32

    @classmethod
    def for_this_cpu(cls) -> Optional["_Atomics"]:
        if platform.machine().lower() in ("x86_64", "amd64", "i386", "i686"):
            return None
        return cls()


def _abort_atomics() -> Optional[_Atomics]:
    try:
        return _Atomics.for_this_cpu()
    except OSError:  # no libatomic: plain stores (the numpy host plane then refuses to open)
        return None


_ATOMICS = _abort_atomics()


def _store_abort(words: Optional[np.ndarray]) -> None:
    """step_status = ABORTED, then done = DONE, in a control block in host memory (uint32 view);
    done with a sequentially consistent store where plain stores may be reordered."""
    if words is None:
        return
    words[_W_STEP_STATUS] = lay.STEP_ABORTED
    if _ATOMICS is None:
        words[_W_DONE] = lay.DONE
    else:
        _ATOMICS.store(words.ctypes.data + lay.DONE_WORD, lay.DONE, _Atomics.SEQ_CST)


class _ShmBuffers:
    """A session layout in a host shm object registered as one region, with numpy views."""

    def __init__(self, client: Any, layout: lay.Layout, np_dtype: np.dtype) -> None:
        n = next(_SERIAL)
        self.region_name = f"dsession-{os.getpid()}-{n}"
        self.region = client.register_host_shm(
            self.region_name, layout.total, key=f"{SHM_PREFIX}dsession-{os.getpid()}-{n}")
        buf = self.region.array
        m, v = layout.max_batch, layout.vocab
        self.control = buf[layout.control:layout.control + lay.CONTROL_BYTES].view(np.uint32)
        self.logits = (buf[layout.logits:layout.logits + m * v * layout.itemsize]
                       .view(np_dtype).reshape(m, v))
        offsets = lay.params_offsets(m)
        self.params_bytes = buf[layout.params:layout.params + lay.params_bytes(m)]
        self.params = {
            name: self.params_bytes[offsets[name]:offsets[name] + m * np.dtype(t).itemsize].view(t)
            for name, t in _FIELDS
        }
        self.token_ids = buf[layout.token_ids:layout.token_ids + 4 * m].view(np.int32)
        self.row_status = buf[layout.row_status:layout.row_status + 4 * m].view(np.int32)
        self.sampled_logprobs = None
        if layout.sampled_logprobs is not None:
            at = layout.sampled_logprobs
            self.sampled_logprobs = buf[at:at + 4 * m].view(np.float32)
        self.token_bitmask = self.processors = None
        if layout.token_bitmask is not None:
            at, w = layout.token_bitmask, lay.bitmask_words(v)
            self.token_bitmask = buf[at:at + 4 * m * w].view(np.int32).reshape(m, w)
        if layout.processors is not None:
            at = layout.processors
            self.processors = buf[at:at + lay.processors_bytes(m, *layout.capacities)]

    @property
    def address(self) -> int:
        return int(self.region.array.ctypes.data)

    def abort(self) -> None:
        _store_abort(self.control)

    def close(self) -> None:
        """Drops the views, then unregisters, unmaps and unlinks the object."""
        self.control = self.logits = self.params_bytes = None  # type: ignore[assignment]
        self.params = {}
        self.token_ids = self.row_status = self.sampled_logprobs = None  # type: ignore
        self.token_bitmask = self.processors = None
        self.region.close()
