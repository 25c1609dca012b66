// An engine that rewrites its buffers while a call runs (a bug on its side) must never make the
// kernels index out of bounds: on a real GPU that faults the server's context, which fails every
// client and exits the server with status 3. The GPU plane of device sessions reads the engine's
// logits and processors in place over several launches, so this suite rewrites them *between*
// launches — after launch k of one Sample or SessionStep call, for every k — and checks that
// the call completes, that every row with status OK has a token in [0, V), and that nothing is
// written out of bounds: every buffer sits against an inaccessible guard page with canary bytes
// around it, and the suite's kernels are built with -fsanitize=bounds (fixed-size arrays, shared
// memory included, abort on an out-of-range index). Tokens themselves are not checked: an engine
// that writes during a step gets whatever tokens, only never a crash.
//
// Emulated GPU only (kernels/gpu/emu/launch_hook.h runs the rewrite between launches).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/session_processors.h"
#include "kernels/gpu/emu/launch_hook.h"
#include "kernels/gpu/sample.h"
#include "kernels/gpu/session_step.h"
#include "proto/samplerd/v1/device_session.h"
#include "tests/gpu/gpu_test_util.h"

namespace samplerd::kernels::testing {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr uint8_t kCanary = 0xa5;

// `bytes` of memory placed against an inaccessible page (an access past the end faults at
// once), `align`-aligned; the bytes between the buffer and the guard pages hold canaries.
class GuardedBuffer {
 public:
  explicit GuardedBuffer(size_t bytes, size_t align = 256) : bytes_(bytes) {
    page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t data_pages = (bytes + align + page_ - 1) / page_;
    mapped_ = (data_pages + 2) * page_;
    void* m = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) std::abort();
    base_ = static_cast<uint8_t*>(m);
    mprotect(base_, page_, PROT_NONE);
    mprotect(base_ + mapped_ - page_, page_, PROT_NONE);
    uint8_t* end = base_ + mapped_ - page_;
    data_ = reinterpret_cast<uint8_t*>(reinterpret_cast<uintptr_t>(end - bytes) / align * align);
    std::memset(base_ + page_, kCanary, mapped_ - 2 * page_);
    std::memset(data_, 0, bytes_);
  }
  ~GuardedBuffer() { munmap(base_, mapped_); }
  GuardedBuffer(const GuardedBuffer&) = delete;
  GuardedBuffer& operator=(const GuardedBuffer&) = delete;

  uint8_t* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  template <class T>
  T* as() const {
    return reinterpret_cast<T*>(data_);
  }

  // Whether every byte around the buffer still holds its canary.
  bool CanariesIntact() const {
    for (const uint8_t* p = base_ + page_; p < data_; ++p) {
      if (*p != kCanary) return false;
    }
    for (const uint8_t* p = data_ + bytes_; p < base_ + mapped_ - page_; ++p) {
      if (*p != kCanary) return false;
    }
    return true;
  }

 private:
  size_t page_ = 0, mapped_ = 0, bytes_ = 0;
  uint8_t* base_ = nullptr;
  uint8_t* data_ = nullptr;
};

// Runs `after(k)` after launch k (0, 1, ...) of whatever runs while it is alive.
class AfterLaunch {
 public:
  explicit AfterLaunch(std::function<void(int)> after) : after_(std::move(after)) {
    previous_ = gpu::emu::SetAfterLaunchHook([this] { after_(launches_++); });
  }
  ~AfterLaunch() { gpu::emu::SetAfterLaunchHook(std::move(previous_)); }
  int launches() const { return launches_; }

 private:
  std::function<void(int)> after_;
  std::function<void()> previous_;
  int launches_ = 0;
};

