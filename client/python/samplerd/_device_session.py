"""Device sessions: a per-step data plane with no RPC per step (sampler.proto's DeviceSession).

    s = client.device_session(max_batch=128, vocab=151936, dtype="float32", plane="auto")
    tokens, status = s.sample(logits, temperature=0.8, top_k=50, seeds=seeds, positions=pos)
    s.close()                                   # or `with client.device_session(...) as s:`

The session allocates its buffers (control block, logits, per-row parameters, token ids, row
statuses, optionally sampled logprobs: proto/samplerd/v1/device_session.h) in one allocation,
registers it as one region and opens the session over a DeviceSession call that a background
thread holds. A step then costs no RPC:

- **numpy sessions** (``device=None``; always the host plane): the buffers are a host shm
  object. sample() writes the logits and parameters into it, writes ``batch`` and rings the
  doorbell, spins on ``done`` (short sleeps after ~1 ms), resets it and returns numpy int32
  tokens and statuses (copies).
- **torch sessions** (``device`` given, or ``plane="gpu"``): sample() takes CUDA logits and only
  enqueues work on the current stream (no host sync, no allocation), so it works eagerly and
  inside ``torch.cuda.graph`` capture: parameters given as CUDA tensors are read at replay, so a
  graph replays with new values (Python scalars are baked in at capture; lists and numpy arrays
  allocate and are eager-only). It returns CUDA int32 tensors that are views of the session's
  output buffers, valid until the next sample() (clone them to keep them).
    - host plane: the shm object is pinned (cudaHostRegister); the stream copies the logits and
      parameters into it, writes the doorbell, waits on ``done`` in host memory, resets it and
      copies the tokens back into CUDA tensors. The server samples on its CPU threads and the
      engine's GPU never switches context: the cheap plane for small batches without MPS.
    - GPU plane: the logits, parameters and outputs are one CUDA allocation registered as a GPU
      IPC region, which the server's GPU kernels read and write; the control block is a
      one-page host shm object of its own (a second region), pinned like the host plane's, so
      the stream's doorbell write and ``done`` wait go to host memory. The server polls the
      doorbell on the host and never parks a stream wait (a parked wait would block every
      device-wide synchronisation in the server: docs/DEVICE_SESSIONS.md).
    - ``plane="auto"``: the GPU plane when the server serves it, else the host plane. With
      ``host_plane_max_batch = N > 0`` (default 0), B <= N goes to the host plane and larger B
      to the GPU plane: the session then opens two server sessions (one per plane, each with its
      own buffers) and picks one per sample() call by B; ``logits_buffer`` is then the GPU
      plane's, and the host plane copies from it. The default follows the H200 measurements
      (tests/bench/DEVICE_SESSION_RESULTS.md): the host plane only ties PyTorch at B = 1 with
      top-k settings and loses badly on top-p alone, while the GPU plane wins from B = 32 on.

Faults: when the DeviceSession call ends without ``closed`` (the server died or drains), the
watcher thread writes ``step_status = ABORTED`` and ``done = 1`` into the control block itself
(plain stores: the control block is host memory in both planes), so a pending engine wait
completes at once, and the session is broken: the next sample() (or check()) raises
SamplerError(ABORTED, "the samplerd server went away: ..."). An aborted step inside a replayed
graph leaves stale outputs: call :meth:`DeviceSession.check` after the replay's results are in.

close() sends ``close``, waits for ``closed``, unregisters the regions, unpins and unlinks the shm
objects; Client.close() and interpreter exit close open sessions.
"""

from __future__ import annotations

import atexit
import ctypes
import itertools
import os
import platform
import queue
import threading
import time
import weakref
from typing import Any, Callable, Dict, Optional, Tuple

import grpc
import numpy as np

from . import _session_layout as lay
from ._client import SHM_PREFIX, SamplerError, _is_torch_tensor, pb
from ._cuda import REGION_PREFIX, IpcUnavailable, SharedStorage
from ._cuda import _SERIAL as _CUDA_SERIAL

_SERIAL = itertools.count(1)

