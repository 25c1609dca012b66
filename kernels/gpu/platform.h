// The one seam between HIP and CUDA: kernels are written with HIP names; under nvcc this header
// maps the HIP names we use onto CUDA. Everything wave-size dependent goes through kWaveSize.
//
// Under hipcc it includes <hip/hip_runtime.h>; under nvcc <cuda_runtime.h>; anything else is an
// error. Keep the mapping short and auditable: add a name only when a kernel uses it.
#ifndef SAMPLERD_KERNELS_GPU_PLATFORM_H_
#define SAMPLERD_KERNELS_GPU_PLATFORM_H_

#if defined(SAMPLERD_GPU_EMULATE)
// The CPU emulation (kernels/gpu/emu/README.md): the dialect as plain C++, launches as fibers.
#include "kernels/gpu/emu/device.h"
#elif defined(__HIPCC__)
#include <hip/hip_runtime.h>
#elif defined(__CUDACC__)
#include <cuda_runtime.h>

// Types and error codes.
using hipError_t = cudaError_t;
using hipStream_t = cudaStream_t;
using hipEvent_t = cudaEvent_t;
using hipDeviceProp_t = cudaDeviceProp;
using hipIpcMemHandle_t = cudaIpcMemHandle_t;
using hipIpcEventHandle_t = cudaIpcEventHandle_t;
#define hipSuccess cudaSuccess
#define hipErrorInvalidValue cudaErrorInvalidValue
#define hipErrorNoDevice cudaErrorNoDevice
#define hipErrorOutOfMemory cudaErrorMemoryAllocation
#define hipErrorNotInitialized cudaErrorInitializationError
#define hipErrorDeinitialized cudaErrorCudartUnloading
#define hipErrorInsufficientDriver cudaErrorInsufficientDriver
#define hipErrorInvalidDevice cudaErrorInvalidDevice
#define hipErrorPeerAccessUnsupported cudaErrorPeerAccessUnsupported
#define hipErrorOperatingSystem cudaErrorOperatingSystem
#define hipErrorIllegalAddress cudaErrorIllegalAddress
#define hipErrorLaunchFailure cudaErrorLaunchFailure
#define hipErrorNotSupported cudaErrorNotSupported
#define hipErrorNotReady cudaErrorNotReady

// Runtime calls.
#define hipGetDeviceCount cudaGetDeviceCount
#define hipGetDeviceProperties cudaGetDeviceProperties
#define hipDeviceGetPCIBusId cudaDeviceGetPCIBusId
#define hipSetDevice cudaSetDevice
#define hipGetDevice cudaGetDevice
#define hipMalloc cudaMalloc
#define hipFree cudaFree
#define hipHostMalloc(ptr, bytes, flags) cudaHostAlloc((ptr), (bytes), (flags))
#define hipHostMallocDefault cudaHostAllocDefault
#define hipHostFree cudaFreeHost
#define hipMemcpy cudaMemcpy
#define hipMemcpyAsync cudaMemcpyAsync
#define hipMemsetAsync cudaMemsetAsync
#define hipMemcpyHostToDevice cudaMemcpyHostToDevice
#define hipMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define hipMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define hipStreamCreateWithFlags cudaStreamCreateWithFlags
#define hipStreamNonBlocking cudaStreamNonBlocking
#define hipStreamDestroy cudaStreamDestroy
#define hipStreamSynchronize cudaStreamSynchronize
#define hipStreamWaitEvent cudaStreamWaitEvent
#define hipEventCreateWithFlags cudaEventCreateWithFlags
#define hipEventDisableTiming cudaEventDisableTiming
#define hipEventInterprocess cudaEventInterprocess
#define hipEventCreate cudaEventCreate
#define hipEventRecord cudaEventRecord
#define hipEventSynchronize cudaEventSynchronize
#define hipEventElapsedTime cudaEventElapsedTime
#define hipEventDestroy cudaEventDestroy
#define hipEventQuery cudaEventQuery
#define hipIpcOpenMemHandle cudaIpcOpenMemHandle
#define hipIpcCloseMemHandle cudaIpcCloseMemHandle
#define hipIpcGetMemHandle cudaIpcGetMemHandle
#define hipIpcOpenEventHandle cudaIpcOpenEventHandle
#define hipIpcGetEventHandle cudaIpcGetEventHandle
#define hipIpcMemLazyEnablePeerAccess cudaIpcMemLazyEnablePeerAccess
#define hipGetLastError cudaGetLastError
#define hipPeekAtLastError cudaPeekAtLastError
#define hipGetErrorString cudaGetErrorString
#define hipGetErrorName cudaGetErrorName
#define hipDeviceSynchronize cudaDeviceSynchronize

