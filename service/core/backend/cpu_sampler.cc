#include "service/core/backend/cpu_sampler.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_sampler.h"
#include "service/core/backend/guarded_copy.h"
#include "service/core/model/validated_batch.h"

namespace samplerd::core {

CpuSampler::CpuSampler(int threads) : pool_(threads) {
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
  const void* host_logits = io.logits;
  if (io.logits_in_shm) {
    // Sample from a private copy: a truncated object must not fault the worker threads.
    const size_t bytes =
        static_cast<size_t>(InlineBytes(batch.dtype, batch.batch, batch.vocab, batch.row_stride));
    if (shm_copy_bytes_ < bytes) {
      shm_copy_.reset(new char[bytes]);
      shm_copy_bytes_ = bytes;
    }
    if (!GuardedCopy(shm_copy_.get(), io.logits, bytes)) {
      return ShrunkShmError("the logits region");
    }
    host_logits = shm_copy_.get();
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
  args.logits = host_logits;
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

  // One row costs O(V log V); a row per chunk keeps the cores busy even at B = 2. The rows check
  // io.cancel one by one, so a drain gives up the batch within one row per thread (issue 12: a
  // B = 400, V = 151,936 batch used to hold the process 8 s past its grace period).
  std::atomic<bool> stopped{false};
  pool_.ParallelFor(b, 1, [&args, &io, &stopped](int64_t begin, int64_t end) {
    if (!kernels::CpuSampleRows(args, begin, end, io.cancel)) {
      stopped.store(true, std::memory_order_relaxed);
    }
  });
  if (stopped.load(std::memory_order_relaxed)) {
    return absl::CancelledError("expected to sample every row, got a drain that stopped the batch");
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

}  // namespace samplerd::core
