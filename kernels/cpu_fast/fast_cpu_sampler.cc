// FastCpuSampler: the oracle's decisions (kernels/cpu/cpu_sampler.cc), reached without sorting
// the row, at a cost bounded for any distribution.
//
// Every filter keeps the tokens with z at or above a threshold (min-p: mx + log m; top-k: the
// k-th largest survivor; top-p: the last value whose strictly-higher mass is < p * total), so a
// filtered row is: find the thresholds, then draw over z >= all of them. Work runs in parallel
// passes over (row, chunk) tasks of kChunk tokens (whole rows per task when B >= threads):
//   1. stats   NaN / -inf / +inf flags, max and min finite z (x for greedy rows, which end here).
//   2. select  (rows with top-k or top-p) radix selection over order-preserving integer keys of
//              z: each pass histograms counts (top-k) or masses (top-p) of the stage's tokens in
//              <= 1024 bins of a key range, and the next pass refines only the bin holding the
//              boundary. Once the tokens at or above the boundary bin number <=
//              Options::gather_cap, they are gathered and the stage (and the draw) finishes on
//              them, sorted into the oracle's order. Masses are exp(z - mx) quantised to 2^-62
//              units and summed as integers, so no sum depends on how tokens were split over tasks.
//   3. draw    Gumbel-max over the survivors z >= threshold. A token skips the noise when
//              z + 16.7 cannot reach the best score so far (or mx - 2.9, which the row's maximum
//              always reaches); otherwise its Philox bits are drawn (one block per 4 tokens) and
//              the logs are taken only if z + (an upper bound of G for those bits' top 10 bits)
//              can still reach it. Every skip is exact, so the token is the oracle's.
#include "kernels/cpu_fast/fast_cpu_sampler.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
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
constexpr int kBinBits = 10;
constexpr int kMaxBins = 1 << kBinBits;
constexpr double kMassScale = 0x1p62;  // masses exp(z - mx) <= 1 as integers
constexpr float kGumbelAbove = 16.7f;  // > the largest Gumbel noise, 16.636
constexpr float kGumbelBelow = 2.9f;   // > minus the smallest Gumbel noise, 2.812
constexpr int kNoiseBucketShift = 22;  // G bound per top 10 bits of the 32 Philox bits

using Mass = unsigned __int128;

// Order-reversing integer key of z: a larger z has a smaller key, equal z (-0 and +0 included)
// the same key, -inf the largest key of all non-NaN values.
inline uint32_t KeyOf(float z) {
  uint32_t u;
  const float canonical = z + 0.0f;  // -0 -> +0
  std::memcpy(&u, &canonical, 4);
  return (u >> 31) != 0 ? u : u ^ 0x7FFFFFFFu;
}

inline float ValueOf(uint32_t key) {
  const uint32_t u = key >= 0x80000000u ? key : key ^ 0x7FFFFFFFu;
  float z;
  std::memcpy(&z, &u, 4);
  return z;
}

// 2^(i / 64), i in [0, 64), for ExpNonPositive.
struct ExpTable {
  double value[64];
  ExpTable() {
    for (int i = 0; i < 64; ++i) value[i] = std::exp2(i / 64.0);
  }
};

const ExpTable& Exp2Table() {
  static const ExpTable table;
  return table;
}

