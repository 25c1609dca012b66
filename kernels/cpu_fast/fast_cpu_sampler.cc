// FastCpuSampler: the oracle's decisions (kernels/cpu/cpu_sampler.cc), reached without sorting
// the row, at a cost bounded for any distribution. This file runs the passes over the worker
// pool; each pass lives in its own file.
//
// Every filter keeps the tokens with z at or above a threshold (min-p: mx + log m; top-k: the
// k-th largest survivor; top-p: the last value whose strictly-higher mass is < p * total), so a
// filtered row is: find the thresholds, then draw over z >= all of them. Work runs in parallel
// passes over (row, token range) tasks read kChunk tokens at a time (row_chunks.h; whole rows
// per task when B >= threads), each row's state in a RowState (row_state.h):
//   1. stats   NaN / -inf / +inf flags, max and min finite z (x for greedy rows, which end
//              here), then the row's plan (row_stats.h).
//   2. select  (rows with top-k or top-p) the thresholds: a pass binning z on a grid below the
//              row max (spread over the row's span), then a gather of the boundary bin, or
//              radix passes over order-preserving integer keys of z (radix_select.h,
//              order_keys.h). Masses are exp(z - mx) quantised to 2^-62 units and summed as
//              integers, so no sum depends on how tokens were split over tasks
//              (quantised_mass.h); a top-p grid pass keeps per-bin sums only in a window that a
//              sample of the row puts around the boundary, and runs again if it missed.
//   3. draw    plain-temperature rows (temperature alone, finite max z): the inverse-CDF draw,
//              mass sums per piece of the row in parallel, then the crossing piece scanned,
//              within a proven margin of the oracle's index-order sums or else the oracle's own
//              draw (inverse_cdf_pass.h). Top-p-alone rows: the chunked inverse CDF, float
//              mass sums per chunk over the kept set, then a chunk, a segment and a token, each
//              within its proven margin or else the oracle's draw (chunked_draw.h); rows whose
//              survivors were all gathered draw from them. Other rows: Gumbel-max over the
//              survivors z >= threshold, skipping the noise (and its logs) wherever it provably
//              cannot win, so the token is the oracle's (gumbel_draw.h).
// The hot loops have AVX2 versions chosen at run time (cpu_features.h) that compute exactly what
// the scalar ones do.
#include "kernels/cpu_fast/fast_cpu_sampler.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/cpu/cpu_sampler.h"
#include "kernels/cpu_fast/chunked_draw.h"
#include "kernels/cpu_fast/gumbel_draw.h"
#include "kernels/cpu_fast/inverse_cdf_pass.h"
#include "kernels/cpu_fast/quantised_mass.h"
#include "kernels/cpu_fast/radix_select.h"
#include "kernels/cpu_fast/row_chunks.h"
#include "kernels/cpu_fast/row_state.h"
#include "kernels/cpu_fast/row_stats.h"
#include "kernels/cpu_fast/worker_pool.h"

namespace samplerd::kernels {

using cpu_fast_internal::ChunkStats;
using cpu_fast_internal::kChunk;
using cpu_fast_internal::Pass;
using cpu_fast_internal::Plan;
using cpu_fast_internal::RowState;

struct FastCpuSampler::Impl {
  explicit Impl(const Options& options)
      : pool(options.threads < 1 ? 1 : options.threads, options.spin_us),
        guard(options.guard),
        gather_cap(options.gather_cap),
        inverse_cdf_extra_margin(options.inverse_cdf_extra_margin),
        snapshot_logits(options.snapshot_logits),
        phase_times(options.phase_times) {
    snapshot.reserve(options.snapshot_reserve_bytes);  // may throw std::bad_alloc
    cpu_fast_internal::WarmNoiseBounds();
    cpu_fast_internal::Exp2Table();
  }

