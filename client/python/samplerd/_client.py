"""Client: the samplerd client over one gRPC channel (the package docstring shows its use).

The rest of the client lives by concern: the sampling options (_options.py), logits into
requests (_encoding.py), results (_results.py), errors (_errors.py), host shm regions
(_host_shm.py), streams (_stream.py), CUDA tensors by GPU IPC (_cuda.py) and device sessions
(_device_session.py).
"""

from __future__ import annotations

import atexit
import threading
import warnings
import weakref
from typing import Any, Dict, List, Optional, Tuple, Union

import grpc
import numpy as np

from ._pb import pb, pb_grpc  # first: it says how to make the stubs when they are missing
from ._cuda import CudaIpc, IpcUnavailable, Lease, is_cuda_tensor  # noqa: I100
from ._encoding import _inline_tensor, _region_dtype, _region_tensor
from ._errors import SamplerError
from ._host_shm import HostShmRegion
from ._options import SampleOptions, with_options
from ._processors import check_bitmask_shape, host_bitmask
from ._results import SampleResult, _checked
from ._stream import StreamSession

DEFAULT_TARGET = "unix:///run/samplerd/samplerd.sock"
#: The server's default message limit (Limits.max_message_bytes).
DEFAULT_MAX_MESSAGE_BYTES = 256 << 20


