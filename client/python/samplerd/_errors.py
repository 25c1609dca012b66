"""SamplerError: how every failed call of the client surfaces (the gRPC code and message)."""

from __future__ import annotations

from typing import Any

import grpc

#: grpc.StatusCode by its integer value (a stream step's google.rpc.Status carries the integer).
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

    @classmethod
    def _from_status(cls, status: Any) -> "SamplerError":
        """The error of a stream step's google.rpc.Status (code != 0)."""
        return cls(_CODES.get(status.code, grpc.StatusCode.UNKNOWN), status.message)
