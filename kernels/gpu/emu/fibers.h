// The CPU emulation of a GPU launch (kernels/gpu/emu/README.md): each block's threads run as
// fibers on the calling thread, one block after another, switching only at barriers
// (__syncthreads, a wave barrier, a shuffle). Internal to the emulated backend.
#ifndef SAMPLERD_KERNELS_GPU_EMU_FIBERS_H_
#define SAMPLERD_KERNELS_GPU_EMU_FIBERS_H_

#include <cstddef>
#include <cstdint>
#include <functional>

namespace samplerd::kernels::gpu::emu {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

// Where the running fiber is: read by the dialect's threadIdx / blockIdx / blockDim / gridDim.
struct Coordinates {
  Dim3 thread_idx, block_idx, block_dim, grid_dim;
};
Coordinates& Current();

// Runs `body` once per thread of every block of `grid` x `block`. `wave_size` is the size of a
// wave (warp): the group that wave barriers and shuffles act on. Aborts with a message when
// the threads of a block can make no progress (a barrier some thread can never reach).
void RunGrid(Dim3 grid, Dim3 block, int wave_size, const std::function<void()>& body);

// Block barrier: returns the OR of `predicate` over the block's live threads.
int BlockBarrier(int predicate);
// Wave barrier over the running thread's wave.
void WaveBarrier();
// A shuffle: the running thread offers `value` (<= 8 bytes) and receives the value that lane
// `source` of its wave offered (its own when `source` < 0).
uint64_t WaveExchange(uint64_t value, int source);
// The running thread's lane in its wave.
int Lane();

}  // namespace samplerd::kernels::gpu::emu

#endif  // SAMPLERD_KERNELS_GPU_EMU_FIBERS_H_
