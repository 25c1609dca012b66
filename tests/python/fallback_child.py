"""Child of test_cuda_fallback.py: samples a fake CUDA tensor with cuda_ipc=MODE and prints what
happened, one fact per line. Usage: fallback_child.py TARGET auto|always|never"""

import sys
import warnings

import numpy as np
import torch  # the fake one (tests/python/fake_torch), first on PYTHONPATH

import samplerd

assert torch.__version__ == "0.0-fake", torch.__file__
target, mode = sys.argv[1], sys.argv[2]
logits = np.zeros((2, 5), np.float32)
logits[0, 3] = logits[1, 1] = 9.0
client = samplerd.Client(target, cuda_ipc=mode)
calls = []
real_info = client.server_info
client.server_info = lambda: calls.append(1) or real_info()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        first = client.sample(torch.Tensor(logits), temperature=0).tokens.tolist()
        second = client.sample(torch.Tensor(logits), temperature=0).tokens.tolist()
        print("tokens", first, second)
    except samplerd.SamplerError as e:
        print("error", e.code.name, e.message)
print("warnings", len(caught))
print("reason", client.cuda_ipc_off_reason)
print("regions", client.cuda_regions)
print("server_info calls", len(calls))
client.close()
