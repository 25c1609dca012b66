// CHECK for the probes in this folder: a failed CUDA runtime call prints the call, its error name
// and line, and exits 1.
#ifndef SAMPLERD_TESTS_GPU_PROBES_PROBE_CHECK_H_
#define SAMPLERD_TESTS_GPU_PROBES_PROBE_CHECK_H_

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK(call)                                                                               \
  do {                                                                                            \
    const cudaError_t err_ = (call);                                                              \
    if (err_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s failed: %s (line %d)\n", #call, cudaGetErrorName(err_), __LINE__); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

#endif  // SAMPLERD_TESTS_GPU_PROBES_PROBE_CHECK_H_
