"""CUDA stream memory operations through libcuda (ctypes), for device sessions on torch streams.

A device-session step on the engine's stream is a few 32-bit writes and one wait on a flag
(proto/samplerd/v1/device_session.h): cuStreamWriteValue32 / cuStreamWaitValue32, which PyTorch
does not expose. The flags are in the session's control block, which is host shm in both
planes, pinned (cudaHostRegister) and addressed through cuMemHostGetDevicePointer. Both
capture into a CUDA graph. Loaded lazily, once per
process; nothing here imports torch.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Optional

#: cuStreamWaitValue32 flag: wait until *addr == value (CU_STREAM_WAIT_VALUE_EQ; 0 is GEQ).
WAIT_EQ = 0x1
#: cuStreamWriteValue32 flag: the write is ordered after the stream's earlier memory operations.
WRITE_DEFAULT = 0x0
#: cudaHostRegister flags: portable (every context) and mapped (a device address exists).
HOST_REGISTER_PORTABLE_MAPPED = 0x1 | 0x2

_lock = threading.Lock()
_lib: Optional["StreamOps"] = None


class CudaDriverError(RuntimeError):
    """A libcuda call failed: the function and its CUresult."""


class StreamOps:
    """The few libcuda entry points device sessions need. Use :func:`stream_ops`."""

    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        self._write = self._pick(lib, "cuStreamWriteValue32_v2", "cuStreamWriteValue32")
        self._wait = self._pick(lib, "cuStreamWaitValue32_v2", "cuStreamWaitValue32")
        for fn in (self._write, self._wait):
            fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
            fn.restype = ctypes.c_int
        self._host_ptr = self._pick(lib, "cuMemHostGetDevicePointer_v2",
                                    "cuMemHostGetDevicePointer")
        self._host_ptr.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_uint]
        self._host_ptr.restype = ctypes.c_int

    @staticmethod
    def _pick(lib: ctypes.CDLL, *names: str):
        for name in names:
            fn = getattr(lib, name, None)
            if fn is not None:
                return fn
        raise CudaDriverError(f"expected libcuda to export one of {names}, got none")

    @staticmethod
    def _check(name: str, rc: int) -> None:
        if rc != 0:
            raise CudaDriverError(f"{name}: expected CUDA_SUCCESS, got CUresult {rc}")

    def write32(self, stream: int, address: int, value: int) -> None:
        """Enqueues *address = value on ``stream`` (a CUstream handle, 0 = legacy default)."""
        self._check("cuStreamWriteValue32", self._write(stream, address, value, WRITE_DEFAULT))

    def wait_eq32(self, stream: int, address: int, value: int) -> None:
        """Enqueues "wait until *address == value" on ``stream``."""
        self._check("cuStreamWaitValue32", self._wait(stream, address, value, WAIT_EQ))

    def host_device_pointer(self, host_pointer: int) -> int:
        """The device address of registered (pinned, mapped) host memory, in the calling
        thread's current context."""
        out = ctypes.c_uint64(0)
        self._check("cuMemHostGetDevicePointer", self._host_ptr(ctypes.byref(out), host_pointer, 0))
        return int(out.value)


def stream_ops() -> StreamOps:
    """The process's StreamOps (libcuda loaded on first use)."""
    global _lib
    with _lock:
        if _lib is None:
            _lib = StreamOps()
        return _lib
