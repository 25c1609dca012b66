"""The sampling options of a request, defined once: SampleOptions.

Every way to sample takes the same options: Client.sample (by keyword, or by position in field
order but joint_top_p and the logits processors), Client.make_request, Client.sample_region and
StreamSession.step. Each takes them as ``**options`` into a SampleOptions, so the names,
defaults and checks are the fields below and nothing else; ``with_options`` writes them into
each method's signature, for help() and inspect. SampleOptions.request builds the
samplerd.v1.SampleRequest of a tensor.

Adding an option: a field at the end, keyword-only (``metadata=_KEYWORD_ONLY``: sample()'s
positional order stays as it is), its encoding in request(), and a line in Client.sample's
docstring.
"""

from __future__ import annotations

import dataclasses
import inspect
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Sequence, Tuple, TypeVar, Union

import numpy as np

from ._pb import pb
from ._processors import (
    LogitBias,
    TokenIds,
    host_bitmask,
    logit_bias_message,
    token_history_message,
)

#: A per-row parameter: one value for every row, or a sequence / array of B values.
PerRow = Union[float, int, Sequence[Any], np.ndarray]
#: None, top_n, or (top_n, "raw" | "processed").
Logprobs = Union[None, int, Tuple[int, str]]

_LOGPROB_SOURCES = {
    "raw": pb.LOGPROB_SOURCE_RAW,
    "processed": pb.LOGPROB_SOURCE_PROCESSED,
}
#: Field metadata of the options that Client.sample takes by keyword only (the last fields).
_KEYWORD_ONLY = {"keyword_only": True}