// How the engine rewrites fp32 logits mid-call.
enum class Rewrite {
  kNegate,     // every logit negated: pass 1's max and argmax are now the row's min
  kShiftUp,    // +100: every logit above pass 1's max (histogram bins relative to it)
  kShiftDown,  // -100: every logit below pass 1's thresholds (boundary bins empty)
  kHuge,       // +-3e38 by sign: z overflows at T < 1
  kSomeNaN,    // every 97th logit NaN
  kSomeInf,    // every 89th +inf, every 83rd -inf
  kAllNegInf,  // nothing finite left
  kScatter,    // every logit replaced by a fresh N(0, 3) draw: the same range, other tokens
};
const std::vector<Rewrite> kRewrites = {Rewrite::kNegate,    Rewrite::kShiftUp, Rewrite::kShiftDown,
                                        Rewrite::kHuge,      Rewrite::kSomeNaN, Rewrite::kSomeInf,
                                        Rewrite::kAllNegInf, Rewrite::kScatter};

const char* Name(Rewrite r) {
  switch (r) {
    case Rewrite::kNegate:
      return "negate";
    case Rewrite::kShiftUp:
      return "shift_up";
    case Rewrite::kShiftDown:
      return "shift_down";
    case Rewrite::kHuge:
      return "huge";
    case Rewrite::kSomeNaN:
      return "some_nan";
    case Rewrite::kSomeInf:
      return "some_inf";
    case Rewrite::kAllNegInf:
      return "all_neg_inf";
    case Rewrite::kScatter:
      return "scatter";
  }
  return "?";
}

void RewriteLogits(Rewrite r, float* x, int64_t n) {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int64_t i = 0; i < n; ++i) {
    switch (r) {
      case Rewrite::kNegate:
        x[i] = -x[i];
        break;
      case Rewrite::kShiftUp:
        x[i] += 100.0f;
        break;
      case Rewrite::kShiftDown:
        x[i] -= 100.0f;
        break;
      case Rewrite::kHuge:
        x[i] = x[i] > 0.0f ? 3e38f : -3e38f;
        break;
      case Rewrite::kSomeNaN:
        if (i % 97 == 0) x[i] = kNaN;
        break;
      case Rewrite::kSomeInf:
        if (i % 89 == 0) x[i] = kInf;
        if (i % 83 == 0) x[i] = -kInf;
        break;
      case Rewrite::kAllNegInf:
        x[i] = -kInf;
        break;
      case Rewrite::kScatter:
        x[i] = normal(rng);
        break;
    }
  }
}

// The row settings of every path of kernels/gpu/row_path.h, mixed in one batch: row r takes
// kMix[r % size].
const RowParams kMix[] = {
    Params(1.0f, 0, 0.9f, 0.0f),                     // top-p alone: the mass path
    Params(0.8f, 50, 1.0f, 0.0f),                    // top-k: candidates
    Params(1.0f, 40, 0.8f, 0.0f),                    // top-k + top-p: candidates
    Params(1.0f, 0, 1.0f, 0.05f),                    // min-p: one block
    Params(0.7f, 0, 1.0f, 0.0f),                     // temperature only: inverse CDF
    Params(0.0f, 0, 1.0f, 0.0f),                     // greedy
    Params(1.2f, 1000, 0.9f, 0.0f),                  // large k + top-p: one block, by mass
    Params(1.0f, 0, 0.7f, 0.02f, TopPMode::kJoint),  // min-p + joint top-p: one block
    Params(0.5f, 0, 0.95f, 0.0f),                    // top-p alone at T < 1
};

RowParams Setting(int64_t row, std::mt19937_64& rng) {
  RowParams p = kMix[row % (sizeof(kMix) / sizeof(kMix[0]))];
  p.seed = rng();
  p.position = rng() % 1000;
  return p;
}

// One Sample call's shape and its rows.
struct Case {
  std::string name;
  int64_t batch;
  int64_t vocab;
  int32_t top_logprobs = -1;
  bool processors = false;  // a bitmask and sparse adjusts on every row
  std::function<RowParams(int64_t, std::mt19937_64&)> params = Setting;
};

