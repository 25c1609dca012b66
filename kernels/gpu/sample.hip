// GPU sampling: RowFinishKernel (filters, draw, logprobs) and the host launcher Sample.
//
// A launch whose rows are all greedy, without logprobs, is one kernel (greedy_pass.h). Others
// take two to four launches on the caller's stream:
//   0. MarkAdjustsKernel (here), only with sparse logits processors: marks their tokens
//      (row_processors.h; every pass applies the processors as it loads a logit).
//   1. ChunkPassKernel (chunk_pass.h): reads every row once in fixed 8192-token chunks.
//   2. RowFinishKernel (here): one block per row; combines the chunks in a fixed order, resolves
//      min-p / top-k / top-p exactly on order-preserving keys (select.h) and draws with the
//      Philox streams of kernels/common/philox.h, exactly as kernels/cpu does. For a row whose
//      only filter is top-p it makes the row's plan instead (mass_plan.h) and leaves it to
//   3. MassDrawKernel (mass_draw.h), launched when such rows may exist (SampleArgs::top_p_rows).
// Which row takes which path: row_path.h.
// Design, measurements and what each version cost: kernels/gpu/NOTES.md.
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kernels/gpu/chunk_pass.h"
#include "kernels/gpu/greedy_pass.h"
#include "kernels/gpu/mass_draw.h"
#include "kernels/gpu/mass_plan.h"
#include "kernels/gpu/platform.h"
#include "kernels/gpu/row_finish.h"
#include "kernels/gpu/row_logprobs.h"
#include "kernels/gpu/row_processors.h"
#include "kernels/gpu/sample.h"
#include "kernels/gpu/select.h"

