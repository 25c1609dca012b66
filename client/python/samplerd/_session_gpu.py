"""The GPU plane of a device session: the data buffers in one CUDA allocation registered as a
GPU IPC region, which the server's GPU kernels read and write, and the control block in a
pinned one-page host shm object (a second region), so the stream's doorbell write and ``done``
wait go to host memory and the server never parks a stream wait (docs/DEVICE_SESSIONS.md).
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Tuple

import grpc
import numpy as np

from . import _session_layout as lay
from ._cuda import REGION_PREFIX, IpcUnavailable, SharedStorage
from ._cuda import _SERIAL as _CUDA_SERIAL
from ._errors import SamplerError
from ._host_shm import SHM_PREFIX
from ._pb import pb
from ._session_params import _DTYPES
from ._session_shm import _SERIAL, _store_abort
from ._session_torch import (_param_views, _pin, _torch_views, _TorchSteps, _unpin,
                             _write_processors)
from ._session_watch import _open_message, _Plane


class _ControlShm:
    """A GPU-plane session's control block: a one-page host shm object registered as a region
    of its own and pinned for the engine's GPU, so that the stream operations write the doorbell
    and wait on ``done`` in host memory (through ``device_address``) and the watcher releases a
    wait with plain stores."""

    def __init__(self, client: Any, steps: "_TorchSteps") -> None:
        n = next(_SERIAL)
        self.steps = steps
        self.region_name = f"dsession-{os.getpid()}-{n}-control"
        self.region = client.register_host_shm(
            self.region_name, lay.CONTROL_SHM_BYTES,
            key=f"{SHM_PREFIX}dsession-{os.getpid()}-{n}-control")
        self.words: Optional[np.ndarray] = self.region.array[:lay.CONTROL_BYTES].view(np.uint32)
        self.address = int(self.region.array.ctypes.data)
        self.pinned = False
        try:
            self.device_address = _pin(steps, self.address, lay.CONTROL_SHM_BYTES,
                                       "the session's control shm")
            self.pinned = True
        except BaseException:
            self.close()
            raise

    def abort(self) -> None:
        _store_abort(self.words)

    def close(self) -> None:
        """Unpins, then unregisters, unmaps and unlinks the object (no stream may still use it)."""
        self.words = None
        if self.pinned:
            _unpin(self.steps, self.address)
            self.pinned = False
        self.region.close()


class _TorchGpuPlane(_Plane):
    """The GPU plane: the data buffers in one CUDA allocation (a GPU IPC region), the control
    block in a pinned host shm object (_ControlShm, a host shm region)."""

    name = "gpu"

    def __init__(self, client: Any, torch: Any, index: int, layout: lay.Layout, dtype: str,
                 logprob_source: Optional[int]) -> None:
        super().__init__()
        enum = _DTYPES[dtype][0]
        self.client = client
        self.layout = layout.without_control()
        self.tdtype = getattr(torch, dtype)
        try:
            server_device = client._cuda._match_device(torch, index)
        except IpcUnavailable as e:
            raise SamplerError(grpc.StatusCode.FAILED_PRECONDITION, f"GPU plane: {e}") from None
        self.cuda = _TorchSteps(torch, index)
        device = torch.device("cuda", index)
        self.buffer = torch.zeros(self.layout.total, dtype=torch.uint8, device=device)
        torch.cuda.synchronize(device)  # the zeros are in place before the server maps them
        self.views = _torch_views(torch, self.buffer, self.layout, self.tdtype)
        self.fields = _param_views(torch, self.views["params"], self.layout.max_batch)
        self.region_name: Optional[str] = None
        self.control: Optional[_ControlShm] = None
        self.shared = SharedStorage(torch, self.buffer)
        try:
            if self.shared.form != b"c":
                raise SamplerError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "GPU plane: PyTorch shares this memory without a CUDA IPC handle "
                    "(expandable_segments is on); set PYTORCH_CUDA_ALLOC_CONF="
                    "expandable_segments:False")
            name = f"{REGION_PREFIX}-{os.getpid()}-{next(_CUDA_SERIAL)}"
            region = pb.GpuIpcRegion(memory_handle=self.shared.handle,
                                     offset=self.shared.offset_in_segment,
                                     byte_size=self.shared.storage_bytes, device=server_device)
            client._call(client._stub.RegisterRegion,
                         pb.RegisterRegionRequest(name=name, gpu_ipc=region))
            self.region_name = name
            self.control = _ControlShm(client, self.cuda)
            self._open(client, _open_message(self.layout, enum, logprob_source, name,
                                             pb.DEVICE_PLANE_GPU, server_device,
                                             control_region=self.control.region_name))
        except BaseException:
            self._release()
            raise

    @property
    def logits_buffer(self) -> Any:
        return self.views["logits"]

    def _write_abort(self) -> None:
        if self.control is not None:
            self.control.abort()  # host memory: plain stores, seen by the engine stream's wait

    def sample(self, logits: Any, batch: int, params: Dict[str, Any],
               procs: Dict[str, Any]) -> Tuple[Any, Any]:
        st = self.cuda
        logits = st.check_logits(logits, batch, self.layout.vocab, self.tdtype)
        mine = self.views["logits"]
        if logits.data_ptr() != mine.data_ptr() or not logits.is_contiguous():
            mine[:batch].copy_(logits)
        for name, view in self.fields.items():
            st.fill(view, params[name], name, batch)
        _write_processors(st.torch, self.views, procs, batch)
        assert self.control is not None
        # The doorbell write is fenced after the logits and params writes above (default flags).
        st.ring_and_wait(st.stream(), self.control.device_address, batch)
        if "sampled_logprobs" in self.views:
            self.logprobs = self.views["sampled_logprobs"][:batch]
        return self.views["token_ids"][:batch], self.views["row_status"][:batch]

    def _release(self) -> None:
        if self.region_name is not None:
            try:
                self.client._unregister_rpc(self.region_name)
            except SamplerError:
                pass
            self.region_name = None
        if self.shared is not None:
            self.shared.release()
            self.shared = None
        if self.control is not None:
            control, self.control = self.control, None
            control.close()

    def close(self, timeout: float) -> None:
        if self.server is not None:
            self.server.close(timeout)
        self.cuda.torch.cuda.synchronize(self.buffer.device)  # no stream op still uses them
        self._release()