# name -> (DType enum, bytes per element, numpy dtype of the logits buffer). A numpy bfloat16
# session's logits buffer holds the raw bf16 bits (uint16).
_DTYPES = {
    "float32": (pb.DTYPE_FP32, 4, np.dtype(np.float32)),
    "float16": (pb.DTYPE_FP16, 2, np.dtype(np.float16)),
    "bfloat16": (pb.DTYPE_BF16, 2, np.dtype(np.uint16)),
}
_PLANES = ("auto", "host", "gpu")
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
_W_DOORBELL, _W_BATCH = lay.DOORBELL // 4, lay.BATCH // 4
_W_DONE, _W_STEP_STATUS = lay.DONE_WORD // 4, lay.STEP_STATUS // 4
#: numpy sessions spin this long on `done` before sleeping _SLEEP_S between polls. Spinning
#: costs a core; with fewer than 4 the spin starves the server's own threads (measured on a busy
#: 2-core machine: p50 3.7 ms per step spinning 1 ms, 0.75 ms sleeping at once), so none there.
_SPIN_S = 0.001 if (os.cpu_count() or 1) >= 4 else 0.0
_SLEEP_S = 0.00005


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


def _aborted(reason: str) -> SamplerError:
    return SamplerError(grpc.StatusCode.ABORTED, f"the samplerd server went away: {reason}")


class _ServerSession:
    """One DeviceSession call: sends `open`, waits for `opened`, then a daemon thread holds the
    call until it ends. ``on_end(reason)`` runs on that thread when the call ends without
    `closed` (the server died, drained or cancelled it)."""

    def __init__(self, client: Any, open_msg: Any, on_end: Callable[[str], None]) -> None:
        self._requests: "queue.Queue[Any]" = queue.Queue()
        self._requests.put(pb.DeviceSessionRequest(open=open_msg))

        def requests():
            while True:
                item = self._requests.get()
                if item is None:
                    return
                yield item

        self._call = client._stub.DeviceSession(requests())
        timed_out = threading.Event()

        def give_up():
            timed_out.set()
            self._call.cancel()

        timer = threading.Timer(client.timeout or 30.0, give_up)
        timer.daemon = True
        timer.start()
        try:
            first = next(self._call)
        except grpc.RpcError as e:
            self._requests.put(None)
            if timed_out.is_set():
                raise SamplerError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"expected `opened` within {client.timeout} s, got nothing") from None
            raise SamplerError._from_rpc(e) from None
        except StopIteration:
            self._requests.put(None)
            raise SamplerError(grpc.StatusCode.UNAVAILABLE,
                               "expected `opened`, got the end of the call") from None
        finally:
            timer.cancel()
        if first.WhichOneof("kind") != "opened":
            self._requests.put(None)
            self._call.cancel()
            raise SamplerError(grpc.StatusCode.INTERNAL,
                               f"expected `opened`, got `{first.WhichOneof('kind')}`")
        self.session_id: str = first.opened.session_id
        self.plane: int = first.opened.plane
        self.device: str = first.opened.device
        self.steps: Optional[int] = None
        self._on_end = on_end
        self._closing = False
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="samplerd-device-session",
                                        daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        reason = "the DeviceSession call ended without `closed`"
        closed = False
        try:
            for response in self._call:
                if response.WhichOneof("kind") == "closed":
                    self.steps = int(response.closed.steps)
                    closed = True
        except grpc.RpcError as e:
            reason = f"{e.code().name}: {e.details()}"
        except Exception as e:  # noqa: BLE001 - any end of the call releases the engine
            reason = repr(e)
        finally:
            try:
                if not closed:
                    self._on_end(reason)
            finally:
                self._ended.set()

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    def close(self, timeout: float) -> None:
        """Sends `close`, half-closes and waits up to ``timeout`` s for the call to end (then
        cancels it)."""
        if self._closing:
            return
        self._closing = True
        if not self._ended.is_set():
            self._requests.put(pb.DeviceSessionRequest(close=pb.DeviceSessionClose()))
        self._requests.put(None)
        if not self._ended.wait(timeout):
            self._call.cancel()
            self._ended.wait(1.0)


