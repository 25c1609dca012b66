"""The host plane of a device session: the session's buffers in one host shm object, sampled by
the server on its CPU threads.

_NumpyHostPlane (numpy logits) runs the engine side of a step on the calling thread: it writes
the shm buffers, rings, spins on ``done`` and returns numpy copies. _TorchHostPlane (CUDA
logits) pins the shm object and enqueues the copies and flags on the engine's stream.
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, Optional, Tuple

import grpc
import numpy as np

from . import _session_layout as lay
from ._encoding import _is_torch_tensor
from ._errors import SamplerError
from ._pb import pb
from ._session_params import _DTYPES, _FIELDS, _fill_np
from ._session_shm import _W_BATCH, _W_DONE, _W_DOORBELL, _W_STEP_STATUS, _Atomics, _ShmBuffers
from ._session_torch import (_param_views, _pin, _torch_views, _TorchSteps, _unpin,
                             _write_processors)
from ._session_watch import _aborted, _open_message, _Plane

#: numpy sessions spin this long on `done` before sleeping _SLEEP_S between polls. Spinning
#: costs a core; with fewer than 4 the spin starves the server's own threads (measured on a busy
#: 2-core machine: p50 3.7 ms per step spinning 1 ms, 0.75 ms sleeping at once), so none there.
_SPIN_S = 0.001 if (os.cpu_count() or 1) >= 4 else 0.0
_SLEEP_S = 0.00005


class _NumpyHostPlane(_Plane):
    """The host plane for numpy logits: the engine side runs on the calling thread."""

    name = "host"

    def __init__(self, client: Any, layout: lay.Layout, dtype: str, logprob_source: Optional[int],
                 step_timeout: float, spin_s: Optional[float]) -> None:
        super().__init__()
        self.spin_s = _SPIN_S if spin_s is None else float(spin_s)
        enum, _, np_dtype = _DTYPES[dtype]
        self.layout = layout
        self.step_timeout = step_timeout
        self.buffers = _ShmBuffers(client, layout, np_dtype)
        try:
            self._atomics = _Atomics.for_this_cpu()
            self._open(client, _open_message(layout, enum, logprob_source, self.buffers.region_name,
                                             pb.DEVICE_PLANE_HOST, ""))
        except BaseException:
            self.buffers.close()
            raise

    def _write_abort(self) -> None:
        if self.buffers.control is not None:
            self.buffers.abort()

    def sample(self, logits: Any, batch: int, params: Dict[str, Any],
               procs: Dict[str, Any]) -> Tuple[np.ndarray, np.ndarray]:
        b = self.buffers
        if _is_torch_tensor(logits):
            logits = logits.detach().cpu().numpy()
        logits = np.asarray(logits)
        if logits.ndim == 1:
            logits = logits[None, :]
        if logits.shape != (batch, self.layout.vocab):
            raise ValueError(f"logits: expected shape [B, {self.layout.vocab}], got {logits.shape}")
        in_place = (logits.__array_interface__["data"][0] == b.logits.ctypes.data
                    and logits.flags.c_contiguous)
        if not in_place:
            if b.logits.dtype == np.uint16 and logits.dtype != np.uint16:
                raise TypeError("logits: a bfloat16 numpy session takes the raw bits as uint16, "
                                f"got {logits.dtype}")
            b.logits[:batch] = logits
        for name, _ in _FIELDS:
            _fill_np(b.params[name], params[name], name, batch)
        if b.token_bitmask is not None:
            mask = procs.get("token_bitmask")
            b.token_bitmask[:batch] = -1 if mask is None else np.asarray(mask).reshape(batch, -1)
        if b.processors is not None:
            b.processors[:] = np.asarray(procs["processors"]).reshape(-1)
        ctrl = b.control
        # Ordering: the logits and params above are plain stores; batch, then the doorbell, are
        # aligned 4-byte numpy stores issued afterwards by separate interpreter steps. x86 (TSO)
        # keeps stores in program order, so the server never sees the doorbell before the data.
        # Other CPUs (aarch64) ring with a sequentially consistent store from libatomic instead,
        # and read `done` once more with acquire order before reading the outputs.
        ctrl[_W_BATCH] = batch
        if self._atomics is None:
            ctrl[_W_DOORBELL] = lay.RING
        else:
            self._atomics.store(ctrl.ctypes.data + lay.DOORBELL, lay.RING, _Atomics.SEQ_CST)
        if ctrl[_W_DONE] != lay.DONE:
            start = time.perf_counter()
            while ctrl[_W_DONE] != lay.DONE:
                now = time.perf_counter()
                if now - start > self.spin_s:
                    if now - start > self.step_timeout:
                        self.broken = f"no step completed within {self.step_timeout} s"
                        raise SamplerError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                           f"expected the step done within {self.step_timeout} s, "
                                           "got no answer; the session is unusable")
                    time.sleep(_SLEEP_S)
        if self._atomics is not None:
            self._atomics.load(ctrl.ctypes.data + lay.DONE_WORD, _Atomics.ACQUIRE)
        status = int(ctrl[_W_STEP_STATUS])
        ctrl[_W_DONE] = 0
        if status == lay.STEP_OK:
            if b.sampled_logprobs is not None:
                self.logprobs = b.sampled_logprobs[:batch].copy()
            return b.token_ids[:batch].copy(), b.row_status[:batch].copy()
        if status == lay.STEP_BAD_BATCH:
            raise SamplerError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"expected batch 1..{self.layout.max_batch}, got {batch} "
                               "(step_status BAD_BATCH)")
        if self.broken is None:
            self.broken = "the session ended (step_status ABORTED)"
        raise _aborted(self.broken)

    def close(self, timeout: float) -> None:
        if self.server is not None:
            self.server.close(timeout)
        self.buffers.close()


class _TorchHostPlane(_Plane):
    """The host plane for CUDA logits: pinned shm, copies and flags on the engine's stream."""

    name = "host"

    def __init__(self, client: Any, torch: Any, index: int, layout: lay.Layout, dtype: str,
                 logprob_source: Optional[int]) -> None:
        super().__init__()
        enum, _, np_dtype = _DTYPES[dtype]
        self.layout = layout
        self.tdtype = getattr(torch, dtype)
        self.cuda = _TorchSteps(torch, index)
        self.buffers = _ShmBuffers(client, layout, np_dtype)
        self._pinned = False
        try:
            base = _pin(self.cuda, self.buffers.address, layout.total, "the session's shm")
            self._pinned = True
            self.control_address = base + layout.control
            host = torch.from_numpy(self.buffers.region.array)  # uint8, pinned by the above
            self.host = _torch_views(torch, host, layout, self.tdtype)
            device = torch.device("cuda", index)
            self.stage = torch.zeros(lay.params_bytes(layout.max_batch), dtype=torch.uint8,
                                     device=device)
            self.stage_fields = _param_views(torch, self.stage, layout.max_batch)
            self.out_tokens = torch.full((layout.max_batch,), -1, dtype=torch.int32, device=device)
            self.out_status = torch.zeros(layout.max_batch, dtype=torch.int32, device=device)
            # The step's bitmask and processors are written here on the stream, then copied to
            # the pinned buffers (host stores would race with the steps still enqueued).
            self.proc_stage = {}
            if layout.token_bitmask is not None:
                self.proc_stage["token_bitmask"] = torch.zeros(
                    (layout.max_batch, lay.bitmask_words(layout.vocab)), dtype=torch.int32,
                    device=device)
            if layout.processors is not None:
                self.proc_stage["processors"] = torch.zeros(
                    lay.processors_bytes(layout.max_batch, *layout.capacities),
                    dtype=torch.uint8, device=device)
            self.out_logprobs = None
            if layout.sampled_logprobs is not None:
                self.out_logprobs = torch.zeros(layout.max_batch, dtype=torch.float32,
                                                device=device)
            self._open(client, _open_message(layout, enum, logprob_source, self.buffers.region_name,
                                             pb.DEVICE_PLANE_HOST, ""))
        except BaseException:
            self._release()
            raise

    def _write_abort(self) -> None:
        if self.buffers.control is not None:
            self.buffers.abort()  # host memory: plain stores, seen by the engine stream's wait

    def sample(self, logits: Any, batch: int, params: Dict[str, Any],
               procs: Dict[str, Any]) -> Tuple[Any, Any]:
        st = self.cuda
        logits = st.check_logits(logits, batch, self.layout.vocab, self.tdtype)
        self.host["logits"][:batch].copy_(logits, non_blocking=True)
        for name, view in self.stage_fields.items():
            st.fill(view, params[name], name, batch)
        self.host["params"].copy_(self.stage, non_blocking=True)
        if self.proc_stage:
            _write_processors(st.torch, self.proc_stage, procs, batch)
            if "token_bitmask" in self.proc_stage:
                self.host["token_bitmask"][:batch].copy_(self.proc_stage["token_bitmask"][:batch],
                                                         non_blocking=True)
            if "processors" in self.proc_stage:
                self.host["processors"].copy_(self.proc_stage["processors"], non_blocking=True)
        st.ring_and_wait(st.stream(), self.control_address, batch)
        self.out_tokens[:batch].copy_(self.host["token_ids"][:batch], non_blocking=True)
        self.out_status[:batch].copy_(self.host["row_status"][:batch], non_blocking=True)
        if self.out_logprobs is not None:
            self.out_logprobs[:batch].copy_(self.host["sampled_logprobs"][:batch],
                                            non_blocking=True)
            self.logprobs = self.out_logprobs[:batch]
        return self.out_tokens[:batch], self.out_status[:batch]

    def _release(self) -> None:
        self.host = {}
        if self._pinned:
            _unpin(self.cuda, self.buffers.address)
            self._pinned = False
        self.buffers.close()

    def close(self, timeout: float) -> None:
        if self.server is not None:
            self.server.close(timeout)
        self.cuda.torch.cuda.synchronize(self.cuda.index)  # no copy still reads the pinned memory
        self._release()
