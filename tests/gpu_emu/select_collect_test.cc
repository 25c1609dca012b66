// AppendCollected (kernels/gpu/select.h) on the bounds-checked emulated GPU: the boundary-bin
// collect that every threshold selection ends with stays inside its kSortCap slots even when more
// items arrive than the histogram pass counted, which only logits changed within the kernel (an
// engine writing them during a device-session step) can bring. Without the cap, the emulation's
// bounds check aborts on the first slot past the array.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/gpu/select.h"

namespace samplerd::kernels::gpu {
namespace {

constexpr int kThreads = 256;

// Appends items 0..n-1 (key: its index, offset) from every thread of one block, then copies the
// stored count and indices out.
__global__ void CollectKernel(int n, int* stored, int32_t* indices) {
  __shared__ SelectStorage s;
  if (threadIdx.x == 0) s.collected = 0;
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < n; i += kThreads) {
    AppendCollected(s, 0x80000000u + static_cast<uint32_t>(i), i);
  }
  __syncthreads();
  const int count = CollectedCount(s);
  for (int i = static_cast<int>(threadIdx.x); i < count; i += kThreads)
    indices[i] = s.sort.index[i];
  if (threadIdx.x == 0) *stored = count;
}

std::vector<int32_t> Collect(int n, int* stored) {
  std::vector<int32_t> indices(kSortCap, -1);
  emu::Launch(dim3(1), dim3(kThreads))(CollectKernel, n, stored, indices.data());
  return indices;
}

TEST(SelectCollect, KeepsEveryItemUpToTheCap) {
  int stored = -1;
  std::vector<int32_t> indices = Collect(1000, &stored);
  ASSERT_EQ(stored, 1000);
  std::vector<int> seen(1000, 0);
  for (int i = 0; i < stored; ++i) {
    ASSERT_GE(indices[i], 0);
    ASSERT_LT(indices[i], 1000);
    ++seen[indices[i]];
  }
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(seen[i], 1) << "item " << i;
}

TEST(SelectCollect, MoreItemsThanTheCapStayInBounds) {
  int stored = -1;
  std::vector<int32_t> indices = Collect(kSortCap + 3000, &stored);
  EXPECT_EQ(stored, kSortCap);
  for (int i = 0; i < stored; ++i) {
    ASSERT_GE(indices[i], 0);
    ASSERT_LT(indices[i], kSortCap + 3000);
  }
}

}  // namespace
}  // namespace samplerd::kernels::gpu
