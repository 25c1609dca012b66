// A C ABI over the GPU sampler for the kernel benchmark (bench_kernels.py loads it with ctypes
// and calls it on PyTorch tensors, so ours and the PyTorch baseline read the same memory in
// the same process). Not part of the server.
#include <cstdint>
#include <vector>

#include "kernels/common/sampling_types.h"
#include "kernels/gpu/runtime.h"
#include "kernels/gpu/sample.h"

using samplerd::kernels::DType;
using samplerd::kernels::RowParams;
using samplerd::kernels::RowStatus;
using samplerd::kernels::SampleArgs;
using samplerd::kernels::TokenAdjust;
using samplerd::kernels::TopPMode;
namespace gpu = samplerd::kernels::gpu;

extern "C" {

// Device bytes of one RowParams (the params buffer holds `batch` of them).
int64_t samplerd_row_params_bytes() { return sizeof(RowParams); }

size_t samplerd_workspace_bytes(int64_t batch, int64_t vocab, int32_t top_logprobs) {
  return gpu::SampleWorkspaceBytes(batch, vocab, top_logprobs);
}

// Writes `batch` RowParams from host arrays into device memory at `device_params`.
int samplerd_write_params(int64_t batch, const float* temperature, const int32_t* top_k,
                          const float* top_p, const float* min_p, const uint8_t* joint,
                          const uint64_t* seed, const uint64_t* position, void* device_params) {
  std::vector<RowParams> params(batch);
  for (int64_t i = 0; i < batch; ++i) {
    params[i].temperature = temperature[i];
    params[i].top_k = top_k[i];
    params[i].top_p = top_p[i];
    params[i].min_p = min_p[i];
    params[i].top_p_mode = joint[i] ? TopPMode::kJoint : TopPMode::kTopKFirst;
    params[i].seed = seed[i];
    params[i].position = position[i];
  }
  int err =
      gpu::CopyToDevice(device_params, params.data(), params.size() * sizeof(RowParams), nullptr);
  if (err == 0) err = gpu::StreamSynchronize(nullptr);
  return err;
}

// The bit of `hints` (below) that sets SampleArgs::all_greedy; a library without this function
// reads any nonzero `hints` as top_p_rows alone.
int samplerd_all_greedy_hint() { return 2; }

// Samples a dense [batch, vocab] tensor (dtype 0 fp32, 1 fp16, 2 bf16) on `stream`; all
// pointers are device memory. `hints`: bit 0 SampleArgs::top_p_rows, bit 1 all_greedy (the
// server passes HasTopPRows and AllGreedy of its host params). The workspace is zero-filled
// before its first use (sample.h). Returns the runtime error code (0 = success).
// Bytes of one TokenAdjust: int32 token, then float bias, repetition and penalty.
int64_t samplerd_token_adjust_bytes() { return sizeof(TokenAdjust); }

// samplerd_sample with logits processors (device memory, each may be null): the allowed-token
// bitmask [batch, ceil(vocab / 32)] and the adjusts with their batch + 1 row offsets.
int samplerd_sample_processed(const void* logits, int dtype, int64_t batch, int64_t vocab,
                              const void* device_params, int32_t* token_ids, uint8_t* status,
                              void* workspace, size_t workspace_bytes, void* stream, int hints,
                              const uint32_t* bitmask, const uint32_t* adjust_offsets,
                              const void* adjusts) {
  SampleArgs args;
  args.logits = logits;
  args.dtype = static_cast<DType>(dtype);
  args.batch = batch;
  args.vocab = vocab;
  args.row_stride = vocab;
  args.params = static_cast<const RowParams*>(device_params);
  args.params_count = batch;
  args.token_ids = token_ids;
  args.status = reinterpret_cast<RowStatus*>(status);
  args.top_p_rows = (hints & 1) != 0;
  args.all_greedy = (hints & 2) != 0;
  if (bitmask != nullptr) {
    args.allowed_bitmask = bitmask;
    args.bitmask_words = (vocab + 31) / 32;
  }
  if (adjusts != nullptr) {
    args.adjust_offsets = adjust_offsets;
    args.adjusts = static_cast<const TokenAdjust*>(adjusts);
  }
  return gpu::Sample(args, workspace, workspace_bytes, stream);
}

int samplerd_sample(const void* logits, int dtype, int64_t batch, int64_t vocab,
                    const void* device_params, int32_t* token_ids, uint8_t* status, void* workspace,
                    size_t workspace_bytes, void* stream, int hints) {
  return samplerd_sample_processed(logits, dtype, batch, vocab, device_params, token_ids, status,
                                   workspace, workspace_bytes, stream, hints, nullptr, nullptr,
                                   nullptr);
}

const char* samplerd_error_string(int code) { return gpu::ErrorString(code); }

}  // extern "C"
