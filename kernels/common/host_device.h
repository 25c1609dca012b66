// Qualifiers for functions shared by host code and GPU kernels.
//
// Headers under kernels/common/ are compiled three ways: by the host compiler (CPU backend,
// tests), by nvcc and by hipcc. Both GPU compilers define the same `__host__ __device__`
// qualifiers, so one macro serves both; plain C++ compilers see nothing.
#ifndef SAMPLERD_KERNELS_COMMON_HOST_DEVICE_H_
#define SAMPLERD_KERNELS_COMMON_HOST_DEVICE_H_

#if defined(__CUDACC__) || defined(__HIPCC__)
#define SAMPLERD_HOST_DEVICE __host__ __device__
#else
#define SAMPLERD_HOST_DEVICE
#endif

#endif  // SAMPLERD_KERNELS_COMMON_HOST_DEVICE_H_
