"""GPU IPC for CUDA tensors: the logits stay on the GPU and the server reads them in place.

A CUDA tensor passed to :meth:`samplerd.Client.sample` (or a stream step) is sent as a slice of a
GPU IPC region instead of being copied to the host (logits, and a grammar engine's int32
``token_bitmask`` alike: :meth:`CudaIpc.share`):

- its storage is shared with ``untyped_storage()._share_cuda_()``: a CUDA IPC handle of the
  caching allocator's segment, the storage's offset in it and its size;
- each (handle, offset, size) is registered once as a region and cached (least recently used
  regions beyond ``max_regions`` are unregistered). A decode loop that allocates its logits anew
  each step usually gets the same block back from the allocator, so steady state costs no
  registration;
- the server must not read before the engine's writes are done. By default ("event") an
  interprocess CUDA event, one per device, is re-recorded each call on the tensor's current
  stream and sent as the request's ready event, which the server's stream waits for: the call
  goes out while the engine's forward is still running, and the request's Python and gRPC costs
  overlap it (tests/bench/ENGINE_RESULTS.md, H200, same run: 3-8% more tokens/s than "sync" at
  B=128 with top-k and top-p, equal with top-p alone). "sync" synchronizes the current stream
  before sending instead: ~140 us less per call when the GPU is idle already, but no overlap;
- ``_share_cuda_()`` increments PyTorch's reference counter of the block (while it is non-zero
  PyTorch keeps the block out of reuse, even after the tensor is gone). The server's reads are
  finished when its reply arrives (a reply without a done event comes after the sampling kernels
  completed), so the counter is given back right after each call: blocks are reused normally and
  nothing is pending at exit.

Requirements: PyTorch's default caching allocator (with ``expandable_segments`` the handles are
not CUDA IPC handles; the server refuses them with FAILED_PRECONDITION), the server on the same
host and GPU (matched by UUID, else PCI bus id) and reached over its unix socket.
"""

from __future__ import annotations

import itertools
import os
import re
import threading
from collections import OrderedDict
from typing import Any, Callable, Dict, Optional, Tuple

from ._pb import pb

#: Region names start with this and the process id, so ListRegions shows whose they are.
REGION_PREFIX = "torch"
#: Numbers region names across every client of the process (names are server-wide).
_SERIAL = itertools.count(1)
_NAME = re.compile(r"^%s-(\d+)-\d+$" % REGION_PREFIX)
#: Process-wide: stale regions are looked for once per process (see CudaIpc._reap_stale).
_REAPED = threading.Event()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


class IpcUnavailable(Exception):
    """GPU IPC cannot serve this tensor (a reason to fall back to a host copy)."""


def is_cuda_tensor(x: Any) -> bool:
    """True for a torch tensor on a CUDA device (without importing torch)."""
    return type(x).__module__.startswith("torch") and getattr(x, "is_cuda", False) is True


def _dtype_enum(torch: Any, dtype: Any) -> int:
    table = {
        torch.float32: pb.DTYPE_FP32,
        torch.float16: pb.DTYPE_FP16,
        torch.bfloat16: pb.DTYPE_BF16,
    }
    if dtype not in table:
        raise TypeError(f"expected float32, float16 or bfloat16 logits, got {dtype}")
    return table[dtype]


def _device_ids(torch: Any, index: int) -> Tuple[str, str]:
    """(uuid, PCI bus id) of CUDA device ``index``, lower case, "" where PyTorch does not say."""
    props = torch.cuda.get_device_properties(index)
    uuid = str(getattr(props, "uuid", "") or "").lower()
    if uuid.startswith("gpu-"):
        uuid = uuid[4:]
    bus = ""
    if hasattr(props, "pci_bus_id") and hasattr(props, "pci_device_id"):
        bus = "%04x:%02x:%02x.0" % (
            getattr(props, "pci_domain_id", 0),
            props.pci_bus_id,
            props.pci_device_id,
        )
    return uuid, bus


class SharedStorage:
    """One ``_share_cuda_()`` of a storage. :meth:`release` gives PyTorch's counter back."""

    def __init__(self, torch: Any, tensor: Any) -> None:
        fields = tensor.untyped_storage()._share_cuda_()
        if len(fields) != 8:
            raise IpcUnavailable(
                f"expected 8 fields from _share_cuda_() (PyTorch 2.x), got {len(fields)}"
            )
        self._torch = torch
        self.handle = bytes(fields[1])  # version byte, 'c' or 'e', then the handle
        self.storage_bytes = int(fields[2])
        self.offset_in_segment = int(fields[3])
        self._counter = (fields[4], int(fields[5]))
        self._released = False

    @property
    def form(self) -> bytes:
        return self.handle[1:2]

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        name, index = self._counter
        storage = self._torch.UntypedStorage
        release = getattr(storage, "_release_ipc_counter_cuda", None)
        if release is not None:
            release(name, index)
        else:  # the older spelling
            storage._release_ipc_counter(name, index, device="cuda")


