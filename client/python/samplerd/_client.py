"""Implementation of the samplerd Python client (see the package docstring)."""

from __future__ import annotations

import atexit
import mmap
import os
import queue
import threading
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import grpc
import numpy as np

try:
    from .v1 import sampler_pb2 as pb
    from .v1 import sampler_pb2_grpc as pb_grpc
except ImportError as e:  # pragma: no cover - depends on the build
    raise ImportError(
        "samplerd: the generated stubs are missing; run client/python/generate.sh first"
    ) from e
from ._cuda import CudaIpc, IpcUnavailable, Lease, is_cuda_tensor  # noqa: E402 - needs the stubs

#: A per-row parameter: one value for every row, or a sequence / array of B values.
PerRow = Union[float, int, Sequence[Any], np.ndarray]

DEFAULT_TARGET = "unix:///run/samplerd/samplerd.sock"
#: The server's default message limit (Limits.max_message_bytes).
DEFAULT_MAX_MESSAGE_BYTES = 256 << 20
#: The server's default --shm_prefix; host shm keys must start with it.
SHM_PREFIX = "/samplerd-"

_DTYPES = {
    np.dtype(np.float32): pb.DTYPE_FP32,
    np.dtype(np.float16): pb.DTYPE_FP16,
}
_LOGPROB_SOURCES = {
    "raw": pb.LOGPROB_SOURCE_RAW,
    "processed": pb.LOGPROB_SOURCE_PROCESSED,
}
_CODES = {c.value[0]: c for c in grpc.StatusCode}


