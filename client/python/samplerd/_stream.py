"""StreamSession: one SampleStream call for a decode loop, one step per decode step."""

from __future__ import annotations

import queue
from typing import TYPE_CHECKING, Any, Iterator

import grpc

from ._errors import SamplerError
from ._options import SampleOptions, with_options
from ._pb import pb
from ._results import SampleResult, _checked

if TYPE_CHECKING:  # pragma: no cover
    from ._client import Client


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

    @with_options()
    def step(self, logits: Any, **options: Any) -> SampleResult:
        """Samples one step; takes the same arguments as :meth:`Client.sample` (by keyword)."""
        return self._client._send_logits(logits, self.step_request, SampleOptions(**options))

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
            raise SamplerError._from_status(reply.status)
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
