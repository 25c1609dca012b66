// The state one row carries through FastCpuSampler's passes (its plan, its filters' thresholds,
// the radix selection in progress, the best draw so far) and the scratch each worker thread
// reuses across tasks. Internal to kernels/cpu_fast.
#ifndef SAMPLERD_KERNELS_CPU_FAST_ROW_STATE_H_
#define SAMPLERD_KERNELS_CPU_FAST_ROW_STATE_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <mutex>
#include <vector>

#include "kernels/common/sampling_types.h"
#include "kernels/cpu_fast/row_chunks.h"
#include "kernels/cpu_fast/spin_mutex.h"

namespace samplerd::kernels::cpu_fast_internal {

inline constexpr float kInf = std::numeric_limits<float>::infinity();
inline constexpr int kBinBits = 10;
// Tokens of a row in NarrowMassWindow's sample: on a flat row the sample's cumulative mass
// fraction at the boundary is within ~0.01 of the row's.
inline constexpr int64_t kWindowSample = 512;
inline constexpr int kMaxBins = 1 << kBinBits;  // bins of one radix histogram pass
// The first pass of a stage bins z on a grid below the row max instead (radix_select.h): bin
// floor((mx - z) * scale) while that is < kGridBins, else kGridBins. The scale spreads the
// grid's bins over the stage's span mx - floor, but never coarser than 1/32 logit over the 44
// logits below mx where masses do not quantise to 0 (kGridBinsPerLogit * kGridLogits =
// kGridBins). At 1/32 logit a randn * 3 row's top-p 0.95 boundary bin holds ~250 tokens (one
// gather); a near-flat row (the 0.5 logits of N(0, 0.05), or the ~5 logits of bf16-rounded
// N(0, 0.6)) put 10,000 tokens in such a bin, which then took a radix pass, an exp per token
// again, before its gather; spread over its span the bin holds a few hundred. A task's
// histogram (merged under the row's lock) stays small either way.
inline constexpr float kGridBinsPerLogit = 32.0f;  // the coarsest scale
inline constexpr float kGridLogits = 44.0f;        // masses below exp(-44) quantise to 0
// The index of the bin below the grid.
inline constexpr int kGridBins = static_cast<int>(kGridLogits * kGridBinsPerLogit);
inline constexpr float kGridMaxScale = 0x1p24f;  // the finest scale, for spans down to 0
inline constexpr int kHistBins =                 // bins of any histogram pass
    kGridBins + 1 > kMaxBins ? kGridBins + 1 : kMaxBins;

// A sum of quantised masses (quantised_mass.h); wide enough for any vocabulary.
using Mass = unsigned __int128;

enum class Plan : uint8_t {
  kDone,         // outputs decided
  kTopTiesDraw,  // max x / T is +inf or -inf: uniform over the tokens at the max x
  kSelect,       // finding the top-k / top-p thresholds
  kDraw,         // Gumbel draw over keys <= draw_key (phase 3)
  kInverseCdf,   // temperature alone, finite max z: the inverse-CDF draw (inverse_cdf_pass.h)
  kChunkedDraw,  // top-p alone, its keys <= draw_key: the chunked inverse-CDF draw (chunked_draw.h)
};

enum class Stage : uint8_t { kTopK, kTopP };
enum class Pass : uint8_t { kHistogram, kGather };

// The grid's bins per logit for a stage of z in [floor, mx] (finite): kGridBins over the span,
// clamped to [kGridBinsPerLogit, kGridMaxScale].
inline float GridScale(float mx, float floor) {
  const float span = mx - floor;  // may overflow to +inf: then the coarsest scale
  if (!(span * kGridMaxScale > static_cast<float>(kGridBins))) return kGridMaxScale;
  return std::max(kGridBinsPerLogit, static_cast<float>(kGridBins) / span);
}

// The grid bin of z below the row max mx (z <= mx) at `scale` bins per logit; non-decreasing as
// z decreases. At scale kGridBinsPerLogit (a power of 2: the product is exact) this is the
// former fixed grid, floor((mx - z) * 32) while mx - z < 44.
inline int GridBin(float z, float mx, float scale) {
  const float f = (mx - z) * scale;
  return f < static_cast<float>(kGridBins) ? static_cast<int>(f) : kGridBins;
}

// A gathered token.
struct Candidate {
  float z;
  int32_t id;
};

// The mass sum of tokens [begin, end) of a plain-temperature row (inverse_cdf_pass.h), or of a
// top-p-alone row's kept set (chunked_draw.h: `mass` its head's, `tail` its tail's).
struct MassPiece {
  int64_t begin;
  int64_t end;
  double mass;        // of the tokens kept (a chunked row: those of the head, z >= head_from)
  int64_t left_out;   // tokens left out of the sums (x < RowState::skip_below)
  double tail = 0.0;  // a chunked row: of the tail's tokens kept (z < head_from)
};

// Chunk tasks of one row lock `mu` to merge their results into it (a spin lock: spin_mutex.h);
// the per-row steps (Decide, StartStage, Advance) run as the row's only task.
struct RowState {
  SpinMutex mu;
  // Histogram merges lock one stripe of the bins at a time, each task starting at its own
  // stripe (merge_ticket), so that tasks finishing together merge side by side.
  static constexpr int kMergeStripes = 8;
  SpinMutex stripe_mu[kMergeStripes];
  std::atomic<uint32_t> merge_ticket{0};
  Plan plan = Plan::kDone;
  RowParams p;
  float mx = 0.0f;
  float top_x = 0.0f;  // Plan::kTopTiesDraw and kInverseCdf: the row's max x
  float min_finite = 0.0f;
  float min_threshold = -kInf;  // min-p: keep z >= this
  float k_threshold = -kInf;
  bool joint = false;
  bool top_p_alone = false;  // IsTopPAlone (kernels/common/inverse_cdf.h): the chunked draw
  bool need_k = false;
  bool need_p = false;
  // Selection state of the current stage: its tokens are the keys in [KeyOf(mx), stage_hi].
  Stage stage = Stage::kTopK;
  Pass pass = Pass::kHistogram;
  bool grid = false;                     // histogram pass on the grid (GridBin) over keys [lo, hi]
  float grid_scale = kGridBinsPerLogit;  // the grid's bins per logit (GridScale)
  // A top-p grid pass sums masses per bin only for bins [window_lo, window_hi] (bin_kernels.h,
  // MassChunkWindowedAvx512); the tokens above the window go into bin window_lo - 1 and those
  // below into bin window_hi + 1. Every bin from window_lo - 1 to window_hi then has its exact
  // cumulative mass and count, and the total is exact. [0, kGridBins]: every bin.
  int32_t window_lo = 0;
  // NarrowMassWindow's sample of the row's x, filled by the stats pass (SampleForWindow):
  // entry k is token k * (V / kWindowSample) + (V / kWindowSample) / 2. Empty: no sample.
  std::vector<float> window_sample;
  int32_t window_hi = kGridBins;
  uint32_t lo = 0, hi = 0;  // histogram key range
  int shift = 0;
  int bins = 0;
  int64_t count_above = 0;  // stage tokens with key < lo
  Mass mass_above = 0;
  Mass total = 0;          // top-p: mass of all the stage's tokens
  uint32_t gather_lo = 0;  // gather pass: keys in [gather_lo, gather_hi]
  uint32_t gather_hi = 0;
  bool boundary_only = false;  // the gather holds one bin, below count_above / mass_above
  int64_t stage_count = -1;    // tokens of the stage when known, else -1
  std::vector<int64_t> counts = std::vector<int64_t>(kHistBins);
  std::vector<Mass> mass = std::vector<Mass>(kHistBins);
  std::vector<Candidate> candidates;
  // Plan::kInverseCdf (inverse_cdf_pass.h): 1 / T; tokens with x < skip_below are left out of
  // the sums, each with a mass <= skip_bound; the mass sums of the row's pieces, in no order.
  // Plan::kChunkedDraw (chunked_draw.h) the same over z = x / T (`scaled`; top_x = mx, inv_t =
  // 1) and over the kept set only, z >= keep_from (-inf: every token), its head (z >=
  // head_from, the tokens above the bin of keep_from) and its tail (below) summed apart.
  double inv_t = 0.0;
  bool scaled = false;
  float keep_from = -kInf;
  float head_from = kInf;
  float skip_below = -kInf;
  double skip_bound = 0.0;
  std::vector<MassPiece> pieces;
  int64_t covered = 0;    // tokens whose pieces are in `pieces`
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