// exp(x) for x in [-44, 0] within ~2 ulp, branch-free: x = (k + i / 64) ln 2 + r with
// |r| <= ln 2 / 128, exp(r) by its Taylor series to r^6 (error < 1e-17), 2^(i/64) from a table
// and 2^k added to the exponent bits.
inline double ExpNonPositive(double x) {
  constexpr double kInvLn2N = 64.0 / 0.69314718055994530942;
  constexpr double kLn2HiN = 0x1.62e42fefa0000p-7;   // ln 2 / 64, high part
  constexpr double kLn2LoN = 0x1.cf79abc9e3b3ap-46;  // ln 2 / 64 - kLn2HiN
  constexpr double kShift = 0x1.8p52;
  const double kd_shifted = x * kInvLn2N + kShift;
  uint64_t ki;
  std::memcpy(&ki, &kd_shifted, 8);
  const double kd = kd_shifted - kShift;
  const double r = (x - kd * kLn2HiN) - kd * kLn2LoN;
  const int64_t k = static_cast<int64_t>(ki << 12) >> 12;  // the integer in the low 52 bits
  uint64_t scale_bits;
  std::memcpy(&scale_bits, &Exp2Table().value[k & 63], 8);
  scale_bits += static_cast<uint64_t>(k >> 6) << 52;
  double scale;
  std::memcpy(&scale, &scale_bits, 8);
  const double r2 = r * r;
  const double poly =
      1.0 + r + r2 * (0.5 + r * (1.0 / 6 + r * (1.0 / 24 + r * (1.0 / 120 + r * (1.0 / 720)))));
  return scale * poly;
}

// exp(z - mx) as an integer in 2^-62 units (0 below 2^-62, where the exp is not needed).
inline uint64_t QuantisedMass(float z, float mx) {
  const double x = static_cast<double>(z) - mx;
  if (!(x >= -44.0)) return 0;
  return static_cast<uint64_t>(static_cast<int64_t>(ExpNonPositive(x) * kMassScale));
}

// Upper bounds of the Gumbel noise -logf(-logf(U)) over the Philox bits sharing their top 10
// bits (U grows with the bits): G at the bucket's largest U, computed in double, plus a margin
// far above logf's error.
struct NoiseBounds {
  float bound[1 << (32 - kNoiseBucketShift)];
  NoiseBounds() {
    constexpr uint32_t kBuckets = 1u << (32 - kNoiseBucketShift);
    for (uint32_t q = 0; q < kBuckets; ++q) {
      const uint32_t top_bits = (q << kNoiseBucketShift) | ((1u << kNoiseBucketShift) - 1);
      const double u = static_cast<double>(UniformFromBits(top_bits));
      bound[q] = static_cast<float>(-std::log(-std::log(u)) + 1e-3);
    }
  }
};

const NoiseBounds& Bounds() {
  static const NoiseBounds bounds;
  return bounds;
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
  float min_finite = kInf;  // smallest z > -inf
  int64_t arg = 0;          // greedy: first index of max_value
  bool nan_x = false;
  bool any_above_neg_inf = false;  // some x != -inf
  bool nan_z = false;
  bool pos_inf_z = false;
};

enum class Plan : uint8_t {
  kDone,     // outputs decided
  kInfDraw,  // some z is +inf: uniform over the +inf entries
  kArgMaxX,  // every finite z overflowed to -inf: argmax of x
  kSelect,   // finding the top-k / top-p thresholds
  kDraw,     // Gumbel draw over keys <= draw_key (phase 3)
};

enum class Stage : uint8_t { kTopK, kTopP };
enum class Pass : uint8_t { kHistogram, kGather };

// A gathered token.
struct Candidate {
  float z;
  int32_t id;
};

struct RowState {
  std::mutex mu;
  Plan plan = Plan::kDone;
  RowParams p;
  float mx = 0.0f;
  float min_finite = 0.0f;
  float min_threshold = -kInf;  // min-p: keep z >= this
  float k_threshold = -kInf;
  bool joint = false;
  bool need_k = false;
  bool need_p = false;
  // Selection state of the current stage: its tokens are the keys in [KeyOf(mx), stage_hi].
  Stage stage = Stage::kTopK;
  Pass pass = Pass::kHistogram;
  uint32_t lo = 0, hi = 0;  // histogram key range
  int shift = 0;
  int bins = 0;
  int64_t count_above = 0;  // stage tokens with key < lo
  Mass mass_above = 0;
  Mass total = 0;            // top-p: mass of all the stage's tokens
  uint32_t gather_hi = 0;    // gather pass: keys <= this
  int64_t stage_count = -1;  // tokens of the stage when known, else -1
  std::vector<int64_t> counts = std::vector<int64_t>(kMaxBins);
  std::vector<Mass> mass = std::vector<Mass>(kMaxBins);
  std::vector<Candidate> candidates;
  uint32_t draw_key = 0;  // survivors: keys <= this
  float best_score = 0.0f;
  int64_t best_id = -1;
  int32_t token = -1;
  RowStatus status = RowStatus::kOk;

