// A fast multi-threaded CPU sampler with exactly the semantics of kernels/cpu (the oracle).
//
// FastCpuSampler samples a whole batch with persistent worker threads. Rows are cut into fixed
// chunks of the vocabulary; every phase runs over (row, chunk) tasks when B < threads, so one
// row spreads over all threads, and over whole rows otherwise. Its cost per row is a bounded
// number of passes over the row for any distribution (top-k / top-p boundaries by radix
// selection, never a sort of more than Options::gather_cap tokens). Nothing a row
// decides depends on B, the thread count or which thread ran which chunk (batch invariance):
// reductions are exact (max, counts, integer-quantised masses) or over a total order, and the
// double mass sums of plain-temperature rows only ever decide a token they provably share with
// the oracle.
//
// Differences from CpuSampleRows: none in the token for greedy rows, for plain-temperature rows
// (temperature alone: the inverse-CDF draw of kernels/common/inverse_cdf.h; when the fast sums
// cannot prove the oracle's token, ~1e-5 of rows or fewer, the row is drawn by the oracle's own
// InverseCdfDraw) and for filters decided by counts (min-p, top-k), nor for top-p when
// TOP_K_FIRST top-k leaves <= gather_cap tokens (then the oracle's own double sums are used).
// Otherwise top-p masses are exp(z - mx) (within 2 ulp) quantised to 2^-62 and summed exactly,
// so a row whose top-p boundary sits within a rounding error (~1e-13 of the total) of a token's
// cumulative mass may keep one token more or less. Logprobs (top_logprobs >= 0) are computed by
// the oracle for the rows that ask; a batch with logits processors (allowed_bitmask or adjusts)
// is sampled by the oracle, row by row.
#ifndef SAMPLERD_KERNELS_CPU_FAST_FAST_CPU_SAMPLER_H_
#define SAMPLERD_KERNELS_CPU_FAST_FAST_CPU_SAMPLER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "kernels/common/sampling_types.h"

namespace samplerd::kernels {

// Wall nanoseconds of FastCpuSampler::Sample's phases, summed over calls (Options::phase_times).
struct PhaseTimes {
  int64_t calls = 0;
  int64_t stats_ns = 0;      // 1. the stats pass (with the snapshot's copy) and each row's plan
  int64_t select_ns = 0;     // 2. top-k / top-p thresholds: the sum of the next four
  int64_t window_ns = 0;     //    the top-p window's sample (NarrowMassWindow)
  int64_t histogram_ns = 0;  //    passes in which some row bins its tokens
  int64_t gather_ns = 0;     //    passes in which every row gathers
  int64_t advance_ns = 0;    //    Advance after each pass (boundary bins, gathered sorts)
  int64_t draw_ns = 0;       // 3. plain-temperature rows, then the Gumbel-max draws
  int64_t output_ns = 0;     // tokens and statuses written
  int64_t loops = 0;         // pool loops that ran on the workers (each ends in a barrier)
};

class FastCpuSampler {
 public:
  // Runs `task` and returns true, or returns false when the task faulted (for example a bus
  // error reading memory another process truncated) and was abandoned part-way. A task
  // touches only the sampler's own scratch besides the inputs and outputs of SampleArgs.
  using TaskGuard = std::function<bool(const std::function<void()>& task)>;

  struct Options {
    int threads = 1;    // >= 1, the calling thread included
    int spin_us = 200;  // how long idle workers spin before they block
    TaskGuard guard;    // null: tasks run unguarded
    // A top-k / top-p boundary is found by histogram passes until at most this many tokens lie
    // at or above its bin; those are then gathered and finished in one thread. Tests lower it
    // to drive every path on small rows.
    int gather_cap = 1024;
    // Plain-temperature and top-p-alone rows: added to the proven margins of the inverse-CDF
    // draws, as a fraction of the total mass. Tests raise it (>= 1 sends every such row to the
    // oracle's InverseCdfDraw / ChunkedInverseCdfDraw) to drive the fallback; 0 in production.
    double inverse_cdf_extra_margin = 0.0;
    // Copy each non-greedy row's logits into the sampler's own memory as the first pass reads
    // them, and run every later pass on the copy. For logits another process may write while a
    // call runs (a device session's host shm): passes that saw different values would break
    // the invariants between them (a value above the row's max falls past the last histogram
    // bin). Greedy rows end with the first pass and are read in place. Costs batch x vocab
    // elements of memory, kept between calls.
    bool snapshot_logits = false;
    // Where a call's time goes (benchmarks): non-null, each Sample adds its phases' wall time
    // here. The caller owns it and reads it between calls.
    struct PhaseTimes* phase_times = nullptr;
    // Bytes of the snapshot (and of the oracle's guarded copies) allocated by the constructor,
    // so that a call at up to that size never allocates it: a caller that knows its largest
    // batch x vocab (a device session) learns at construction, as std::bad_alloc, that the
    // memory is not there, instead of from a call on its own thread. Reserved, not touched.
    size_t snapshot_reserve_bytes = 0;
  };

  explicit FastCpuSampler(const Options& options);
  ~FastCpuSampler();
  FastCpuSampler(const FastCpuSampler&) = delete;
  FastCpuSampler& operator=(const FastCpuSampler&) = delete;

  int threads() const;

  // Plain-temperature and top-p-alone rows whose token came from the oracle's InverseCdfDraw or
  // ChunkedInverseCdfDraw (the fast sums were within their margin of a boundary) since
  // construction. Thread-safe.
  int64_t inverse_cdf_fallbacks() const;

  // Samples every row of `args` (host memory, validated as for CpuSampleRows) and writes the
  // outputs. Returns false when a guarded task faulted: the outputs are then unspecified.
  // One call at a time.
  bool Sample(const SampleArgs& args);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace samplerd::kernels

#endif  // SAMPLERD_KERNELS_CPU_FAST_FAST_CPU_SAMPLER_H_
