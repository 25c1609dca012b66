"""Where a device session's buffers lie (proto/samplerd/v1/device_session.h).

The control block is host shm in both planes. The host plane puts all buffers (control block,
logits, params, token ids, row statuses, and the optional sampled logprobs, token bitmask and
processors) in one host shm object, one region. The GPU plane puts the five data buffers in one CUDA allocation (a GPU IPC
region) and the control block alone in a one-page host shm object (a second region, at offset
0). Each buffer starts at a multiple of ``ALIGN`` bytes (more than any alignment the header
asks for), in this order, with no overlap. The constants mirror the header's; keep them equal.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from typing import Optional, Tuple

# Flag values and step statuses (SAMPLERD_* in device_session.h).
RING = 1
DONE = 1
STEP_OK = 0
STEP_BAD_BATCH = 1
STEP_ABORTED = 2
ROW_OK = 1
ROW_INVALID_PARAMS = 4
ROW_INVALID_NO_ALLOWED = 5

CONTROL_BYTES = 256
#: Size of a GPU-plane session's control shm object: one page, so that pinning it
#: (cudaHostRegister) covers whole pages on both sides.
CONTROL_SHM_BYTES = max(mmap.PAGESIZE, CONTROL_BYTES)
# Byte offsets of the control words, and their indices in a uint32 view of the block.
DOORBELL = 0
BATCH = 4
DONE_WORD = 64
STEP_STATUS = 68
STEPS_DONE = 72

#: Every buffer of the allocation starts at a multiple of this (bytes).
ALIGN = 256

#: TopPMode values of sampler.proto, by the names sample() accepts.
TOP_P_MODES = {"top_k_first": 1, "joint": 2}


def params_offsets(max_batch: int) -> dict:
    """Byte offsets of the params arrays for max_batch M (samplerd_params_*_offset)."""
    m = max_batch
    return {
        "seed": 0,
        "position": 8 * m,
        "temperature": 16 * m,
        "top_k": 20 * m,
        "top_p": 24 * m,
        "min_p": 28 * m,
        "top_p_mode": 32 * m,
    }


def params_bytes(max_batch: int) -> int:
    """Size of the params buffer (samplerd_params_bytes)."""
    return 36 * max_batch


def bitmask_words(vocab: int) -> int:
    """Words per row of the token_bitmask buffer: ceil(V / 32) (samplerd_bitmask_words)."""
    return (vocab + 31) // 32


def processors_offsets(max_batch: int, nb: int, nh: int) -> dict:
    """Byte offsets of the processors arrays (samplerd_processors_*_offset) for max_batch M,
    bias capacity NB and history capacity NH, and their "total" size."""
    m = max_batch
    out = {"repetition": 0, "presence": 4 * m, "frequency": 8 * m, "bias_offsets": 12 * m}
    out["bias_tokens"] = out["bias_offsets"] + 4 * (m + 1)
    out["biases"] = out["bias_tokens"] + 4 * nb
    out["history_offsets"] = out["biases"] + 4 * nb
    out["history_tokens"] = out["history_offsets"] + 4 * (m + 1)
    out["output_counts"] = out["history_tokens"] + 4 * nh
    out["in_prompt"] = out["output_counts"] + 4 * nh
    out["total"] = out["in_prompt"] + nh
    return out


def processors_bytes(max_batch: int, nb: int, nh: int) -> int:
    """Size of the processors buffer (samplerd_processors_bytes)."""
    return processors_offsets(max_batch, nb, nh)["total"]


def _up(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class Layout:
    """Byte offsets of one session's buffers in its allocation, and the allocation's size."""

    max_batch: int
    vocab: int
    itemsize: int  # bytes per logit
    control: Optional[int]  # None: the control block is in a region of its own
    logits: int
    params: int
    token_ids: int
    row_status: int
    sampled_logprobs: Optional[int]  # None: no logprobs buffer
    total: int
    token_bitmask: Optional[int] = None  # None: no bitmask buffer
    processors: Optional[int] = None  # None: no processors buffer
    bias_capacity: int = 0  # NB
    history_capacity: int = 0  # NH

    @classmethod
    def of(cls, max_batch: int, vocab: int, itemsize: int, logprobs: bool,
           control: bool = True, bitmask: bool = False,
           capacities: Optional[Tuple[int, int]] = None) -> "Layout":
        """The layout of one allocation; ``control=False`` leaves the control block out (the
        GPU plane's data allocation). ``bitmask`` adds a token_bitmask buffer, ``capacities``
        (NB, NH) a processors buffer."""
        if max_batch < 1 or vocab < 1:
            raise ValueError(f"expected max_batch >= 1 and vocab >= 1, got {max_batch}, {vocab}")
        at = 0
        control_at = None
        if control:
            control_at, at = at, _up(at + CONTROL_BYTES)
        logits, at = at, _up(at + max_batch * vocab * itemsize)
        params, at = at, _up(at + params_bytes(max_batch))
        token_ids, at = at, _up(at + 4 * max_batch)
        row_status, at = at, _up(at + 4 * max_batch)
        sampled = None
        if logprobs:
            sampled, at = at, _up(at + 4 * max_batch)
        mask = procs = None
        if bitmask:
            mask, at = at, _up(at + 4 * max_batch * bitmask_words(vocab))
        nb, nh = capacities if capacities is not None else (0, 0)
        if capacities is not None:
            procs, at = at, _up(at + processors_bytes(max_batch, nb, nh))
        return cls(max_batch, vocab, itemsize, control_at, logits, params, token_ids, row_status,
                   sampled, at, mask, procs, nb, nh)

    @property
    def capacities(self) -> Optional[Tuple[int, int]]:
        """(NB, NH) of the processors buffer, or None without one."""
        return None if self.processors is None else (self.bias_capacity, self.history_capacity)

    def without_control(self) -> "Layout":
        """The same buffers in an allocation without the control block."""
        return Layout.of(self.max_batch, self.vocab, self.itemsize,
                         self.sampled_logprobs is not None, control=False,
                         bitmask=self.token_bitmask is not None, capacities=self.capacities)

    def slices(self, pb, region: str, control_region: Optional[str] = None):
        """DeviceSessionOpen's RegionSlice fields (a dict) for a region holding this layout;
        a layout without the control block takes it at offset 0 of ``control_region``."""
        if (self.control is None) == (control_region is None):
            raise ValueError("expected a control region exactly when the layout has no control "
                             f"block, got control {self.control}, region {control_region!r}")
        out = {
            name: pb.RegionSlice(region=region, offset=offset)
            for name, offset in (
                ("logits", self.logits),
                ("params", self.params),
                ("token_ids", self.token_ids),
                ("row_status", self.row_status),
                ("sampled_logprobs", self.sampled_logprobs),
                ("token_bitmask", self.token_bitmask),
                ("processors", self.processors),
            )
            if offset is not None
        }
        out["control"] = pb.RegionSlice(region=control_region or region,
                                        offset=self.control or 0)
        return out