@dataclass(eq=False)
class SampleOptions:
    """The options of one request (made per call, never kept); Client.sample says what each
    means."""

    temperature: PerRow = 1.0
    top_k: PerRow = 0
    top_p: PerRow = 1.0
    min_p: PerRow = 0.0
    seed: Optional[PerRow] = None
    position: PerRow = 0
    logprobs: Logprobs = None
    request_id: str = ""
    joint_top_p: bool = field(default=False, metadata=_KEYWORD_ONLY)
    # The logits processors (_processors.py; applied before temperature and the filters).
    token_bitmask: Any = field(default=None, metadata=_KEYWORD_ONLY)
    logit_bias: Optional[LogitBias] = field(default=None, metadata=_KEYWORD_ONLY)
    repetition_penalty: Optional[PerRow] = field(default=None, metadata=_KEYWORD_ONLY)
    presence_penalty: Optional[PerRow] = field(default=None, metadata=_KEYWORD_ONLY)
    frequency_penalty: Optional[PerRow] = field(default=None, metadata=_KEYWORD_ONLY)
    prompt_token_ids: Optional[TokenIds] = field(default=None, metadata=_KEYWORD_ONLY)
    output_token_ids: Optional[TokenIds] = field(default=None, metadata=_KEYWORD_ONLY)
    token_history: Any = field(default=None, metadata=_KEYWORD_ONLY)

    @classmethod
    def _of(cls, args: Tuple[Any, ...], kwargs: Any) -> "SampleOptions":
        """The options of Client.sample's ``*args, **kwargs`` (those after ``logits``)."""
        if len(args) > _N_POSITIONAL:
            raise TypeError(
                f"sample() takes at most {_N_POSITIONAL} sampling options by position, "
                f"got {len(args)}"
            )
        return cls(*args, **kwargs)

    def request(self, tensor: Any, ready_event: bytes = b"", token_bitmask: Any = None) -> Any:
        """The samplerd.v1.SampleRequest of ``tensor`` (a samplerd.v1.Tensor [B, V]) with these
        options; ``ready_event`` is a CUDA IPC event handle the server waits for before reading.
        ``token_bitmask`` is a prepared samplerd.v1.TokenBitmask (a CUDA tensor's region slice)
        that replaces the encoding of ``self.token_bitmask``. Raises ValueError for a per-row
        option with neither one nor B values or a bitmask of the wrong shape or dtype, KeyError
        for an unknown logprob source; TypeError or ValueError, naming the option, for a value
        that is not an integer where one is expected (seed, position, top_k, logprobs, token
        ids)."""
        batch, vocab = int(tensor.shape[0]), int(tensor.shape[1])
        params, row_seeds, row_positions = self._params(batch)
        if self.joint_top_p:
            for p in params:
                p.top_p_mode = pb.TOP_P_MODE_JOINT
        request = pb.SampleRequest(request_id=self.request_id, logits=tensor, params=params)
        if row_seeds is not None:
            request.row_seeds.extend(row_seeds)
        if row_positions is not None:
            request.row_positions.extend(row_positions)
        if ready_event:
            request.ready_event = bytes(ready_event)
        options = self._logprob_options()
        if options is not None:
            request.logprobs.CopyFrom(options)
        self._processors(request, batch, vocab, token_bitmask)
        return request

    def _processors(self, request: Any, batch: int, vocab: int, token_bitmask: Any) -> None:
        """Writes the logit bias, token history and bitmask of these options into ``request``
        (each only when given)."""
        if self.logit_bias is not None:
            request.logit_bias.CopyFrom(logit_bias_message(self.logit_bias, batch))
        from_ids = self.prompt_token_ids is not None or self.output_token_ids is not None
        if self.token_history is not None:
            if from_ids or not isinstance(self.token_history, pb.TokenHistory):
                raise ValueError(
                    "token_history: expected a samplerd.v1.TokenHistory without prompt_token_ids"
                    f" / output_token_ids, got {type(self.token_history).__name__}"
                    + (" with them" if from_ids else "")
                )
            request.token_history.CopyFrom(self.token_history)
        elif from_ids:
            history = token_history_message(self.prompt_token_ids, self.output_token_ids, batch)
            request.token_history.CopyFrom(history)
        if token_bitmask is None and self.token_bitmask is not None:
            token_bitmask = host_bitmask(self.token_bitmask, batch, vocab)
        if token_bitmask is not None:
            request.token_bitmask.CopyFrom(token_bitmask)

    def _params(self, batch: int) -> Tuple[List[Any], Optional[List[int]], Optional[List[int]]]:
        """(params, row_seeds, row_positions) of a request.

        One SamplingParams when the filters (temperature, top_k, top_p, min_p) and the given
        penalties are scalars;
        per-row seeds and positions then travel as the request's packed row_seeds /
        row_positions (a decode loop's usual case, and far cheaper than B messages). Per-row
        filters or penalties give B SamplingParams.
        """
        seed, position = self.seed, self.position
        filters = (
            ("temperature", self.temperature, _real("temperature")),
            ("top_k", self.top_k, _integer("top_k", -(2**31), 2**31 - 1)),
            ("top_p", self.top_p, _real("top_p")),
            ("min_p", self.min_p, _real("min_p")),
        ) + tuple(
            (name, value, _real(name))
            for name, value in (
                ("repetition_penalty", self.repetition_penalty),
                ("presence_penalty", self.presence_penalty),
                ("frequency_penalty", self.frequency_penalty),
            )
            if value is not None  # unset: not sent (repetition 1, presence and frequency 0)
        )
        filter_rows = [_per_row(name, value, batch) for name, value, _ in filters]
        seed_rows = _per_row("seed", seed, batch)
        position_rows = _per_row("position", position, batch)
        as_seed, as_position = _integer("seed", 0, 2**64 - 1), _integer("position", 0, 2**64 - 1)
        if all(r is None for r in filter_rows):
            kw = {name: cast(value) for name, value, cast in filters}
            if seed_rows is None and seed is not None:
                kw["seed"] = as_seed(seed)
            if position_rows is None:
                kw["position"] = as_position(position)
            return (
                [pb.SamplingParams(**kw)],
                None if seed_rows is None else [as_seed(v) for v in seed_rows],
                None if position_rows is None else [as_position(v) for v in position_rows],
            )
        given = filters + (("position", position, as_position), ("seed", seed, as_seed))
        rows = filter_rows + [position_rows, seed_rows]
        columns = {
            name: [None] * batch if value is None and r is None
            else [cast(value)] * batch if r is None
            else [cast(v) for v in r]
            for (name, value, cast), r in zip(given, rows)
        }
        make = pb.SamplingParams
        return (
            [
                make(**{name: column[i] for name, column in columns.items()
                        if column[i] is not None})
                for i in range(batch)
            ],
            None,
            None,
        )

    def _logprob_options(self) -> Optional[Any]:
        """The request's LogprobOptions, or None when no logprobs were asked for."""
        logprobs = self.logprobs
        if logprobs is None:
            return None
        as_top_n = _integer("logprobs", 0, 2**32 - 1)  # top_n: a uint32
        if isinstance(logprobs, tuple):
            top_n, source = logprobs
            return pb.LogprobOptions(top_n=as_top_n(top_n), source=_LOGPROB_SOURCES[source])
        return pb.LogprobOptions(top_n=as_top_n(logprobs))


