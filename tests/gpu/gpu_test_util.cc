#include "tests/gpu/gpu_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_sampler.h"
#include "kernels/cpu/half_float.h"
#include "kernels/gpu/runtime.h"
#include "kernels/gpu/sample.h"

namespace samplerd::kernels::testing {
namespace {

uint16_t FloatToBf16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

uint16_t FloatToHalf(float v) {
  const _Float16 h = static_cast<_Float16>(v);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}

// Device buffer freed at scope exit.
struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) {
    if (bytes > 0) {
      EXPECT_EQ(gpu::DeviceMalloc(&ptr, bytes), 0) << bytes << " bytes";
    }
  }
  ~DeviceBuffer() {
    if (ptr != nullptr) gpu::DeviceFree(ptr);
  }
};

template <typename T>
void Upload(const std::vector<T>& v, DeviceBuffer& d, gpu::Stream s) {
  if (!v.empty()) {
    ASSERT_EQ(gpu::CopyToDevice(d.ptr, v.data(), v.size() * sizeof(T), s), 0);
  }
}

template <typename T>
void Download(DeviceBuffer& d, std::vector<T>& v, gpu::Stream s) {
  if (!v.empty()) {
    ASSERT_EQ(gpu::CopyToHost(v.data(), d.ptr, v.size() * sizeof(T), s), 0);
  }
}

}  // namespace

void StoreValue(DType dtype, float v, uint8_t* out) {
  switch (dtype) {
    case DType::kFp32:
      std::memcpy(out, &v, 4);
      return;
    case DType::kBf16: {
      const uint16_t h = FloatToBf16(v);
      std::memcpy(out, &h, 2);
      return;
    }
    case DType::kFp16: {
      const uint16_t h = FloatToHalf(v);
      std::memcpy(out, &h, 2);
      return;
    }
  }
}

