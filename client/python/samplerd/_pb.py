"""The generated stubs of proto/samplerd/v1/*.proto (client/python/generate.sh makes them; they
are never committed), with an ImportError that says so when they are missing.

`pb` is one namespace over the API's three files (sampler, regions, processors), so callers
write pb.SampleRequest, pb.RegionSlice and pb.LogitBias alike, wherever each is defined."""

import types

try:
    from .v1 import processors_pb2, regions_pb2, sampler_pb2
    from .v1 import sampler_pb2_grpc as pb_grpc
except ImportError as e:  # pragma: no cover - depends on the build
    raise ImportError(
        "samplerd: the generated stubs are missing; run client/python/generate.sh first"
    ) from e


def _merged(*modules):
    names = {}
    for module in modules:
        names.update((k, v) for k, v in vars(module).items() if not k.startswith("_"))
    return types.SimpleNamespace(**names)


pb = _merged(regions_pb2, processors_pb2, sampler_pb2)

__all__ = ["pb", "pb_grpc"]
