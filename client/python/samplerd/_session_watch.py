"""A device session's gRPC call and fault handling: the `open` message, the call a daemon thread
watches, and the plane base class that turns the call's end into an abort.

When the call ends without `closed` (the server died, drained or cancelled it), the watcher
thread marks the plane broken and writes step_status = ABORTED, done = DONE into its control
block, so that a pending engine wait completes at once; the next sample() raises ABORTED.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Optional

import grpc

from . import _session_layout as lay
from ._errors import SamplerError
from ._pb import pb


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


def _open_message(layout: lay.Layout, dtype_enum: int, logprob_source: Optional[int], region: str,
                  plane: int, device: str, control_region: Optional[str] = None) -> Any:
    msg = pb.DeviceSessionOpen(
        device=device, dtype=dtype_enum, max_batch=layout.max_batch, vocab=layout.vocab,
        plane=plane, unregister_regions_on_end=True,
        **layout.slices(pb, region, control_region))
    if logprob_source is not None:
        msg.logprob_source = logprob_source
    msg.logit_bias_capacity = layout.bias_capacity
    msg.token_history_capacity = layout.history_capacity
    return msg