_FIELDS = dataclasses.fields(SampleOptions)
_N_POSITIONAL = sum(1 for f in _FIELDS if not f.metadata.get("keyword_only"))
assert all(f.metadata.get("keyword_only") for f in _FIELDS[_N_POSITIONAL:]), "keyword-only last"


def _integer(name: str, low: int, high: int) -> Callable[[Any], int]:
    """A cast to int that refuses what int() would silently change: a fractional number, a
    string, a bool, or a value outside the proto field's range (each error names the field)."""

    def cast(value: Any) -> int:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name}: expected an integer, got {type(value).__name__} {value!r}")
        if not isinstance(value, numbers.Integral) and not float(value).is_integer():
            raise ValueError(f"{name}: expected an integer, got {value!r}")
        number = int(value)
        if not low <= number <= high:
            raise ValueError(f"{name}: expected an integer in [{low}, {high}], got {number}")
        return number

    return cast


def _real(name: str) -> Callable[[Any], float]:
    """A cast to float that refuses strings and bools (float('0.5') would pass), naming the
    field; the server checks the range."""

    def cast(value: Any) -> float:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name}: expected a number, got {type(value).__name__} {value!r}")
        return float(value)

    return cast


def _per_row(name: str, value: Any, batch: int) -> Optional[list]:
    """None for a scalar (or None), else a list of B values."""
    if value is None or np.isscalar(value):
        return None
    values = list(np.asarray(value).reshape(-1).tolist())
    if len(values) != batch:
        raise ValueError(f"{name}: expected a scalar or {batch} values, got {len(values)}")
    return values


_Method = TypeVar("_Method", bound=Callable[..., Any])


def with_options(positional: bool = False) -> Callable[[_Method], _Method]:
    """Decorates a method that takes the sampling options as ``**options`` (with
    ``positional``, also as ``*args``, in field order): its signature, as help() and inspect
    show it, lists SampleOptions' fields in place of those, after the method's own positional
    parameters. Calls are unchanged (SampleOptions checks the names)."""
    kinds = inspect.Parameter

    def option(f: "dataclasses.Field[Any]") -> inspect.Parameter:
        by_position = positional and not f.metadata.get("keyword_only")
        kind = kinds.POSITIONAL_OR_KEYWORD if by_position else kinds.KEYWORD_ONLY
        return inspect.Parameter(f.name, kind, default=f.default, annotation=f.type)

    def decorate(method: _Method) -> _Method:
        signature = inspect.signature(method)
        own = [p for p in signature.parameters.values()
               if p.kind not in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD)]
        cut = next((i for i, p in enumerate(own) if p.kind == kinds.KEYWORD_ONLY), len(own))
        parameters = own[:cut] + [option(f) for f in _FIELDS] + own[cut:]
        method.__signature__ = signature.replace(parameters=parameters)  # type: ignore
        return method

    return decorate