  // Runs fn(0..n-1) over the pool, each call under the guard; false once any call faulted.
  bool Run(int64_t n, const std::function<void(int64_t)>& fn) {
    if (n <= 0) return !failed.load();
    if (phase_times != nullptr && n > 1 && pool.threads() > 1) ++phase_times->loops;
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

  // Runs fn(row, token_begin, token_end) over tasks covering every token of `rows`: one task
  // per row when there are as many rows as threads, else each row cut into ~2 * threads / rows
  // equal ranges (multiples of 4 tokens: whole Philox blocks). Equal ranges balance the
  // threads (19 chunks of a V = 151,936 row do not split evenly over 8); two per thread cover one
  // that starts late; each task merges its histogram into the row's once. No result depends on the
  // cut.
  bool RunChunks(const std::vector<int64_t>& rows, int64_t vocab,
                 const std::function<void(int64_t, int64_t, int64_t)>& fn) {
    const int64_t n = static_cast<int64_t>(rows.size());
    if (n == 0 || n >= pool.threads() || vocab <= kChunk) {
      return Run(n, [&](int64_t i) { fn(rows[i], 0, vocab); });
    }
    const int64_t parts = std::min<int64_t>(vocab / 4, (2 * pool.threads() + n - 1) / n);
    return Run(n * parts, [&](int64_t i) {
      const int64_t part = i % parts;
      const int64_t t0 = (part * vocab / parts) & ~int64_t{3};
      const int64_t t1 = part + 1 == parts ? vocab : ((part + 1) * vocab / parts) & ~int64_t{3};
      fn(rows[i / parts], t0, t1);
    });
  }

  bool Sample(const SampleArgs& args);
  bool SampleWithLogprobs(const SampleArgs& args);  // also rows with processors

  WorkerPool pool;
  TaskGuard guard;
  const int64_t gather_cap;
  const double inverse_cdf_extra_margin;
  const bool snapshot_logits;
  PhaseTimes* const phase_times;
  std::vector<unsigned char> snapshot;  // snapshot_logits: [batch, vocab] elements
  // Guarded oracle calls (SampleWithLogprobs): the rows' bitmask words and the outputs.
  std::vector<uint32_t> bitmask_copy;
  std::vector<int32_t> out_tokens;
  std::vector<RowStatus> out_status;
  std::vector<float> out_logprobs;
  std::vector<int64_t> out_ranks;
  std::vector<int32_t> out_top_ids;
  std::vector<float> out_top_values;
  std::atomic<bool> failed{false};
  std::atomic<int64_t> inverse_cdf_fallbacks{0};
  int64_t chunks = 0;  // stats pieces per row
  std::vector<ChunkStats> stats;
  std::vector<std::unique_ptr<RowState>> rows;
  std::vector<int64_t> selecting, drawn, plain;  // reused across calls
};

bool FastCpuSampler::Impl::SampleWithLogprobs(const SampleArgs& args) {
  if (!guard) return Run(args.batch, [&](int64_t row) { CpuSampleRows(args, row, row + 1); });
  // Guarded (the inputs may be shared memory another process truncates or rewrites): the oracle
  // owns heap scratch for the whole call (RowScratch, vectors of V elements), which a bus error
  // jumping out of a guarded task would leak. So only plain copies run under the guard: the
  // rows' logits and bitmask words into the sampler's memory, then the oracle runs unguarded on
  // the copies (no fault is possible there, and no check can see one value and use another),
  // and the outputs are copied back under the guard.
  const int64_t batch = args.batch;
  const int64_t size = DTypeSize(args.dtype);
  const size_t row_bytes = static_cast<size_t>(args.vocab * size);
  if (snapshot.size() < batch * row_bytes) snapshot.resize(batch * row_bytes);
  const int64_t words = args.allowed_bitmask != nullptr ? args.bitmask_words : 0;
  if (static_cast<int64_t>(bitmask_copy.size()) < batch * words) {
    bitmask_copy.resize(batch * words);
  }
  const int64_t top_n = std::max<int64_t>(0, args.top_logprobs);
  out_tokens.resize(batch);
  out_status.resize(batch);
  out_logprobs.resize(batch);
  out_ranks.resize(batch);
  out_top_ids.resize(batch * top_n);
  out_top_values.resize(batch * top_n);
  if (!Run(batch, [&](int64_t row) {
        std::memcpy(snapshot.data() + row * row_bytes,
                    static_cast<const unsigned char*>(args.logits) + row * args.row_stride * size,
                    row_bytes);
        if (words > 0) {
          std::memcpy(bitmask_copy.data() + row * words, args.allowed_bitmask + row * words,
                      static_cast<size_t>(words) * sizeof(uint32_t));
        }
      })) {
    return false;
  }
  SampleArgs local = args;
  local.logits = snapshot.data();
  local.row_stride = args.vocab;
  if (words > 0) local.allowed_bitmask = bitmask_copy.data();
  local.token_ids = out_tokens.data();
  local.status = out_status.data();
  local.sampled_logprob = args.sampled_logprob != nullptr ? out_logprobs.data() : nullptr;
  local.sampled_rank = args.sampled_rank != nullptr ? out_ranks.data() : nullptr;
  local.top_ids = args.top_ids != nullptr ? out_top_ids.data() : nullptr;
  local.top_values = args.top_values != nullptr ? out_top_values.data() : nullptr;
  pool.Run(batch, [&](int64_t row) { CpuSampleRows(local, row, row + 1); });
  return Run(1, [&](int64_t) {
    for (int64_t row = 0; row < batch; ++row) {
      args.token_ids[row] = out_tokens[row];
      args.status[row] = out_status[row];
      if (args.sampled_logprob != nullptr) args.sampled_logprob[row] = out_logprobs[row];
      if (args.sampled_rank != nullptr) args.sampled_rank[row] = out_ranks[row];
    }
    if (args.top_ids != nullptr) std::copy(out_top_ids.begin(), out_top_ids.end(), args.top_ids);
    if (args.top_values != nullptr) {
      std::copy(out_top_values.begin(), out_top_values.end(), args.top_values);
    }
  });
}

namespace {

// Stats of tokens [begin, begin + n) of `row` (ComputeChunkStats). With a snapshot (`in` reads
// the sampler's copy), a non-greedy row's tokens are first copied there from `args`, and their
// stats are those of the copy, which every later pass reads.
ChunkStats SnapshotChunkStats(const SampleArgs& args, const SampleArgs& in, int64_t row,
                              int64_t begin, int64_t n, const RowParams& p) {
  if (in.logits == args.logits || p.temperature < kGreedyTemperature) {
    return cpu_fast_internal::ComputeChunkStats(args, row, begin, n, p);
  }
  const int64_t size = DTypeSize(args.dtype);
  std::memcpy(
      static_cast<unsigned char*>(const_cast<void*>(in.logits)) +
          (row * in.row_stride + begin) * size,
      static_cast<const unsigned char*>(args.logits) + (row * args.row_stride + begin) * size,
      static_cast<size_t>(n * size));
  return cpu_fast_internal::ComputeChunkStats(in, row, begin, n, p);
}

// Adds the wall time since the last mark to a field of PhaseTimes, when there is one.
class PhaseClock {
 public:
  explicit PhaseClock(PhaseTimes* times) : times_(times) {
    if (times_ == nullptr) return;
    ++times_->calls;
    last_ = std::chrono::steady_clock::now();
  }
  void Mark(int64_t PhaseTimes::*field) { Mark(field, nullptr); }
  // Adds the time to `part` as well (a part of the phase `field`), when it is not null.
  void Mark(int64_t PhaseTimes::*field, int64_t PhaseTimes::*part) {
    if (times_ == nullptr) return;
    const auto now = std::chrono::steady_clock::now();
    const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now - last_).count();
    times_->*field += ns;
    if (part != nullptr) times_->*part += ns;
    last_ = now;
  }