namespace samplerd::kernels::gpu {
namespace {

// Top-N logprobs collected on chip (the server's limit is far lower).
constexpr int32_t kMaxGpuTopLogprobs = kSortCap / 2;

// v47: a top-p-alone row's token by the chunked inverse CDF over the survivors (key >= t);
// sources other than the row itself (the candidates of top-k rows) keep `token`.
template <class Source>
__device__ int64_t ChunkedIfTopPAlone(const Source&, int64_t token, uint32_t, const RowParams&,
                                      float, FinishShared&) {
  return token;
}
template <DType kDType>
__device__ int64_t ChunkedIfTopPAlone(const RowSource<kDType>& source, int64_t token, uint32_t t,
                                      const RowParams& params, float row_max, FinishShared& sh) {
  if (!IsTopPAlone(params, source.vocab)) return token;
  __syncthreads();  // every thread is done with sh.select
  auto keeps = [t](float, float z) { return OrderedKey(z) >= t; };
  return OneBlockChunkedDraw<kDType, kFinishThreads>(
      source.row, source.procs, source.row_index, source.vocab, row_max, source.temperature, keeps,
      params, [token] { return token; }, sh.chunked, sh.reduce);
}

// Resolves min-p, top-k and top-p over `source` and draws. Returns the token; *threshold gets
// the smallest surviving key, *mass and *count the survivors' fixed-point mass and number.
template <class Source>
__device__ int64_t FilterAndDraw(const Source& source, const RowParams& params, int64_t vocab,
                                 const RowSummary& summary, FinishShared& sh, uint32_t* threshold,
                                 uint64_t* mass, uint64_t* count) {
  const float row_max = summary.max_z;
  uint32_t t = 0;
  if (params.min_p > 0.0f) t = OrderedKey(row_max + logf(params.min_p));
  if (params.top_k > 0 && params.top_k < vocab) {
    t = SelectThreshold<kFinishThreads>(source, t, /*by_mass=*/false, row_max, 0.0, -1.0,
                                        static_cast<double>(params.top_k), sh.select, sh.reduce);
  }
  if (params.top_p > 0.0f && params.top_p < 1.0f) {
    const double joint = params.top_p_mode == TopPMode::kJoint
                             ? static_cast<double>(summary.sum_exp_z) * kMassScale
                             : -1.0;
    FusedDraw draw;
    draw.enabled = true;
    draw.seed = params.seed;
    draw.position = params.position;
    t = SelectThreshold<kFinishThreads>(source, t, /*by_mass=*/true, row_max, params.top_p, joint,
                                        0.0, sh.select, sh.reduce, &draw);
    if (draw.done) {
      *threshold = t;
      *mass = draw.mass;
      *count = draw.count;
      return ChunkedIfTopPAlone(source, draw.best.index, t, params, row_max, sh);
    }
  }
  *threshold = t;
  const int64_t token =
      GumbelDraw(source, t, /*noise_only=*/false, row_max, params, sh, mass, count);
  return ChunkedIfTopPAlone(source, token, t, params, row_max, sh);
}

// The raw logits' statistics of a row with logits processors (pass 1 saw the processed ones):
// max_x, sum_exp_x, pos_inf_x and not_neg_inf_x, from two passes over the row (NaN rows never
// get here). Costs a re-read of the row, for raw logprobs and the no-allowed status only.
template <DType kDType>
__device__ RowSummary RawRowSummary(const RowSource<kDType>& raw, FinishShared& sh) {
  using Reduce = BlockReduce<kFinishThreads>;
  float max_x = -kInfF;
  uint64_t pos_inf = 0, not_neg_inf = 0;
  raw.ForEach([&](uint32_t, int64_t, float x) {
    max_x = fmaxf(max_x, x);
    pos_inf += x == kInfF;
    ++not_neg_inf;
  });
  RowSummary r{};
  r.max_x = Reduce::Max(sh.reduce, max_x);
  r.pos_inf_x = static_cast<uint32_t>(Reduce::SumU64(sh.reduce, pos_inf));
  r.not_neg_inf_x = static_cast<uint32_t>(Reduce::SumU64(sh.reduce, not_neg_inf));
  float sum = 0.0f;
  if (r.max_x > -kInfF && r.max_x < kInfF) {
    raw.ForEach([&](uint32_t, int64_t, float x) { sum += expf(x - r.max_x); });
  }
  r.sum_exp_x = Reduce::Sum(sh.reduce, sum);
  return r;
}

// A row without a token: -1, `status`, and its logprob outputs empty. Every thread calls.
__device__ void FinishInvalidRow(const RowFinishParams& p, int64_t row, RowStatus status) {
  if (threadIdx.x == 0) {
    p.token_ids[row] = -1;
    p.status[row] = status;
    if (p.top_logprobs >= 0) {
      if (p.sampled_logprob != nullptr) p.sampled_logprob[row] = -kInfF;
      if (p.sampled_rank != nullptr) p.sampled_rank[row] = 0;
    }
  }
  for (int i = threadIdx.x; i < p.top_logprobs; i += kFinishThreads) {
    p.top_ids[row * p.top_logprobs + i] = -1;
    p.top_values[row * p.top_logprobs + i] = -kInfF;
  }
}

// The finish of every row that no short path of RowFinishKernel took (logprobs, filters the
// candidates cannot serve, invalid rows): the chunk stats combined, the filters resolved over
// the row, the draw, and the logprob outputs. Out of line (v53), with the kernel's parameters
// and the row's params as its own copies: the callees that are not inlined take them by
// reference (WriteLogprobs, FilterAndDraw), and while the kernel referenced them every thread of
// every row copied the 288-byte RowFinishParams and the row's params to local memory in its
// prologue, the mass rows that only plan included (44% of RowFinishKernel's stall samples on
// top-p rows at B = 128: kernels/gpu/NOTES.md, session 40). Every thread of the block calls.
template <DType kDType>
__device__ __noinline__ void FinishGeneralRow(const RowFinishParams& p, int64_t row,
                                              const RowParams params, bool plain,
                                              int64_t plain_token, FinishShared& sh) {
  const ChunkStats* stats = p.stats + row * p.rows.chunks;
  const uint32_t* candidate_key = p.candidate_key + row * p.rows.chunks * kCandidateCap;
  const int32_t* candidate_index = p.candidate_index + row * p.rows.chunks * kCandidateCap;
  for (int c = threadIdx.x; c < p.rows.chunks; c += kFinishThreads) sh.staged[c] = stats[c];
  __syncthreads();
  if (threadIdx.x == 0) {
    sh.summary = CombineChunks(sh.staged, p.rows.chunks);
    // Here, while the chunk stats are staged (the select storage reuses their memory), and only
    // for the rows that can use it: every row paid ~1 µs when CombineChunks did it (v11).
    sh.summary.tied = UsesCandidates(params, p.rows.vocab) && !sh.summary.candidates_ok &&
                      TiedAtRowMax(sh.staged, p.rows.chunks, sh.summary.max_z);
  }
  __syncthreads();
  const RowSummary summary = sh.summary;
  const void* row_ptr = p.rows.Row<kDType>(row);

  const RowSource<kDType> raw_source{row_ptr, p.rows.vocab, 1.0f};
  RowStatus status = RowStatus::kOk;
  if (summary.nan_count > 0) {
    status = RowStatus::kNan;
  } else if (summary.not_neg_inf_x == 0) {
    // Nothing above -inf after the processors: was there anything before them?
    status = p.rows.procs.active() && RawRowSummary(raw_source, sh).not_neg_inf_x > 0
                 ? RowStatus::kNoAllowed
                 : RowStatus::kNoFinite;
  }
  if (status != RowStatus::kOk) {
    FinishInvalidRow(p, row, status);
    return;
  }

  const RowSource<kDType> z_source{row_ptr, p.rows.vocab, params.temperature, p.rows.procs, row};
  // The processed x (the rows of step 4's limit). Made where it is used: a RowSource kept live
  // across the whole finish spilled registers, and cost greedy rows ~1 µs (v11).
  auto x_source = [&] { return RowSource<kDType>{row_ptr, p.rows.vocab, 1.0f, p.rows.procs, row}; };
  const CandidateSource candidates{candidate_key, candidate_index, stats, p.rows.chunks};
  const bool use_candidates = UsesCandidates(params, p.rows.vocab) && summary.candidates_ok;
  const bool processed_logprobs =
      p.top_logprobs >= 0 && p.logprob_source == LogprobSource::kProcessed;
  DrawKind kind = DrawKind::kFiltered;
  int64_t token = summary.argmax_x;
  uint32_t threshold = 0;
  uint64_t mass = 0, count = 0;
  if (IsGreedy(params)) {
    kind = DrawKind::kPointMass;
  } else if (summary.pos_inf_z > 0 || !(summary.max_z > -kInfF)) {
    // max x / T is +inf (a +inf logit, or overflow) or -inf (every finite x / T underflowed):
    // uniform over the tokens at the max x, as in the CPU reference (DESIGN.md, "Arithmetic").
    kind = DrawKind::kTopTies;
    token = GumbelDraw(x_source(), OrderedKey(summary.max_x), /*noise_only=*/true, 0.0f, params, sh,
                       &mass, &count);
  } else if (plain && plain_token >= 0) {
    // The inverse-CDF draw made above; processed logprobs need the survivors' mass and count,
    // which the unfiltered FilterAndDraw gives (its own token is not used).
    if (processed_logprobs) {
      FilterAndDraw(z_source, params, p.rows.vocab, summary, sh, &threshold, &mass, &count);
    }
    token = plain_token;
  } else if (summary.tied && !processed_logprobs) {
    token = summary.drawn.index;  // every finite z ties at the max: every filter keeps them all
  } else if (use_candidates) {
    token = FilterAndDraw(candidates, params, p.rows.vocab, summary, sh, &threshold, &mass, &count);
  } else {
    token = FilterAndDraw(z_source, params, p.rows.vocab, summary, sh, &threshold, &mass, &count);
  }
  if (!TokenInRow(token, p.rows.vocab)) {  // the logits changed since pass 1 (TokenInRow)
    FinishInvalidRow(p, row, RowStatus::kNoFinite);
    return;
  }
  if (threadIdx.x == 0) {
    p.token_ids[row] = static_cast<int32_t>(token);
    p.status[row] = RowStatus::kOk;
  }
  if (p.top_logprobs < 0) return;

  LogprobView view;
  if (p.logprob_source == LogprobSource::kRaw) {
    view.temperature = 1.0f;
    // Pass 1's x statistics are of the processed logits when there are processors.
    const RowSummary raw = p.rows.procs.active() ? RawRowSummary(raw_source, sh) : summary;
    if (raw.pos_inf_x > 0) {
      view.lo = OrderedKey(kInfF);
      view.constant = true;
      view.value_constant = -log(static_cast<double>(raw.pos_inf_x));
      view.eligible = raw.pos_inf_x;
    } else {
      view.row_max = raw.max_x;
      view.log_sum = log(static_cast<double>(raw.sum_exp_x));
      view.eligible = raw.not_neg_inf_x;
    }
    WriteLogprobs<kDType>(p, row, row_ptr, raw_source, view, token, sh);
    return;
  }
  view.temperature = params.temperature;
  view.processed = true;
  switch (kind) {
    case DrawKind::kPointMass:
      view.point_mass = true;
      view.eligible = 1;
      break;
    case DrawKind::kTopTies:
      view.temperature = 1.0f;  // eligible: the processed x at the max
      view.lo = OrderedKey(summary.max_x);
      view.constant = true;
      view.value_constant = -log(static_cast<double>(count));
      view.eligible = count;
      break;
    case DrawKind::kFiltered:
      view.lo = threshold;
      view.row_max = summary.max_z;
      view.log_sum = log(static_cast<double>(mass) / static_cast<double>(kMassScale));
      view.eligible = count;
      break;
  }
  if (kind == DrawKind::kFiltered && use_candidates) {
    WriteLogprobs<kDType>(p, row, row_ptr, candidates, view, token, sh);
  } else if (kind == DrawKind::kTopTies) {
    WriteLogprobs<kDType>(p, row, row_ptr, x_source(), view, token, sh);
  } else {
    WriteLogprobs<kDType>(p, row, row_ptr, z_source, view, token, sh);
  }
}

// Pass 2: one block per row. A mass row gets its plan here; on the two-pass plan it is left to
// MassDrawKernel (mass_draw.h), else it is finished here like every other row.
template <DType kDType>
__global__ void __launch_bounds__(kFinishThreads) RowFinishKernel(RowFinishParams p) {
  __shared__ FinishShared sh;
  const int64_t row = blockIdx.x;
  // Launched dependent on ChunkPassKernel, whose stats are read below. Every block waits for
  // it, also a skipped one: a kernel that ends before ChunkPassKernel would let the next launch
  // on the stream start while ChunkPassKernel still writes the workspace.
  const bool skipped = p.rows.Skipped(row);  // device sessions: a row past the step's batch
  const RowParams params = p.rows.Params(skipped ? 0 : row);
  GridWaitPrerequisites();
  if (skipped) return;
  if (IsMassRow(params, p.rows.vocab, p.mass.enabled) &&
      PlanMassRow<kFinishThreads>(p.mass, p.stats + row * p.rows.chunks, row, p.rows.chunks, params,
                                  sh.mass_plan, sh.reduce) != MassPath::kFallback) {
    return;  // MassDrawKernel draws the row
  }
  const ChunkStats* stats = p.stats + row * p.rows.chunks;
  const uint32_t* candidate_key = p.candidate_key + row * p.rows.chunks * kCandidateCap;
  const int32_t* candidate_index = p.candidate_index + row * p.rows.chunks * kCandidateCap;
  // Plain temperature: the inverse-CDF draw from pass 1's chunk masses (inverse_cdf.h), at one
  // call site for every such row (with logprobs, the general finish below uses its token).
  const bool plain = IsPlainTemperature(params, p.rows.vocab);
  int64_t plain_token = -1;
  if (plain) {
    plain_token = InverseCdfToken<kFinishThreads, kDType>(p.rows, row, params, stats,
                                                          sh.inverse_cdf, sh.reduce);
    if (p.top_logprobs < 0 && plain_token >= 0) {
      if (threadIdx.x == 0) WriteRowToken(p.token_ids, p.status, row, plain_token, p.rows.vocab);
      return;
    }
  }
  if (p.top_logprobs < 0 && IsGreedy(params)) {
    // Pass 1 decided the token; the chunk stats only have to be combined (v16).
    const int64_t token = GreedyToken(stats, p.rows.chunks, &sh.greedy_token);
    if (token >= 0) {
      if (threadIdx.x == 0) {
        p.token_ids[row] = static_cast<int32_t>(token);
        p.status[row] = RowStatus::kOk;
      }
      return;
    }
  }
  if (p.top_logprobs < 0 && UsesCandidates(params, p.rows.vocab)) {
    // The common top-k row, on the short path (candidate_finish.h): most of the general
    // finish below is a chain of serial steps and barriers that these rows do not need (v14).
    const bool joint = TopPActive(params) && params.top_p_mode == TopPMode::kJoint;
    CandidateRowSummary(stats, p.rows.chunks, joint, sh.candidate_offset, sh.candidates);
    const CandidatePath path = sh.candidates.path;
    if (path != CandidatePath::kGeneral) {
      int64_t token = sh.candidates.drawn;  // kTied
      if (path == CandidatePath::kList) {
        // Inlined at this one call site: a second one (for logprob rows) spilled registers
        // across the whole kernel, +2 us on every other row at B = 1 (NOTES.md v14).
        token = CandidatesDraw<kFinishThreads>(candidate_key, candidate_index, sh.candidate_offset,
                                               p.rows.chunks, static_cast<int>(sh.candidates.total),
                                               sh.candidates.max_z, sh.candidates.sum_exp_z, params,
                                               sh.candidates, sh.select, sh.reduce);
      }
      if (threadIdx.x == 0) WriteRowToken(p.token_ids, p.status, row, token, p.rows.vocab);
      return;
    }
  }
  // The general finish, out of line with its own copy of `p` (v53).
  const RowFinishParams copy = p;
  FinishGeneralRow<kDType>(copy, row, params, plain, plain_token, sh);
}

// Sets `marked` and `first` (row_processors.h) from the adjust lists: grid (batch),
// kMarkThreads threads; a block clears its row's marks, sets one bit per entry, and has the first
// entry of each marked word store its index.
constexpr int kMarkThreads = 256;
// Entries a thread loads before it marks any (v40): one entry at a time, each load waited for
// behind the atomic of the entry before, a row of 2,000 entries took ~7.6 us at B = 1 under ncu
// (3,259 instructions: eight round trips), as long as the greedy pass after it.
constexpr int kMarkBatch = 8;

__global__ void __launch_bounds__(kMarkThreads) MarkAdjustsKernel(RowProcessors p) {
  // The pass after it is launched dependent (LaunchDependent): it issues its logits' loads while
  // the marks are set, and waits for this kernel before it reads them (v43).
  GridLaunchDependents();
  const int64_t row = blockIdx.x;
  uint32_t* marked = p.marked + row * p.words;
  uint32_t* first = p.first + row * p.words;
  for (int64_t w = threadIdx.x; w < p.words; w += kMarkThreads) marked[w] = 0u;
  __syncthreads();  // the block's clears are visible to its own atomics after the barrier
  const uint32_t begin = p.offsets[row], end = p.offsets[row + 1];
  for (uint32_t base = begin; base < end; base += kMarkThreads * kMarkBatch) {
    int32_t token[kMarkBatch];
    bool starts[kMarkBatch];  // the entry is its word's first
#pragma unroll
    for (int k = 0; k < kMarkBatch; ++k) {
      const uint32_t i = base + k * kMarkThreads + threadIdx.x;
      token[k] = i < end ? p.adjusts[i].token : 0;
      const int32_t before = i < end && i > begin ? p.adjusts[i - 1].token : -32;
      starts[k] = (before >> 5) != (token[k] >> 5);
    }
#pragma unroll
    for (int k = 0; k < kMarkBatch; ++k) {
      const uint32_t i = base + k * kMarkThreads + threadIdx.x;
      if (i >= end) break;
      atomicOr(&marked[token[k] >> 5], 1u << (token[k] & 31));
      if (starts[k]) first[token[k] >> 5] = i;
    }
  }
}

constexpr size_t kAlign = 256;
size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

int ChunksPerRow(int64_t vocab) { return static_cast<int>((vocab + kChunk - 1) / kChunk); }

size_t BitmaskWords(int64_t vocab) { return static_cast<size_t>((vocab + 31) / 32); }

// Rows a launch may have (grid.y).
constexpr int64_t kMaxBatch = 65535;

// The greedy launch's vectors a thread (greedy_pass.h). Small launches take short spans, so that
// a row spreads over many SMs (B = 1, fp32: 149 blocks rather than 38); large ones take long
// spans, so that fewer blocks pay the fixed cost. Measured: NOTES.md v12.
template <DType kDType>
bool ShortGreedySpans(int64_t batch, int64_t vocab) {
  const int64_t blocks = batch * ((vocab + kGreedySpan<kDType, 1> - 1) / kGreedySpan<kDType, 1>);
  return blocks <= 4 * 132;
}

int64_t GreedySpansPerRow(int64_t vocab) {
  return (vocab + kGreedySpan<DType::kFp32, 1> - 1) / kGreedySpan<DType::kFp32, 1>;  // the most
}

// The workspace, in this order: the greedy launch's tickets (at a fixed place for every shape,
// so that the zeroes each launch leaves stay where the next launch of any shape looks), chunk
// stats, candidate keys and indices, the mass path's arrays (MassWorkspace), then the greedy
// launch's spans.
struct WorkspaceLayout {
  size_t tickets, greedy_spans, stats, candidate_key, candidate_index, hist_count, hist_hi, hist_lo,
      chunk_scale, chunk_kept, plan, counters, boundary_key, boundary_index, sub_count, sub_weight,
      marked, first, total;