  bool Masses() const { return stage == Stage::kTopP; }

  // Keeps (score, id) if it beats the best so far; lowest id on equal scores.
  void Offer(float score, int64_t id) {
    if (best_id < 0 || score > best_score || (score == best_score && id < best_id)) {
      best_score = score;
      best_id = id;
    }
  }

  // Starts a histogram pass over keys [lo, hi].
  void SetRange(uint32_t range_lo, uint32_t range_hi) {
    lo = range_lo;
    hi = range_hi;
    const uint32_t span = hi - lo;
    const int width = span == 0 ? 0 : 32 - __builtin_clz(span);
    shift = std::max(0, width - kBinBits);
    bins = static_cast<int>(span >> shift) + 1;
    pass = Pass::kHistogram;
    std::fill(counts.begin(), counts.begin() + bins, 0);
    std::fill(mass.begin(), mass.begin() + bins, 0);
  }
};

// Scratch of one thread.
struct ThreadScratch {
  std::vector<float> x = std::vector<float>(kChunk);
  std::vector<int64_t> counts = std::vector<int64_t>(kMaxBins);
  std::vector<Mass> mass = std::vector<Mass>(kMaxBins);
  std::vector<Candidate> candidates;
};

ThreadScratch& Scratch() {
  thread_local ThreadScratch scratch;
  return scratch;
}

}  // namespace

struct FastCpuSampler::Impl {
  explicit Impl(const Options& options)
      : pool(options.threads < 1 ? 1 : options.threads, options.spin_us),
        guard(options.guard),
        gather_cap(options.gather_cap) {
    Bounds();
    Exp2Table();
  }

