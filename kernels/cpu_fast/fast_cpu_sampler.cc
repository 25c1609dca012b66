// FastCpuSampler: the oracle's decisions (kernels/cpu/cpu_sampler.cc), reached without sorting
// the row.
//
// Every row goes through at most four parallel phases over (row, chunk) tasks of kChunk tokens:
//   1. stats     NaN / -inf / +inf flags and the row maximum (of x for greedy rows, of z = x / T
//                otherwise); greedy rows are finished here.
//   2. histogram (rows with top-k or top-p) counts of the min-p survivors, and for top-p the
//                masses exp(z - mx), in bins of d = mx - z (width 1/8, d >= 64 in one overflow
//                bin). Masses are quantised to integers (2^-62 units) so their sums do not
//                depend on the order chunks are added in.
//   3. gather    the tokens in the bins at or above the filter boundary (the k-th survivor's bin,
//                or the bin where the top-p mass crosses p), or for rows without top-k / top-p,
//                the Gumbel draw itself over every survivor.
//   4. finish    per filtered row: sort the gathered tokens (z descending, id ascending: the
//                oracle's order), apply top-k and top-p exactly as the oracle does, and draw.
// The Gumbel draw skips tokens that cannot win: G lies in [-2.82, 16.64], so a token with
// z + 16.7 below a score already reached (or below mx - 2.9, which the row's maximum token
// always reaches) never wins or ties. Skipping is exact, so the token is the oracle's.
#include "kernels/cpu_fast/fast_cpu_sampler.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <vector>

#include "kernels/common/philox.h"
#include "kernels/cpu/cpu_sampler.h"
#include "kernels/cpu/half_float.h"
#include "kernels/cpu_fast/worker_pool.h"

namespace samplerd::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int64_t kChunk = 8192;
constexpr int kBins = 512;  // bins of d = mx - z: [0, 1/8), [1/8, 2/8), ... [63 7/8, 64)
constexpr float kBinsPerUnit = 8.0f;
constexpr float kBinRange = 64.0f;
constexpr int kOverflowBin = kBins;  // d >= 64
constexpr int kHistSize = kBins + 1;
constexpr double kMassScale = 0x1p62;  // masses exp(z - mx) <= 1 as integers
constexpr float kGumbelAbove = 16.7f;  // > the largest Gumbel noise, 16.636
constexpr float kGumbelBelow = 2.9f;   // > minus the smallest Gumbel noise, 2.812

using Mass = unsigned __int128;

// Bin of z in a row whose maximum z is mx: monotone (a larger z never gets a larger bin), and
// equal z share a bin, so bins are contiguous ranges of the oracle's order.
inline int BinOf(float z, float mx) {
  const float d = mx - z;
  return d < kBinRange ? static_cast<int>(d * kBinsPerUnit) : kOverflowBin;
}

inline uint64_t QuantisedMass(float z, float mx) {
  return static_cast<uint64_t>(std::exp(static_cast<double>(z) - mx) * kMassScale);
}

// Reads tokens [begin, begin + n) of row `row` as fp32.
void LoadChunk(const SampleArgs& args, int64_t row, int64_t begin, int64_t n, float* x) {
  const int64_t first = row * args.row_stride + begin;
  const auto* bytes = static_cast<const unsigned char*>(args.logits);
  switch (args.dtype) {
    case DType::kFp32:
      std::memcpy(x, bytes + first * 4, static_cast<size_t>(n) * 4);
      return;
    case DType::kFp16:
      for (int64_t j = 0; j < n; ++j) {
        uint16_t bits;
        std::memcpy(&bits, bytes + (first + j) * 2, sizeof(bits));
        x[j] = HalfBitsToFloat(bits);
      }
      return;
    case DType::kBf16:
      for (int64_t j = 0; j < n; ++j) {
        uint16_t bits;
        std::memcpy(&bits, bytes + (first + j) * 2, sizeof(bits));
        x[j] = Bf16BitsToFloat(bits);
      }
      return;
  }
  std::fill(x, x + n, std::numeric_limits<float>::quiet_NaN());
}