// Guarded device buffers of one Sample call.
class SampleCall {
 public:
  explicit SampleCall(const Case& c) : c_(c) {
    const int64_t n = c.batch * c.vocab;
    std::mt19937_64 rng(11);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    original_.resize(n);
    for (float& x : original_) x = normal(rng);
    logits_ = std::make_unique<GuardedBuffer>(n * sizeof(float));
    params_ = std::make_unique<GuardedBuffer>(c.batch * sizeof(RowParams));
    for (int64_t r = 0; r < c.batch; ++r) params_->as<RowParams>()[r] = c.params(r, rng);
    tokens_ = std::make_unique<GuardedBuffer>(c.batch * sizeof(int32_t), 4);
    status_ = std::make_unique<GuardedBuffer>(c.batch * sizeof(RowStatus), 4);
    const int64_t top = c.top_logprobs > 0 ? c.top_logprobs : 1;
    logprob_ = std::make_unique<GuardedBuffer>(c.batch * sizeof(float), 4);
    rank_ = std::make_unique<GuardedBuffer>(c.batch * sizeof(int64_t), 8);
    top_ids_ = std::make_unique<GuardedBuffer>(c.batch * top * sizeof(int32_t), 4);
    top_values_ = std::make_unique<GuardedBuffer>(c.batch * top * sizeof(float), 4);
    const size_t ws = gpu::SampleWorkspaceBytes(c.batch, c.vocab, c.top_logprobs);
    workspace_ = std::make_unique<GuardedBuffer>((ws + 255) / 256 * 256);
    if (c.processors) {
      const int64_t words = (c.vocab + 31) / 32;
      bitmask_ = std::make_unique<GuardedBuffer>(c.batch * words * sizeof(uint32_t), 4);
      for (int64_t i = 0; i < c.batch * words; ++i) {
        bitmask_->as<uint32_t>()[i] = static_cast<uint32_t>(rng()) | 0x11111111u;
      }
      std::vector<TokenAdjust> adjusts;
      std::vector<uint32_t> offsets{0};
      for (int64_t r = 0; r < c.batch; ++r) {
        for (int32_t t = static_cast<int32_t>(r % 7); t < c.vocab; t += 997) {
          TokenAdjust a;
          a.token = t;
          a.bias = (t % 3 == 0) ? 5.0f : -kInf;
          a.repetition = 1.3f;
          a.penalty = 0.5f;
          adjusts.push_back(a);
        }
        offsets.push_back(static_cast<uint32_t>(adjusts.size()));
      }
      adjusts_ = std::make_unique<GuardedBuffer>(adjusts.size() * sizeof(TokenAdjust), 4);
      std::memcpy(adjusts_->data(), adjusts.data(), adjusts.size() * sizeof(TokenAdjust));
      offsets_ = std::make_unique<GuardedBuffer>(offsets.size() * sizeof(uint32_t), 4);
      std::memcpy(offsets_->data(), offsets.data(), offsets.size() * sizeof(uint32_t));
    }
  }

  // Runs one call with the original logits, rewritten by `rewrite` after launch `k` (-1:
  // never). Returns the number of launches the call made.
  int Run(int k, Rewrite rewrite) {
    std::memcpy(logits_->data(), original_.data(), original_.size() * sizeof(float));
    std::memset(tokens_->data(), 0x7f, tokens_->bytes());
    std::memset(status_->data(), 0x7f, status_->bytes());
    SampleArgs a;
    a.logits = logits_->data();
    a.dtype = DType::kFp32;
    a.batch = c_.batch;
    a.vocab = c_.vocab;
    a.row_stride = c_.vocab;
    a.params = params_->as<RowParams>();
    a.params_count = c_.batch;
    a.top_logprobs = c_.top_logprobs;
    a.token_ids = tokens_->as<int32_t>();
    a.status = status_->as<RowStatus>();
    if (c_.top_logprobs >= 0) {
      a.sampled_logprob = logprob_->as<float>();
      a.sampled_rank = rank_->as<int64_t>();
      if (c_.top_logprobs > 0) {
        a.top_ids = top_ids_->as<int32_t>();
        a.top_values = top_values_->as<float>();
      }
    }
    if (c_.processors) {
      a.allowed_bitmask = bitmask_->as<uint32_t>();
      a.bitmask_words = (c_.vocab + 31) / 32;
      a.adjusts = adjusts_->as<TokenAdjust>();
      a.adjust_offsets = offsets_->as<uint32_t>();
    }
    a.top_p_rows = gpu::HasTopPRows(a.params, c_.batch, c_.vocab);
    a.all_greedy = gpu::AllGreedy(a.params, c_.batch);
    AfterLaunch hook([&](int launch) {
      if (launch == k) RewriteLogits(rewrite, logits_->as<float>(), c_.batch * c_.vocab);
    });
    const int rc = gpu::Sample(a, workspace_->data(), workspace_->bytes(), nullptr);
    EXPECT_EQ(rc, 0);
    return hook.launches();
  }