  WorkspaceLayout(int64_t batch, int64_t vocab) {
    const size_t rows = static_cast<size_t>(batch);
    const size_t slots = rows * ChunksPerRow(vocab);
    size_t at = 0;
    auto take = [&](size_t bytes) {
      const size_t here = at;
      at += AlignUp(bytes);
      return here;
    };
    tickets = take(kMaxBatch * sizeof(uint32_t));
    greedy_spans = take(rows * GreedySpansPerRow(vocab) * sizeof(GreedySpan));
    stats = take(slots * sizeof(ChunkStats));
    candidate_key = take(slots * kCandidateCap * sizeof(uint32_t));
    candidate_index = take(slots * kCandidateCap * sizeof(int32_t));
    hist_count = take(slots * kMassBins * sizeof(uint32_t));
    hist_hi = take(slots * kMassBins * sizeof(uint32_t));
    hist_lo = take(slots * kMassBins * sizeof(uint32_t));
    chunk_scale = take(slots * sizeof(double));
    chunk_kept = take(slots * sizeof(unsigned long long));
    plan = take(rows * sizeof(MassPlan));
    counters = take(2 * rows * sizeof(uint32_t));
    boundary_key = take(rows * kBoundaryCap * sizeof(uint32_t));
    boundary_index = take(rows * kBoundaryCap * sizeof(int32_t));
    sub_count = take(rows * kBoundarySubBins * sizeof(uint32_t));
    sub_weight = take(rows * kBoundarySubBins * sizeof(unsigned long long));
    marked = take(rows * BitmaskWords(vocab) * sizeof(uint32_t));  // RowProcessors::marked
    first = take(rows * BitmaskWords(vocab) * sizeof(uint32_t));   // RowProcessors::first
    total = at;
  }
};

#if defined(__CUDACC__)
// Whether dependent launches are safe and available here, asked once per device: the device
// has them (compute capability 9.0+) and the kernels that run on it were compiled for 9.0+
// (their PTX version, which is what __CUDA_ARCH__ was: an sm_80-only build runs on an H100 as
// JIT-compiled compute_80 code, without the waits of platform.h, and must launch plainly).
// SAMPLERD_DEPENDENT_LAUNCH=0 in the environment turns them off (plain launches), for A/B
// measurements and as an escape hatch.
bool DependentLaunches() {
  static const bool allowed = [] {
    const char* v = std::getenv("SAMPLERD_DEPENDENT_LAUNCH");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  if (!allowed) return false;
  constexpr int kDevices = 64;
  static std::atomic<int8_t> known[kDevices];  // 0: not asked yet, 1: yes, 2: no
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kDevices) return false;
  int8_t state = known[device].load(std::memory_order_relaxed);
  if (state == 0) {
    int major = 0;
    cudaFuncAttributes attributes{};
    const bool yes =
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
        major >= 9 &&
        cudaFuncGetAttributes(&attributes, RowFinishKernel<DType::kFp32>) == cudaSuccess &&
        attributes.ptxVersion >= 90;
    state = yes ? 1 : 2;
    known[device].store(state, std::memory_order_relaxed);
  }
  return state == 1;
}
#endif

// Launches `kernel` so that it may start while the kernel before it on the stream finishes
// (platform.h, GridWaitPrerequisites): its launch and its prologue, which at small batches
// are a good part of its time, overlap that kernel. A plain launch where that is not
// available (HIP, older GPUs).
template <class Params>
void LaunchDependent(void (*kernel)(Params), dim3 grid, int threads, hipStream_t stream,
                     const Params& params) {
#if defined(__CUDACC__)
  if (DependentLaunches()) {
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = dim3(static_cast<unsigned>(threads));
    config.stream = stream;
    config.attrs = attribute;
    config.numAttrs = 1;
    cudaLaunchKernelEx(&config, kernel, params);  // errors surface in hipGetLastError
    return;
  }
#endif
  kernel<<<grid, threads, 0, stream>>>(params);
}

template <DType kDType, int kVecs>
int LaunchGreedySpans(const SampleArgs& args, GreedyParams p, hipStream_t stream) {
  p.rows.chunks =
      static_cast<int>((args.vocab + kGreedySpan<kDType, kVecs> - 1) / kGreedySpan<kDType, kVecs>);
  const dim3 grid(static_cast<unsigned>(p.rows.chunks), static_cast<unsigned>(args.batch));
  if (p.rows.procs.marked != nullptr) {  // after MarkAdjustsKernel (v43)
    LaunchDependent(GreedyKernel<kDType, kVecs, true>, grid, kGreedyThreads, stream, p);
  } else if (p.rows.procs.active()) {
    GreedyKernel<kDType, kVecs, true><<<grid, kGreedyThreads, 0, stream>>>(p);
  } else {
    GreedyKernel<kDType, kVecs, false><<<grid, kGreedyThreads, 0, stream>>>(p);
  }
  return static_cast<int>(hipGetLastError());
}

// Whether a launch of `chunk_blocks` pass-1 blocks splits each chunk over kMassDrawSplit
// MassDrawKernel blocks (v34; the same tokens either way). SAMPLERD_MASS_DRAW_SPLIT=0 in the
// environment never splits, =1 always does: for A/B measurements in one binary, and for the tests
// that hold both forms to the same tokens. Read at each launch (a test may change it).
bool SplitMassDraw(int64_t chunk_blocks) {
  const char* v = std::getenv("SAMPLERD_MASS_DRAW_SPLIT");
  if (v != nullptr && std::strcmp(v, "0") == 0) return false;
  if (v != nullptr && std::strcmp(v, "1") == 0) return true;
  return chunk_blocks <= kMassDrawSplitMaxChunks;
}

// Pass 1, the finish and (for top-p rows on the mass path) pass 2, compiled for the launch's
// kind of logits processors.
template <DType kDType, ProcsKind kKind>
void LaunchPasses(dim3 grid, const ChunkPassParams& chunk, const RowFinishParams& finish,
                  const MassDrawParams& draw, hipStream_t stream) {
  if constexpr (kKind == ProcsKind::kAll) {  // after MarkAdjustsKernel (v43)
    LaunchDependent(ChunkPassKernel<kDType, kKind>, grid, kChunkThreads, stream, chunk);
  } else {
    ChunkPassKernel<kDType, kKind><<<grid, kChunkThreads, 0, stream>>>(chunk);
  }
  LaunchDependent(RowFinishKernel<kDType>, dim3(grid.y), kFinishThreads, stream, finish);
  if (!draw.mass.enabled) return;
  if (SplitMassDraw(static_cast<int64_t>(grid.x) * grid.y)) {
    const dim3 split(grid.x * kMassDrawSplit, grid.y);
    MassDrawKernel<kDType, kKind, kMassDrawSplit><<<split, kMassDrawThreads, 0, stream>>>(draw);
  } else {
    MassDrawKernel<kDType, kKind, 1><<<grid, kMassDrawThreads, 0, stream>>>(draw);
  }
}

template <DType kDType>
int Launch(const SampleArgs& args, const ChunkPassParams& chunk, const RowFinishParams& finish,
           const MassDrawParams& draw, const GreedyParams* greedy, hipStream_t stream) {
  const dim3 grid(static_cast<unsigned>(chunk.rows.chunks), static_cast<unsigned>(args.batch));
  if (chunk.rows.procs.marked != nullptr) {
    MarkAdjustsKernel<<<static_cast<unsigned>(args.batch), kMarkThreads, 0, stream>>>(
        chunk.rows.procs);
  }
  if (greedy != nullptr) {
    return ShortGreedySpans<kDType>(args.batch, args.vocab)
               ? LaunchGreedySpans<kDType, 1>(args, *greedy, stream)
               : LaunchGreedySpans<kDType, 4>(args, *greedy, stream);
  }
  switch (chunk.rows.procs.kind()) {
    case ProcsKind::kNone:
      LaunchPasses<kDType, ProcsKind::kNone>(grid, chunk, finish, draw, stream);
      break;
    case ProcsKind::kMask:
      LaunchPasses<kDType, ProcsKind::kMask>(grid, chunk, finish, draw, stream);
      break;
    case ProcsKind::kAll:
      LaunchPasses<kDType, ProcsKind::kAll>(grid, chunk, finish, draw, stream);
      break;
  }
  return static_cast<int>(hipGetLastError());
}

}  // namespace

size_t SampleWorkspaceBytes(int64_t batch, int64_t vocab, int32_t) {
  return WorkspaceLayout(batch, vocab).total;
}

bool HasTopPRows(const RowParams* params, int64_t count, int64_t vocab) {
  for (int64_t i = 0; i < count; ++i) {
    if (TopPAlone(params[i], vocab)) return true;
  }
  return false;
}

bool AllGreedy(const RowParams* params, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    if (!(params[i].temperature < kGreedyTemperature)) return false;
  }
  return count > 0;
}