// z = x / T in place (the oracle's fp32 division).
void Scale(float* x, int64_t n, float temperature) {
  for (int64_t j = 0; j < n; ++j) x[j] = x[j] / temperature;
}

// Phase 1 output of one (row, chunk).
struct ChunkStats {
  float max_value = -kInf;  // of x (greedy) or z
  int64_t arg = 0;          // greedy: first index of max_value
  bool nan_x = false;
  bool any_above_neg_inf = false;  // some x != -inf
  bool nan_z = false;
  bool pos_inf_z = false;
};

enum class Plan : uint8_t {
  kDone,        // outputs decided in phase 1
  kInfDraw,     // some z is +inf: uniform over the +inf entries
  kArgMaxX,     // every finite z overflowed to -inf: argmax of x
  kSimpleDraw,  // survivors are z >= min-p threshold: draw over all of them (phase 3)
  kFiltered,    // top-k and/or top-p: histogram, gather, finish
};

// A gathered token.
struct Candidate {
  float z;
  int32_t id;
  bool survivor;  // passed min-p (and so far every filter)
};

struct RowState {
  std::mutex mu;
  Plan plan = Plan::kDone;
  RowParams p;
  float mx = 0.0f;
  float min_threshold = -kInf;  // keep z >= this (and z != -inf)
  bool joint = false;
  bool need_k = false;
  bool need_p = false;
  bool hist_mass = false;  // phase 2 sums masses (the top-p total comes from the histogram)
  int bound = kOverflowBin;
  std::vector<int64_t> counts;
  std::vector<Mass> mass;
  std::vector<Candidate> candidates;
  float best_score = 0.0f;
  int64_t best_id = -1;
  int32_t token = -1;
  RowStatus status = RowStatus::kOk;

  bool Survives(float z) const { return z != -kInf && z >= min_threshold; }

  // Keeps (score, id) if it beats the best so far; lowest id on equal scores.
  void Offer(float score, int64_t id) {
    if (best_id < 0 || score > best_score || (score == best_score && id < best_id)) {
      best_score = score;
      best_id = id;
    }
  }
};

// Scratch of one thread.
struct ThreadScratch {
  std::vector<float> x = std::vector<float>(kChunk);
  std::vector<int64_t> counts = std::vector<int64_t>(kHistSize);
  std::vector<Mass> mass = std::vector<Mass>(kHistSize);
  std::vector<Candidate> candidates;
};

ThreadScratch& Scratch() {
  thread_local ThreadScratch scratch;
  return scratch;
}

}  // namespace

struct FastCpuSampler::Impl {
  explicit Impl(const Options& options)
      : pool(options.threads < 1 ? 1 : options.threads, options.spin_us), guard(options.guard) {}

  // Runs fn(0..n-1) over the pool, each call under the guard; false once any call faulted.
  bool Run(int64_t n, const std::function<void(int64_t)>& fn) {
    if (!guard) {
      pool.Run(n, fn);
      return true;
    }
    pool.Run(n, [&](int64_t i) {
      if (failed.load(std::memory_order_relaxed)) return;
      if (!guard([&] { fn(i); })) failed.store(true, std::memory_order_relaxed);
    });
    return !failed.load();
  }

  bool Sample(const SampleArgs& args);
  bool SampleWithLogprobs(const SampleArgs& args);
  void Stats(const SampleArgs& args, int64_t row, int64_t chunk);
  void Decide(const SampleArgs& args, int64_t row);
  void Histogram(const SampleArgs& args, int64_t row, int64_t chunk);
  void FindBound(int64_t row);
  void Gather(const SampleArgs& args, int64_t row, int64_t chunk);
  void Draw(const SampleArgs& args, int64_t row, int64_t chunk);
  void ArgMaxX(const SampleArgs& args, int64_t row);
  void Finish(int64_t row);