  // Expects a token in [0, V) on every OK row, a known status on every row, and every canary.
  void ExpectSafe(const std::string& what) const {
    SCOPED_TRACE(what);
    for (int64_t r = 0; r < c_.batch; ++r) {
      const RowStatus s = status_->as<RowStatus>()[r];
      const int32_t t = tokens_->as<int32_t>()[r];
      ASSERT_TRUE(s == RowStatus::kOk || s == RowStatus::kNan || s == RowStatus::kNoFinite ||
                  s == RowStatus::kNoAllowed)
          << "row " << r << " status " << static_cast<int>(s);
      if (s == RowStatus::kOk) {
        ASSERT_TRUE(t >= 0 && t < c_.vocab) << "row " << r << " OK with token " << t;
      }
    }
    for (const GuardedBuffer* b :
         {logits_.get(), params_.get(), tokens_.get(), status_.get(), logprob_.get(), rank_.get(),
          top_ids_.get(), top_values_.get(), workspace_.get(), bitmask_.get(), adjusts_.get(),
          offsets_.get()}) {
      if (b != nullptr) {
        ASSERT_TRUE(b->CanariesIntact()) << "a write out of bounds";
      }
    }
  }

  std::vector<int32_t> Tokens() const {
    return std::vector<int32_t>(tokens_->as<int32_t>(), tokens_->as<int32_t>() + c_.batch);
  }

 private:
  Case c_;
  std::vector<float> original_;
  std::unique_ptr<GuardedBuffer> logits_, params_, tokens_, status_, logprob_, rank_, top_ids_,
      top_values_, workspace_, bitmask_, adjusts_, offsets_;
};