class SamplerError(Exception):
    """A failed samplerd call: ``code`` is the grpc.StatusCode, ``message`` the server's text."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message

    @classmethod
    def _from_rpc(cls, err: grpc.RpcError) -> "SamplerError":
        code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
        details = err.details() if hasattr(err, "details") else str(err)
        return cls(code or grpc.StatusCode.UNKNOWN, details or "")


@dataclass
class RowLogprobs:
    """Logprobs of one row (natural log)."""

    sampled_logprob: float
    sampled_rank: int
    top_token_ids: np.ndarray  # int32 [top_n]
    top_logprobs: np.ndarray  # float32 [top_n]


@dataclass
class SampleResult:
    """The answer to one sample call or stream step."""

    tokens: np.ndarray  # int32 [B]; -1 where row_status != ROW_STATUS_OK
    row_status: np.ndarray  # int32 [B], samplerd.v1.RowStatus values (1 = OK)
    seeds: np.ndarray  # uint64 [B], the seed each row used (replayable)
    logprobs: Optional[List[RowLogprobs]]  # B entries when asked for, else None
    request_id: str
    compute_ns: int  # server-side sampling time
    response: Any  # the raw samplerd.v1.SampleResponse

    @classmethod
    def _from_pb(cls, r: Any) -> "SampleResult":
        logprobs = None
        if len(r.logprobs):
            logprobs = [
                RowLogprobs(
                    float(lp.sampled_logprob),
                    int(lp.sampled_rank),
                    np.asarray(lp.top_token_ids, dtype=np.int32),
                    np.asarray(lp.top_logprobs, dtype=np.float32),
                )
                for lp in r.logprobs
            ]
        return cls(
            tokens=np.asarray(r.token_ids, dtype=np.int32),
            row_status=np.asarray(r.row_status, dtype=np.int32),
            seeds=np.asarray(r.seeds, dtype=np.uint64),
            logprobs=logprobs,
            request_id=r.request_id,
            compute_ns=int(r.timings.compute_ns),
            response=r,
        )


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
    dtype = _DTYPES.get(arr.dtype)
    if dtype is None:
        raise TypeError(
            f"expected float32 or float16 logits (bfloat16 as a torch tensor), got {arr.dtype}"
        )
    arr = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
    return dtype, (arr.shape[0], arr.shape[1]), arr.tobytes()


def _per_row(name: str, value: Any, batch: int) -> Optional[list]:
    """None for a scalar (or None), else a list of B values."""
    if value is None or np.isscalar(value):
        return None
    values = list(np.asarray(value).reshape(-1).tolist())
    if len(values) != batch:
        raise ValueError(f"{name}: expected a scalar or {batch} values, got {len(values)}")
    return values


def _params(
    batch: int,
    temperature: PerRow,
    top_k: PerRow,
    top_p: PerRow,
    min_p: PerRow,
    seed: Optional[PerRow],
    position: PerRow,
) -> Tuple[List[Any], Optional[List[int]], Optional[List[int]]]:
    """(params, row_seeds, row_positions) of a request.

    One SamplingParams when the filters (temperature, top_k, top_p, min_p) are scalars; per-row
    seeds and positions then travel as the request's packed row_seeds / row_positions (a decode
    loop's usual case, and far cheaper than B messages). Per-row filters give B SamplingParams.
    """
    filters = (
        ("temperature", temperature, float),
        ("top_k", top_k, int),
        ("top_p", top_p, float),
        ("min_p", min_p, float),
    )
    filter_rows = [_per_row(name, value, batch) for name, value, _ in filters]
    seed_rows = _per_row("seed", seed, batch)
    position_rows = _per_row("position", position, batch)
    if all(r is None for r in filter_rows):
        kw = {name: cast(value) for name, value, cast in filters}
        if seed_rows is None and seed is not None:
            kw["seed"] = int(seed)
        if position_rows is None:
            kw["position"] = int(position)
        return (
            [pb.SamplingParams(**kw)],
            None if seed_rows is None else [int(v) for v in seed_rows],
            None if position_rows is None else [int(v) for v in position_rows],
        )
    given = filters + (("position", position, int), ("seed", seed, int))
    rows = filter_rows + [position_rows, seed_rows]
    columns = [
        [None] * batch if value is None and r is None
        else [cast(value)] * batch if r is None
        else [cast(v) for v in r]
        for (_, value, cast), r in zip(given, rows)
    ]
    make = pb.SamplingParams
    return (
        [
            make(temperature=t, top_k=k, top_p=p, min_p=m, position=pos)
            if s is None
            else make(temperature=t, top_k=k, top_p=p, min_p=m, position=pos, seed=s)
            for t, k, p, m, pos, s in zip(*columns)
        ],
        None,
        None,
    )


def _checked(request: Any, result: "SampleResult") -> "SampleResult":
    """The result, unless the server ignored the request's row_seeds (a server older than the
    field would sample with seeds of its own: refuse that rather than return other draws)."""
    if len(request.row_seeds) and len(result.seeds) and not np.array_equal(
        result.seeds, np.asarray(request.row_seeds, dtype=np.uint64)
    ):
        raise SamplerError(
            grpc.StatusCode.FAILED_PRECONDITION,
            "expected the server to sample with the request's row_seeds, got other seeds: the "
            "server predates row_seeds; upgrade samplerd",
        )
    return result


def _logprob_options(logprobs: Union[None, int, Tuple[int, str]]) -> Optional[Any]:
    """None, top_n, or (top_n, "raw" | "processed")."""
    if logprobs is None:
        return None
    if isinstance(logprobs, tuple):
        top_n, source = logprobs
        return pb.LogprobOptions(top_n=int(top_n), source=_LOGPROB_SOURCES[source])
    return pb.LogprobOptions(top_n=int(logprobs))


class HostShmRegion:
    """A POSIX shm object ("/dev/shm/samplerd-...") registered with the server as a region.

    ``array`` is a writable numpy view of the whole object; write the next step's logits into it
    and call :meth:`Client.sample_region`. :meth:`close` (or :meth:`Client.unregister`)
    unregisters the region, unmaps and unlinks the object.
    """

    def __init__(self, client: "Client", name: str, key: str, mm: mmap.mmap, array: np.ndarray):
        self.client = client
        self.name = name
        self.key = key
        self._mmap: Optional[mmap.mmap] = mm
        self.array = array

    @property
    def nbytes(self) -> int:
        return self.array.nbytes

    def close(self) -> None:
        """Unregisters the region (errors ignored), then unmaps and unlinks the object."""
        if self._mmap is None:
            return
        try:
            self.client._unregister_rpc(self.name)
        except SamplerError:
            pass
        self.client._shm.pop(self.name, None)
        self.array = np.empty(0, dtype=self.array.dtype)
        try:
            self._mmap.close()
        except BufferError:  # a caller still holds a view; the mapping goes with it
            pass
        self._mmap = None
        try:
            os.unlink("/dev/shm" + self.key)
        except FileNotFoundError:
            pass

    def __enter__(self) -> "HostShmRegion":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class StreamSession:
    """One SampleStream call for a decode loop: one :meth:`step` per decode step, in order.

    A step the server rejects raises :class:`SamplerError`; the session stays open. Not
    thread-safe: one step at a time. Close it (or use it as a context manager) when done.
    """

    def __init__(self, client: "Client") -> None:
        self._client = client
        self._requests: "queue.Queue[Any]" = queue.Queue()
        self._closed = False

        def gen() -> Iterator[Any]:
            while True:
                item = self._requests.get()
                if item is None:
                    return
                yield item

        self._call = client._stub.SampleStream(gen())
        self._responses = iter(self._call)

    def step(self, logits: Any, **kwargs: Any) -> SampleResult:
        """Samples one step; takes the same arguments as :meth:`Client.sample`."""
        return self._client._send_logits(logits, self.step_request, **kwargs)

    def step_request(self, request: Any) -> SampleResult:
        """Sends a prepared samplerd.v1.SampleRequest as the next step and waits for its answer."""
        if self._closed:
            raise SamplerError(grpc.StatusCode.FAILED_PRECONDITION, "stream session is closed")
        self._requests.put(pb.SampleStreamRequest(request=request))
        try:
            reply = next(self._responses)
        except grpc.RpcError as e:
            self._closed = True
            raise SamplerError._from_rpc(e) from None
        except StopIteration:
            self._closed = True
            raise SamplerError(grpc.StatusCode.UNAVAILABLE, "stream ended by the server") from None
        if reply.status.code != 0:
            code = _CODES.get(reply.status.code, grpc.StatusCode.UNKNOWN)
            raise SamplerError(code, reply.status.message)
        return _checked(request, SampleResult._from_pb(reply.response))

    def close(self) -> None:
        """Half-closes the stream and waits for the server to end it."""
        if self._closed:
            return
        self._closed = True
        self._requests.put(None)
        try:
            for _ in self._responses:
                pass
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                raise SamplerError._from_rpc(e) from None

    def __enter__(self) -> "StreamSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Client:
    """A samplerd client over one gRPC channel. Thread-safe (streams excepted).

    ``target`` is "unix:///abs/path.sock" or "host:port". Unary calls get ``timeout`` seconds.

    ``cuda_ipc`` says how CUDA tensors travel: "auto" (default) through GPU IPC when the server
    samples on the same GPU and accepts it, else (with one warning saying why) copied to the
    host and sent inline; "always" raises instead of falling back; "never" always copies.
    ``max_cuda_regions`` bounds the GPU IPC regions kept registered (least recently used go).
    ``cuda_ready`` orders the server's read after the engine's writes: "event" (default) sends an
    IPC event recorded on the tensor's current stream, which the server's stream waits for (the
    call overlaps the engine's GPU work); "sync" synchronizes that stream before sending (see
    samplerd/_cuda.py for the measured costs of each).
    """

    _CUDA_IPC_MODES = ("auto", "always", "never")
    #: Registration refusals that mean "GPU IPC cannot work here" (fall back in "auto").
    _IPC_REFUSALS = (
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.NOT_FOUND,
    )

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        timeout: Optional[float] = 10.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        cuda_ipc: str = "auto",
        max_cuda_regions: int = 16,
        cuda_ready: str = "event",
    ) -> None:
        if cuda_ipc not in self._CUDA_IPC_MODES:
            raise ValueError(f"cuda_ipc: expected one of {self._CUDA_IPC_MODES}, got {cuda_ipc!r}")
        if max_cuda_regions < 1:
            raise ValueError(f"max_cuda_regions: expected >= 1, got {max_cuda_regions}")
        self.target = target
        self.timeout = timeout
        self.cuda_ipc = cuda_ipc
        self._channel = grpc.insecure_channel(
            target,
            options=[
                ("grpc.max_send_message_length", max_message_bytes),
                ("grpc.max_receive_message_length", max_message_bytes),
            ],
        )
        self._stub = pb_grpc.SamplerServiceStub(self._channel)
        self._shm: Dict[str, HostShmRegion] = {}
        self._lock = threading.Lock()
        self._info: Any = None
        self._device_sessions: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._cuda = CudaIpc(
            self._call, self._stub, self._cached_server_info, max_cuda_regions, cuda_ready
        )
        #: Why CUDA tensors are copied to the host ("auto" mode after a refusal), else None.
        self.cuda_ipc_off_reason: Optional[str] = None
        # Regions are given back at interpreter exit when the client was not closed.
        ref = weakref.ref(self)
        self._at_exit = lambda: ref() is not None and ref()._release_regions()  # type: ignore
        atexit.register(self._at_exit)

    @property
    def stub(self) -> Any:
        """The generated SamplerServiceStub, for anything this wrapper does not cover."""
        return self._stub

    def _call(self, method: Any, request: Any) -> Any:
        try:
            return method(request, timeout=self.timeout)
        except grpc.RpcError as e:
            raise SamplerError._from_rpc(e) from None

    # --- sampling -------------------------------------------------------------------------------

    def make_request(
        self,
        logits: Any = None,
        *,
        temperature: PerRow = 1.0,
        top_k: PerRow = 0,
        top_p: PerRow = 1.0,
        min_p: PerRow = 0.0,
        seed: Optional[PerRow] = None,
        position: PerRow = 0,
        logprobs: Union[None, int, Tuple[int, str]] = None,
        request_id: str = "",
        region: Optional[Tuple[str, int, int, Tuple[int, int]]] = None,
        joint_top_p: bool = False,
        tensor: Any = None,
        ready_event: bytes = b"",
    ) -> Any:
        """Builds a samplerd.v1.SampleRequest (see :meth:`sample` for the arguments).

        ``region`` = (name, byte offset, DType enum, (B, V)) references a registered region
        instead of sending ``logits``; ``tensor`` is a prepared samplerd.v1.Tensor, sent as is,
        and ``ready_event`` a CUDA IPC event handle the server waits for. Torch tensors given as
        ``logits`` here are copied to the host (:meth:`sample` sends CUDA tensors by GPU IPC).
        """
        if tensor is not None:
            batch, vocab = int(tensor.shape[0]), int(tensor.shape[1])
        elif region is not None:
            name, offset, dtype, (batch, vocab) = region
            tensor = pb.Tensor(
                dtype=dtype,
                shape=[batch, vocab],
                region=pb.RegionSlice(region=name, offset=int(offset)),
            )
        else:
            dtype, (batch, vocab), data = _tensor_bytes(logits)
            tensor = pb.Tensor(dtype=dtype, shape=[batch, vocab], inline_data=data)
        params, row_seeds, row_positions = _params(
            batch, temperature, top_k, top_p, min_p, seed, position
        )
        if joint_top_p:
            for p in params:
                p.top_p_mode = pb.TOP_P_MODE_JOINT
        request = pb.SampleRequest(request_id=request_id, logits=tensor, params=params)
        if row_seeds is not None:
            request.row_seeds.extend(row_seeds)
        if row_positions is not None:
            request.row_positions.extend(row_positions)
        if ready_event:
            request.ready_event = bytes(ready_event)
        options = _logprob_options(logprobs)
        if options is not None:
            request.logprobs.CopyFrom(options)
        return request

    def sample(
        self,
        logits: Any,
        temperature: PerRow = 1.0,
        top_k: PerRow = 0,
        top_p: PerRow = 1.0,
        min_p: PerRow = 0.0,
        seed: Optional[PerRow] = None,
        position: PerRow = 0,
        logprobs: Union[None, int, Tuple[int, str]] = None,
        request_id: str = "",
        *,
        joint_top_p: bool = False,
    ) -> SampleResult:
        """Samples one token per row of ``logits`` (sent inline, or by GPU IPC for CUDA tensors).

        Args:
            logits: [B, V] (or [V]) numpy float32/float16 array, or a torch tensor (float32,
                float16, bfloat16). A CUDA tensor stays on the GPU (GPU IPC, see ``cuda_ipc``);
                other tensors are copied to the host.
            temperature, top_k, top_p, min_p, position: a scalar for every row, or B values.
                temperature 0 is greedy.
            seed: None (the server picks; see ``result.seeds``), an int, or B ints.
            logprobs: None, top_n, or (top_n, "raw" | "processed").
            request_id: echoed in the result.
            joint_top_p: top-p against the full row's mass (SGLang) instead of vLLM's.

        Raises:
            SamplerError: the server's code (INVALID_ARGUMENT, UNAVAILABLE, ...) and message.
        """
        return self._send_logits(
            logits,
            self.sample_request,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            seed=seed,
            position=position,
            logprobs=logprobs,
            request_id=request_id,
            joint_top_p=joint_top_p,
        )

    def _send_logits(self, logits: Any, send: Any, **kwargs: Any) -> SampleResult:
        """Builds the request for ``logits`` (by GPU IPC for CUDA tensors), ``send``s it (a
        unary call or a stream step) and gives the tensor's lease back after the reply."""
        tensor, ready, lease = self._logits_tensor(logits)
        try:
            return send(self.make_request(tensor=tensor, ready_event=ready, **kwargs))
        finally:
            if lease is not None:
                lease.release()

    def _logits_tensor(self, logits: Any) -> Tuple[Any, bytes, Optional[Lease]]:
        """(samplerd.v1.Tensor, ready event handle, Lease to release after the reply)."""
        if is_cuda_tensor(logits) and self.cuda_ipc != "never" and not self.cuda_ipc_off_reason:
            try:
                return self._cuda.prepare(logits)
            except IpcUnavailable as e:
                self._ipc_refused(str(e))
            except SamplerError as e:
                if e.code not in self._IPC_REFUSALS:
                    raise
                self._ipc_refused(f"the server refused the region: {e}")
        dtype, (batch, vocab), data = _tensor_bytes(logits)
        return pb.Tensor(dtype=dtype, shape=[batch, vocab], inline_data=data), b"", None

    def _ipc_refused(self, reason: str) -> None:
        if self.cuda_ipc == "always":
            raise SamplerError(grpc.StatusCode.FAILED_PRECONDITION, f"GPU IPC: {reason}")
        self.cuda_ipc_off_reason = reason
        warnings.warn(
            f"samplerd: CUDA tensors are copied to the host and sent inline: {reason}",
            RuntimeWarning,
            stacklevel=4,
        )

    def sample_request(self, request: Any) -> SampleResult:
        """Sends a prepared samplerd.v1.SampleRequest."""
        return _checked(request, SampleResult._from_pb(self._call(self._stub.Sample, request)))

    def stream(self) -> StreamSession:
        """Opens a stream session for a decode loop (one per engine, for its lifetime)."""
        return StreamSession(self)

    def device_session(
        self,
        max_batch: int = 128,
        vocab: int = 151936,
        dtype: Any = "float32",
        plane: str = "auto",
        logprobs: Union[bool, str] = False,
        device: Any = None,
        **kwargs: Any,
    ) -> Any:
        """Opens a device session: a per-step data plane with no RPC per step.

        ``device=None`` gives a numpy session (host plane, numpy logits); a CUDA device (or
        ``plane="gpu"``) a torch session whose sample() only enqueues on the current stream.
        ``plane``: "auto", "host" or "gpu"; ``logprobs``: False, True / "raw", "processed".
        Keywords: ``host_plane_max_batch`` (auto: B up to it on the host plane), ``step_timeout``
        and ``close_timeout`` (seconds), ``spin_s`` (numpy sessions: how long to spin on `done`
        before sleeping; default 1 ms, 0 with fewer than 4 cores). See
        samplerd/_device_session.py.

        Raises:
            SamplerError: the server's refusal of the open (FAILED_PRECONDITION for a plane it
                cannot serve, RESOURCE_EXHAUSTED over --max_device_sessions, ...).
        """
        from ._device_session import DeviceSession

        return DeviceSession(self, max_batch, vocab, dtype, plane, logprobs, device, **kwargs)

    # --- regions --------------------------------------------------------------------------------

    def register_host_shm(
        self, name: str, array: Union[np.ndarray, int], *, key: Optional[str] = None
    ) -> HostShmRegion:
        """Creates a POSIX shm object, copies ``array`` into it and registers it as ``name``.

        ``array`` may also be a byte size (the object is then zero-filled, a uint8 view). The
        key defaults to "/samplerd-<name>-<pid>". The object lives until the region is closed,
        unregistered, or the client closed. Host shm works over the server's unix socket.
        """
        if isinstance(array, (int, np.integer)):
            src = np.zeros(int(array), dtype=np.uint8)
        else:
            src = np.ascontiguousarray(array)
        nbytes = src.nbytes
        if nbytes == 0:
            raise ValueError("register_host_shm: expected a non-empty array")
        key = key or f"{SHM_PREFIX}{name}-{os.getpid()}"
        if not key.startswith(SHM_PREFIX) or "/" in key[1:] or ".." in key:
            raise ValueError(f"register_host_shm: expected a key '{SHM_PREFIX}NAME', got {key!r}")
        path = "/dev/shm" + key
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, nbytes)
            mm = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        os.close(fd)
        view = np.frombuffer(mm, dtype=src.dtype).reshape(src.shape)
        view[...] = src
        region = HostShmRegion(self, name, key, mm, view)
        request = pb.RegisterRegionRequest(
            name=name, host_shm=pb.HostShmRegion(key=key, offset=0, byte_size=nbytes)
        )
        try:
            self._call(self._stub.RegisterRegion, request)
        except SamplerError:
            region._mmap = None
            del view
            try:
                mm.close()
            except BufferError:
                pass
            os.unlink(path)
            raise
        with self._lock:
            self._shm[name] = region
        return region

    def sample_region(
        self,
        region: Union[HostShmRegion, str],
        shape: Optional[Tuple[int, int]] = None,
        dtype: Any = None,
        offset: int = 0,
        **kwargs: Any,
    ) -> SampleResult:
        """Samples logits that lie in a registered region, at byte ``offset``.

        With a :class:`HostShmRegion`, shape and dtype default to its array's ([V] arrays are one
        row). Other arguments as for :meth:`sample`.
        """
        if isinstance(region, HostShmRegion):
            arr = region.array
            shape = shape or ((1, arr.shape[0]) if arr.ndim == 1 else tuple(arr.shape))
            dtype = arr.dtype if dtype is None else dtype
            name = region.name
        else:
            name = region
        if shape is None or dtype is None:
            raise ValueError("sample_region: shape and dtype are required for a region name")
        enum = dtype if isinstance(dtype, int) else _DTYPES.get(np.dtype(dtype))
        if enum is None:
            raise TypeError(f"sample_region: expected float32 or float16, got {dtype}")
        request = self.make_request(region=(name, offset, enum, tuple(shape)), **kwargs)
        return self.sample_request(request)

    def _unregister_rpc(self, name: str) -> None:
        self._call(self._stub.UnregisterRegion, pb.UnregisterRegionRequest(name=name))

    def unregister(self, name: str) -> None:
        """Unregisters a region; a host shm object this client created is unlinked too."""
        with self._lock:
            region = self._shm.pop(name, None)
        if region is not None:
            region.close()
        else:
            self._unregister_rpc(name)

    def list_regions(self) -> List[Any]:
        """The registered regions (samplerd.v1.RegionInfo), sorted by name."""
        return list(self._call(self._stub.ListRegions, pb.ListRegionsRequest()).regions)

    # --- info and lifetime ----------------------------------------------------------------------

    def server_info(self) -> Any:
        """The server's samplerd.v1.GetServerInfoResponse (version, backend, devices, limits)."""
        return self._call(self._stub.GetServerInfo, pb.GetServerInfoRequest())

    def _cached_server_info(self) -> Any:
        if self._info is None:
            self._info = self.server_info()
        return self._info

    @property
    def cuda_regions(self) -> List[str]:
        """Names of the GPU IPC regions registered for CUDA tensors (least recent first)."""
        return self._cuda.region_names

    def release_cuda_regions(self) -> None:
        """Unregisters the GPU IPC regions of CUDA tensors; later calls register anew. Call it
        after ``torch.cuda.empty_cache()``, so that the server does not keep freed segments."""
        self._cuda.close()

    def _release_regions(self) -> None:
        for session in list(self._device_sessions):
            session.close()
        with self._lock:
            regions = list(self._shm.values())
        for region in regions:
            region.close()
        self._cuda.close()

    def close(self) -> None:
        """Releases the regions this client registered (host shm objects are unlinked, GPU IPC
        regions unregistered) and closes the channel."""
        atexit.unregister(self._at_exit)
        self._release_regions()
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