  // Runs fn(0..n-1) over the pool, each call under the guard; false once any call faulted.
  bool Run(int64_t n, const std::function<void(int64_t)>& fn) {
    if (n <= 0) return !failed.load();
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

  // Runs fn(row, chunk_begin, chunk_end) over tasks covering every chunk of `rows`: one task per
  // chunk when there are fewer rows than threads, else one per row.
  bool RunChunks(const std::vector<int64_t>& rows,
                 const std::function<void(int64_t, int64_t, int64_t)>& fn) {
    const int64_t n = static_cast<int64_t>(rows.size());
    if (n >= pool.threads() || chunks == 1) {
      return Run(n, [&](int64_t i) { fn(rows[i], 0, chunks); });
    }
    return Run(n * chunks, [&](int64_t i) {
      const int64_t c = i % chunks;
      fn(rows[i / chunks], c, c + 1);
    });
  }

  bool Sample(const SampleArgs& args);
  bool SampleWithLogprobs(const SampleArgs& args);
  void Stats(const SampleArgs& args, int64_t row, int64_t chunk);
  void Decide(const SampleArgs& args, int64_t row);
  void StartStage(int64_t row);
  void Histogram(const SampleArgs& args, int64_t row, int64_t c0, int64_t c1);
  void Gather(const SampleArgs& args, int64_t row, int64_t c0, int64_t c1);
  void Advance(int64_t row);
  void FinishGathered(int64_t row);
  void Draw(const SampleArgs& args, int64_t row, int64_t c0, int64_t c1);
  void ArgMaxX(const SampleArgs& args, int64_t row);

  WorkerPool pool;
  TaskGuard guard;
  const int64_t gather_cap;
  std::atomic<bool> failed{false};
  int64_t chunks = 0;  // per row
  std::vector<ChunkStats> stats;
  std::vector<std::unique_ptr<RowState>> rows;
  std::vector<int64_t> selecting, drawn, argmax_rows;  // reused across calls
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
    float lowest = kInf;
    bool nan_z = false;
    bool pos_inf = false;
    for (int64_t j = 0; j < n; ++j) {
      nan_z |= x[j] != x[j];
      pos_inf |= x[j] == kInf;
      m = x[j] > m ? x[j] : m;
      lowest = x[j] != -kInf && x[j] < lowest ? x[j] : lowest;
    }
    s.max_value = m;
    s.min_finite = lowest;
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
  float lowest = kInf;
  for (int64_t c = 0; c < chunks; ++c) {
    nan_x |= s[c].nan_x;
    above |= s[c].any_above_neg_inf;
    nan_z |= s[c].nan_z;
    pos_inf |= s[c].pos_inf_z;
    lowest = std::min(lowest, s[c].min_finite);
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
  r.min_finite = lowest;
  r.min_threshold = p.min_p > 0.0f ? r.mx + logf(p.min_p) : -kInf;
  r.k_threshold = -kInf;
  r.joint = p.top_p_mode == TopPMode::kJoint;
  r.need_k = p.top_k > 0 && p.top_k < args.vocab;
  r.need_p = p.top_p > 0.0f && p.top_p < 1.0f;
  r.candidates.clear();
  r.stage_count = -1;
  if (!r.need_k && !r.need_p) {
    r.plan = Plan::kDraw;
    r.draw_key = KeyOf(std::max(r.min_threshold, r.min_finite));
    return;
  }
  r.plan = Plan::kSelect;
  r.stage = r.need_k ? Stage::kTopK : Stage::kTopP;
  StartStage(row);
}

// First pass of the current stage: its tokens are the finite z >= the stage's floor (top-k: the
// min-p survivors; top-p: the survivors of min-p and top-k, or in JOINT mode every finite z).
void FastCpuSampler::Impl::StartStage(int64_t row) {
  RowState& r = *rows[row];
  float floor = r.min_finite;
  if (r.stage == Stage::kTopK || !r.joint) floor = std::max(floor, r.min_threshold);
  if (r.stage == Stage::kTopP && !r.joint) floor = std::max(floor, r.k_threshold);
  const uint32_t top = KeyOf(r.mx);
  const uint32_t bottom = KeyOf(floor);
  r.count_above = 0;
  r.mass_above = 0;
  r.total = 0;
  if (r.stage == Stage::kTopP && r.stage_count >= 0 && r.stage_count <= gather_cap) {
    r.pass = Pass::kGather;  // few tokens: gather them all, the total comes from them
    r.gather_hi = bottom;
    return;
  }
  r.stage_count = -1;
  r.SetRange(top, bottom);
}

void FastCpuSampler::Impl::Histogram(const SampleArgs& args, int64_t row, int64_t c0, int64_t c1) {
  RowState& r = *rows[row];
  ThreadScratch& t = Scratch();
  float* z = t.x.data();
  const uint32_t lo = r.lo;
  const uint32_t span = r.hi - r.lo;
  const int shift = r.shift;
  const float mx = r.mx;
  const bool masses = r.Masses();
  std::fill(t.counts.begin(), t.counts.begin() + r.bins, 0);
  if (masses) std::fill(t.mass.begin(), t.mass.begin() + r.bins, 0);
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t begin = c * kChunk;
    const int64_t n = std::min(kChunk, args.vocab - begin);
    LoadChunk(args, row, begin, n, z);
    Scale(z, n, r.p.temperature);
    for (int64_t j = 0; j < n; ++j) {
      const uint32_t offset = KeyOf(z[j]) - lo;
      if (offset > span) continue;
      const uint32_t bin = offset >> shift;
      ++t.counts[bin];
      if (masses) t.mass[bin] += QuantisedMass(z[j], mx);
    }
  }
  std::lock_guard<std::mutex> lock(r.mu);
  for (int b = 0; b < r.bins; ++b) r.counts[b] += t.counts[b];
  if (masses) {
    for (int b = 0; b < r.bins; ++b) r.mass[b] += t.mass[b];
  }
}

void FastCpuSampler::Impl::Gather(const SampleArgs& args, int64_t row, int64_t c0, int64_t c1) {
  RowState& r = *rows[row];
  ThreadScratch& t = Scratch();
  float* z = t.x.data();
  const uint32_t top = KeyOf(r.mx);
  const uint32_t span = r.gather_hi - top;
  t.candidates.clear();
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t begin = c * kChunk;
    const int64_t n = std::min(kChunk, args.vocab - begin);
    LoadChunk(args, row, begin, n, z);
    Scale(z, n, r.p.temperature);
    for (int64_t j = 0; j < n; ++j) {
      if (KeyOf(z[j]) - top <= span) {
        t.candidates.push_back({z[j], static_cast<int32_t>(begin + j)});
      }
    }
  }
  std::lock_guard<std::mutex> lock(r.mu);
  r.candidates.insert(r.candidates.end(), t.candidates.begin(), t.candidates.end());
}