  WorkerPool pool;
  TaskGuard guard;
  std::atomic<bool> failed{false};
  int64_t chunks = 0;  // per row
  std::vector<ChunkStats> stats;
  std::vector<std::unique_ptr<RowState>> rows;
};

void FastCpuSampler::Impl::Stats(const SampleArgs& args, int64_t row, int64_t chunk) {
  const int64_t begin = chunk * kChunk;
  const int64_t n = std::min(kChunk, args.vocab - begin);
  float* x = Scratch().x.data();
  LoadChunk(args, row, begin, n, x);
  const RowParams& p = rows[row]->p;
  ChunkStats s;
  bool nan_x = false;
  bool above = false;
  for (int64_t j = 0; j < n; ++j) {
    nan_x |= x[j] != x[j];
    above |= x[j] != -kInf;
  }
  s.nan_x = nan_x;
  s.any_above_neg_inf = above;
  if (p.temperature < kGreedyTemperature) {
    float m = -kInf;
    for (int64_t j = 0; j < n; ++j) m = x[j] > m ? x[j] : m;
    int64_t arg = 0;
    while (arg < n && !(x[arg] == m)) ++arg;
    s.max_value = m;
    s.arg = begin + (arg < n ? arg : 0);
  } else {
    Scale(x, n, p.temperature);
    float m = -kInf;
    bool nan_z = false;
    bool pos_inf = false;
    for (int64_t j = 0; j < n; ++j) {
      nan_z |= x[j] != x[j];
      pos_inf |= x[j] == kInf;
      m = x[j] > m ? x[j] : m;
    }
    s.max_value = m;
    s.nan_z = nan_z;
    s.pos_inf_z = pos_inf;
  }
  stats[row * chunks + chunk] = s;
}

void FastCpuSampler::Impl::Decide(const SampleArgs& args, int64_t row) {
  RowState& r = *rows[row];
  const ChunkStats* s = &stats[row * chunks];
  bool nan_x = false, above = false, nan_z = false, pos_inf = false;
  int64_t best_chunk = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    nan_x |= s[c].nan_x;
    above |= s[c].any_above_neg_inf;
    nan_z |= s[c].nan_z;
    pos_inf |= s[c].pos_inf_z;
    if (s[c].max_value > s[best_chunk].max_value) best_chunk = c;
  }
  r.plan = Plan::kDone;
  r.token = -1;
  r.best_id = -1;
  if (nan_x) {
    r.status = RowStatus::kNan;
    return;
  }
  if (!above) {
    r.status = RowStatus::kNoFinite;
    return;
  }
  r.status = RowStatus::kOk;
  const RowParams& p = r.p;
  if (p.temperature < kGreedyTemperature) {
    r.token = static_cast<int32_t>(s[best_chunk].arg);
    return;
  }
  if (nan_z) {
    r.status = RowStatus::kNan;
    return;
  }
  if (pos_inf) {
    r.plan = Plan::kInfDraw;
    return;
  }
  r.mx = s[best_chunk].max_value;
  if (r.mx == -kInf) {
    r.plan = Plan::kArgMaxX;
    return;
  }
  r.min_threshold = p.min_p > 0.0f ? r.mx + logf(p.min_p) : -kInf;
  r.joint = p.top_p_mode == TopPMode::kJoint;
  r.need_k = p.top_k > 0 && p.top_k < args.vocab;
  r.need_p = p.top_p > 0.0f && p.top_p < 1.0f;
  r.candidates.clear();
  if (!r.need_k && !r.need_p) {
    r.plan = Plan::kSimpleDraw;
    return;
  }
  r.plan = Plan::kFiltered;
  r.hist_mass = r.need_p && (r.joint || !r.need_k);
  r.counts.assign(kHistSize, 0);
  r.mass.assign(r.hist_mass ? kHistSize : 0, 0);
}