class Lease:
    """What one call holds until its reply: the shared storage and the tensor it read."""

    def __init__(self, shared: Optional[SharedStorage], tensor: Any) -> None:
        self._shared: Optional[SharedStorage] = shared
        self._tensor: Any = tensor  # a contiguous copy must live until the server read it

    def release(self) -> None:
        if self._shared is not None:
            self._shared.release()
        self._shared = None
        self._tensor = None


class CudaIpc:
    """A client's GPU IPC regions for CUDA tensors (see the module docstring). Thread-safe.

    ``call(method, request)`` sends one unary RPC and raises the client's SamplerError;
    ``server_info()`` returns the server's GetServerInfoResponse.
    """

    READY_MODES = ("sync", "event")

    def __init__(
        self, call: Callable[[Any, Any], Any], stub: Any, server_info: Callable[[], Any],
        max_regions: int = 16, ready: str = "event",
    ) -> None:
        if ready not in self.READY_MODES:
            raise ValueError(f"cuda_ready: expected one of {self.READY_MODES}, got {ready!r}")
        self.ready = ready
        self._call = call
        self._stub = stub
        self._server_info = server_info
        self.max_regions = max_regions
        self._regions: "OrderedDict[Tuple[int, bytes, int, int], str]" = OrderedDict()
        self._server_device: Dict[int, str] = {}  # torch index -> the server's device id
        self._events: Dict[int, Tuple[Any, bytes]] = {}  # torch index -> (event, its handle)
        # (storage, its _cdata, region name) of the last call: a decode loop that hands the same
        # storage back (a CUDA graph's static output) skips _share_cuda_() and the release. The
        # reference keeps that one storage alive until another storage comes or close().
        self._last: Optional[Tuple[Any, int, str]] = None
        self._lock = threading.Lock()

    @property
    def region_names(self) -> list:
        with self._lock:
            return list(self._regions.values())

    def _match_device(self, torch: Any, index: int) -> str:
        """The server's id of CUDA device ``index`` (its UUID or bus id), else IpcUnavailable."""
        if index in self._server_device:
            return self._server_device[index]
        info = self._server_info()
        if info.backend != pb.BACKEND_GPU:
            raise IpcUnavailable("the server samples on the CPU (backend is not GPU)")
        uuid, bus = _device_ids(torch, index)
        for d in info.devices:
            their_uuid = d.uuid.lower()
            their_uuid = their_uuid[4:] if their_uuid.startswith("gpu-") else their_uuid
            if (uuid and uuid == their_uuid) or (bus and bus == d.pci_bus_id.lower()):
                if not d.ipc_memory:
                    raise IpcUnavailable(f"the server's device {d.pci_bus_id} has no IPC memory")
                self._server_device[index] = d.pci_bus_id or d.uuid
                return self._server_device[index]
        served = ", ".join(f"{d.pci_bus_id} ({d.uuid})" for d in info.devices) or "none"
        raise IpcUnavailable(
            f"expected the server on this tensor's GPU (cuda:{index}, uuid {uuid or '?'}, bus "
            f"{bus or '?'}), got the server's devices: {served}"
        )

    def _ready_event(self, torch: Any, tensor: Any) -> bytes:
        """Records this device's interprocess event on the tensor's current stream; its handle,
        or b"" when the event has completed already (the stream was idle: nothing to wait for,
        and a fresh IPC event costs the server ~70 us or more to wait on, tests/bench/
        ENGINE_RESULTS.md)."""
        index = tensor.device.index
        entry = self._events.get(index)
        if entry is None:
            event = torch.cuda.Event(interprocess=True)
            event.record(torch.cuda.current_stream(tensor.device))
            entry = (event, bytes(event.ipc_handle()))
            self._events[index] = entry
        else:
            entry[0].record(torch.cuda.current_stream(tensor.device))
        return b"" if entry[0].query() else entry[1]

    def prepare(self, logits: Any) -> Tuple[Any, bytes, Lease]:
        """(samplerd.v1.Tensor naming a region slice, ready event handle or b"", Lease).

        Raises IpcUnavailable when GPU IPC cannot serve it, TypeError/ValueError for bad logits,
        and the client's SamplerError when registering fails for another reason.
        """
        import torch  # lazily: only CUDA tensors get here

        t = logits.detach()
        if t.dim() == 1:
            t = t.unsqueeze(0)
        if t.dim() != 2:
            raise ValueError(f"expected logits of shape [B, V], got {tuple(t.shape)}")
        dtype = _dtype_enum(torch, t.dtype)
        region, ready, lease = self.share(t)
        tensor = pb.Tensor(dtype=dtype, shape=[int(t.shape[0]), int(t.shape[1])], region=region)
        return tensor, ready, lease

    def share(self, tensor: Any) -> Tuple[Any, bytes, Lease]:
        """(samplerd.v1.RegionSlice of the CUDA ``tensor``'s bytes, ready event handle or b"",
        Lease): :meth:`prepare` for any tensor (an int32 bitmask too), made contiguous first
        (the one case that copies on the GPU). Raises as :meth:`prepare` does."""
        import torch  # lazily: only CUDA tensors get here

        t = tensor if tensor.is_contiguous() else tensor.contiguous()
        index = t.device.index if t.device.index is not None else torch.cuda.current_device()
        with self._lock:
            device = self._match_device(torch, index)
            storage = t.untyped_storage()
            last = self._last
            if last is not None and last[1] == storage._cdata:
                # The storage of the previous call (kept alive by self._last, so its memory
                # cannot have been freed and reused): its region is still the right one.
                shared, name = None, last[2]
            else:
                shared, name = SharedStorage(torch, t), None
            lease = Lease(shared, t)
            try:
                if shared is not None and shared.form != b"c":
                    raise IpcUnavailable(
                        "PyTorch shares this tensor without a CUDA IPC handle (form %r: "
                        "expandable_segments is on); set PYTORCH_CUDA_ALLOC_CONF="
                        "expandable_segments:False to use GPU IPC" % shared.form
                    )
                if shared is not None:
                    name = self._region_for(index, device, shared)
                    self._last = (storage, storage._cdata, name)
                if self.ready == "event":
                    ready = self._ready_event(torch, t)
                else:
                    torch.cuda.current_stream(t.device).synchronize()
                    ready = b""
            except BaseException:
                lease.release()
                raise
        region = pb.RegionSlice(region=name, offset=t.storage_offset() * t.element_size())
        return region, ready, lease

    def _reap_stale(self) -> None:
        """Unregisters the CUDA regions of earlier processes of this pod that are gone.

        A producer killed without closing its client (a crash, SIGKILL, an engine restart in
        the same pod) leaves its regions registered, and the server keeps their GPU memory
        mapped. Their names carry the producer's pid ("torch-PID-N"); the first registration of
        each process unregisters those whose pid no longer exists. Only a dead pid counts: a
        live one (even another process's) is left alone, and pids are seen in this process's
        namespace, which GPU IPC shares with the other producers of the server anyway.
        A current server releases a dead owner's regions itself (RegionInfo.owner_watched), so
        this finds them only on older servers or for registrations the server could not watch.
        """
        if _REAPED.is_set():
            return
        _REAPED.set()
        try:
            listed = self._call(self._stub.ListRegions, pb.ListRegionsRequest()).regions
        except Exception:  # noqa: BLE001 - best effort: registration reports real trouble
            return
        for r in listed:
            m = _NAME.match(r.name)
            if m and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1))):
                self._unregister(r.name)

    def _region_for(self, index: int, device: str, shared: SharedStorage) -> str:
        key = (index, shared.handle, shared.offset_in_segment, shared.storage_bytes)
        name = self._regions.get(key)
        if name is not None:
            self._regions.move_to_end(key)
            return name
        self._reap_stale()
        while len(self._regions) >= self.max_regions:
            _, old = self._regions.popitem(last=False)
            if self._last is not None and self._last[2] == old:
                self._last = None
            self._unregister(old)
        region = pb.GpuIpcRegion(
            memory_handle=shared.handle,
            offset=shared.offset_in_segment,
            byte_size=shared.storage_bytes,
            device=device,
        )
        for attempt in range(3):
            name = f"{REGION_PREFIX}-{os.getpid()}-{next(_SERIAL)}"
            try:
                self._call(self._stub.RegisterRegion,
                           pb.RegisterRegionRequest(name=name, gpu_ipc=region))
                break
            except Exception as e:  # noqa: BLE001 - the client's SamplerError, checked by name
                # Another process with this pid (another pid namespace) may hold the name.
                if getattr(getattr(e, "code", None), "name", "") != "ALREADY_EXISTS" or attempt == 2:
                    raise
        self._regions[key] = name
        return name

    def _unregister(self, name: str) -> None:
        try:
            self._call(self._stub.UnregisterRegion, pb.UnregisterRegionRequest(name=name))
        except Exception:  # noqa: BLE001 - the server may be gone; nothing else to do
            pass

    def close(self) -> None:
        """Unregisters every region this client registered for CUDA tensors."""
        with self._lock:
            names = list(self._regions.values())
            self._regions.clear()
            self._last = None
        for name in names:
            self._unregister(name)