class _Plane:
    """One server session and its buffers. Subclasses fill the buffers and run steps."""

    name = ""  # "host" or "gpu"

    def __init__(self) -> None:
        self.server: Optional[_ServerSession] = None
        self.broken: Optional[str] = None  # why the session can no longer step
        self.logprobs: Any = None  # the last step's sampled logprobs, when asked for

    def _open(self, client: Any, open_msg: Any) -> None:
        self.server = _ServerSession(client, open_msg, self._on_end)

    def _on_end(self, reason: str) -> None:
        if self.broken is None:
            self.broken = reason
        self._write_abort()

    def _write_abort(self) -> None:
        """Writes step_status = ABORTED, then done = DONE, into the control block."""
        raise NotImplementedError

    def check(self) -> None:
        if self.broken is not None:
            raise _aborted(self.broken)

    def close(self, timeout: float) -> None:
        raise NotImplementedError


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
        self.region.close()


def _fill_np(view: np.ndarray, value: Any, name: str, batch: int) -> None:
    arr = np.asarray(value)
    if arr.ndim == 0 or arr.shape == (batch,):
        view[:batch] = arr
    else:
        raise ValueError(f"{name}: expected a scalar or {batch} values, got shape {arr.shape}")


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

    def sample(self, logits: Any, batch: int,
               params: Dict[str, Any]) -> Tuple[np.ndarray, np.ndarray]:
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


def _open_message(layout: lay.Layout, dtype_enum: int, logprob_source: Optional[int], region: str,
                  plane: int, device: str, control_region: Optional[str] = None) -> Any:
    msg = pb.DeviceSessionOpen(
        device=device, dtype=dtype_enum, max_batch=layout.max_batch, vocab=layout.vocab,
        plane=plane, unregister_regions_on_end=True,
        **layout.slices(pb, region, control_region))
    if logprob_source is not None:
        msg.logprob_source = logprob_source
    return msg


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

    def sample(self, logits: Any, batch: int, params: Dict[str, Any]) -> Tuple[Any, Any]:
        st = self.cuda
        logits = st.check_logits(logits, batch, self.layout.vocab, self.tdtype)
        self.host["logits"][:batch].copy_(logits, non_blocking=True)
        for name, view in self.stage_fields.items():
            st.fill(view, params[name], name, batch)
        self.host["params"].copy_(self.stage, non_blocking=True)
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

    def sample(self, logits: Any, batch: int, params: Dict[str, Any]) -> Tuple[Any, Any]:
        st = self.cuda
        logits = st.check_logits(logits, batch, self.layout.vocab, self.tdtype)
        mine = self.views["logits"]
        if logits.data_ptr() != mine.data_ptr() or not logits.is_contiguous():
            mine[:batch].copy_(logits)
        for name, view in self.fields.items():
            st.fill(view, params[name], name, batch)
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


def _device_index(torch: Any, device: Any) -> int:
    if device is None:
        return int(torch.cuda.current_device())
    if isinstance(device, int):
        return device
    d = torch.device(device)
    if d.type != "cuda":
        raise ValueError(f"device: expected a CUDA device, got {device!r}")
    return int(d.index) if d.index is not None else int(torch.cuda.current_device())


