// Test-only: a function the emulated GPU calls after each kernel launch completes, so that a
// test can play an engine that rewrites its buffers while a step runs (between two launches of
// one Sample or SessionStep call), deterministically. Emulated backend only: real GPU builds
// have no such seam (their launches are asynchronous), and samplerd never links the emulation.
#ifndef SAMPLERD_KERNELS_GPU_EMU_LAUNCH_HOOK_H_
#define SAMPLERD_KERNELS_GPU_EMU_LAUNCH_HOOK_H_

#include <functional>

namespace samplerd::kernels::gpu::emu {

// Sets the hook (an empty function: none, the default) and returns the previous one. The hook
// runs on the launching thread once every block of a launch has run, before the launch call
// returns; it may read and write any memory but must not launch a kernel. Not thread-safe: set
// it while no launch runs.
std::function<void()> SetAfterLaunchHook(std::function<void()> hook);

}  // namespace samplerd::kernels::gpu::emu

#endif  // SAMPLERD_KERNELS_GPU_EMU_LAUNCH_HOOK_H_