class Client:
    """A samplerd client over one gRPC channel. Thread-safe (streams excepted).

    ``target`` is "unix:///abs/path.sock" or "host:port". Unary calls get ``timeout`` seconds.
    ``max_message_bytes`` bounds the messages sent and received (keep it <= the server's limit);
    stream steps whose inline logits exceed ``stream_chunk_bytes`` travel as several messages
    that the server reassembles (0, the default: never split).

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
        stream_chunk_bytes: int = 0,
    ) -> None:
        if cuda_ipc not in self._CUDA_IPC_MODES:
            raise ValueError(f"cuda_ipc: expected one of {self._CUDA_IPC_MODES}, got {cuda_ipc!r}")
        if max_cuda_regions < 1:
            raise ValueError(f"max_cuda_regions: expected >= 1, got {max_cuda_regions}")
        if stream_chunk_bytes < 0:
            raise ValueError(f"stream_chunk_bytes: expected >= 0, got {stream_chunk_bytes}")
        self.target = target
        self.timeout = timeout
        self.cuda_ipc = cuda_ipc
        self.max_message_bytes = max_message_bytes
        self.stream_chunk_bytes = stream_chunk_bytes
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

    @with_options()
    def make_request(
        self,
        logits: Any = None,
        *,
        region: Optional[Tuple[str, int, int, Tuple[int, int]]] = None,
        tensor: Any = None,
        ready_event: bytes = b"",
        **options: Any,
    ) -> Any:
        """Builds a samplerd.v1.SampleRequest (see :meth:`sample` for the arguments).

        ``region`` = (name, byte offset, DType enum, (B, V)) references a registered region
        instead of sending ``logits``; ``tensor`` is a prepared samplerd.v1.Tensor, sent as is,
        and ``ready_event`` a CUDA IPC event handle the server waits for. Torch tensors given as
        ``logits`` here are copied to the host (:meth:`sample` sends CUDA tensors by GPU IPC).
        """
        sample_options = SampleOptions(**options)
        if tensor is None:
            tensor = _region_tensor(*region) if region is not None else _inline_tensor(logits)
        return sample_options.request(tensor, ready_event)

    @with_options(positional=True)
    def sample(self, logits: Any, *args: Any, **options: Any) -> SampleResult:
        """Samples one token per row of ``logits`` (sent inline, or by GPU IPC for CUDA tensors).

        The options after ``logits`` are SampleOptions' fields (_options.py): by keyword, or by
        position in this order (joint_top_p by keyword only).

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

            The logits processors (by keyword; applied before temperature and the filters, in
            this order: logit bias, penalties, bitmask; each optional):

            logit_bias: {token id: bias} added to every row, or B such dicts (None for none);
                +inf forces a token, -inf bans it. Or a samplerd.v1.LogitBias, sent as is
                (e.g. ``LogitBias(region=RegionSlice(...))`` naming lists written with
                ``samplerd.packed_lists`` into a registered region).
            repetition_penalty, presence_penalty, frequency_penalty: a scalar or B values
                (vLLM's definitions; unset: off). They act on each row's token history:
            prompt_token_ids, output_token_ids: B sequences of token ids (the prompt and the
                tokens generated so far); the client sends each row's distinct tokens with
                their output count and whether the prompt has them.
            token_history: instead of those two, a samplerd.v1.TokenHistory sent as is (e.g.
                a region slice, like logit_bias).
            token_bitmask: allowed tokens, bit t % 32 of word t / 32 of a row (xgrammar's and
                vLLM's layout): int32 [B, ceil(V / 32)] as a numpy array or torch tensor (a
                CUDA tensor travels by GPU IPC like CUDA logits, without a copy), a numpy bool
                [B, V], or a samplerd.v1.TokenBitmask. A row left with no allowed token gets
                row status ROW_STATUS_INVALID_NO_ALLOWED (5) and token -1.

        Raises:
            SamplerError: the server's code (INVALID_ARGUMENT, UNAVAILABLE, ...) and message.
            ValueError: a per-row option without 1 or B values; a bitmask of the wrong shape or
                dtype; token histories or per-row biases without B rows.
        """
        options = SampleOptions._of(args, options)
        return self._send_logits(logits, self.sample_request, options)

    def _send_logits(self, logits: Any, send: Any, options: SampleOptions) -> SampleResult:
        """Builds the request for ``logits`` (by GPU IPC for CUDA tensors, a CUDA bitmask too),
        ``send``s it (a unary call or a stream step) and gives the tensors' leases back after
        the reply."""
        leases: List[Optional[Lease]] = []
        try:
            tensor, ready, lease = self._by_ipc_or_inline(logits, self._cuda.prepare,
                                                          _inline_tensor)
            leases.append(lease)
            mask = None
            if is_cuda_tensor(options.token_bitmask):
                mask, mask_ready, lease = self._cuda_bitmask(options.token_bitmask, tensor)
                leases.append(lease)
                # The same event of the device, recorded after the logits' (b"": all done).
                ready = mask_ready if lease is not None else ready
            return send(options.request(tensor, ready, token_bitmask=mask))
        finally:
            for lease in leases:
                if lease is not None:
                    lease.release()

    def _cuda_bitmask(self, mask: Any, logits: Any) -> Tuple[Any, bytes, Optional[Lease]]:
        """(samplerd.v1.TokenBitmask, ready event handle, Lease) of a CUDA int32 bitmask
        [B, ceil(V / 32)] for the logits Tensor ``logits``: a GPU IPC region slice, or inline
        words when GPU IPC cannot serve it (as for logits; see ``cuda_ipc``)."""
        import torch  # lazily: a CUDA tensor means torch is there

        batch, vocab = int(logits.shape[0]), int(logits.shape[1])
        if mask.dtype != torch.int32:
            raise ValueError(f"token_bitmask: expected a torch int32 tensor, got {mask.dtype}")
        check_bitmask_shape(tuple(mask.shape), batch, vocab)

        def share(m: Any) -> Tuple[Any, bytes, Lease]:
            region, ready, lease = self._cuda.share(m.detach())
            return pb.TokenBitmask(region=region), ready, lease

        return self._by_ipc_or_inline(mask, share, lambda m: host_bitmask(m, batch, vocab))

    def _by_ipc_or_inline(
        self, x: Any, share: Any, inline: Any
    ) -> Tuple[Any, bytes, Optional[Lease]]:
        """(message, ready event handle, Lease to release after the reply): ``share(x)`` for a
        CUDA tensor when GPU IPC serves it, else ``inline(x)`` (a host copy)."""
        if is_cuda_tensor(x) and self.cuda_ipc != "never" and not self.cuda_ipc_off_reason:
            try:
                return share(x)
            except IpcUnavailable as e:
                self._ipc_refused(str(e))
            except SamplerError as e:
                if e.code not in self._IPC_REFUSALS:
                    raise
                self._ipc_refused(f"the server refused the region: {e}")
        return inline(x), b"", None

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
        before sleeping; default 1 ms, 0 with fewer than 4 cores), ``token_bitmask=True`` (an
        allowed-token bitmask buffer) and ``processors`` (True, (NB, NH) or {"logit_bias": NB,
        "token_history": NH}: a buffer for penalties, logit bias and token histories of up to NB
        and NH entries over all rows; True: 64 and 2048 per row). See
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
        return HostShmRegion._register(self, name, array, key)

    @with_options()
    def sample_region(
        self,
        region: Union[HostShmRegion, str],
        shape: Optional[Tuple[int, int]] = None,
        dtype: Any = None,
        offset: int = 0,
        **options: Any,
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
        enum = _region_dtype(dtype)
        if enum is None:
            raise TypeError(f"sample_region: expected float32 or float16, got {dtype}")
        request = self.make_request(region=(name, offset, enum, tuple(shape)), **options)
        try:
            return self.sample_request(request)
        except SamplerError as err:
            # A server that restarted has forgotten the region: register this client's object
            # again and retry once.
            if not (
                isinstance(region, HostShmRegion)
                and err.code == grpc.StatusCode.NOT_FOUND
                and region._register_again()
            ):
                raise
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
