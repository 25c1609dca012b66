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
      ``host_plane_max_batch = N > 0``, B <= N goes to the host plane and larger B to the GPU
      plane: the session then opens two server sessions (one per plane, each with its own
      buffers; the host plane's hold N rows unless the session has a processors buffer) and
      picks one per sample() call by B; ``logits_buffer`` is then the GPU plane's, and the host
      plane copies from it. The default (None) is 1 when the server runs without MPS
      (GetServerInfo device_sessions.mps) and 0 under MPS, following the H200 decode loop
      (tests/bench/DEVICE_SESSION_RESULTS.md): without MPS a GPU-plane step pays two context
      switches (~270 us), and at B = 1 the host plane's CPU sampler is cheaper; from B = 4 on
      the GPU plane wins. When the server refuses the default's second session
      (RESOURCE_EXHAUSTED: --max_device_sessions), the session keeps the GPU plane alone.

Faults: when the DeviceSession call ends without ``closed`` (the server died or drains), the
watcher thread writes ``step_status = ABORTED`` and ``done = 1`` into the control block itself
(plain stores: the control block is host memory in both planes), so a pending engine wait
completes at once, and the session is broken: the next sample() (or check()) raises
SamplerError(ABORTED, "the samplerd server went away: ..."). An aborted step inside a replayed
graph leaves stale outputs: call :meth:`DeviceSession.check` after the replay's results are in.

close() sends ``close``, waits for ``closed``, unregisters the regions, unpins and unlinks the shm
objects; Client.close() and interpreter exit close open sessions.

This file holds the public class and the choice of planes; the rest lives beside it:
_session_params.py (dtypes and parameter values), _session_watch.py (the gRPC call, its watcher
thread and the plane base class), _session_shm.py (host shm buffers, ordered control-block
stores), _session_host.py (the numpy and torch host planes), _session_torch.py (what both torch
planes share: stream operations, device views, pinning), _session_gpu.py (the GPU plane) and
_session_layout.py (where the buffers lie).
"""

from __future__ import annotations

import atexit
import weakref
from typing import Any, Dict, Optional, Tuple

import grpc
import numpy as np

from . import _session_layout as lay
from ._errors import SamplerError
from ._session_gpu import _TorchGpuPlane
from ._session_host import _NumpyHostPlane, _TorchHostPlane
from . import _session_processors as _procs
from ._encoding import _is_torch_tensor
from ._processors import bitmask_array
from ._session_params import _DTYPES, _LOGPROB_SOURCES, _dtype_name, _top_p_mode
from ._session_torch import _device_index
from ._session_watch import _Plane

_PLANES = ("auto", "host", "gpu")
# The penalties' "off" values: given as such, they need no processors buffer.
_PENALTY_DEFAULTS = {"repetition_penalty": 1.0, "presence_penalty": 0.0,
                     "frequency_penalty": 0.0}


class DeviceSession:
    """A device session (see the module docstring). Made by :meth:`Client.device_session`.

    Attributes: ``plane`` ("host" or "gpu": the plane of the last sample(), before any the one
    that serves B = 1), ``session_id`` (the server's id of that plane's session), ``planes``
    (plane -> session id), ``steps`` (steps the server completed, summed over planes; None until
    closed), ``host_plane_max_batch``, ``logits_buffer``, ``sampled_logprobs`` (the last step's,
    when the session was opened with ``logprobs``).
    """

    #: Default of ``host_plane_max_batch`` without MPS: "auto" serves B <= this on the host
    #: plane (when the server serves the GPU plane too). Under MPS the default is 0 (the GPU
    #: plane for every B: a GPU-plane step then costs no context switch). Measured on the H200:
    #: tests/bench/DEVICE_SESSION_RESULTS.md, "The engine decode loop".
    HOST_PLANE_MAX_BATCH = 1

    def __init__(self, client: Any, max_batch: int = 128, vocab: int = 151936,
                 dtype: Any = "float32", plane: str = "auto", logprobs: Any = False,
                 device: Any = None, *, token_bitmask: bool = False, processors: Any = False,
                 host_plane_max_batch: Optional[int] = None,
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
        self.close_timeout = close_timeout
        self.steps: Optional[int] = None
        self._closed = False
        self._host: Optional[_Plane] = None
        self._gpu: Optional[_TorchGpuPlane] = None
        self._staging: Any = None
        layout = lay.Layout.of(self.max_batch, self.vocab, _DTYPES[dtype][1], bool(source),
                               bitmask=bool(token_bitmask),
                               capacities=_procs.capacities(processors, self.max_batch,
                                                            self.vocab))
        self.layout = layout
        self.torch_session = device is not None or plane == "gpu"
        support = client._cached_server_info().device_sessions
        default_split = host_plane_max_batch is None
        self.host_plane_max_batch = (
            (0 if support.mps else self.HOST_PLANE_MAX_BATCH) if default_split
            else int(host_plane_max_batch))
        if (layout.token_bitmask is not None or layout.processors is not None) and \
                not support.processors:
            raise SamplerError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"expected a server that applies device-session processors, got {client.target} "
                "without (GetServerInfo device_sessions.processors is false): it would ignore "
                "token_bitmask and processors")
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
                    self._host = self._open_torch_host(client, torch, index, layout, dtype,
                                                       source, default_split and want_gpu)
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

    def _open_torch_host(self, client: Any, torch: Any, index: int, layout: lay.Layout,
                         dtype: str, source: Optional[int], optional: bool) -> Optional[_Plane]:
        """The torch host plane. Beside a GPU plane it holds host_plane_max_batch rows (the
        processors buffer is packed for max_batch rows, so a session with one keeps the full
        layout). ``optional``: the default split, which a server at --max_device_sessions may
        refuse; the session then keeps its GPU plane alone."""
        rows = self.max_batch
        if self._gpu is not None and layout.processors is None:
            rows = max(1, min(self.max_batch, self.host_plane_max_batch))
        if rows != self.max_batch:
            layout = lay.Layout.of(rows, self.vocab, layout.itemsize,
                                   layout.sampled_logprobs is not None,
                                   bitmask=layout.token_bitmask is not None)
        try:
            return _TorchHostPlane(client, torch, index, layout, dtype, source)
        except SamplerError as e:
            if not optional or e.code != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
            self.host_plane_max_batch = 0
            return None

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

    def pack_processors(self, batch: int, logit_bias: Any = None,
                        repetition_penalty: Any = 1.0, presence_penalty: Any = 0.0,
                        frequency_penalty: Any = 0.0, prompt_token_ids: Any = None,
                        output_token_ids: Any = None) -> Any:
        """The bytes of the session's processors buffer (numpy uint8) for rows [0, batch), from
        the same arguments as sample() takes: copy them into a CUDA uint8 tensor of fixed shape
        and pass it as ``sample(..., processors=tensor)`` to change them between replays of a
        captured graph. Raises ValueError for lists over the session's capacities."""
        return _procs.pack(self.layout, batch, logit_bias, repetition_penalty, presence_penalty,
                           frequency_penalty, prompt_token_ids, output_token_ids)

    def _processors(self, batch: int, token_bitmask: Any, processors: Any,
                    lists: Dict[str, Any]) -> Dict[str, Any]:
        """The step's bitmask (None: all allowed) and processors bytes, checked against the
        buffers the session was opened with."""
        given = {k for k, v in lists.items() if v is not None and not (
            k in _PENALTY_DEFAULTS and not _is_torch_tensor(v) and np.ndim(v) == 0
            and float(v) == _PENALTY_DEFAULTS[k])}
        out: Dict[str, Any] = {"token_bitmask": None, "processors": None}
        if token_bitmask is not None:
            if self.layout.token_bitmask is None:
                raise ValueError("token_bitmask: expected a session opened with "
                                 "token_bitmask=True, got one without a bitmask buffer")
            if _is_torch_tensor(token_bitmask) and token_bitmask.is_cuda:
                out["token_bitmask"] = token_bitmask  # checked by the torch plane
            else:
                out["token_bitmask"] = bitmask_array(token_bitmask, batch, self.vocab).reshape(
                    batch, -1)
        if self.layout.processors is None:
            if processors is not None or given:
                raise ValueError(f"{', '.join(sorted(given)) or 'processors'}: expected a session "
                                 "opened with processors=..., got one without a processors "
                                 "buffer")
            return out
        if processors is not None:
            if given:
                raise ValueError(f"processors: expected either a packed buffer or "
                                 f"{', '.join(sorted(given))}, got both")
            out["processors"] = processors
        else:
            out["processors"] = self.pack_processors(batch, **{
                k: (_PENALTY_DEFAULTS[k] if v is None and k in _PENALTY_DEFAULTS else v)
                for k, v in lists.items()})
        return out

    def sample(self, logits: Any, temperature: Any = 1.0, top_k: Any = 0, top_p: Any = 1.0,
               min_p: Any = 0.0, seeds: Any = None, positions: Any = None,
               top_p_mode: Any = "top_k_first", *, token_bitmask: Any = None,
               logit_bias: Any = None, repetition_penalty: Any = None,
               presence_penalty: Any = None, frequency_penalty: Any = None,
               prompt_token_ids: Any = None, output_token_ids: Any = None,
               processors: Any = None) -> Tuple[Any, Any]:
        """Samples one token per row of ``logits`` [B, V] (B <= max_batch) in one step.

        Each parameter is a scalar or B values (a sequence, numpy array, or for torch sessions a
        CUDA tensor, which a captured graph reads at replay). ``seeds`` and ``positions`` are
        required (there is no server-chosen seed): the Philox key and counter of each row.
        ``top_p_mode``: "top_k_first" (vLLM) or "joint", or per-row TopPMode numbers.

        Logits processors (sessions opened with ``token_bitmask=True`` / ``processors=...``;
        Client.sample's semantics, applied by the server per row before temperature and the
        filters: logit bias, penalties, bitmask):
        ``token_bitmask``: int32 words [B, ceil(V / 32)] (numpy, a bool [B, V] array, or a CUDA
        int32 tensor for torch sessions, copied on the stream: capturable); None: all allowed.
        ``logit_bias``, ``repetition_penalty``, ``presence_penalty``, ``frequency_penalty``,
        ``prompt_token_ids``, ``output_token_ids``: as Client.sample takes them, packed on the
        host into the processors buffer (eager only), rows within the session's capacities.
        ``processors``: instead of those, the packed buffer (pack_processors) as numpy, or as a
        CUDA uint8 tensor that a captured graph reads at replay. A session with processors
        writes them every step (unset: none). A row whose processors break the rules
        (device_session.h) gets status 4; a row with nothing allowed status 5; token -1.

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
        procs = self._processors(batch, token_bitmask, processors, {
            "logit_bias": logit_bias, "repetition_penalty": repetition_penalty,
            "presence_penalty": presence_penalty, "frequency_penalty": frequency_penalty,
            "prompt_token_ids": prompt_token_ids, "output_token_ids": output_token_ids})
        return plane.sample(logits, batch, params, procs)

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
