"""StreamSession: one SampleStream call for a decode loop, one step per decode step."""

from __future__ import annotations

import queue
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Optional

import grpc

from ._errors import SamplerError
from ._options import SampleOptions, with_options
from ._pb import pb
from ._results import SampleResult, _checked

if TYPE_CHECKING:  # pragma: no cover
    from ._client import Client


class StreamSession:
    """One SampleStream call for a decode loop: one :meth:`step` per decode step, in order.

    A step the server rejects raises :class:`SamplerError`; the session stays open. So does a
    step whose message is larger than the client's ``max_message_bytes`` (RESOURCE_EXHAUSTED,
    not sent: grpc would fail the whole call for it); the client's ``stream_chunk_bytes`` splits
    such steps. Not thread-safe: one step at a time. Close it (or use it as a context manager)
    when done.
    """

    def __init__(self, client: "Client") -> None:
        self._client = client
        # One iterable of stream messages per step; None half-closes.
        self._steps: "queue.Queue[Optional[Iterable[Any]]]" = queue.Queue()
        self._closed = False

        def gen() -> Iterator[Any]:
            while True:
                messages = self._steps.get()
                if messages is None:
                    return
                yield from messages

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
        self._steps.put(self._messages(request))
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

    def _messages(self, request: Any) -> Iterable[Any]:
        """The stream messages of one step: the request alone, or, when its inline logits exceed
        the client's stream_chunk_bytes, the request with their first chunk and then one
        message per further chunk (sliced as gRPC sends them). Raises SamplerError
        (RESOURCE_EXHAUSTED) when the first message is larger than max_message_bytes; the chunk
        messages are no larger than the first."""
        chunk = self._client.stream_chunk_bytes
        first = pb.SampleStreamRequest(request=request)  # a copy: the caller's is not modified
        logits = first.request.logits
        data = logits.inline_data if chunk and logits.WhichOneof("data") == "inline_data" else b""
        if len(data) > chunk:
            logits.inline_data = data[:chunk]
            first.more_chunks = True
        limit, size = self._client.max_message_bytes, first.ByteSize()
        if 0 < limit < size:
            raise SamplerError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"expected a step message of at most {limit} bytes (max_message_bytes), got "
                f"{size} bytes (stream_chunk_bytes splits large steps)",
            )
        if not first.more_chunks:
            return [first]

        def chunked() -> Iterator[Any]:
            yield first
            for offset in range(chunk, len(data), chunk):
                end = offset + chunk
                yield pb.SampleStreamRequest(chunk=data[offset:end], more_chunks=end < len(data))

        return chunked()

    def close(self) -> None:
        """Half-closes the stream and waits for the server to end it."""
        if self._closed:
            return
        self._closed = True
        self._steps.put(None)
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