// After a histogram pass: picks the bin holding the stage's boundary, then refines it, gathers
// the tokens at or above it, or (a single key) takes its value as the threshold.
// After a gather pass: finishes the row on the gathered tokens.
void FastCpuSampler::Impl::Advance(int64_t row) {
  RowState& r = *rows[row];
  if (r.pass == Pass::kGather) return FinishGathered(row);
  const bool top_p = r.stage == Stage::kTopP;
  if (top_p && r.total == 0) {  // the first pass of a top-p stage: its total
    for (int b = 0; b < r.bins; ++b) r.total += r.mass[b];
  }
  const double limit = static_cast<double>(r.p.top_p) * static_cast<double>(r.total);
  int64_t count = r.count_above;
  Mass cumulative = r.mass_above;
  uint32_t p_key = UINT32_MAX;  // top-p keeps keys <= this
  int b = 0;
  for (; b < r.bins; ++b) {
    const int64_t before_count = count;
    const Mass before_mass = cumulative;
    count += r.counts[b];
    cumulative += r.mass[b];
    const bool reached = top_p ? static_cast<double>(cumulative) >= limit : count >= r.p.top_k;
    if (!reached) continue;
    const uint32_t bin_lo = r.lo + (static_cast<uint32_t>(b) << r.shift);
    const uint32_t bin_hi = std::min(r.hi, bin_lo + ((1u << r.shift) - 1));
    if (count <= gather_cap) {
      r.pass = Pass::kGather;
      r.gather_hi = bin_hi;
      r.candidates.clear();
      return;
    }
    if (bin_lo != bin_hi) {
      r.count_above = before_count;
      r.mass_above = before_mass;
      r.SetRange(bin_lo, bin_hi);
      return;
    }
    // One value: the boundary itself.
    if (top_p) {
      p_key = bin_lo;
    } else {
      r.k_threshold = ValueOf(bin_lo);
      r.stage_count = count;  // the tokens with z >= the k-th value
    }
    break;
  }
  if (b == r.bins && !top_p) {
    // Fewer survivors than k: top-k keeps them all. (A top-p stage that never reaches its
    // limit, which only rounding could cause, keeps all its tokens.)
    r.need_k = false;
    r.stage_count = count;
  }
  if (!top_p && r.need_p) {
    r.stage = Stage::kTopP;
    return StartStage(row);
  }
  r.plan = Plan::kDraw;
  r.draw_key = std::min({p_key, KeyOf(std::max(r.min_threshold, r.min_finite)),
                         KeyOf(std::max(r.k_threshold, r.min_finite))});
}

