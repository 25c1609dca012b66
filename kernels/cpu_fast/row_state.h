// The state one row carries through FastCpuSampler's passes (its plan, its filters' thresholds,
// the radix selection in progress, the best draw so far) and the scratch each worker thread
// reuses across tasks. Internal to kernels/cpu_fast.
#ifndef SAMPLERD_KERNELS_CPU_FAST_ROW_STATE_H_
#define SAMPLERD_KERNELS_CPU_FAST_ROW_STATE_H_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <mutex>
#include <vector>

#include "kernels/common/sampling_types.h"
#include "kernels/cpu_fast/row_chunks.h"

namespace samplerd::kernels::cpu_fast_internal {

inline constexpr float kInf = std::numeric_limits<float>::infinity();
inline constexpr int kBinBits = 10;
inline constexpr int kMaxBins = 1 << kBinBits;  // bins of one histogram pass

// A sum of quantised masses (quantised_mass.h); wide enough for any vocabulary.
using Mass = unsigned __int128;

enum class Plan : uint8_t {
  kDone,         // outputs decided
  kTopTiesDraw,  // max x / T is +inf or -inf: uniform over the tokens at the max x
  kSelect,       // finding the top-k / top-p thresholds
  kDraw,         // Gumbel draw over keys <= draw_key (phase 3)
};

enum class Stage : uint8_t { kTopK, kTopP };
enum class Pass : uint8_t { kHistogram, kGather };

// A gathered token.
struct Candidate {
  float z;
  int32_t id;
};

// Chunk tasks of one row lock `mu` to merge their results into it; the per-row steps (Decide,
// StartStage, Advance) run as the row's only task.
struct RowState {
  std::mutex mu;
  Plan plan = Plan::kDone;
  RowParams p;
  float mx = 0.0f;
  float top_x = 0.0f;  // Plan::kTopTiesDraw: the row's max x
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

// The calling thread's scratch (thread_local, allocated at its first use).
ThreadScratch& Scratch();

}  // namespace samplerd::kernels::cpu_fast_internal

#endif  // SAMPLERD_KERNELS_CPU_FAST_ROW_STATE_H_