// Warp intrinsics: HIP's shuffles take no mask; CUDA's _sync forms take a full mask.
#define __shfl_xor(v, lane_mask, width) __shfl_xor_sync(0xffffffffu, (v), (lane_mask), (width))
#define __shfl_down(v, delta, width) __shfl_down_sync(0xffffffffu, (v), (delta), (width))
#define __shfl(v, src, width) __shfl_sync(0xffffffffu, (v), (src), (width))
#define __shfl_up(v, delta, width) __shfl_up_sync(0xffffffffu, (v), (delta), (width))
#else
#error "kernels/gpu needs hipcc (ROCm) or nvcc (CUDA)"
#endif

namespace samplerd::kernels::gpu {

// Threads of one hardware wave: 64 on AMD CDNA (gfx9), 32 on NVIDIA and on AMD RDNA (gfx10+).
// Device code only; host code asks the runtime (hipDeviceProp_t::warpSize).
// clang defines __AMDGCN_WAVEFRONT_SIZE in each AMD device pass (64 for gfx90a, 32 for gfx1030).
#if defined(SAMPLERD_GPU_EMULATE)
inline constexpr int kWaveSize = SAMPLERD_EMU_WAVE_SIZE;
#elif defined(__AMDGCN_WAVEFRONT_SIZE)
inline constexpr int kWaveSize = __AMDGCN_WAVEFRONT_SIZE;
#else
inline constexpr int kWaveSize = 32;
#endif

// The smallest wave of any target: sizes per-wave scratch arrays for every wave size.
inline constexpr int kMinWaveSize = 32;
// Width of in-register sorts and of shuffles whose result must not depend on the wave size:
// shuffles with this width stay within 32-lane segments on a 64-lane wave.
inline constexpr int kLogicalWarp = 32;

// Orders one wave's shared-memory writes before the same wave's later reads of them by other
// lanes (NVIDIA's lanes of a warp may run apart; AMD's waves run in lockstep but the compiler
// may reorder without a wave-scope fence).
__device__ __forceinline__ void WaveSync() {
#if defined(SAMPLERD_GPU_EMULATE)
  __syncwarp();
#elif defined(__HIPCC__)
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
  __builtin_amdgcn_wave_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
#else
  __syncwarp();
#endif
}

// Programmatic dependent launch (NVIDIA compute capability 9.0+; no-ops elsewhere, HIP included).
// A kernel launched with it (LaunchDependent, sample.hip) may start while the kernel before it
// on the stream still runs, once every block of that kernel called GridLaunchDependents (or
// exited); it must call GridWaitPrerequisites before it reads anything that kernel writes, and
// the wait returns when that kernel has completed and its memory is visible.
__device__ __forceinline__ void GridLaunchDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void GridWaitPrerequisites() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Whether `word & mask` is nonzero, for a mask that is a constant once loops are unrolled: on
// NVIDIA one LOP3 that sets the predicate its user reads. CUDA 13's front end rewrites
// `(word & (1 << i)) != 0` into `((word >> i) & 1) == 1`, which ptxas issues as three
// instructions (kernels/gpu/NOTES.md v26); the AND in inline PTX is opaque to that rewrite.
__device__ __forceinline__ bool AnyBitSet(uint32_t word, uint32_t mask) {
#if defined(__CUDA_ARCH__)
  uint32_t both;
  asm("and.b32 %0, %1, %2;" : "=r"(both) : "r"(word), "r"(mask));
  return both != 0u;
#else
  return (word & mask) != 0u;
#endif
}

// `word`, as a value the compiler cannot see through: tests of it are not merged with the same
// tests of `word` elsewhere. Where two unrolled loops test the same 32 bits, the compiler keeps
// the first loop's 32 predicates for the second and, with 7 predicate registers, packs them into
// a register (2 instructions a token in the first loop) where a second test costs 1 (v44).
__device__ __forceinline__ uint32_t OpaqueWord(uint32_t word) {
#if defined(__CUDA_ARCH__)
  asm volatile("" : "+r"(word));
#elif defined(__HIP_DEVICE_COMPILE__)
  asm volatile("" : "+v"(word));
#endif
  return word;
}

// `v`, which must be the same in every lane of the wave (and every lane must call), as a value
// the compiler knows is: NVIDIA keeps it in a uniform register (a REDUX from sm_80), AMD in a
// scalar one. Values a function gets by reference or as arguments of a call that is not inlined
// are not known to be, so each use of them is vector work: the Philox key schedule of the
// top-p draw was 2 adds a round of every block (kernels/gpu/NOTES.md v46).
__device__ __forceinline__ uint32_t WaveUniform(uint32_t v) {
#if defined(SAMPLERD_GPU_EMULATE)
  return v;
#elif defined(__HIP_DEVICE_COMPILE__)
  return __builtin_amdgcn_readfirstlane(v);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return __reduce_or_sync(0xffffffffu, v);
#elif defined(__CUDA_ARCH__)
  return __shfl_sync(0xffffffffu, v, 0);
#else
  return v;
#endif
}

}  // namespace samplerd::kernels::gpu

#endif  // SAMPLERD_KERNELS_GPU_PLATFORM_H_