void FastCpuSampler::Impl::Histogram(const SampleArgs& args, int64_t row, int64_t chunk) {
  RowState& r = *rows[row];
  const int64_t begin = chunk * kChunk;
  const int64_t n = std::min(kChunk, args.vocab - begin);
  ThreadScratch& t = Scratch();
  float* z = t.x.data();
  LoadChunk(args, row, begin, n, z);
  Scale(z, n, r.p.temperature);
  std::fill(t.counts.begin(), t.counts.end(), 0);
  const float mx = r.mx;
  for (int64_t j = 0; j < n; ++j) {
    if (r.Survives(z[j])) ++t.counts[BinOf(z[j], mx)];
  }
  if (r.hist_mass) {
    std::fill(t.mass.begin(), t.mass.end(), 0);
    for (int64_t j = 0; j < n; ++j) {
      if (z[j] == -kInf || !(r.joint || z[j] >= r.min_threshold)) continue;
      t.mass[BinOf(z[j], mx)] += QuantisedMass(z[j], mx);
    }
  }
  std::lock_guard<std::mutex> lock(r.mu);
  for (int b = 0; b < kHistSize; ++b) r.counts[b] += t.counts[b];
  if (r.hist_mass) {
    for (int b = 0; b < kHistSize; ++b) r.mass[b] += t.mass[b];
  }
}

void FastCpuSampler::Impl::FindBound(int64_t row) {
  RowState& r = *rows[row];
  if (r.plan != Plan::kFiltered) return;
  r.bound = kOverflowBin;
  if (r.need_k) {
    int64_t seen = 0;
    int b = 0;
    for (; b < kHistSize; ++b) {
      seen += r.counts[b];
      if (seen >= r.p.top_k) break;
    }
    if (b < kHistSize) {
      r.bound = b;  // the k-th survivor's bin: every kept token is at or above it
      return;
    }
    // Fewer survivors than k: top-k keeps them all.
    r.need_k = false;
    if (!r.need_p) {
      r.plan = Plan::kSimpleDraw;
      return;
    }
    // TOP_K_FIRST: the survivors (fewer than k) are gathered whole and give the total.
    if (!r.hist_mass) return;
  }
  // top-p alone: the first bin whose cumulative mass reaches p * total, plus one bin for the
  // rounding of the quantised sums; the exact walk then runs over the gathered tokens.
  Mass total = 0;
  for (int b = 0; b < kHistSize; ++b) total += r.mass[b];
  const double limit = static_cast<double>(r.p.top_p) * static_cast<double>(total);
  Mass cumulative = 0;
  for (int b = 0; b < kHistSize; ++b) {
    cumulative += r.mass[b];
    if (static_cast<double>(cumulative) >= limit) {
      r.bound = std::min(b + 1, kOverflowBin);
      return;
    }
  }
}

void FastCpuSampler::Impl::Gather(const SampleArgs& args, int64_t row, int64_t chunk) {
  RowState& r = *rows[row];
  const int64_t begin = chunk * kChunk;
  const int64_t n = std::min(kChunk, args.vocab - begin);
  ThreadScratch& t = Scratch();
  float* z = t.x.data();
  LoadChunk(args, row, begin, n, z);
  Scale(z, n, r.p.temperature);
  t.candidates.clear();
  const bool take_all_finite = r.need_p && r.joint;
  for (int64_t j = 0; j < n; ++j) {
    if (z[j] == -kInf || BinOf(z[j], r.mx) > r.bound) continue;
    const bool survivor = z[j] >= r.min_threshold;
    if (survivor || take_all_finite) {
      t.candidates.push_back({z[j], static_cast<int32_t>(begin + j), survivor});
    }
  }
  std::lock_guard<std::mutex> lock(r.mu);
  r.candidates.insert(r.candidates.end(), t.candidates.begin(), t.candidates.end());
}