 private:
  PhaseTimes* const times_;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace

bool FastCpuSampler::Impl::Sample(const SampleArgs& caller_args) {
  failed.store(false);
  if (caller_args.batch <= 0) return true;
  // Logprobs and logits processors: the oracle's rows (the fast passes read raw logits; the
  // oracle reads each row once, into its own buffer).
  if (caller_args.top_logprobs >= 0 || caller_args.allowed_bitmask != nullptr ||
      caller_args.adjusts != nullptr) {
    return SampleWithLogprobs(caller_args);
  }
  PhaseClock clock(phase_times);
  // `args`: what every pass after the first reads (the snapshot, when there is one).
  SampleArgs args = caller_args;
  if (snapshot_logits) {
    const size_t bytes = static_cast<size_t>(args.batch * args.vocab * DTypeSize(args.dtype));
    if (snapshot.size() < bytes) snapshot.resize(bytes);
    args.logits = snapshot.data();
    args.row_stride = args.vocab;
  }
  const int64_t batch = args.batch;
  // Stats pieces: kChunk tokens, or a quarter of that when rows are cut over the threads (19
  // chunks of a V = 151,936 row leave one thread of 8 three where the mean is 2.4).
  const int64_t piece = batch < pool.threads() ? kChunk / 4 : kChunk;
  chunks = (args.vocab + piece - 1) / piece;
  if (static_cast<int64_t>(stats.size()) < batch * chunks) stats.resize(batch * chunks);
  while (static_cast<int64_t>(rows.size()) < batch) rows.push_back(std::make_unique<RowState>());
  for (int64_t row = 0; row < batch; ++row) {
    RowState& r = *rows[row];
    r.p = args.params[args.params_count == 1 ? 0 : row];
    if (cpu_fast_internal::WantsWindowSample(r.p, args.vocab)) {
      r.window_sample.resize(cpu_fast_internal::kWindowSample);
    } else {
      r.window_sample.clear();
    }
  }

  // 1. Stats; greedy rows end here.
  if (!Run(batch * chunks, [&](int64_t i) {
        const int64_t row = i / chunks;
        const int64_t begin = i % chunks * piece;
        const int64_t n = std::min(piece, args.vocab - begin);
        stats[i] = SnapshotChunkStats(caller_args, args, row, begin, n, rows[row]->p);
        // NarrowMassWindow's sample, from the tokens this task just read (from `args`: the
        // snapshot, when there is one, as every later pass).
        if (!rows[row]->window_sample.empty()) {
          cpu_fast_internal::SampleForWindow(args, row, begin, n, *rows[row]);
        }
      })) {
    return false;
  }
  selecting.clear();
  plain.clear();
  for (int64_t row = 0; row < batch; ++row) {
    RowState& r = *rows[row];
    cpu_fast_internal::Decide(args, &stats[row * chunks], chunks, r);
    if (r.plan == Plan::kSelect) {
      cpu_fast_internal::StartStage(gather_cap, r);
      selecting.push_back(row);
    }
    if (r.plan == Plan::kInverseCdf) {
      cpu_fast_internal::StartInverseCdf(r);
      plain.push_back(row);
    }
  }

  clock.Mark(&PhaseTimes::stats_ns);

  // 2. Select: histogram and gather passes until every filtered row has its thresholds (at
  // most 4 histogram passes per stage: 32 key bits, 10 per pass). A top-p stage's grid pass
  // first narrows its exact bins to where a sample puts the boundary (one row per task; at
  // B = 1 on the calling thread, no barrier).
  if (!Run(static_cast<int64_t>(selecting.size()), [&](int64_t i) {
        cpu_fast_internal::NarrowMassWindow(args, selecting[i], *rows[selecting[i]]);
      })) {
    return false;
  }
  clock.Mark(&PhaseTimes::select_ns, &PhaseTimes::window_ns);
  while (!selecting.empty()) {
    const bool histogram = std::any_of(selecting.begin(), selecting.end(), [&](int64_t row) {
      return rows[row]->pass != Pass::kGather;
    });
    if (!RunChunks(selecting, args.vocab, [&](int64_t row, int64_t t0, int64_t t1) {
          RowState& r = *rows[row];
          if (r.pass == Pass::kGather) return cpu_fast_internal::Gather(args, row, t0, t1, r);
          cpu_fast_internal::Histogram(args, row, t0, t1, r);
        })) {
      return false;
    }
    clock.Mark(&PhaseTimes::select_ns,
               histogram ? &PhaseTimes::histogram_ns : &PhaseTimes::gather_ns);
    if (!Run(static_cast<int64_t>(selecting.size()),
             [&](int64_t i) { cpu_fast_internal::Advance(gather_cap, *rows[selecting[i]]); })) {
      return false;
    }
    clock.Mark(&PhaseTimes::select_ns, &PhaseTimes::advance_ns);
    size_t kept = 0;
    for (int64_t row : selecting) {
      if (rows[row]->plan == Plan::kSelect) selecting[kept++] = row;
    }
    selecting.resize(kept);
  }

  // 3. Draw. Plain-temperature and top-p-alone rows: piece masses over every task range; the
  // task that completes a row finds its token (or hands the row to the oracle's draw), so no
  // second loop.
  for (int64_t row = 0; row < batch; ++row) {
    if (rows[row]->plan != Plan::kChunkedDraw) continue;
    cpu_fast_internal::StartChunkedDraw(*rows[row]);
    plain.push_back(row);
  }
  if (!RunChunks(plain, args.vocab, [&](int64_t row, int64_t t0, int64_t t1) {
        RowState& r = *rows[row];
        const bool chunked = r.plan == Plan::kChunkedDraw;
        if (!(chunked ? cpu_fast_internal::ChunkedMassPieces(args, row, t0, t1, r)
                      : cpu_fast_internal::MassPieces(args, row, t0, t1, r))) {
          return;
        }
        const bool oracle =
            chunked ? cpu_fast_internal::FinishChunkedDraw(args, row, inverse_cdf_extra_margin, r)
                    : cpu_fast_internal::FinishInverseCdf(args, row, inverse_cdf_extra_margin, r);
        if (oracle) inverse_cdf_fallbacks.fetch_add(1, std::memory_order_relaxed);
      })) {
    return false;
  }
  // Rows left to draw by Gumbel-max over the whole row.
  drawn.clear();
  for (int64_t row = 0; row < batch; ++row) {
    const Plan plan = rows[row]->plan;
    if (plan == Plan::kDraw || plan == Plan::kTopTiesDraw) drawn.push_back(row);
  }
  if (!RunChunks(drawn, args.vocab, [&](int64_t row, int64_t t0, int64_t t1) {
        cpu_fast_internal::DrawChunks(args, row, t0, t1, *rows[row]);
      })) {
    return false;
  }

  clock.Mark(&PhaseTimes::draw_ns);

  // Outputs (under the guard too: they may live in shared memory).
  const bool written = Run(1, [&](int64_t) {
    for (int64_t row = 0; row < batch; ++row) {
      RowState& r = *rows[row];
      if (r.plan == Plan::kDraw || r.plan == Plan::kTopTiesDraw) {
        r.token = static_cast<int32_t>(r.best_id);
      }
      args.token_ids[row] = r.status == RowStatus::kOk ? r.token : -1;
      args.status[row] = r.status;
    }
  });
  clock.Mark(&PhaseTimes::output_ns);
  return written;
}

FastCpuSampler::FastCpuSampler(const Options& options) : impl_(std::make_unique<Impl>(options)) {}

FastCpuSampler::~FastCpuSampler() = default;

int FastCpuSampler::threads() const { return impl_->pool.threads(); }

int64_t FastCpuSampler::inverse_cdf_fallbacks() const {
  return impl_->inverse_cdf_fallbacks.load(std::memory_order_relaxed);
}

bool FastCpuSampler::Sample(const SampleArgs& args) { return impl_->Sample(args); }

}  // namespace samplerd::kernels
