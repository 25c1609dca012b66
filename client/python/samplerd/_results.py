"""What a sample call or stream step returns: SampleResult and RowLogprobs, from the response."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

import grpc
import numpy as np

from ._errors import SamplerError


@dataclass
class RowLogprobs:
    """Logprobs of one row (natural log)."""

    sampled_logprob: float
    sampled_rank: int
    top_token_ids: np.ndarray  # int32 [top_n]; -1 past V (top_n > V) and in an invalid row
    top_logprobs: np.ndarray  # float32 [top_n]; -inf where the id is -1


@dataclass
class SampleResult:
    """The answer to one sample call or stream step."""

    tokens: np.ndarray  # int32 [B]; -1 where row_status != ROW_STATUS_OK
    row_status: np.ndarray  # int32 [B], samplerd.v1.RowStatus values (1 = OK)
    seeds: np.ndarray  # uint64 [B], the seed each row used (replayable)
    logprobs: Optional[List[RowLogprobs]]  # B entries when asked for, else None
    request_id: str
    compute_ns: int  # server-side sampling time
    response: Any  # the raw samplerd.v1.SampleResponse

    @classmethod
    def _from_pb(cls, r: Any) -> "SampleResult":
        logprobs = None
        if len(r.logprobs):
            logprobs = [
                RowLogprobs(
                    float(lp.sampled_logprob),
                    int(lp.sampled_rank),
                    np.asarray(lp.top_token_ids, dtype=np.int32),
                    np.asarray(lp.top_logprobs, dtype=np.float32),
                )
                for lp in r.logprobs
            ]
        return cls(
            tokens=np.asarray(r.token_ids, dtype=np.int32),
            row_status=np.asarray(r.row_status, dtype=np.int32),
            seeds=np.asarray(r.seeds, dtype=np.uint64),
            logprobs=logprobs,
            request_id=r.request_id,
            compute_ns=int(r.timings.compute_ns),
            response=r,
        )


def _checked(request: Any, result: SampleResult) -> SampleResult:
    """The result, unless the server ignored the request's row_seeds (a server older than the
    field would sample with seeds of its own: refuse that rather than return other draws)."""
    if len(request.row_seeds) and len(result.seeds) and not np.array_equal(
        result.seeds, np.asarray(request.row_seeds, dtype=np.uint64)
    ):
        raise SamplerError(
            grpc.StatusCode.FAILED_PRECONDITION,
            "expected the server to sample with the request's row_seeds, got other seeds: the "
            "server predates row_seeds; upgrade samplerd",
        )
    return result
