// mps_latency_probe: the latency of one dependent global load, with and without CUDA MPS
// (issue 10). Under MPS the decode loop's small kernels ran ~1 µs longer each while the gaps
// between them did not change (tests/bench/engine/mps_forward_profile.py), and an empty kernel
// only ~0.1 µs longer (mps_graph_probe.cu). A small kernel's time is a few dependent memory round
// trips, so this measures one: a single thread chases pointers through a buffer and times the
// chain with clock64, for working sets that hit L1, L2 and DRAM and for strides that touch a new
// page on every load (address translation).
//
//   nvcc -std=c++17 -O3 -arch=sm_90 -o /tmp/mps_latency_probe tests/gpu/probes/mps_latency_probe.cu
//   /tmp/mps_latency_probe            (then again under an MPS daemon; run_mps_probe.sh does both)
//
// Output: one line per case, the median over repetitions of cycles and ns per load.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe_check.h"

namespace {

// Follows `loads` links from next[start] and writes the elapsed clock64 cycles; the final index
// goes to *sink so that the chain cannot be optimised away.
__global__ void Chase(const uint64_t* next, uint64_t start, int loads, long long* cycles,
                      uint64_t* sink) {
  uint64_t at = start;
  for (int i = 0; i < 16; ++i) at = next[at];  // warm the first links' code path
  at = start;
  const long long t0 = clock64();
  for (int i = 0; i < loads; ++i) at = __ldcg(next + at);  // cache-global: skips L1
  const long long t1 = clock64();
  *cycles = t1 - t0;
  *sink = at;
}

__global__ void ChaseL1(const uint64_t* next, uint64_t start, int loads, long long* cycles,
                        uint64_t* sink) {
  uint64_t at = start;
  for (int i = 0; i < loads; ++i) at = next[at];  // fill L1
  at = start;
  const long long t0 = clock64();
  for (int i = 0; i < loads; ++i) at = __ldca(next + at);
  const long long t1 = clock64();
  *cycles = t1 - t0;
  *sink = at;
}

// Spins `cycles` SM clock cycles and writes the %globaltimer nanoseconds they took: the SM clock
// the kernel really ran at (a lower clock under MPS would slow every latency-bound kernel).
__global__ void ClockRate(long long cycles, unsigned long long* ns) {
  unsigned long long g0, g1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g0));
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g1));
  *ns = g1 - g0;
}

// 0 .. n-1 in a random order (xorshift64 Fisher-Yates): the order of a chase's links, so that
// no prefetcher helps.
std::vector<size_t> Shuffled(size_t n, uint64_t state) {
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  for (size_t i = n - 1; i > 0; --i) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    std::swap(order[i], order[state % (i + 1)]);
  }
  return order;
}

// Follows `warm` links (to fill the caches with the chain), then times `loads` more.
__global__ void ChaseWarm(const uint64_t* next, int warm, int loads, long long* cycles,
                          uint64_t* sink) {
  uint64_t at = 0;
  for (int i = 0; i < warm; ++i) at = __ldcg(next + at);
  const long long t0 = clock64();
  for (int i = 0; i < loads; ++i) at = __ldcg(next + at);
  const long long t1 = clock64();
  *cycles = t1 - t0;
  *sink = at;
}

// Load latency against the working set, one link per 128-byte line in a random cycle over all
// lines: where it jumps from L2's latency to DRAM's is the L2 capacity this process gets.
void L2Sweep(int clock_khz, long long* cycles, uint64_t* sink) {
  std::printf("%-24s %10s %10s\n", "l2 sweep: working set", "cycles", "ns/load");
  for (int mb : {4, 8, 16, 24, 32, 40, 48, 56, 64, 96}) {
    const size_t bytes = static_cast<size_t>(mb) << 20;
    const size_t step = 128 / sizeof(uint64_t);
    const size_t links = bytes / 128;
    const std::vector<size_t> order = Shuffled(links, 0x9E3779B97F4A7C15ull);
    std::vector<uint64_t> host(bytes / sizeof(uint64_t), 0);
    for (size_t i = 0; i < links; ++i) host[order[i] * step] = order[(i + 1) % links] * step;
    uint64_t* next = nullptr;
    CHECK(cudaMalloc(&next, bytes));
    CHECK(cudaMemcpy(next, host.data(), bytes, cudaMemcpyHostToDevice));
    constexpr int kLoads = 8192;
    std::vector<long long> samples;
    for (int r = 0; r < 5; ++r) {
      ChaseWarm<<<1, 1>>>(next, static_cast<int>(std::min<size_t>(links, 1 << 20)), kLoads, cycles,
                          sink);
      CHECK(cudaGetLastError());
      CHECK(cudaDeviceSynchronize());
      long long host_cycles = 0;
      CHECK(cudaMemcpy(&host_cycles, cycles, sizeof(host_cycles), cudaMemcpyDeviceToHost));
      samples.push_back(host_cycles);
    }
    std::sort(samples.begin(), samples.end());
    const double per_load = static_cast<double>(samples[2]) / kLoads;
    char label[32];
    std::snprintf(label, sizeof(label), "%d MB", mb);
    std::printf("%-24s %10.1f %10.1f\n", label, per_load, per_load / (clock_khz / 1e6));
    CHECK(cudaFree(next));
  }
}

