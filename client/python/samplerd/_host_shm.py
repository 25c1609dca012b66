"""Host shm regions: a POSIX shm object this client creates, maps and registers with the server
(Client.register_host_shm), then samples in place (Client.sample_region)."""

from __future__ import annotations

import mmap
import os
from typing import TYPE_CHECKING, Any, Optional, Union

import numpy as np

from ._errors import SamplerError
from ._pb import pb

if TYPE_CHECKING:  # pragma: no cover
    from ._client import Client

#: The server's default --shm_prefix; host shm keys must start with it.
SHM_PREFIX = "/samplerd-"


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

    @classmethod
    def _register(
        cls, client: "Client", name: str, array: Union[np.ndarray, int], key: Optional[str]
    ) -> "HostShmRegion":
        """Client.register_host_shm: creates the object, copies ``array`` into it, registers it
        and adds it to the client's regions. On failure nothing is left behind."""
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
        region = cls(client, name, key, mm, view)
        request = pb.RegisterRegionRequest(
            name=name, host_shm=pb.HostShmRegion(key=key, offset=0, byte_size=nbytes)
        )
        try:
            client._call(client._stub.RegisterRegion, request)
        except SamplerError:
            region._mmap = None
            del view
            try:
                mm.close()
            except BufferError:
                pass
            os.unlink(path)
            raise
        with client._lock:
            client._shm[name] = region
        return region

    @property
    def nbytes(self) -> int:
        return self.array.nbytes

    def _register_again(self) -> bool:
        """Registers the open object under its name again, after the server forgot it (it
        restarted, or someone unregistered the name). True when that succeeded."""
        if self._mmap is None:
            return False
        shm = pb.HostShmRegion(key=self.key, offset=0, byte_size=len(self._mmap))
        request = pb.RegisterRegionRequest(name=self.name, host_shm=shm)
        try:
            self.client._call(self.client._stub.RegisterRegion, request)
        except SamplerError:
            return False
        return True

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