int Sample(const SampleArgs& args, void* workspace, size_t workspace_bytes, Stream stream) {
  if (args.batch <= 0 || args.batch > kMaxBatch || args.vocab <= 0 ||
      ChunksPerRow(args.vocab) > kMaxStagedChunks || args.row_stride < args.vocab ||
      args.top_logprobs > kMaxGpuTopLogprobs ||
      (args.params_count != 1 && args.params_count != args.batch) ||
      workspace_bytes < SampleWorkspaceBytes(args.batch, args.vocab, args.top_logprobs) ||
      (args.allowed_bitmask != nullptr &&
       args.bitmask_words != static_cast<int64_t>(BitmaskWords(args.vocab))) ||
      ((args.adjusts == nullptr) != (args.adjust_offsets == nullptr))) {
    return static_cast<int>(hipErrorInvalidValue);
  }
  const int chunks = ChunksPerRow(args.vocab);
  const WorkspaceLayout layout(args.batch, args.vocab);
  char* ws = static_cast<char*>(workspace);
  auto* stats = reinterpret_cast<ChunkStats*>(ws + layout.stats);
  auto* candidate_key = reinterpret_cast<uint32_t*>(ws + layout.candidate_key);
  auto* candidate_index = reinterpret_cast<int32_t*>(ws + layout.candidate_index);
  auto* counters = reinterpret_cast<uint32_t*>(ws + layout.counters);
  MassWorkspace mass;
  // Logprobs, or no top-p rows: every row takes the one-block finish.
  mass.enabled = args.top_logprobs < 0 && args.top_p_rows;
  mass.hist_count = reinterpret_cast<uint32_t*>(ws + layout.hist_count);
  mass.hist_hi = reinterpret_cast<uint32_t*>(ws + layout.hist_hi);
  mass.hist_lo = reinterpret_cast<uint32_t*>(ws + layout.hist_lo);
  mass.chunk_scale = reinterpret_cast<double*>(ws + layout.chunk_scale);
  mass.chunk_kept = reinterpret_cast<unsigned long long*>(ws + layout.chunk_kept);
  mass.plan = reinterpret_cast<MassPlan*>(ws + layout.plan);
  mass.pass2_ticket = counters;
  mass.boundary_fill = counters + args.batch;
  mass.boundary_key = reinterpret_cast<uint32_t*>(ws + layout.boundary_key);
  mass.boundary_index = reinterpret_cast<int32_t*>(ws + layout.boundary_index);
  mass.sub_count = reinterpret_cast<uint32_t*>(ws + layout.sub_count);
  mass.sub_weight = reinterpret_cast<unsigned long long*>(ws + layout.sub_weight);

  RowProcessors procs{};
  procs.allowed = args.allowed_bitmask;
  procs.words = static_cast<int64_t>(BitmaskWords(args.vocab));
  if (args.adjusts != nullptr) {
    procs.marked = reinterpret_cast<uint32_t*>(ws + layout.marked);
    procs.first = reinterpret_cast<uint32_t*>(ws + layout.first);
    procs.adjusts = args.adjusts;
    procs.offsets = args.adjust_offsets;
  }
  const bool raw = args.top_logprobs >= 0 && args.logprob_source == LogprobSource::kRaw;
  const RowsIn rows{args.logits,       args.vocab, args.row_stride,   args.params,
                    args.params_count, chunks,     args.device_batch, procs};
  // With processors, pass 1's x statistics are of the processed logits: the finish computes the
  // raw ones it needs (RawRowSummary).
  const ChunkPassParams chunk{rows,          raw && !procs.active(), stats,
                              candidate_key, candidate_index,        mass};
  const RowFinishParams finish{rows,
                               stats,
                               candidate_key,
                               candidate_index,
                               args.top_logprobs,
                               args.logprob_source,
                               args.token_ids,
                               args.status,
                               args.sampled_logprob,
                               args.sampled_rank,
                               args.top_ids,
                               args.top_values,
                               mass};
  const MassDrawParams draw{rows, stats, args.token_ids, args.status, mass};
  // Every row greedy, no logprobs: one kernel (device sessions never say so: their rows'
  // parameters are on the device only).
  const GreedyParams greedy{rows, reinterpret_cast<GreedySpan*>(ws + layout.greedy_spans),
                            reinterpret_cast<uint32_t*>(ws + layout.tickets), args.token_ids,
                            args.status};
  const GreedyParams* one_launch =
      args.all_greedy && args.top_logprobs < 0 && args.device_batch == nullptr ? &greedy : nullptr;
  auto* s = static_cast<hipStream_t>(stream);
  switch (args.dtype) {
    case DType::kFp32:
      return Launch<DType::kFp32>(args, chunk, finish, draw, one_launch, s);
    case DType::kFp16:
      return Launch<DType::kFp16>(args, chunk, finish, draw, one_launch, s);
    case DType::kBf16:
      return Launch<DType::kBf16>(args, chunk, finish, draw, one_launch, s);
  }
  return static_cast<int>(hipErrorInvalidValue);
}

}  // namespace samplerd::kernels::gpu
