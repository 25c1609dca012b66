// mps_body_probe: which part of a small kernel's body gets slower under CUDA MPS (issue 10).
//
// Under MPS the decode loop's small kernels each ran ~0.6-3.5 µs longer while the gaps between
// them did not change (tests/bench/engine/mps_forward_profile.py); an empty kernel got only
// ~0.1 µs longer (mps_graph_probe.cu), and neither the SM clock nor a load's latency changed
// (mps_latency_probe.cu). This times CUDA-graph chains of N small kernels whose bodies differ in
// one thing each (loads, stores, grid size, dynamic shared memory), so that a run without MPS and
// one under it (run_mps_probe.sh runs both) show which body pays.
//
//   nvcc -std=c++17 -O3 -arch=sm_90 -o /tmp/mps_body_probe tests/gpu/probes/mps_body_probe.cu
//
// Output: one line per body, the median over replays of the chain's time per kernel (µs).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe_check.h"

namespace {

constexpr int kNodes = 500;
constexpr int kReps = 21;
constexpr int kThreads = 128;

__global__ void Empty(const float*, float*, int) {}

__global__ void LoadOnly(const float* in, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const float v = i < n ? in[i] : 0.0f;
  if (v == 12345.678f) out[i] = v;  // never true: keeps the load
}

__global__ void StoreOnly(const float*, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = static_cast<float>(i);
}

__global__ void LoadStore(const float* in, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] * 2.0f + 1.0f;
}

// Two dependent loads (an index, then a value), as an index_select does.
__global__ void Gather(const float* in, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int j = static_cast<int>(in[i]) & (n - 1);
  out[i] = in[j];
}

// A block reduction through shared memory, as a mean over a row does.
__global__ void Reduce(const float* in, float* out, int n) {
  __shared__ float partial[kThreads];
  float sum = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) sum += in[blockIdx.x * n + i];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}

// Uses 64 KB of dynamic shared memory (a different L1 / shared split from the others).
__global__ void BigShared(const float* in, float* out, int n) {
  extern __shared__ float tile[];
  const int i = threadIdx.x;
  tile[i * 64] = i < n ? in[i] : 0.0f;
  __syncthreads();
  if (i < n) out[i] = tile[((i + 1) % blockDim.x) * 64];
}

// ~600 instructions of straight-line code, different for each I: chains cycling through 16 of
// them fetch new code at every node, as a forward's mix of kernels does.
template <int I>
__global__ void Code(const float* in, float* out, int n) {
  const int i = threadIdx.x;
  float v = i < n ? in[i] : 0.0f;
#pragma unroll
  for (int k = 0; k < 300; ++k) v = v * (1.0f + 1e-7f * (k + I)) + static_cast<float>(I);
  if (i < n) out[i] = v;
}

// A kernel parameter of 2 KB (PyTorch's TensorIterator kernels take ~0.5-1 KB).
struct BigParam {
  float value[512];
};
__global__ void LargeParam(BigParam p, float* out, int n) {
  const int i = threadIdx.x;
  if (i < n) out[i] = p.value[i & 511];
}

// The same 2 KB parameter block in 16 different kernels that each read the previous node's
// output (session 42: a layer's RoPE kernels, small, with large parameter blocks and a new
// kernel every node, carried half of MPS's growth on a layer).
template <int I>
__global__ void LargeParamCode(BigParam p, const float* in, float* out, int n) {
  const int i = threadIdx.x;
  if (i < n) out[i] = in[(i + I) % n] * p.value[(i + I) & 511] + static_cast<float>(I);
}
using LargeParamBody = void (*)(BigParam, const float*, float*, int);
constexpr LargeParamBody kLargeParamCodes[16] = {
    LargeParamCode<0>,  LargeParamCode<1>,  LargeParamCode<2>,  LargeParamCode<3>,
    LargeParamCode<4>,  LargeParamCode<5>,  LargeParamCode<6>,  LargeParamCode<7>,
    LargeParamCode<8>,  LargeParamCode<9>,  LargeParamCode<10>, LargeParamCode<11>,
    LargeParamCode<12>, LargeParamCode<13>, LargeParamCode<14>, LargeParamCode<15>};

using Body = void (*)(const float*, float*, int);
constexpr Body kCodes[16] = {Code<0>,  Code<1>,  Code<2>,  Code<3>, Code<4>,  Code<5>,
                             Code<6>,  Code<7>,  Code<8>,  Code<9>, Code<10>, Code<11>,
                             Code<12>, Code<13>, Code<14>, Code<15>};