// The gathered tokens are every token of the stage with key <= gather_hi, which holds the
// stage's boundary: apply the stage exactly as the oracle does, then either start top-p (JOINT
// needs the whole row) or draw over the survivors, which are all gathered.
void FastCpuSampler::Impl::FinishGathered(int64_t row) {
  RowState& r = *rows[row];
  std::vector<Candidate>& c = r.candidates;
  std::sort(c.begin(), c.end(), [](const Candidate& a, const Candidate& b) {
    return a.z > b.z || (a.z == b.z && a.id < b.id);
  });
  const int64_t n = static_cast<int64_t>(c.size());
  int64_t kept = n;  // survivors: c[0, kept)
  if (r.stage == Stage::kTopK) {
    // Fewer gathered than k happens only when the stage holds fewer tokens: then no cut.
    if (r.p.top_k <= n) {
      r.k_threshold = c[r.p.top_k - 1].z;
      while (kept > 0 && c[kept - 1].z < r.k_threshold) --kept;
    }
    if (r.need_p && r.joint) {
      r.stage = Stage::kTopP;
      r.stage_count = -1;
      return StartStage(row);
    }
  }
  if (r.need_p) {
    // Top-p over c[0, kept). From a histogram stage the total (and every mass) is quantised;
    // otherwise these are all the stage's tokens and the sums are the oracle's own.
    const bool quantised = r.total != 0;
    auto mass = [&](const Candidate& t) { return std::exp(static_cast<double>(t.z) - r.mx); };
    double total = 0.0;
    if (quantised) {
      total = static_cast<double>(r.total);
    } else {
      for (int64_t i = 0; i < kept; ++i) total += mass(c[i]);
    }
    const double limit = static_cast<double>(r.p.top_p) * total;
    double prefix = 0.0;
    Mass prefix_q = 0;
    int64_t i = 0;
    for (; i < kept; ++i) {
      if (i > 0 && c[i].z != c[i - 1].z) {
        const double above = quantised ? static_cast<double>(prefix_q) : prefix;
        if (!(above < limit)) break;
      }
      if (quantised) {
        prefix_q += QuantisedMass(c[i].z, r.mx);
      } else {
        prefix += mass(c[i]);
      }
    }
    kept = i;
  }
  const RowParams& p = r.p;
  for (int64_t i = 0; i < kept; ++i) {
    if (c[i].z < r.min_threshold || c[i].z < r.k_threshold) break;  // JOINT: not a survivor
    // Sorted by z descending: once z + max noise is below the best score, nothing later wins.
    if (r.best_id >= 0 && c[i].z + kGumbelAbove < r.best_score) break;
    r.Offer(c[i].z + GumbelNoise(p.seed, p.position, static_cast<uint64_t>(c[i].id)), c[i].id);
  }
  r.plan = Plan::kDone;
  r.token = static_cast<int32_t>(r.best_id);
}

