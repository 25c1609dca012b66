// mps_graph_probe.cu: where does a replayed CUDA graph's per-node cost come from, with and
// without MPS? A standalone probe for the MPS graph-replay penalty of issue 10.
//
// Measured on the H200 (driver 580, CUDA 13, docs/DEVICE_SESSIONS.md): with a user-space MPS
// daemon running, every kernel node of a replayed CUDA graph gets ~0.8 us slower (a 0.5B
// decoder's graph-replayed forward, 1,311 kernels a step: 2.90 -> 3.85 ms at B = 1), while the
// eager forward of the same model does not change (3.91 -> 3.93 ms) and chains of big kernels
// linked by programmatic dependent launch (PDL) show no penalty. This probe runs chains of N tiny
// kernels in several ways; one run without MPS and one under MPS, compared case by case, say
// which part of a node's cost MPS adds:
//   graph_* vs stream_*          graph replay vs eager launches of the same kernels;
//   graph_chain_* vs graph_independent_empty
//                                resolving a dependency between nodes vs submitting nodes;
//   *_tiny_work, *_multiblock    whether the cost is fixed per node or grows with work or grid;
//   *_pdl                        programmatic (early-launch) edges instead of completion edges;
//   gap/*                        %globaltimer stamps inside each kernel: the GPU-side gap between
//                                one kernel's end and the next one's start, no host clock.
// Every case runs in two modes:
//   idle    the GPU is idle when the host submits, so the cudaEvent time includes submission;
//   queued  the work is submitted behind a gate kernel that the host releases only after
//           submitting, so the cudaEvent time is the GPU's execution alone.
//
// Build: nvcc -std=c++17 -O3 -arch=sm_90 -o /tmp/mps_graph_probe
// tests/gpu/probes/mps_graph_probe.cu Run:   tests/gpu/probes/run_mps_probe.sh /tmp/mps_graph_probe
// (README.md: reading the output) Flags: --nodes N (1000), --reps R (21), --warmup W (3). Exits 1
// if any CUDA call failed.

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace {

// ---------------------------------------------------------------------------------------------
// Errors: every CUDA call goes through CHECK, which prints the call and returns its error from
// the enclosing function (all of which return cudaError_t). A failed case is reported and the
// next case runs; main exits non-zero at the end.

void ReportError(const char* call, cudaError_t err, int line) {
  std::fprintf(stderr, "CUDA error at line %d: %s -> %s: %s\n", line, call, cudaGetErrorName(err),
               cudaGetErrorString(err));
}

#define CHECK(call)                             \
  do {                                          \
    const cudaError_t check_err_ = (call);      \
    if (check_err_ != cudaSuccess) {            \
      ReportError(#call, check_err_, __LINE__); \
      return check_err_;                        \
    }                                           \
  } while (0)

// ---------------------------------------------------------------------------------------------
// Kernels. Each node of a chain is one launch of one of these.

constexpr uint64_t kSpinNs = 2000;                // tiny_work: ~2 us of work a node
constexpr uint64_t kGateTimeoutNs = 200'000'000;  // a gate never holds the stream > 0.2 s
constexpr int kMultiblockThreads = 256;

__device__ __forceinline__ uint64_t GlobalTimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// PDL controls (sm_90). Both are no-ops in a kernel launched without the PDL attribute.
__device__ __forceinline__ void WaitForPrerequisiteGrids() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}
__device__ __forceinline__ void AllowDependentsToLaunch() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// 1 block x 32 threads (or sm_count x 256 for the multiblock case): does nothing.
__global__ void EmptyKernel() {}

// 1 block x 32 threads: every thread spins ns nanoseconds by %globaltimer.
__global__ void SpinKernel(uint64_t ns) {
  const uint64_t t0 = GlobalTimer();
  while (GlobalTimer() - t0 < ns) {
  }
}

// 1 block x 32 threads: waits for its predecessor, then lets its successor launch at once.
__global__ void EmptyPdlKernel() {
  WaitForPrerequisiteGrids();
  AllowDependentsToLaunch();
}

// Device arrays of N timestamps (ns, %globaltimer), one entry per node.
struct Stamps {
  uint64_t* entry;  // the kernel began (under PDL: possibly before its predecessor ended)
  uint64_t* start;  // its predecessor's results are visible (after griddepcontrol.wait)
  uint64_t* end;    // the kernel's last instruction
};

// 1 block x 32 threads: thread 0 stamps node `index`. Launched with or without PDL.
__global__ void StampKernel(Stamps stamps, int index) {
  const uint64_t entry = GlobalTimer();
  WaitForPrerequisiteGrids();
  const uint64_t start = GlobalTimer();
  AllowDependentsToLaunch();
  if (threadIdx.x == 0) {
    stamps.entry[index] = entry;
    stamps.start[index] = start;
    stamps.end[index] = GlobalTimer();
  }
}

// 1 thread: holds the stream until the host sets gate[0] (or the timeout passes: gate[1] = 1).
// gate is mapped pinned host memory.
__global__ void GateKernel(volatile int* gate, uint64_t timeout_ns) {
  const uint64_t t0 = GlobalTimer();
  while (gate[0] == 0) {
    if (GlobalTimer() - t0 > timeout_ns) {
      gate[1] = 1;
      return;
    }
    __nanosleep(256);
  }
}

// ---------------------------------------------------------------------------------------------
// The cases.

enum class Body { kEmpty, kSpin, kEmptyPdl, kEmptyMultiblock, kStamp, kStampPdl };
enum class Submit {
  kCapturedChain,     // stream capture of N launches in stream order: a chain of N-1 edges
  kIndependentNodes,  // cudaGraphAddKernelNode x N, no edges at all
  kStream,            // eager: N launches on a stream, no graph
};
enum class Mode { kIdle, kQueued };

struct Case {
  const char* name;
  Submit submit;
  Body body;
};

// Timed cases: one line each per mode (total, per node, host time of the submission).
constexpr Case kTimedCases[] = {
    // The baseline: a captured chain of empty kernels, as a graph-replayed forward.
    {"graph_chain_empty", Submit::kCapturedChain, Body::kEmpty},
    // Same chain, each node ~2 us of work: a fixed per-node cost stays the same.
    {"graph_chain_tiny_work", Submit::kCapturedChain, Body::kSpin},
    // No edges: the nodes may run concurrently, so this is submission cost, not dependencies.
    {"graph_independent_empty", Submit::kIndependentNodes, Body::kEmpty},
    // Eager launches of the same kernels: MPS left the eager forward unchanged.
    {"stream_chain_empty", Submit::kStream, Body::kEmpty},
    // PDL edges (captured as programmatic dependencies): the next node launches early.
    {"graph_chain_pdl", Submit::kCapturedChain, Body::kEmptyPdl},
    {"stream_chain_pdl", Submit::kStream, Body::kEmptyPdl},
    // One block per SM x 256 threads: does the per-node cost depend on the grid?
    {"graph_chain_multiblock", Submit::kCapturedChain, Body::kEmptyMultiblock},
    {"stream_chain_multiblock", Submit::kStream, Body::kEmptyMultiblock},
};

// Timestamp cases (gap_timestamps): one line each per mode with the GPU-side gaps.
constexpr Case kGapCases[] = {
    {"gap/graph_chain", Submit::kCapturedChain, Body::kStamp},
    {"gap/graph_chain_pdl", Submit::kCapturedChain, Body::kStampPdl},
    {"gap/stream_chain", Submit::kStream, Body::kStamp},
    {"gap/stream_chain_pdl", Submit::kStream, Body::kStampPdl},
};

struct Options {
  int nodes = 1000;
  int warmup = 3;
  int reps = 21;
};

// What every case shares; set up once in main.
struct Context {
  Options options;
  int sm_count = 0;
  Stamps stamps{};           // device, options.nodes entries each
  int* gate_host = nullptr;  // mapped pinned: [0] release, [1] timed out
  int* gate_device = nullptr;
};

// The kernel, geometry and arguments of node `index` of a case. `args` points into this object,
// so it is neither copied nor moved while in use.
class Node {
 public:
  Node(Body body, const Context& ctx, int index)
      : spin_ns_(kSpinNs), stamps_(ctx.stamps), index_(index) {
    switch (body) {
      case Body::kEmpty:
        func = reinterpret_cast<const void*>(EmptyKernel);
        break;
      case Body::kSpin:
        func = reinterpret_cast<const void*>(SpinKernel);
        break;
      case Body::kEmptyPdl:
        func = reinterpret_cast<const void*>(EmptyPdlKernel);
        break;
      case Body::kEmptyMultiblock:
        func = reinterpret_cast<const void*>(EmptyKernel);
        break;
      case Body::kStamp:
        func = reinterpret_cast<const void*>(StampKernel);
        break;
      case Body::kStampPdl:
        func = reinterpret_cast<const void*>(StampKernel);
        break;
    }
    if (body == Body::kEmptyMultiblock) {
      grid = dim3(ctx.sm_count);
      block = dim3(kMultiblockThreads);
    }
    pdl = body == Body::kEmptyPdl || body == Body::kStampPdl;
    if (body == Body::kSpin) {
      args[0] = &spin_ns_;
    } else if (body == Body::kStamp || body == Body::kStampPdl) {
      args[0] = &stamps_;
      args[1] = &index_;
    }
  }
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  const void* func = nullptr;
  dim3 grid{1};
  dim3 block{32};
  bool pdl = false;
  void* args[2] = {nullptr, nullptr};

 private:
  uint64_t spin_ns_;
  Stamps stamps_;
  int index_;
};

// Launches node `index` on `stream` (eagerly, or into a capture), with the PDL attribute when
// the body asks for it.
cudaError_t LaunchNode(Body body, const Context& ctx, cudaStream_t stream, int index) {
  const Node node(body, ctx, index);
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = node.grid;
  config.blockDim = node.block;
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = node.pdl ? &attr : nullptr;
  config.numAttrs = node.pdl ? 1 : 0;
  CHECK(cudaLaunchKernelExC(&config, node.func, const_cast<void**>(node.args)));
  return cudaSuccess;
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t i = static_cast<size_t>(p * static_cast<double>(values.size() - 1) + 0.5);
  return values[std::min(i, values.size() - 1)];
}

double Median(const std::vector<double>& values) { return Percentile(values, 0.5); }

// ---------------------------------------------------------------------------------------------
// One case: owns its stream, events and graph; releases them (ending a broken capture first)
// whatever happened.

class CaseRun {
 public:
  CaseRun(const Case& c, const Context& ctx) : case_(c), ctx_(ctx) {}
  CaseRun(const CaseRun&) = delete;
  CaseRun& operator=(const CaseRun&) = delete;

  ~CaseRun() {
    if (stream_ != nullptr) {
      cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
      if (cudaStreamIsCapturing(stream_, &status) == cudaSuccess &&
          status != cudaStreamCaptureStatusNone) {
        cudaGraph_t broken = nullptr;
        cudaStreamEndCapture(stream_, &broken);
        if (broken != nullptr) cudaGraphDestroy(broken);
      }
      cudaStreamSynchronize(stream_);
    }
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
    if (graph_ != nullptr) cudaGraphDestroy(graph_);
    if (start_ != nullptr) cudaEventDestroy(start_);
    if (stop_ != nullptr) cudaEventDestroy(stop_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    cudaGetLastError();  // a failed case leaves no (non-sticky) error behind for the next
  }

  // Creates the stream and events, and builds, instantiates and uploads the graph if any.
  cudaError_t Init() {
    CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CHECK(cudaEventCreate(&start_));
    CHECK(cudaEventCreate(&stop_));
    if (case_.submit == Submit::kCapturedChain) CHECK(CaptureChain());
    if (case_.submit == Submit::kIndependentNodes) CHECK(AddIndependentNodes());
    if (graph_ != nullptr) {
      CHECK(DescribeGraph());
      CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
      CHECK(cudaGraphUpload(exec_, stream_));
      CHECK(cudaStreamSynchronize(stream_));
    }
    return cudaSuccess;
  }

  // Graph cases: "nodes=N edges=E programmatic=P"; empty for stream cases.
  const std::string& graph_note() const { return graph_note_; }

  // One replay (or one eager chain). gpu_us: cudaEvent time around the submission; host_us:
  // host wall time of the submitting call(s). *gate_timed_out: queued mode's gate gave up, so
  // the host could not submit everything within kGateTimeoutNs and gpu_us is not GPU-only.
  cudaError_t Rep(Mode mode, double* gpu_us, double* host_us, bool* gate_timed_out) {
    volatile int* gate = ctx_.gate_host;
    *gate_timed_out = false;
    if (mode == Mode::kQueued) {
      gate[0] = 0;
      gate[1] = 0;
      std::atomic_thread_fence(std::memory_order_seq_cst);
      GateKernel<<<1, 1, 0, stream_>>>(ctx_.gate_device, kGateTimeoutNs);
      CHECK(cudaGetLastError());
    }
    CHECK(cudaEventRecord(start_, stream_));
    const auto t0 = std::chrono::steady_clock::now();
    const cudaError_t submitted = SubmitOnce();
    const auto t1 = std::chrono::steady_clock::now();
    if (mode == Mode::kQueued) {
      std::atomic_thread_fence(std::memory_order_seq_cst);
      gate[0] = 1;  // released even if the submission failed, so the stream drains
    }
    CHECK(submitted);
    CHECK(cudaEventRecord(stop_, stream_));
    CHECK(cudaEventSynchronize(stop_));
    float ms = 0.0f;
    CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    *gpu_us = 1000.0 * ms;
    *host_us = std::chrono::duration<double, std::micro>(t1 - t0).count();
    *gate_timed_out = mode == Mode::kQueued && gate[1] != 0;
    return cudaSuccess;
  }

  cudaStream_t stream() const { return stream_; }

 private:
  cudaError_t CaptureChain() {
    CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < ctx_.options.nodes; ++i) CHECK(LaunchNode(case_.body, ctx_, stream_, i));
    CHECK(cudaStreamEndCapture(stream_, &graph_));
    return cudaSuccess;
  }

  cudaError_t AddIndependentNodes() {
    CHECK(cudaGraphCreate(&graph_, 0));
    for (int i = 0; i < ctx_.options.nodes; ++i) {
      const Node node(case_.body, ctx_, i);
      cudaKernelNodeParams params{};
      params.func = const_cast<void*>(node.func);
      params.gridDim = node.grid;
      params.blockDim = node.block;
      params.sharedMemBytes = 0;
      params.kernelParams = const_cast<void**>(node.args);
      params.extra = nullptr;
      cudaGraphNode_t added = nullptr;
      CHECK(cudaGraphAddKernelNode(&added, graph_, nullptr, 0, &params));
    }
    return cudaSuccess;
  }

  // Counts nodes, edges and programmatic (PDL) edges, to show what capture produced.
  cudaError_t DescribeGraph() {
    size_t nodes = 0;
    size_t edges = 0;
    CHECK(cudaGraphGetNodes(graph_, nullptr, &nodes));
    CHECK(cudaGraphGetEdges(graph_, nullptr, nullptr, nullptr, &edges));
    size_t programmatic = 0;
    if (edges > 0) {
      std::vector<cudaGraphNode_t> from(edges), to(edges);
      std::vector<cudaGraphEdgeData> data(edges);
      CHECK(cudaGraphGetEdges(graph_, from.data(), to.data(), data.data(), &edges));
      for (size_t i = 0; i < edges; ++i) {
        if (data[i].type == cudaGraphDependencyTypeProgrammatic) ++programmatic;
      }
    }
    graph_note_ = "nodes=" + std::to_string(nodes) + " edges=" + std::to_string(edges) +
                  " programmatic=" + std::to_string(programmatic);
    return cudaSuccess;
  }

  cudaError_t SubmitOnce() {
    if (exec_ != nullptr) {
      CHECK(cudaGraphLaunch(exec_, stream_));
      return cudaSuccess;
    }
    for (int i = 0; i < ctx_.options.nodes; ++i) CHECK(LaunchNode(case_.body, ctx_, stream_, i));
    return cudaSuccess;
  }

  const Case& case_;
  const Context& ctx_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  std::string graph_note_;
};

// ---------------------------------------------------------------------------------------------
// Running the cases.

const char* ModeName(Mode mode) { return mode == Mode::kIdle ? "idle" : "queued"; }

constexpr Mode kModes[] = {Mode::kIdle, Mode::kQueued};

// Runs warmup + reps of one mode and fills the medians. per_rep(bool timed) is called after
// every rep, for the stamp cases to read (timed reps) and clear their stamps. Stops at the first
// gate timeout.
template <typename PerRep>
cudaError_t RunMode(CaseRun& run, const Context& ctx, Mode mode, PerRep per_rep, double* gpu_us,
                    double* host_us, bool* gate_timed_out) {
  std::vector<double> gpu, host;
  for (int r = 0; r < ctx.options.warmup + ctx.options.reps; ++r) {
    double g = 0.0, h = 0.0;
    CHECK(run.Rep(mode, &g, &h, gate_timed_out));
    if (*gate_timed_out) return cudaSuccess;
    const bool timed = r >= ctx.options.warmup;
    CHECK(per_rep(timed));
    if (!timed) continue;
    gpu.push_back(g);
    host.push_back(h);
  }
  *gpu_us = Median(gpu);
  *host_us = Median(host);
  return cudaSuccess;
}

cudaError_t RunTimedCase(const Case& c, const Context& ctx) {
  CaseRun run(c, ctx);
  CHECK(run.Init());
  const int n = ctx.options.nodes;
  for (const Mode mode : kModes) {
    double gpu_us = 0.0, host_us = 0.0;
    bool timed_out = false;
    CHECK(RunMode(
        run, ctx, mode, [](bool) { return cudaSuccess; }, &gpu_us, &host_us, &timed_out));
    if (timed_out) {
      std::printf("%-26s %-6s %10s %11s %10s  gate timed out: submission blocked\n", c.name,
                  ModeName(mode), "n/a", "n/a", "n/a");
      continue;
    }
    std::printf("%-26s %-6s %10.1f %11.3f %10.1f  %s\n", c.name, ModeName(mode), gpu_us, gpu_us / n,
                host_us, run.graph_note().c_str());
  }
  std::fflush(stdout);
  return cudaSuccess;
}

// Accumulates, over reps, the per-node gaps of the stamp cases (all in us).
struct GapSamples {
  std::vector<double> gap;   // start[i+1] - end[i]: the dependent-launch gap
  std::vector<double> lead;  // entry[i+1] - end[i]: < 0 when the next node launched early
  std::vector<double> dur;   // end[i] - start[i]
  std::vector<double> span;  // end[N-1] - start[0], one per rep
  int missing = 0;           // reps where some node left no stamp
};

double DiffUs(uint64_t later, uint64_t earlier) {
  return static_cast<double>(static_cast<int64_t>(later - earlier)) / 1000.0;
}

// Copies the stamps of the last rep into *out (if timed) and clears them for the next rep.
cudaError_t ReadStamps(const Context& ctx, cudaStream_t stream, bool timed, GapSamples* out) {
  const int n = ctx.options.nodes;
  std::vector<uint64_t> entry(n), start(n), end(n);
  const size_t bytes = sizeof(uint64_t) * n;
  CHECK(cudaMemcpyAsync(entry.data(), ctx.stamps.entry, bytes, cudaMemcpyDeviceToHost, stream));
  CHECK(cudaMemcpyAsync(start.data(), ctx.stamps.start, bytes, cudaMemcpyDeviceToHost, stream));
  CHECK(cudaMemcpyAsync(end.data(), ctx.stamps.end, bytes, cudaMemcpyDeviceToHost, stream));
  CHECK(cudaMemsetAsync(ctx.stamps.entry, 0, bytes, stream));
  CHECK(cudaMemsetAsync(ctx.stamps.start, 0, bytes, stream));
  CHECK(cudaMemsetAsync(ctx.stamps.end, 0, bytes, stream));
  CHECK(cudaStreamSynchronize(stream));
  if (!timed) return cudaSuccess;
  for (int i = 0; i < n; ++i) {
    if (entry[i] == 0 || start[i] == 0 || end[i] == 0) {
      ++out->missing;
      return cudaSuccess;
    }
  }
  for (int i = 0; i < n; ++i) {
    out->dur.push_back(DiffUs(end[i], start[i]));
    if (i + 1 < n) {
      out->gap.push_back(DiffUs(start[i + 1], end[i]));
      out->lead.push_back(DiffUs(entry[i + 1], end[i]));
    }
  }
  out->span.push_back(DiffUs(end[n - 1], start[0]));
  return cudaSuccess;
}

cudaError_t RunGapCase(const Case& c, const Context& ctx) {
  CaseRun run(c, ctx);
  CHECK(run.Init());
  for (const Mode mode : kModes) {
    GapSamples samples;
    double gpu_us = 0.0, host_us = 0.0;
    bool timed_out = false;
    CHECK(RunMode(
        run, ctx, mode, [&](bool timed) { return ReadStamps(ctx, run.stream(), timed, &samples); },
        &gpu_us, &host_us, &timed_out));
    if (timed_out || samples.gap.empty()) {
      std::printf("%-22s %-6s n/a  %s\n", c.name, ModeName(mode),
                  timed_out ? "gate timed out: submission blocked" : "no complete stamps");
      continue;
    }
    std::printf("%-22s %-6s %9.1f %8.3f %8.3f %8.3f %9.3f %8.3f %9.1f  %s%s\n", c.name,
                ModeName(mode), gpu_us, Median(samples.gap), Percentile(samples.gap, 0.9),
                Percentile(samples.gap, 1.0), Median(samples.lead), Median(samples.dur),
                Median(samples.span), run.graph_note().c_str(),
                samples.missing > 0 ? " (some reps had missing stamps)" : "");
  }
  std::fflush(stdout);
  return cudaSuccess;
}

// ---------------------------------------------------------------------------------------------
// Setup and the report header.

std::string EnvOr(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::string(value) : std::string(fallback);
}

std::string KernelDriverVersion() {
  std::ifstream file("/proc/driver/nvidia/version");
  std::string line;
  if (!file || !std::getline(file, line)) return "unknown (/proc/driver/nvidia/version)";
  return line;
}

cudaError_t PrintHeader(const Context& ctx) {
  int device = 0;
  CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, device));
  int driver = 0, runtime = 0, compute_mode = 0, mps_enabled = 0;
  CHECK(cudaDriverGetVersion(&driver));
  CHECK(cudaRuntimeGetVersion(&runtime));
  CHECK(cudaDeviceGetAttribute(&compute_mode, cudaDevAttrComputeMode, device));
  CHECK(cudaDeviceGetAttribute(&mps_enabled, cudaDevAttrMpsEnabled, device));
  std::printf("mps_graph_probe: nodes=%d warmup=%d reps=%d (medians over reps)\n",
              ctx.options.nodes, ctx.options.warmup, ctx.options.reps);
  std::printf("device: %s, sm_%d%d, %d SMs\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount);
  std::printf("driver: %s\n", KernelDriverVersion().c_str());
  std::printf("cuda: driver API %d, runtime %d\n", driver, runtime);
  std::printf("compute_mode: %d, mps_enabled attribute: %d\n", compute_mode, mps_enabled);
  const char* pipe = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  std::printf("env: CUDA_MPS_PIPE_DIRECTORY %s%s\n", pipe != nullptr ? "set: " : "unset",
              pipe != nullptr ? pipe : "");
  std::printf("env: CUDA_DEVICE_MAX_CONNECTIONS=%s\n",
              EnvOr("CUDA_DEVICE_MAX_CONNECTIONS", "(unset)").c_str());
  std::printf("env: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%s\n",
              EnvOr("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "(unset)").c_str());
  return cudaSuccess;
}

// Creates the context and the shared buffers. Fatal on failure.
cudaError_t Setup(Context* ctx) {
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));  // creates the context (under MPS: connects to the daemon)
  CHECK(cudaDeviceGetAttribute(&ctx->sm_count, cudaDevAttrMultiProcessorCount, 0));
  const size_t bytes = sizeof(uint64_t) * ctx->options.nodes;
  CHECK(cudaMalloc(&ctx->stamps.entry, bytes));
  CHECK(cudaMalloc(&ctx->stamps.start, bytes));
  CHECK(cudaMalloc(&ctx->stamps.end, bytes));
  CHECK(cudaMemset(ctx->stamps.entry, 0, bytes));
  CHECK(cudaMemset(ctx->stamps.start, 0, bytes));
  CHECK(cudaMemset(ctx->stamps.end, 0, bytes));
  CHECK(cudaHostAlloc(&ctx->gate_host, 2 * sizeof(int), cudaHostAllocMapped));
  ctx->gate_host[0] = 1;
  ctx->gate_host[1] = 0;
  CHECK(cudaHostGetDevicePointer(&ctx->gate_device, ctx->gate_host, 0));
  return cudaSuccess;
}

