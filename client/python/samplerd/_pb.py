"""The generated stubs of proto/samplerd/v1/sampler.proto (client/python/generate.sh makes them;
they are never committed), with an ImportError that says so when they are missing."""

try:
    from .v1 import sampler_pb2 as pb
    from .v1 import sampler_pb2_grpc as pb_grpc
except ImportError as e:  # pragma: no cover - depends on the build
    raise ImportError(
        "samplerd: the generated stubs are missing; run client/python/generate.sh first"
    ) from e

__all__ = ["pb", "pb_grpc"]