void FastCpuSampler::Impl::Draw(const SampleArgs& args, int64_t row, int64_t chunk) {
  RowState& r = *rows[row];
  const int64_t begin = chunk * kChunk;
  const int64_t n = std::min(kChunk, args.vocab - begin);
  float* z = Scratch().x.data();
  LoadChunk(args, row, begin, n, z);
  Scale(z, n, r.p.temperature);
  const RowParams& p = r.p;
  int64_t best = -1;
  float best_score = 0.0f;
  if (r.plan == Plan::kInfDraw) {
    for (int64_t j = 0; j < n; ++j) {
      if (z[j] != kInf) continue;
      const float score = GumbelNoise(p.seed, p.position, static_cast<uint64_t>(begin + j));
      if (best < 0 || score > best_score) {
        best = begin + j;
        best_score = score;
      }
    }
  } else {
    // The row's maximum token always survives and scores at least mx - 2.82.
    float floor = r.mx - kGumbelBelow;
    for (int64_t j = 0; j < n; ++j) {
      if (!r.Survives(z[j]) || z[j] + kGumbelAbove < floor) continue;
      const float score = z[j] + GumbelNoise(p.seed, p.position, static_cast<uint64_t>(begin + j));
      if (best < 0 || score > best_score) {
        best = begin + j;
        best_score = score;
        floor = std::max(floor, score);
      }
    }
  }
  if (best < 0) return;
  std::lock_guard<std::mutex> lock(r.mu);
  r.Offer(best_score, best);
}

void FastCpuSampler::Impl::ArgMaxX(const SampleArgs& args, int64_t row) {
  RowState& r = *rows[row];
  float* x = Scratch().x.data();
  float best_value = 0.0f;
  int64_t best = -1;
  for (int64_t begin = 0; begin < args.vocab; begin += kChunk) {
    const int64_t n = std::min(kChunk, args.vocab - begin);
    LoadChunk(args, row, begin, n, x);
    for (int64_t j = 0; j < n; ++j) {
      if (best < 0 || x[j] > best_value) {
        best = begin + j;
        best_value = x[j];
      }
    }
  }
  r.token = static_cast<int32_t>(best);
}

void FastCpuSampler::Impl::Finish(int64_t row) {
  RowState& r = *rows[row];
  std::vector<Candidate>& c = r.candidates;
  std::sort(c.begin(), c.end(), [](const Candidate& a, const Candidate& b) {
    return a.z > b.z || (a.z == b.z && a.id < b.id);
  });
  const int64_t n = static_cast<int64_t>(c.size());
  if (r.need_k) {
    int64_t seen = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (c[i].survivor && ++seen == r.p.top_k) {
        const float kth = c[i].z;
        for (int64_t t = i + 1; t < n; ++t) {
          if (c[t].survivor && !(c[t].z >= kth)) c[t].survivor = false;
        }
        break;
      }
    }
  }
  if (r.need_p) {
    auto mass = [&](const Candidate& t) { return std::exp(static_cast<double>(t.z) - r.mx); };
    double total = 0.0;
    if (r.hist_mass) {
      Mass sum = 0;
      for (int b = 0; b < kHistSize; ++b) sum += r.mass[b];
      total = static_cast<double>(sum) / kMassScale;
    } else {
      for (int64_t i = 0; i < n; ++i) {
        if (r.joint || c[i].survivor) total += mass(c[i]);
      }
    }
    const double limit = static_cast<double>(r.p.top_p) * total;
    double prefix = 0.0;
    double mass_above = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      if (i == 0 || c[i].z != c[i - 1].z) mass_above = prefix;
      const bool survivor = c[i].survivor;
      if (r.joint || survivor) prefix += mass(c[i]);
      if (survivor && !(mass_above < limit)) c[i].survivor = false;
    }
  }
  const RowParams& p = r.p;
  for (int64_t i = 0; i < n; ++i) {
    if (!c[i].survivor) continue;
    // Sorted by z descending: once z + max noise is below the best score, nothing later wins.
    if (r.best_id >= 0 && c[i].z + kGumbelAbove < r.best_score) break;
    r.Offer(c[i].z + GumbelNoise(p.seed, p.position, static_cast<uint64_t>(c[i].id)), c[i].id);
  }
}

