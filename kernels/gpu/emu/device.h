// The HIP dialect on the CPU, for the emulated backend (kernels/gpu/emu/README.md): platform.h
// includes this instead of a GPU runtime when SAMPLERD_GPU_EMULATE is defined. Kernels compile
// as plain C++; a launch runs each block's threads as fibers (fibers.h). Only what the kernels
// use is here, with HIP's semantics: add a name when a kernel needs it.
#ifndef SAMPLERD_KERNELS_GPU_EMU_DEVICE_H_
#define SAMPLERD_KERNELS_GPU_EMU_DEVICE_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kernels/gpu/emu/fibers.h"

// The wave size the kernels are compiled for: 32 (NVIDIA, AMD RDNA) or 64 (AMD CDNA).
#ifndef SAMPLERD_EMU_WAVE_SIZE
#define SAMPLERD_EMU_WAVE_SIZE 32
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
// One block runs at a time on a host thread, so a block's shared memory is per-thread static
// storage (uninitialised on a GPU; zero or the last block's values here).
#define __shared__ static thread_local

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};

// Vector types, aligned as on the GPU (a load of one is one wide load there).
struct alignas(16) float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
struct alignas(8) uint2 {
  unsigned x, y;
};
inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};

#define threadIdx (::samplerd::kernels::gpu::emu::Current().thread_idx)
#define blockIdx (::samplerd::kernels::gpu::emu::Current().block_idx)
#define blockDim (::samplerd::kernels::gpu::emu::Current().block_dim)
#define gridDim (::samplerd::kernels::gpu::emu::Current().grid_dim)
#define warpSize SAMPLERD_EMU_WAVE_SIZE

// Runtime types and the calls the kernel sources make (runtime_emu.cc has the rest).
using hipError_t = int;
using hipStream_t = void*;
#define hipSuccess 0
#define hipErrorInvalidValue 1
inline hipError_t hipGetLastError() { return hipSuccess; }

// Barriers.
inline void __syncthreads() { ::samplerd::kernels::gpu::emu::BlockBarrier(0); }
inline int __syncthreads_or(int predicate) {
  return ::samplerd::kernels::gpu::emu::BlockBarrier(predicate != 0);
}
inline void __syncwarp(unsigned = 0xffffffffu) { ::samplerd::kernels::gpu::emu::WaveBarrier(); }
inline void __threadfence() {}

// Shuffles, with HIP's rules for a source outside the caller's `width` segment (its own value).
namespace samplerd::kernels::gpu::emu {
template <class T>
T Shuffle(T value, int source) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffle of <= 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = WaveExchange(bits, source);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}
}  // namespace samplerd::kernels::gpu::emu

template <class T>
T __shfl_xor(T value, int lane_mask, int width = warpSize) {
  const int self = ::samplerd::kernels::gpu::emu::Lane();
  int source = self ^ lane_mask;
  if (source >= ((self + width) & ~(width - 1))) source = self;
  return ::samplerd::kernels::gpu::emu::Shuffle(value, source);
}
template <class T>
T __shfl_down(T value, unsigned delta, int width = warpSize) {
  const int self = ::samplerd::kernels::gpu::emu::Lane();
  const int source = (self & (width - 1)) + static_cast<int>(delta) >= width
                         ? self
                         : self + static_cast<int>(delta);
  return ::samplerd::kernels::gpu::emu::Shuffle(value, source);
}
template <class T>
T __shfl_up(T value, unsigned delta, int width = warpSize) {
  const int self = ::samplerd::kernels::gpu::emu::Lane();
  const int source =
      (self & (width - 1)) - static_cast<int>(delta) < 0 ? self : self - static_cast<int>(delta);
  return ::samplerd::kernels::gpu::emu::Shuffle(value, source);
}
template <class T>
T __shfl(T value, int source_lane, int width = warpSize) {
  const int self = ::samplerd::kernels::gpu::emu::Lane();
  return ::samplerd::kernels::gpu::emu::Shuffle(
      value, (source_lane & (width - 1)) + (self & ~(width - 1)));
}

// Atomics: one block runs at a time, so a plain read-modify-write is atomic here.
template <class T, class U>
T atomicAdd(T* address, U value) {
  const T old = *address;
  *address = static_cast<T>(old + static_cast<T>(value));
  return old;
}
template <class T, class U>
T atomicMin(T* address, U value) {
  const T old = *address;
  if (static_cast<T>(value) < old) *address = static_cast<T>(value);
  return old;
}
template <class T, class U>
T atomicMax(T* address, U value) {
  const T old = *address;
  if (static_cast<T>(value) > old) *address = static_cast<T>(value);
  return old;
}
template <class T, class U>
T atomicOr(T* address, U value) {
  const T old = *address;
  *address = static_cast<T>(old | static_cast<T>(value));
  return old;
}

// Bit and math intrinsics.
inline float __uint_as_float(unsigned v) {
  float f;
  std::memcpy(&f, &v, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned v;
  std::memcpy(&v, &f, 4);
  return v;
}
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __ffs(int v) { return __builtin_ffs(v); }
inline float __expf(float x) { return std::exp(x); }

// The device overloads of min and max that CUDA and HIP provide for mixed integer types.
template <class A, class B>
constexpr std::common_type_t<A, B> min(A a, B b) {
  return b < a ? b : a;
}
template <class A, class B>
constexpr std::common_type_t<A, B> max(A a, B b) {
  return a < b ? b : a;
}

namespace samplerd::kernels::gpu::emu {

// The launch that `kernel<<<grid, block, shared, stream>>>(args...)` becomes (CMake rewrites the
// chevrons): Launch(grid, block, shared, stream)(kernel, args...). Runs the whole grid before
// returning; the stream is ignored (every launch is synchronous).
struct Launch {
  Dim3 grid, block;
  Launch(dim3 g, dim3 b, size_t = 0, hipStream_t = nullptr)
      : grid{g.x, g.y, g.z}, block{b.x, b.y, b.z} {}
  template <class Kernel, class... Args>
  void operator()(Kernel kernel, Args&&... args) const {
    RunGrid(grid, block, SAMPLERD_EMU_WAVE_SIZE, [&] { kernel(args...); });
  }
};

}  // namespace samplerd::kernels::gpu::emu

#endif  // SAMPLERD_KERNELS_GPU_EMU_DEVICE_H_
