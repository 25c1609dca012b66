"""A stand-in for the few torch names the samplerd client touches, with tensors that claim to live
on a CUDA device (they hold a numpy array). Only for tests/python/test_cuda_fallback.py."""

import numpy as np

__version__ = "0.0-fake"

float32, float16, bfloat16 = np.dtype(np.float32), np.dtype(np.float16), "bfloat16"
int32 = np.dtype(np.int32)


class device:  # noqa: N801 - torch's spelling
    def __init__(self, kind, index=None):
        self.type, self.index = kind, index


class Tensor:
    def __init__(self, array, is_cuda=True):
        self._a = np.ascontiguousarray(array)
        self.is_cuda = is_cuda
        self.device = device("cuda" if is_cuda else "cpu", 0 if is_cuda else None)
        self.dtype = self._a.dtype
        self.shape = self._a.shape

    def detach(self):
        return self

    def dim(self):
        return self._a.ndim

    def unsqueeze(self, axis):
        return Tensor(np.expand_dims(self._a, axis), self.is_cuda)

    def is_contiguous(self):
        return True

    def contiguous(self):
        return self

    def cpu(self):
        return Tensor(self._a, is_cuda=False)

    def numpy(self):
        if self.is_cuda:
            raise TypeError("can't convert cuda tensor to numpy (copy it to the host first)")
        return self._a

    def untyped_storage(self):
        raise AssertionError("the client shared a tensor although GPU IPC cannot be used")