struct Case {
  const char* name;
  size_t bytes;   // working set
  size_t stride;  // bytes between consecutive links
  bool l1;
};

}  // namespace

int main() {
  int device = 0;
  CHECK(cudaSetDevice(device));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, device));
  int clock_khz = 0;
  CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device));
  const char* pipe = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  std::printf("mps_latency_probe: %s, SM clock %.0f MHz (nominal), CUDA_MPS_PIPE_DIRECTORY %s\n",
              prop.name, clock_khz / 1000.0, pipe ? "set" : "unset");

  const Case cases[] = {
      {"l1_hit_4KB", 4 << 10, 64, true},
      {"l2_hit_2MB_stride128", 2 << 20, 128, false},
      {"dram_1GB_stride4KB", size_t{1} << 30, 4096, false},
      {"dram_1GB_stride64KB", size_t{1} << 30, 64 << 10, false},
      {"dram_1GB_stride2MB", size_t{1} << 30, 2 << 20, false},
      {"dram_8GB_stride2MB", size_t{8} << 30, 2 << 20, false},
  };
  constexpr int kLoads = 4096;
  constexpr int kReps = 9;
  long long* cycles = nullptr;
  uint64_t* sink = nullptr;
  CHECK(cudaMalloc(&cycles, sizeof(long long)));
  CHECK(cudaMalloc(&sink, sizeof(uint64_t)));
  {
    unsigned long long* ns = nullptr;
    CHECK(cudaMalloc(&ns, sizeof(*ns)));
    constexpr long long kCycles = 20'000'000;  // ~10 ms at 2 GHz
    std::vector<double> mhz;
    for (int r = 0; r < 5; ++r) {
      ClockRate<<<1, 1>>>(kCycles, ns);
      CHECK(cudaGetLastError());
      unsigned long long host = 0;
      CHECK(cudaMemcpy(&host, ns, sizeof(host), cudaMemcpyDeviceToHost));
      mhz.push_back(static_cast<double>(kCycles) / static_cast<double>(host) * 1000.0);
    }
    std::sort(mhz.begin(), mhz.end());
    std::printf("SM clock while a kernel spins: %.0f MHz (median of 5; min %.0f, max %.0f)\n",
                mhz[2], mhz[0], mhz[4]);
    CHECK(cudaFree(ns));
  }
  std::printf("%-24s %10s %10s %8s\n", "case", "cycles", "ns/load", "links");
  for (const Case& c : cases) {
    const size_t slots = c.bytes / sizeof(uint64_t);
    const size_t step = c.stride / sizeof(uint64_t);
    const size_t links = std::max<size_t>(1, slots / step);
    // A random cycle over the links (so no prefetcher helps), each link `step` slots apart.
    const std::vector<size_t> order = Shuffled(links, 88172645463325252ull);
    uint64_t* next = nullptr;
    CHECK(cudaMalloc(&next, c.bytes));
    // Only the link slots are written: a host vector of the whole working set would be 8 GB.
    for (size_t i = 0; i < links; ++i) {
      const uint64_t from = order[i] * step;
      const uint64_t to = order[(i + 1) % links] * step;
      CHECK(cudaMemcpy(next + from, &to, sizeof(to), cudaMemcpyHostToDevice));
      if (i >= 65536) break;  // enough links for kLoads; the rest of the cycle is never reached
    }
    const uint64_t start = order[0] * step;
    std::vector<long long> samples;
    for (int r = 0; r < kReps; ++r) {
      if (c.l1) {
        ChaseL1<<<1, 1>>>(next, start, kLoads, cycles, sink);
      } else {
        Chase<<<1, 1>>>(next, start, kLoads, cycles, sink);
      }
      CHECK(cudaGetLastError());
      CHECK(cudaDeviceSynchronize());
      long long host = 0;
      CHECK(cudaMemcpy(&host, cycles, sizeof(host), cudaMemcpyDeviceToHost));
      samples.push_back(host);
    }
    std::sort(samples.begin(), samples.end());
    const double per_load = static_cast<double>(samples[kReps / 2]) / kLoads;
    std::printf("%-24s %10.1f %10.1f %8zu\n", c.name, per_load, per_load / (clock_khz / 1e6),
                std::min<size_t>(links, 65537));
    CHECK(cudaFree(next));
  }
  L2Sweep(clock_khz, cycles, sink);
  CHECK(cudaFree(cycles));
  CHECK(cudaFree(sink));
  return 0;
}