  // Appends the pieces of the tokens [t0, t1), each within one aligned span of `span` tokens
  // (weigh(piece) fills the sums of piece.begin .. piece.end), to `pieces` under the lock.
  // Returns whether the row of `vocab` tokens is now covered. Chunk tasks of the mass passes
  // call it (inverse_cdf_pass.h, chunked_draw.h).
  template <typename Weigh>
  bool AddPieces(int64_t vocab, int64_t t0, int64_t t1, int64_t span, Weigh&& weigh) {
    std::vector<MassPiece> mine;
    mine.reserve(static_cast<size_t>((t1 - t0) / span + 2));
    for (int64_t begin = t0; begin < t1;) {
      const int64_t end = std::min(t1, (begin / span + 1) * span);
      MassPiece piece{begin, end, 0.0, 0};
      weigh(piece);
      mine.push_back(piece);
      begin = end;
    }
    std::lock_guard<SpinMutex> lock(mu);
    pieces.insert(pieces.end(), mine.begin(), mine.end());
    covered += t1 - t0;
    return covered == vocab;
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
    grid = false;
    std::fill(counts.begin(), counts.begin() + bins, 0);
    std::fill(mass.begin(), mass.begin() + bins, 0);
  }

  // Starts a grid histogram pass over keys [range_lo, range_hi] (range_lo = KeyOf(mx)) at
  // `scale` bins per logit.
  void SetGrid(uint32_t range_lo, uint32_t range_hi, float scale) {
    lo = range_lo;
    hi = range_hi;
    bins = kGridBins + 1;
    pass = Pass::kHistogram;
    grid = true;
    grid_scale = scale;
    window_lo = 0;
    window_hi = kGridBins;
    std::fill(counts.begin(), counts.begin() + bins, 0);
    std::fill(mass.begin(), mass.begin() + bins, 0);
  }
};

// Scratch of one thread.
struct ThreadScratch {
  std::vector<float> x = std::vector<float>(kChunk);
  std::vector<Candidate> candidates;
  // A histogram pass's bins (radix_select.cc), all zero between passes (a pass clears the
  // bins it used). `histogram_dirty` is set while a pass fills them: a task abandoned by its
  // guard (a fault reading the logits) leaves it set, and the next pass clears them all.
  bool histogram_dirty = false;
  std::vector<int64_t> counts = std::vector<int64_t>(kHistBins + 1);  // + a spare counter
  std::vector<Mass> mass = std::vector<Mass>(kHistBins);
  std::vector<int32_t> bins = std::vector<int32_t>(kChunk);  // a chunk's bins
  std::vector<float> row;  // a whole row, for the inverse-CDF draw's fallback (sized on use)
  // A chunk's kept z packed together, for the chunked draw's sparse pieces (chunk_weights.h).
  std::vector<float> packed = std::vector<float>(kChunk + 32);
  std::vector<double> window_weight;  // NarrowMassWindow's sample masses per grid bin
};

// The calling thread's scratch (thread_local, allocated at its first use).
ThreadScratch& Scratch();

}  // namespace samplerd::kernels::cpu_fast_internal

#endif  // SAMPLERD_KERNELS_CPU_FAST_ROW_STATE_H_