void Teardown(Context* ctx) {
  if (ctx->stamps.entry != nullptr) cudaFree(ctx->stamps.entry);
  if (ctx->stamps.start != nullptr) cudaFree(ctx->stamps.start);
  if (ctx->stamps.end != nullptr) cudaFree(ctx->stamps.end);
  if (ctx->gate_host != nullptr) cudaFreeHost(ctx->gate_host);
}

bool ParseOptions(int argc, char** argv, Options* options) {
  for (int i = 1; i < argc; ++i) {
    int* target = nullptr;
    if (std::strcmp(argv[i], "--nodes") == 0) target = &options->nodes;
    if (std::strcmp(argv[i], "--reps") == 0) target = &options->reps;
    if (std::strcmp(argv[i], "--warmup") == 0) target = &options->warmup;
    if (target == nullptr || i + 1 >= argc) {
      std::fprintf(stderr, "usage: %s [--nodes N] [--reps R] [--warmup W]\n", argv[0]);
      return false;
    }
    char* end = nullptr;
    const long value = std::strtol(argv[++i], &end, 10);
    if (*end != '\0' || value < 0 || value > 100000) {
      std::fprintf(stderr, "expected an integer in [0, 100000] after %s, got %s\n", argv[i - 1],
                   argv[i]);
      return false;
    }
    *target = static_cast<int>(value);
  }
  if (options->nodes < 2 || options->reps < 1) {
    std::fprintf(stderr, "expected --nodes >= 2 and --reps >= 1\n");
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Context ctx;
  if (!ParseOptions(argc, argv, &ctx.options)) return 2;
  if (Setup(&ctx) != cudaSuccess || PrintHeader(ctx) != cudaSuccess) {
    std::fprintf(stderr, "setup failed\n");
    Teardown(&ctx);
    return 1;
  }
  int failed = 0;

  std::printf("\n%-26s %-6s %10s %11s %10s  %s\n", "case", "mode", "total_us", "us_per_node",
              "host_us", "graph");
  for (const Case& c : kTimedCases) {
    if (RunTimedCase(c, ctx) != cudaSuccess) {
      std::printf("%-26s FAILED (error above, on stderr)\n", c.name);
      ++failed;
    }
  }

  std::printf("\n%-22s %-6s %9s %8s %8s %8s %9s %8s %9s  %s\n", "gap_timestamps", "mode",
              "total_us", "gap_med", "gap_p90", "gap_max", "lead_med", "dur_med", "span_us",
              "graph");
  for (const Case& c : kGapCases) {
    if (RunGapCase(c, ctx) != cudaSuccess) {
      std::printf("%-22s FAILED (error above, on stderr)\n", c.name);
      ++failed;
    }
  }

  Teardown(&ctx);
  if (failed > 0) {
    std::printf("\n%d case(s) failed\n", failed);
    return 1;
  }
  return 0;
}