bool FastCpuSampler::Impl::SampleWithLogprobs(const SampleArgs& args) {
  return Run(args.batch, [&](int64_t row) { CpuSampleRows(args, row, row + 1); });
}

bool FastCpuSampler::Impl::Sample(const SampleArgs& args) {
  failed.store(false);
  if (args.batch <= 0) return true;
  if (args.top_logprobs >= 0) return SampleWithLogprobs(args);
  const int64_t batch = args.batch;
  chunks = (args.vocab + kChunk - 1) / kChunk;
  stats.resize(batch * chunks);
  while (static_cast<int64_t>(rows.size()) < batch) rows.push_back(std::make_unique<RowState>());
  for (int64_t row = 0; row < batch; ++row) {
    rows[row]->p = args.params[args.params_count == 1 ? 0 : row];
  }
  const int64_t tasks = batch * chunks;

  // 1. Stats; greedy rows end here.
  if (!Run(tasks, [&](int64_t i) { Stats(args, i / chunks, i % chunks); })) return false;
  std::vector<int64_t> filtered, drawn;
  for (int64_t row = 0; row < batch; ++row) {
    Decide(args, row);
    if (rows[row]->plan == Plan::kFiltered) filtered.push_back(row);
  }

  // 2. Histograms of the rows with top-k / top-p, and where their boundary bins are.
  const int64_t filtered_chunks = static_cast<int64_t>(filtered.size()) * chunks;
  if (!Run(filtered_chunks,
           [&](int64_t i) { Histogram(args, filtered[i / chunks], i % chunks); })) {
    return false;
  }
  for (int64_t row : filtered) FindBound(row);
  filtered.clear();
  for (int64_t row = 0; row < batch; ++row) {
    const Plan plan = rows[row]->plan;
    if (plan == Plan::kFiltered) filtered.push_back(row);
    if (plan == Plan::kSimpleDraw || plan == Plan::kInfDraw) drawn.push_back(row);
  }

  // 3. Gather (filtered rows), draw (rows without top-k / top-p), argmax of x (overflowed rows).
  std::vector<int64_t> argmax_rows;
  for (int64_t row = 0; row < batch; ++row) {
    if (rows[row]->plan == Plan::kArgMaxX) argmax_rows.push_back(row);
  }
  const int64_t n_gather = static_cast<int64_t>(filtered.size()) * chunks;
  const int64_t n_draw = static_cast<int64_t>(drawn.size()) * chunks;
  const int64_t n_argmax = static_cast<int64_t>(argmax_rows.size());
  if (!Run(n_gather + n_draw + n_argmax, [&](int64_t i) {
        if (i < n_gather) return Gather(args, filtered[i / chunks], i % chunks);
        i -= n_gather;
        if (i < n_draw) return Draw(args, drawn[i / chunks], i % chunks);
        ArgMaxX(args, argmax_rows[i - n_draw]);
      })) {
    return false;
  }

  // 4. Filtered rows: exact filters over the gathered tokens, and the draw.
  if (!Run(static_cast<int64_t>(filtered.size()), [&](int64_t i) { Finish(filtered[i]); })) {
    return false;
  }

  // Outputs (under the guard too: they may live in shared memory).
  return Run(1, [&](int64_t) {
    for (int64_t row = 0; row < batch; ++row) {
      RowState& r = *rows[row];
      if (r.plan == Plan::kSimpleDraw || r.plan == Plan::kInfDraw || r.plan == Plan::kFiltered) {
        r.token = static_cast<int32_t>(r.best_id);
      }
      args.token_ids[row] = r.status == RowStatus::kOk ? r.token : -1;
      args.status[row] = r.status;
    }
  });
}

FastCpuSampler::FastCpuSampler(const Options& options) : impl_(std::make_unique<Impl>(options)) {}

FastCpuSampler::~FastCpuSampler() = default;

int FastCpuSampler::threads() const { return impl_->pool.threads(); }

bool FastCpuSampler::Sample(const SampleArgs& args) { return impl_->Sample(args); }

}  // namespace samplerd::kernels
