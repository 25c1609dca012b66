#include "service/core/backend/cpu_sampler.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_sampler.h"
#include "service/core/backend/guarded_copy.h"
#include "service/core/model/status_macros.h"
#include "service/core/model/validated_batch.h"

namespace samplerd::core {
namespace {

// `args` narrowed to its rows [first, first + count): every per-row pointer moved to row
// `first` (the kernel indexes them all by row), the logits left to the caller. The adjust
// offsets index the whole `adjusts` array, so they move and it stays.
kernels::SampleArgs RowsOf(const kernels::SampleArgs& args, int64_t first, int64_t count) {
  kernels::SampleArgs rows = args;
  rows.batch = count;
  if (args.params_count != 1) {
    rows.params += first;
    rows.params_count = count;
  }
  rows.token_ids += first;
  rows.status += first;
  if (rows.sampled_logprob != nullptr) rows.sampled_logprob += first;
  if (rows.sampled_rank != nullptr) rows.sampled_rank += first;
  if (args.top_logprobs > 0) {
    if (rows.top_ids != nullptr) rows.top_ids += first * args.top_logprobs;
    if (rows.top_values != nullptr) rows.top_values += first * args.top_logprobs;
  }
  if (rows.allowed_bitmask != nullptr) rows.allowed_bitmask += first * args.bitmask_words;
  if (rows.adjust_offsets != nullptr) rows.adjust_offsets += first;
  return rows;
}

// Copies `count` rows of `row_bytes`, `stride_bytes` apart at `src` (host shm), densely to
// `dst`: dense rows in one copy, strided ones row by row (the gaps are never read). False when
// the object shrank under the copy (GuardedCopy).
bool CopyRows(char* dst, const char* src, int64_t count, size_t row_bytes, size_t stride_bytes) {
  if (stride_bytes == row_bytes) {
    return GuardedCopy(dst, src, static_cast<size_t>(count) * row_bytes);
  }
  for (int64_t r = 0; r < count; ++r) {
    if (!GuardedCopy(dst + static_cast<size_t>(r) * row_bytes,
                     src + static_cast<size_t>(r) * stride_bytes, row_bytes)) {
      return false;
    }
  }
  return true;
}

}  // namespace

CpuSampler::CpuSampler(int threads, size_t shm_block_bytes)
    : pool_(threads), threads_(std::max(threads, 1)), shm_block_bytes_(shm_block_bytes) {
  device_.ordinal = 0;
  device_.uuid = "cpu";
  device_.name = "CPU";
}

absl::Status CpuSampler::Sample(const ValidatedBatch& batch, const SampleIo& io,
                                SampleResult* result) {
  if (io.logits_on_device || io.output_on_device || io.bitmask_on_device ||
      io.ready_event != nullptr || io.done_event != nullptr) {
    return absl::UnimplementedError(
        "expected host memory for the CPU backend, got device memory or IPC events");
  }
  const uint32_t* bitmask = nullptr;
  if (batch.bitmask_words > 0) {
    // Shm words are copied (GuardedCopy) like the logits; inline bytes only when unaligned.
    const size_t bytes = static_cast<size_t>(batch.batch * batch.bitmask_words) * 4;
    if (io.bitmask_in_shm || reinterpret_cast<uintptr_t>(io.bitmask) % alignof(uint32_t) != 0) {
      bitmask_copy_.resize(bytes / 4);
      if (!io.bitmask_in_shm) {
        std::memcpy(bitmask_copy_.data(), io.bitmask, bytes);
      } else if (!GuardedCopy(bitmask_copy_.data(), io.bitmask, bytes)) {
        return ShrunkShmError("the token_bitmask region");
      }
      bitmask = bitmask_copy_.data();
    } else {
      bitmask = static_cast<const uint32_t*>(io.bitmask);
    }
  }
  const int64_t b = batch.batch;
  const int32_t n = batch.top_logprobs;
  result->token_ids.assign(b, -1);
  result->row_status.assign(b, kernels::RowStatus::kOk);
  std::vector<float> sampled_logprob;
  std::vector<int64_t> sampled_rank;
  std::vector<int32_t> top_ids;
  std::vector<float> top_values;

  kernels::SampleArgs args;
  args.logits = io.logits;
  args.dtype = batch.dtype;
  args.batch = b;
  args.vocab = batch.vocab;
  args.row_stride = batch.row_stride;
  args.params = batch.params.data();
  args.params_count = static_cast<int64_t>(batch.params.size());
  args.top_logprobs = n;
  args.logprob_source = batch.logprob_source;
  args.allowed_bitmask = bitmask;
  args.bitmask_words = batch.bitmask_words;
  if (!batch.adjusts.empty()) {
    args.adjusts = batch.adjusts.data();
    args.adjust_offsets = batch.adjust_offsets.data();
  }
  args.token_ids = result->token_ids.data();
  args.status = result->row_status.data();
  if (n >= 0) {
    sampled_logprob.resize(b);
    sampled_rank.resize(b);
    top_ids.resize(b * n);
    top_values.resize(b * n);
    args.sampled_logprob = sampled_logprob.data();
    args.sampled_rank = sampled_rank.data();
    args.top_ids = top_ids.data();
    args.top_values = top_values.data();
  }

  if (!io.logits_in_shm) {
    RETURN_IF_ERROR(SampleRows(args, io.cancel));
  } else {
    // Host shm logits are sampled from a private copy (a truncated object must not fault the
    // worker threads), made a block of rows at a time and each row's V elements only: the copy
    // stays within max(shm_block_bytes_, a row per thread) whatever B and the row stride are.
    // The whole B x row_stride span used to be copied at once: a valid [4096, 16] request with
    // row_stride 64Mi over a sparse 1 TiB object allocated 1 TiB and aborted the server.
    const size_t elem = static_cast<size_t>(kernels::DTypeSize(batch.dtype));
    const size_t row_bytes = static_cast<size_t>(batch.vocab) * elem;
    const int64_t block_rows = std::min<int64_t>(
        b, std::max<int64_t>(threads_, static_cast<int64_t>(shm_block_bytes_ / row_bytes)));
    const size_t block_bytes = static_cast<size_t>(block_rows) * row_bytes;
    if (shm_copy_bytes_ < block_bytes) {
      shm_copy_.reset(new char[block_bytes]);
      shm_copy_bytes_ = block_bytes;
    }
    const auto* src = static_cast<const char*>(io.logits);
    const size_t stride_bytes = static_cast<size_t>(batch.row_stride) * elem;
    for (int64_t first = 0; first < b; first += block_rows) {
      const int64_t count = std::min(block_rows, b - first);
      if (!CopyRows(shm_copy_.get(), src + static_cast<size_t>(first) * stride_bytes, count,
                    row_bytes, stride_bytes)) {
        return ShrunkShmError("the logits region");
      }
      kernels::SampleArgs block = RowsOf(args, first, count);
      block.logits = shm_copy_.get();
      block.row_stride = batch.vocab;
      RETURN_IF_ERROR(SampleRows(block, io.cancel));
    }
  }

  if (n >= 0) {
    result->logprobs.resize(b);
    for (int64_t r = 0; r < b; ++r) {
      RowLogprobs& lp = result->logprobs[r];
      lp.sampled_logprob = sampled_logprob[r];
      lp.sampled_rank = sampled_rank[r];
      lp.top_ids.assign(top_ids.begin() + r * n, top_ids.begin() + (r + 1) * n);
      lp.top_values.assign(top_values.begin() + r * n, top_values.begin() + (r + 1) * n);
    }
  }
  if (io.output != nullptr) {
    // Host outputs are host shm regions, which their owner may truncate under us.
    if (!GuardedCopy(io.output, result->token_ids.data(),
                     result->token_ids.size() * sizeof(int32_t))) {
      return ShrunkShmError("the output region");
    }
  }
  return absl::OkStatus();
}

absl::Status CpuSampler::SampleRows(const kernels::SampleArgs& args,
                                    const std::atomic<bool>* cancel) {
  // One row costs O(V log V); a row per chunk keeps the cores busy even at B = 2. The rows check
  // `cancel` one by one, so a drain gives up the batch within one row per thread (issue 12: a
  // B = 400, V = 151,936 batch used to hold the process 8 s past its grace period).
  std::atomic<bool> stopped{false};
  pool_.ParallelFor(args.batch, 1, [&args, cancel, &stopped](int64_t begin, int64_t end) {
    if (!kernels::CpuSampleRows(args, begin, end, cancel)) {
      stopped.store(true, std::memory_order_relaxed);
    }
  });
  if (stopped.load(std::memory_order_relaxed)) {
    return absl::CancelledError("expected to sample every row, got a drain that stopped the batch");
  }
  return absl::OkStatus();
}

}  // namespace samplerd::core