// Every rewrite after every launch but the last, then a clean call in the same workspace, which
// must give the first clean call's tokens (the workspace stays fit for the next call).
void RunEveryRewrite(const Case& c, const std::vector<Rewrite>& rewrites = kRewrites) {
  const auto start = std::chrono::steady_clock::now();
  SampleCall call(c);
  const int launches = call.Run(-1, Rewrite::kNegate);
  call.ExpectSafe(c.name + ", no rewrite");
  const std::vector<int32_t> clean = call.Tokens();
  ASSERT_GE(launches, 2) << "nothing runs between launches";
  for (int k = 0; k + 1 < launches; ++k) {
    for (Rewrite r : rewrites) {
      // Named before the call: a bounds check aborts the process.
      std::fprintf(stderr, "%s: %s after launch %d\n", c.name.c_str(), Name(r), k);
      call.Run(k, r);
      call.ExpectSafe(c.name + ", " + Name(r) + " after launch " + std::to_string(k) + " of " +
                      std::to_string(launches));
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  call.Run(-1, Rewrite::kNegate);
  EXPECT_EQ(call.Tokens(), clean) << "a clean call after the rewrites";
  std::fprintf(stderr, "%s: %d launches, %.1f s\n", c.name.c_str(), launches,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

// Every path in one batch. Each rewrite found a fault before the kernels were hardened:
//  - a token raised above pass 1's row max (negate, shift_up, scatter, huge) got a ValueBin
//    (select.h) past kHistBins in RowFinishKernel's SelectThreshold: a shared-memory write out
//    of bounds (top-p rows on the one-block finish: with logprobs, min-p, or k > 256);
//  - every token dropped below what pass 1 saw (shift_down, all_neg_inf) left rows with nothing
//    to draw: status OK with token -1 (min-p on the one-block finish, the mass path); such rows
//    now get status kNoFinite (WriteRowToken, device_common.h).
TEST(RewriteBetweenLaunches, MixedRowsLargeVocab) {
  // The mass path's wide rows sum their sub-bins in pass 2.
  RunEveryRewrite(Case{"mixed_v151936_b9", 9, 151936});
}

TEST(RewriteBetweenLaunches, MixedRowsWithLogprobs) {
  // Logprobs: no mass path; top-p rows read the row again in the one-block finish.
  RunEveryRewrite(Case{"mixed_logprobs", 9, 40000, 2});
}

TEST(RewriteBetweenLaunches, MixedRowsWithProcessors) {
  RunEveryRewrite(Case{"mixed_processors", 9, 40000, -1, true});
}

TEST(RewriteBetweenLaunches, TopPAloneLargeLaunch) {
  // B * chunks = 43 * 19 > 800: the mass path's last block weighs the boundary list itself.
  Case c{"top_p_v151936_b43", 43, 151936};
  c.params = [](int64_t, std::mt19937_64& rng) {
    RowParams p = Params(1.0f, 0, 0.9f, 0.0f);
    p.seed = rng();
    return p;
  };
  RunEveryRewrite(c);
}

// ---- The processors of a device session's GPU plane (SessionStep, session_step.h) ----

// How the engine rewrites its processors buffer mid-step.
enum class ProcsRewrite {
  kGrowLastRow,     // the last row's lists grow to all of both lists (offsets still in range)
  kHugeOffsets,     // the last row's history end far past NH
  kTokensTooLarge,  // every token near INT32_MAX (still sorted)
  kTokensNegative,  // every token negative (still sorted)
  kDisjoint,        // history tokens moved off the bias tokens: the rows' unions grow
  kNaNPenalties,    // repetition, presence, frequency and biases NaN
};
constexpr ProcsRewrite kProcsRewrites[] = {
    ProcsRewrite::kGrowLastRow,    ProcsRewrite::kHugeOffsets, ProcsRewrite::kTokensTooLarge,
    ProcsRewrite::kTokensNegative, ProcsRewrite::kDisjoint,    ProcsRewrite::kNaNPenalties};

const char* Name(ProcsRewrite r) {
  switch (r) {
    case ProcsRewrite::kGrowLastRow:
      return "grow_last_row";
    case ProcsRewrite::kHugeOffsets:
      return "huge_offsets";
    case ProcsRewrite::kTokensTooLarge:
      return "tokens_too_large";
    case ProcsRewrite::kTokensNegative:
      return "tokens_negative";
    case ProcsRewrite::kDisjoint:
      return "disjoint";
    case ProcsRewrite::kNaNPenalties:
      return "nan_penalties";
  }
  return "?";
}

// One device session's buffers, the engine's and the server's, each guarded.
class SessionCall {
 public:
  static constexpr uint32_t kRows = 8;
  static constexpr uint32_t kBias = 64, kHistory = 64;  // NB + NH: a multiple of 16 entries
  static constexpr uint32_t kPerRow = 6;                // entries a row in each list
  static constexpr int64_t kVocab = 40000;

  SessionCall()
      : control_(SAMPLERD_CONTROL_BYTES, 64),
        params_(samplerd_params_bytes(kRows), 8),
        logits_(kRows * kVocab * sizeof(float)),
        tokens_(kRows * sizeof(int32_t), 4),
        status_(kRows * sizeof(int32_t), 4),
        processors_(samplerd_processors_bytes(kRows, kBias, kHistory), 4),
        workspace_(SessionStepBytes()) {
    std::mt19937_64 rng(5);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (int64_t i = 0; i < kRows * kVocab; ++i) logits_.as<float>()[i] = normal(rng);
    uint8_t* p = params_.data();
    for (uint32_t r = 0; r < kRows; ++r) {
      const RowParams s = Setting(r, rng);
      reinterpret_cast<uint64_t*>(p + samplerd_params_seed_offset(kRows))[r] = s.seed;
      reinterpret_cast<uint64_t*>(p + samplerd_params_position_offset(kRows))[r] = s.position;
      reinterpret_cast<float*>(p + samplerd_params_temperature_offset(kRows))[r] = s.temperature;
      reinterpret_cast<int32_t*>(p + samplerd_params_top_k_offset(kRows))[r] = s.top_k;
      reinterpret_cast<float*>(p + samplerd_params_top_p_offset(kRows))[r] = s.top_p;
      reinterpret_cast<float*>(p + samplerd_params_min_p_offset(kRows))[r] = s.min_p;
      reinterpret_cast<int32_t*>(p + samplerd_params_top_p_mode_offset(kRows))[r] =
          s.top_p_mode == TopPMode::kJoint ? 2 : 1;
    }
    original_.assign(processors_.data(), processors_.data() + processors_.bytes());
    Procs q = Resolve();
    // Row r: bias tokens r + 1000 j, history tokens r + 1000 j + (j odd ? 500 : 0), j < kPerRow:
    // half of each list is in the other.
    for (uint32_t r = 0; r <= kRows; ++r) {
      q.bias_offsets[r] = r * kPerRow;
      q.history_offsets[r] = r * kPerRow;
    }
    for (uint32_t r = 0; r < kRows; ++r) {
      q.repetition[r] = 1.2f;
      q.presence[r] = 0.5f;
      q.frequency[r] = 0.25f;
      for (uint32_t j = 0; j < kPerRow; ++j) {
        const uint32_t i = r * kPerRow + j;
        q.bias_tokens[i] = static_cast<int32_t>(r + 1000 * j);
        q.biases[i] = j == 0 ? kInf : 2.0f;
        q.history_tokens[i] = static_cast<int32_t>(r + 1000 * j + (j % 2 == 1 ? 500 : 0));
        q.output_counts[i] = j;
        q.in_prompt[i] = j % 2;
      }
    }
    original_.assign(processors_.data(), processors_.data() + processors_.bytes());
  }

  // Runs one step (batch kRows) with the original processors, rewritten by `rewrite` after
  // launch `k` (-1: never). Returns the number of launches.
  int Run(int k, ProcsRewrite rewrite) {
    std::memcpy(processors_.data(), original_.data(), original_.size());
    std::memset(tokens_.data(), 0x7f, tokens_.bytes());
    std::memset(status_.data(), 0x7f, status_.bytes());
    reinterpret_cast<uint32_t*>(control_.data() + SAMPLERD_CONTROL_BATCH)[0] = kRows;
    gpu::SessionStepArgs a;
    a.control = control_.data();
    a.max_batch = kRows;
    a.vocab = kVocab;
    a.row_stride = kVocab;
    a.logits = logits_.data();
    a.params = params_.data();
    a.token_ids = tokens_.as<int32_t>();
    a.row_status = status_.as<int32_t>();
    a.processors = processors_.data();
    a.logit_bias_capacity = kBias;
    a.token_history_capacity = kHistory;
    AfterLaunch hook([&](int launch) {
      if (launch == k) Rewrite(rewrite);
    });
    EXPECT_EQ(gpu::SessionStep(a, workspace_.data(), workspace_.bytes(), nullptr), 0);
    return hook.launches();
  }

  void ExpectSafe(const std::string& what) const {
    SCOPED_TRACE(what);
    const uint32_t step =
        *reinterpret_cast<const uint32_t*>(control_.data() + SAMPLERD_CONTROL_STEP_STATUS);
    ASSERT_EQ(step, SAMPLERD_STEP_OK);
    for (uint32_t r = 0; r < kRows; ++r) {
      const int32_t s = status_.as<int32_t>()[r];
      const int32_t t = tokens_.as<int32_t>()[r];
      ASSERT_TRUE(s >= SAMPLERD_ROW_OK && s <= SAMPLERD_ROW_INVALID_NO_ALLOWED)
          << "row " << r << " status " << s;
      if (s == SAMPLERD_ROW_OK) {
        ASSERT_TRUE(t >= 0 && t < kVocab) << "row " << r << " token " << t;
      }
    }
    // Sample's workspace follows the step's merged adjusts (session_step.hip), and its first
    // bytes are the one-launch greedy path's tickets, which a session step never uses: a write
    // past the adjusts lands there.
    const size_t sample_at = workspace_.bytes() - gpu::SampleWorkspaceBytes(kRows, kVocab, -1);
    for (size_t i = sample_at; i < sample_at + 65535 * 4; ++i) {
      ASSERT_EQ(workspace_.data()[i], 0)
          << "a write past the merged adjusts, at byte " << i - sample_at << " after them";
    }
    for (const GuardedBuffer* b :
         {&control_, &params_, &logits_, &tokens_, &status_, &processors_, &workspace_}) {
      ASSERT_TRUE(b->CanariesIntact()) << "a write out of bounds";
    }
  }

 private:
  // Writable views of the processors buffer's arrays.
  struct Procs {
    float *repetition, *presence, *frequency, *biases;
    uint32_t *bias_offsets, *history_offsets, *output_counts;
    int32_t *bias_tokens, *history_tokens;
    uint8_t* in_prompt;
  };
  Procs Resolve() {
    const SessionProcessors q =
        ResolveSessionProcessors(processors_.data(), kRows, kBias, kHistory);
    return Procs{const_cast<float*>(q.repetition),       const_cast<float*>(q.presence),
                 const_cast<float*>(q.frequency),        const_cast<float*>(q.biases),
                 const_cast<uint32_t*>(q.bias_offsets),  const_cast<uint32_t*>(q.history_offsets),
                 const_cast<uint32_t*>(q.output_counts), const_cast<int32_t*>(q.bias_tokens),
                 const_cast<int32_t*>(q.history_tokens), const_cast<uint8_t*>(q.in_prompt)};
  }

  static size_t SessionStepBytes() {
    return gpu::SessionStepWorkspaceBytes(kRows, kVocab, false, kBias + kHistory);
  }

  void Rewrite(ProcsRewrite r) {
    Procs q = Resolve();
    const uint32_t used = kRows * kPerRow;
    switch (r) {
      case ProcsRewrite::kGrowLastRow:
        q.bias_offsets[kRows - 1] = 0;
        q.history_offsets[kRows - 1] = 0;
        q.bias_offsets[kRows] = kBias;
        q.history_offsets[kRows] = kHistory;
        for (uint32_t i = used; i < kBias; ++i) q.bias_tokens[i] = static_cast<int32_t>(20000 + i);
        for (uint32_t i = used; i < kHistory; ++i) {
          q.history_tokens[i] = static_cast<int32_t>(30000 + i);
        }
        break;
      case ProcsRewrite::kHugeOffsets:
        q.history_offsets[kRows] = kHistory + 100000;
        break;
      case ProcsRewrite::kTokensTooLarge:
        for (uint32_t i = 0; i < used; ++i) {
          q.bias_tokens[i] = INT32_MAX - static_cast<int32_t>(used - i);
          q.history_tokens[i] = INT32_MAX - static_cast<int32_t>(used - i);
        }
        break;
      case ProcsRewrite::kTokensNegative:
        for (uint32_t i = 0; i < used; ++i) {
          q.bias_tokens[i] = -1000000 + static_cast<int32_t>(i);
          q.history_tokens[i] = -2000000 + static_cast<int32_t>(i);
        }
        break;
      case ProcsRewrite::kDisjoint:
        for (uint32_t i = 0; i < used; ++i) q.history_tokens[i] += 1;
        break;
      case ProcsRewrite::kNaNPenalties:
        for (uint32_t r2 = 0; r2 < kRows; ++r2) {
          q.repetition[r2] = kNaN;
          q.presence[r2] = kNaN;
          q.frequency[r2] = kNaN;
        }
        for (uint32_t i = 0; i < used; ++i) q.biases[i] = kNaN;
        break;
    }
  }

  GuardedBuffer control_, params_, logits_, tokens_, status_, processors_, workspace_;
  std::vector<uint8_t> original_;
};

TEST(RewriteBetweenLaunches, SessionProcessors) {
  SessionCall call;
  const int launches = call.Run(-1, ProcsRewrite::kGrowLastRow);
  call.ExpectSafe("no rewrite");
  ASSERT_GE(launches, 6);
  for (int k = 0; k + 1 < launches; ++k) {
    for (ProcsRewrite r : kProcsRewrites) {
      std::fprintf(stderr, "session processors: %s after launch %d\n", Name(r), k);
      call.Run(k, r);
      call.ExpectSafe(std::string(Name(r)) + " after launch " + std::to_string(k) + " of " +
                      std::to_string(launches));
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

}  // namespace
}  // namespace samplerd::kernels::testing