class DeviceSession:
    """A device session (see the module docstring). Made by :meth:`Client.device_session`.

    Attributes: ``plane`` ("host" or "gpu": the plane of the last sample(), before any the one
    that serves B = 1), ``session_id`` (the server's id of that plane's session), ``planes``
    (plane -> session id), ``steps`` (steps the server completed, summed over planes; None until
    closed), ``host_plane_max_batch``, ``logits_buffer``, ``sampled_logprobs`` (the last step's,
    when the session was opened with ``logprobs``).
    """

    #: Default of ``host_plane_max_batch``: "auto" serves B <= this on the host plane (when the
    #: server serves the GPU plane too). 0: the GPU plane for every B (measured best overall on
    #: the H200, tests/bench/DEVICE_SESSION_RESULTS.md).
    HOST_PLANE_MAX_BATCH = 0

    def __init__(self, client: Any, max_batch: int = 128, vocab: int = 151936,
                 dtype: Any = "float32", plane: str = "auto", logprobs: Any = False,
                 device: Any = None, *, host_plane_max_batch: Optional[int] = None,
                 step_timeout: float = 60.0, close_timeout: float = 5.0,
                 spin_s: Optional[float] = None) -> None:
        if plane not in _PLANES:
            raise ValueError(f"plane: expected one of {_PLANES}, got {plane!r}")
        dtype = _dtype_name(dtype)
        source = None
        if logprobs:
            if logprobs not in _LOGPROB_SOURCES:
                raise ValueError("logprobs: expected False, True, 'raw' or 'processed', got "
                                 f"{logprobs!r}")
            source = _LOGPROB_SOURCES[logprobs]
        self.client = client
        self.max_batch = int(max_batch)
        self.vocab = int(vocab)
        self.dtype = dtype
        self.host_plane_max_batch = (self.HOST_PLANE_MAX_BATCH if host_plane_max_batch is None
                                     else int(host_plane_max_batch))
        self.close_timeout = close_timeout
        self.steps: Optional[int] = None
        self._closed = False
        self._host: Optional[_Plane] = None
        self._gpu: Optional[_TorchGpuPlane] = None
        self._staging: Any = None
        layout = lay.Layout.of(self.max_batch, self.vocab, _DTYPES[dtype][1], bool(source))
        self.torch_session = device is not None or plane == "gpu"
        support = client._cached_server_info().device_sessions
        try:
            if not self.torch_session:
                self._host = _NumpyHostPlane(client, layout, dtype, source, step_timeout, spin_s)
            else:
                want_host, want_gpu = self._choose(plane, support)
                import torch  # lazily: numpy sessions need no torch

                index = _device_index(torch, device)
                self._torch = torch
                self._index = index
                if want_gpu:
                    self._gpu = _TorchGpuPlane(client, torch, index, layout, dtype, source)
                if want_host:
                    self._host = _TorchHostPlane(client, torch, index, layout, dtype, source)
        except BaseException:
            self._close_planes()
            raise
        self._last = self._plane_for(1)
        client._device_sessions.add(self)
        ref = weakref.ref(self)
        self._at_exit = lambda: ref() is not None and ref().close()  # type: ignore[union-attr]
        atexit.register(self._at_exit)

    def _choose(self, plane: str, support: Any) -> Tuple[bool, bool]:
        """(open a host plane, open a GPU plane) for a torch session. "auto": the host plane
        when the server serves it, plus the GPU plane when it serves that too and max_batch
        goes above host_plane_max_batch."""
        if plane == "host":
            return True, False  # the server says it if it cannot
        gpu = support.gpu_plane and (
            plane == "gpu" or self.max_batch > self.host_plane_max_batch or not support.host_plane)
        host = plane == "auto" and support.host_plane and (self.host_plane_max_batch > 0 or not gpu)
        if plane == "gpu" and not gpu or not (host or gpu):
            raise SamplerError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"expected a server that serves {'GPU-plane ' if plane == 'gpu' else ''}device "
                f"sessions, got {self.client.target} without (GetServerInfo device_sessions: "
                f"gpu_plane {support.gpu_plane}, host_plane {support.host_plane})")
        return host, gpu

    def _plane_for(self, batch: int) -> _Plane:
        if self._gpu is not None and (self._host is None or batch > self.host_plane_max_batch):
            return self._gpu
        assert self._host is not None
        return self._host

    # --- the API --------------------------------------------------------------------------------

    @property
    def plane(self) -> str:
        return self._last.name

    @property
    def session_id(self) -> str:
        server = self._last.server
        return server.session_id if server is not None else ""

    @property
    def planes(self) -> Dict[str, str]:
        return {p.name: p.server.session_id for p in (self._host, self._gpu)
                if p is not None and p.server is not None}

    @property
    def sampled_logprobs(self) -> Any:
        return self._last.logprobs

    @property
    def logits_buffer(self) -> Any:
        """The session's own logits buffer [max_batch, vocab]: a numpy view of the shm object
        (numpy sessions; uint16 bits for bfloat16), or a CUDA tensor (torch sessions: the GPU
        plane's buffer, else a staging tensor allocated on first use). Logits written into its
        first B rows and passed as ``logits_buffer[:B]`` are not copied again by sample()."""
        if not self.torch_session:
            return self._host.buffers.logits  # type: ignore[union-attr]
        if self._gpu is not None:
            return self._gpu.logits_buffer
        if self._staging is None:
            self._staging = self._torch.empty((self.max_batch, self.vocab),
                                              dtype=getattr(self._torch, self.dtype),
                                              device=self._torch.device("cuda", self._index))
        return self._staging

    def check(self) -> None:
        """Raises SamplerError(ABORTED) when the session is broken (the server went away), or
        FAILED_PRECONDITION when it is closed."""
        if self._closed:
            raise SamplerError(grpc.StatusCode.FAILED_PRECONDITION, "device session is closed")
        for p in (self._host, self._gpu):
            if p is not None:
                p.check()

    def sample(self, logits: Any, temperature: Any = 1.0, top_k: Any = 0, top_p: Any = 1.0,
               min_p: Any = 0.0, seeds: Any = None, positions: Any = None,
               top_p_mode: Any = "top_k_first") -> Tuple[Any, Any]:
        """Samples one token per row of ``logits`` [B, V] (B <= max_batch) in one step.

        Each parameter is a scalar or B values (a sequence, numpy array, or for torch sessions a
        CUDA tensor, which a captured graph reads at replay). ``seeds`` and ``positions`` are
        required (there is no server-chosen seed): the Philox key and counter of each row.
        ``top_p_mode``: "top_k_first" (vLLM) or "joint", or per-row TopPMode numbers.

        Returns (tokens, row_status), int32 [B]: numpy copies for numpy sessions; CUDA views of
        the session's output buffers for torch sessions (valid until the next sample()). A row
        with bad parameters gets status 4 (ROW_STATUS_INVALID_PARAMS) and token -1.

        Raises:
            SamplerError: ABORTED when the server went away (the session is then broken),
                INVALID_ARGUMENT for a batch the server refused, FAILED_PRECONDITION when closed.
            ValueError, TypeError: bad shapes, dtypes or arguments (nothing was sent).
        """
        if self._closed:
            raise SamplerError(grpc.StatusCode.FAILED_PRECONDITION, "device session is closed")
        if seeds is None or positions is None:
            raise ValueError("seeds and positions: expected ints or B ints each (a device "
                             "session has no server-chosen seed), got None")
        shape = tuple(getattr(logits, "shape", ()))
        batch = 1 if len(shape) == 1 else (int(shape[0]) if len(shape) == 2 else 0)
        if len(shape) not in (1, 2) or not 1 <= batch <= self.max_batch:
            raise ValueError(f"logits: expected [B, V] with 1 <= B <= {self.max_batch}, got "
                             f"shape {shape}")
        plane = self._plane_for(batch)
        plane.check()
        self._last = plane
        params = {"seed": seeds, "position": positions, "temperature": temperature,
                  "top_k": top_k, "top_p": top_p, "min_p": min_p,
                  "top_p_mode": _top_p_mode(top_p_mode)}
        return plane.sample(logits, batch, params)

    def _close_planes(self) -> None:
        steps = None
        for p in (self._gpu, self._host):
            if p is None:
                continue
            try:
                p.close(self.close_timeout)
            finally:
                if p.server is not None and p.server.steps is not None:
                    steps = (steps or 0) + p.server.steps
        self.steps = steps

    def close(self) -> None:
        """Ends the session: `close`, wait for `closed`, unregister, unpin, unlink. Idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._at_exit)
        self.client._device_sessions.discard(self)
        self._close_planes()

    def __enter__(self) -> "DeviceSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