void FastCpuSampler::Impl::Draw(const SampleArgs& args, int64_t row, int64_t c0, int64_t c1) {
  RowState& r = *rows[row];
  float* z = Scratch().x.data();
  const RowParams& p = r.p;
  const PhiloxKey key = PhiloxKeyFromSeed(p.seed);
  const float* bound = Bounds().bound;
  int64_t best = -1;
  float best_score = 0.0f;
  // The row's maximum token always survives and scores at least mx - 2.82.
  float floor = r.mx - kGumbelBelow;
  const uint32_t top = KeyOf(r.mx);
  const uint32_t span = r.draw_key - top;
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t begin = c * kChunk;
    const int64_t n = std::min(kChunk, args.vocab - begin);
    LoadChunk(args, row, begin, n, z);
    Scale(z, n, p.temperature);
    if (r.plan == Plan::kInfDraw) {
      for (int64_t j = 0; j < n; ++j) {
        if (z[j] != kInf) continue;
        const float score = GumbelNoise(p.seed, p.position, static_cast<uint64_t>(begin + j));
        if (best < 0 || score > best_score) {
          best = begin + j;
          best_score = score;
        }
      }
      continue;
    }
    // Blocks of 4 tokens share one Philox call (begin is a multiple of 4).
    for (int64_t j0 = 0; j0 < n; j0 += 4) {
      const int64_t m = std::min<int64_t>(4, n - j0);
      bool any = false;
      for (int64_t i = 0; i < m; ++i) {
        const float v = z[j0 + i];
        any |= KeyOf(v) - top <= span && !(v + kGumbelAbove < floor);
      }
      if (!any) continue;
      const PhiloxCounter bits =
          Philox4x32x10(PhiloxCounterFor(p.position, static_cast<uint64_t>(begin + j0)), key);
      for (int64_t i = 0; i < m; ++i) {
        const float v = z[j0 + i];
        if (KeyOf(v) - top > span) continue;
        const uint32_t w = bits.word[i];
        if (v + bound[w >> kNoiseBucketShift] < floor) continue;
        const float score = v + GumbelFromUniform(UniformFromBits(w));
        if (best < 0 || score > best_score) {
          best = begin + j0 + i;
          best_score = score;
          floor = std::max(floor, score);
        }
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

bool FastCpuSampler::Impl::SampleWithLogprobs(const SampleArgs& args) {
  return Run(args.batch, [&](int64_t row) { CpuSampleRows(args, row, row + 1); });
}

bool FastCpuSampler::Impl::Sample(const SampleArgs& args) {
  failed.store(false);
  if (args.batch <= 0) return true;
  if (args.top_logprobs >= 0) return SampleWithLogprobs(args);
  const int64_t batch = args.batch;
  chunks = (args.vocab + kChunk - 1) / kChunk;
  if (static_cast<int64_t>(stats.size()) < batch * chunks) stats.resize(batch * chunks);
  while (static_cast<int64_t>(rows.size()) < batch) rows.push_back(std::make_unique<RowState>());
  for (int64_t row = 0; row < batch; ++row) {
    rows[row]->p = args.params[args.params_count == 1 ? 0 : row];
  }

  // 1. Stats; greedy rows end here.
  if (!Run(batch * chunks, [&](int64_t i) { Stats(args, i / chunks, i % chunks); })) {
    return false;
  }
  selecting.clear();
  for (int64_t row = 0; row < batch; ++row) {
    Decide(args, row);
    if (rows[row]->plan == Plan::kSelect) selecting.push_back(row);
  }

  // 2. Select: histogram and gather passes until every filtered row has its thresholds (at
  // most 4 histogram passes per stage: 32 key bits, 10 per pass).
  while (!selecting.empty()) {
    if (!RunChunks(selecting, [&](int64_t row, int64_t c0, int64_t c1) {
          if (rows[row]->pass == Pass::kGather) return Gather(args, row, c0, c1);
          Histogram(args, row, c0, c1);
        })) {
      return false;
    }
    if (!Run(static_cast<int64_t>(selecting.size()), [&](int64_t i) { Advance(selecting[i]); })) {
      return false;
    }
    size_t kept = 0;
    for (int64_t row : selecting) {
      if (rows[row]->plan == Plan::kSelect) selecting[kept++] = row;
    }
    selecting.resize(kept);
  }

  // 3. Draw (rows left to draw over the whole row) and argmax of x (overflowed rows).
  drawn.clear();
  argmax_rows.clear();
  for (int64_t row = 0; row < batch; ++row) {
    const Plan plan = rows[row]->plan;
    if (plan == Plan::kDraw || plan == Plan::kInfDraw) drawn.push_back(row);
    if (plan == Plan::kArgMaxX) argmax_rows.push_back(row);
  }
  if (!RunChunks(drawn, [&](int64_t row, int64_t c0, int64_t c1) { Draw(args, row, c0, c1); })) {
    return false;
  }
  if (!Run(static_cast<int64_t>(argmax_rows.size()),
           [&](int64_t i) { ArgMaxX(args, argmax_rows[i]); })) {
    return false;
  }

  // Outputs (under the guard too: they may live in shared memory).
  return Run(1, [&](int64_t) {
    for (int64_t row = 0; row < batch; ++row) {
      RowState& r = *rows[row];
      if (r.plan == Plan::kDraw || r.plan == Plan::kInfDraw) {
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