float LoadValue(DType dtype, const uint8_t* row, int64_t i) {
  if (dtype == DType::kFp32) {
    float v;
    std::memcpy(&v, row + i * 4, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, row + i * 2, 2);
  return dtype == DType::kBf16 ? Bf16BitsToFloat(h) : HalfBitsToFloat(h);
}

void FillLogits(Batch& b, const std::string& kind, std::mt19937_64& rng) {
  if (b.row_stride == 0) b.row_stride = b.vocab;
  const int64_t elem = DTypeSize(b.dtype);
  b.bytes.assign(static_cast<size_t>(b.batch * b.row_stride * elem), 0);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<int64_t> rank(static_cast<size_t>(b.vocab));
  for (int64_t r = 0; r < b.batch; ++r) {
    const int64_t peak = static_cast<int64_t>(rng() % static_cast<uint64_t>(b.vocab));
    if (kind == "zipf") {  // token of rank q has logit -1.5 ln(1 + q): ranks shuffled
      for (int64_t j = 0; j < b.vocab; ++j) rank[j] = j;
      std::shuffle(rank.begin(), rank.end(), rng);
    }
    for (int64_t j = 0; j < b.vocab; ++j) {
      float v;
      if (kind == "peaked") {
        v = normal(rng) + (j == peak ? 12.0f : 0.0f);
      } else if (kind == "zipf") {
        v = -1.5f * std::log1p(static_cast<float>(rank[j])) + 0.1f * normal(rng);
      } else if (kind == "flat") {
        v = 0.25f;
      } else if (kind == "engine") {  // a random-weight model's rows: top-p 0.95 keeps ~85%
        v = 0.6f * normal(rng);
      } else {
        v = 3.0f * normal(rng);
      }
      StoreValue(b.dtype, v, &b.bytes[(r * b.row_stride + j) * elem]);
    }
  }
}

static void AllocateOutputs(const Batch& b, Outputs& o) {
  o.tokens.assign(b.batch, -2);
  o.status.assign(b.batch, RowStatus::kOk);
  if (b.top_logprobs >= 0) {
    o.sampled_logprob.assign(b.batch, 0.0f);
    o.sampled_rank.assign(b.batch, -1);
    o.top_ids.assign(b.batch * b.top_logprobs, -2);
    o.top_values.assign(b.batch * b.top_logprobs, 0.0f);
  }
}

static SampleArgs ArgsFor(const Batch& b) {
  SampleArgs a;
  a.dtype = b.dtype;
  a.batch = b.batch;
  a.vocab = b.vocab;
  a.row_stride = b.row_stride == 0 ? b.vocab : b.row_stride;
  a.params_count = static_cast<int64_t>(b.params.size());
  a.top_logprobs = b.top_logprobs;
  a.logprob_source = b.source;
  if (!b.bitmask.empty()) a.bitmask_words = (b.vocab + 31) / 32;
  return a;
}

Outputs RunCpu(const Batch& b) {
  Outputs o;
  AllocateOutputs(b, o);
  SampleArgs a = ArgsFor(b);
  a.logits = b.bytes.data();
  a.params = b.params.data();
  if (!b.bitmask.empty()) a.allowed_bitmask = b.bitmask.data();
  if (!b.adjusts.empty()) {
    a.adjust_offsets = b.adjust_offsets.data();
    a.adjusts = b.adjusts.data();
  }
  a.token_ids = o.tokens.data();
  a.status = o.status.data();
  if (b.top_logprobs >= 0) {
    a.sampled_logprob = o.sampled_logprob.data();
    a.sampled_rank = o.sampled_rank.data();
    a.top_ids = o.top_ids.data();
    a.top_values = o.top_values.data();
  }
  CpuSampleRows(a, 0, b.batch);
  return o;
}

Outputs RunGpu(const Batch& b) {
  const size_t ws_bytes = gpu::SampleWorkspaceBytes(b.batch, b.vocab, b.top_logprobs);
  DeviceBuffer ws(ws_bytes);
  EXPECT_EQ(gpu::ZeroDevice(ws.ptr, ws_bytes, nullptr), 0);
  EXPECT_EQ(gpu::StreamSynchronize(nullptr), 0);
  return RunGpuIn(b, ws.ptr, ws_bytes);
}

Outputs RunGpuIn(const Batch& b, void* workspace, size_t workspace_bytes) {
  Outputs o;
  AllocateOutputs(b, o);
  gpu::Stream stream = nullptr;
  EXPECT_EQ(gpu::StreamCreate(&stream), 0);
  {
    SampleArgs a = ArgsFor(b);
    a.all_greedy = b.greedy_hint && gpu::AllGreedy(b.params.data(), a.params_count);
    DeviceBuffer logits(b.bytes.size()), params(b.params.size() * sizeof(RowParams));
    DeviceBuffer tokens(b.batch * 4), status(b.batch), lp(o.sampled_logprob.size() * 4),
        rank(o.sampled_rank.size() * 8), top_ids(o.top_ids.size() * 4),
        top_values(o.top_values.size() * 4);
    EXPECT_GE(workspace_bytes, gpu::SampleWorkspaceBytes(b.batch, b.vocab, b.top_logprobs));
    DeviceBuffer bitmask(b.bitmask.size() * 4), offsets(b.adjust_offsets.size() * 4),
        adjusts(b.adjusts.size() * sizeof(TokenAdjust));
    Upload(b.bytes, logits, stream);
    Upload(b.params, params, stream);
    a.logits = logits.ptr;
    a.params = static_cast<const RowParams*>(params.ptr);
    if (!b.bitmask.empty()) {
      Upload(b.bitmask, bitmask, stream);
      a.allowed_bitmask = static_cast<const uint32_t*>(bitmask.ptr);
    }
    if (!b.adjusts.empty()) {
      Upload(b.adjust_offsets, offsets, stream);
      Upload(b.adjusts, adjusts, stream);
      a.adjust_offsets = static_cast<const uint32_t*>(offsets.ptr);
      a.adjusts = static_cast<const TokenAdjust*>(adjusts.ptr);
    }
    a.token_ids = static_cast<int32_t*>(tokens.ptr);
    a.status = static_cast<RowStatus*>(status.ptr);
    a.sampled_logprob = static_cast<float*>(lp.ptr);
    a.sampled_rank = static_cast<int64_t*>(rank.ptr);
    a.top_ids = static_cast<int32_t*>(top_ids.ptr);
    a.top_values = static_cast<float*>(top_values.ptr);
    const int err = gpu::Sample(a, workspace, workspace_bytes, stream);
    EXPECT_EQ(err, 0) << gpu::ErrorString(err);
    Download(tokens, o.tokens, stream);
    Download(status, o.status, stream);
    Download(lp, o.sampled_logprob, stream);
    Download(rank, o.sampled_rank, stream);
    Download(top_ids, o.top_ids, stream);
    Download(top_values, o.top_values, stream);
    const int sync = gpu::StreamSynchronize(stream);
    EXPECT_EQ(sync, 0) << gpu::ErrorString(sync);
  }
  gpu::StreamDestroy(stream);
  return o;
}

RowParams Params(float temperature, int32_t top_k, float top_p, float min_p, TopPMode mode) {
  RowParams r;
  r.temperature = temperature;
  r.top_k = top_k;
  r.top_p = top_p;
  r.min_p = min_p;
  r.top_p_mode = mode;
  return r;
}

void SetParams(Batch& b, const RowParams& setting, std::mt19937_64& rng) {
  b.params.assign(b.batch, setting);
  for (auto& p : b.params) {
    p.seed = rng();
    p.position = rng() % 100000;
  }
}

void ExpectLogprobsMatch(const Outputs& gpu, const Outputs& cpu) {
  EXPECT_EQ(gpu.sampled_rank, cpu.sampled_rank);
  EXPECT_EQ(gpu.top_ids, cpu.top_ids);
  auto expect_near = [](const std::vector<float>& got, const std::vector<float>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      if (std::isinf(want[i])) {
        EXPECT_EQ(got[i], want[i]) << "entry " << i;
      } else {
        EXPECT_NEAR(got[i], want[i], 2e-4) << "entry " << i;
      }
    }
  };
  expect_near(gpu.sampled_logprob, cpu.sampled_logprob);
  expect_near(gpu.top_values, cpu.top_values);
}

bool HaveGpu(std::string* why) { return !gpu::ListDevices(why).empty(); }

}  // namespace samplerd::kernels::testing