struct Case {
  const char* name;
  Body body;
  int blocks;
  int n;                   // elements the body touches
  size_t shared;           // dynamic shared memory bytes
  bool alternate;          // alternate with Empty nodes (a shared-memory split change every node)
  int codes = 0;           // > 0: the body is ignored; node k runs kCodes[k % codes]
  bool big_param = false;  // with codes > 0: node k runs kLargeParamCodes[k % codes]
};

float ChainMicros(const Case& c, const float* in, float* out, cudaStream_t stream) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int k = 0; k < kNodes; ++k) {
    if (c.big_param && c.codes > 0) {
      BigParam p{};
      p.value[k & 511] = static_cast<float>(k);
      // in and out alternate, so that each node reads what the one before wrote.
      const float* src = (k & 1) ? out : in;
      float* dst = (k & 1) ? const_cast<float*>(in) : out;
      kLargeParamCodes[k % c.codes]<<<c.blocks, kThreads, 0, stream>>>(p, src, dst, c.n);
    } else if (c.big_param) {
      BigParam p{};
      p.value[k & 511] = static_cast<float>(k);
      LargeParam<<<c.blocks, kThreads, 0, stream>>>(p, out, c.n);
    } else if (c.codes > 0) {
      kCodes[k % c.codes]<<<c.blocks, kThreads, 0, stream>>>(in, out, c.n);
    } else if (c.alternate && (k & 1)) {
      Empty<<<1, kThreads, 0, stream>>>(in, out, c.n);
    } else {
      c.body<<<c.blocks, kThreads, c.shared, stream>>>(in, out, c.n);
    }
  }
  CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  for (int w = 0; w < 3; ++w) CHECK(cudaGraphLaunch(exec, stream));
  std::vector<float> ms;
  for (int r = 0; r < kReps; ++r) {
    CHECK(cudaEventRecord(start, stream));
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float t = 0.0f;
    CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  return ms[kReps / 2] * 1000.0f / kNodes;
}

}  // namespace

int main() {
  CHECK(cudaSetDevice(0));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("mps_body_probe: %s, CUDA_MPS_PIPE_DIRECTORY %s; %d-kernel graph chains\n", prop.name,
              std::getenv("CUDA_MPS_PIPE_DIRECTORY") ? "set" : "unset", kNodes);
  constexpr int kElems = 1 << 20;
  float* in = nullptr;
  float* out = nullptr;
  CHECK(cudaMalloc(&in, kElems * sizeof(float)));
  CHECK(cudaMalloc(&out, kElems * sizeof(float)));
  CHECK(cudaMemset(in, 0, kElems * sizeof(float)));
  CHECK(cudaFuncSetAttribute(BigShared, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const Case cases[] = {
      {"empty_1x128", Empty, 1, 128, 0, false},
      {"load_1x128", LoadOnly, 1, 128, 0, false},
      {"store_1x128", StoreOnly, 1, 128, 0, false},
      {"load_store_1x128", LoadStore, 1, 128, 0, false},
      {"load_store_7x128", LoadStore, 7, 896, 0, false},
      {"load_store_132x128", LoadStore, 132, 132 * 128, 0, false},
      {"load_store_1024x128", LoadStore, 1024, 1024 * 128, 0, false},
      {"gather_7x128", Gather, 7, 896, 0, false},
      {"reduce_1x128_n896", Reduce, 1, 896, 0, false},
      {"big_shared_1x128", BigShared, 1, 128, 64 << 10, false},
      {"big_shared_alt_empty", BigShared, 1, 128, 64 << 10, true},
      {"code_same_x1", nullptr, 1, 128, 0, false, 1},
      {"code_cycle_16", nullptr, 1, 128, 0, false, 16},
      {"code_cycle_16_7blocks", nullptr, 7, 896, 0, false, 16},
      {"param_2KB", nullptr, 1, 128, 0, false, 0, true},
      {"param_2KB_same_x1", nullptr, 1, 128, 0, false, 1, true},
      {"param_2KB_cycle_16", nullptr, 1, 128, 0, false, 16, true},
      {"param_2KB_cycle_16_7blk", nullptr, 7, 896, 0, false, 16, true},
  };
  std::printf("%-24s %12s\n", "body", "us/kernel");
  for (const Case& c : cases) {
    std::printf("%-24s %12.3f\n", c.name, ChainMicros(c, in, out, stream));
  }
  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaFree(in));
  CHECK(cudaFree(out));
  return 0;
}
