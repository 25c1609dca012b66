// Logit-bias lists and token histories packed in registered regions (processors.proto:
// LogitBias.region, TokenHistory.region): a host shm slice gives the same tokens and logprobs as
// the same lists inline on the CPU backend; every malformed slice gets its exact status, and the
// core keeps serving; a GPU IPC slice is copied through the GpuIpc after the ready event, on the
// executor thread (SampleAsync, called on a gRPC thread, never waits for that copy).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "service/core/backend/cpu_sampler.h"
#include "service/core/sampler_core.h"
#include "tests/core/fake_gpu_ipc.h"
#include "tests/core/shm_test_util.h"
#include "tests/core/test_util.h"

namespace samplerd::core {
namespace {

// Appends the little-endian bytes of `values` to `out`.
template <typename T>
void Put(const std::vector<T>& values, std::vector<uint8_t>* out) {
  const size_t at = out->size();
  out->resize(at + values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(out->data() + at, values.data(), values.size() * sizeof(T));
}

LogitBiasSpec Bias(std::vector<uint32_t> offsets, std::vector<int32_t> ids,
                   std::vector<float> biases) {
  LogitBiasSpec bias;
  bias.row_offsets = std::move(offsets);
  bias.token_ids = std::move(ids);
  bias.biases = std::move(biases);
  return bias;
}

TokenHistorySpec History(std::vector<uint32_t> offsets, std::vector<int32_t> ids,
                         std::vector<uint32_t> counts, std::vector<uint8_t> in_prompt) {
  TokenHistorySpec history;
  history.row_offsets = std::move(offsets);
  history.token_ids = std::move(ids);
  history.output_counts = std::move(counts);
  history.in_prompt = std::move(in_prompt);
  return history;
}

// The packed layouts of processors.proto.
std::vector<uint8_t> Pack(const LogitBiasSpec& bias) {
  std::vector<uint8_t> out;
  Put(bias.row_offsets, &out);
  Put(bias.token_ids, &out);
  Put(bias.biases, &out);
  return out;
}

std::vector<uint8_t> Pack(const TokenHistorySpec& history) {
  std::vector<uint8_t> out;
  Put(history.row_offsets, &out);
  Put(history.token_ids, &out);
  Put(history.output_counts, &out);
  Put(history.in_prompt, &out);
  return out;
}

// Random distinct tokens per row: up to `max_per_row` of [0, vocab).
std::vector<std::vector<int32_t>> RandomRows(int64_t batch, int64_t vocab, int max_per_row,
                                             std::mt19937* rng) {
  std::vector<std::vector<int32_t>> rows(batch);
  std::vector<int32_t> all(vocab);
  for (int32_t t = 0; t < vocab; ++t) all[t] = t;
  for (auto& row : rows) {
    std::shuffle(all.begin(), all.end(), *rng);
    row.assign(all.begin(), all.begin() + (*rng)() % (max_per_row + 1));
  }
  return rows;
}

LogitBiasSpec RandomBias(int64_t batch, int64_t vocab, std::mt19937* rng) {
  LogitBiasSpec bias;
  std::normal_distribution<float> normal(0.0f, 4.0f);
  bias.row_offsets.push_back(0);
  for (const auto& row : RandomRows(batch, vocab, 40, rng)) {
    for (int32_t t : row) {
      bias.token_ids.push_back(t);
      bias.biases.push_back(normal(*rng));
    }
    bias.row_offsets.push_back(static_cast<uint32_t>(bias.token_ids.size()));
  }
  return bias;
}

TokenHistorySpec RandomHistory(int64_t batch, int64_t vocab, std::mt19937* rng) {
  TokenHistorySpec history;
  history.row_offsets.push_back(0);
  for (const auto& row : RandomRows(batch, vocab, 60, rng)) {
    for (int32_t t : row) {
      history.token_ids.push_back(t);
      history.output_counts.push_back((*rng)() % 4);
      history.in_prompt.push_back((*rng)() % 2);
    }
    history.row_offsets.push_back(static_cast<uint32_t>(history.token_ids.size()));
  }
  return history;
}

// fp32 [batch, vocab] logits from a fixed seed, as inline bytes.
std::string RandomLogitBytes(int64_t batch, int64_t vocab, uint32_t seed) {
  std::vector<float> v(batch * vocab);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (float& x : v) x = normal(rng);
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

// A CPU core with one host shm region "lists" of 64 KiB.
class ListsInShm : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(shm_.ok());
    core_ = std::make_unique<SamplerCore>(CoreOptions{}, std::make_unique<CpuSampler>(1),
                                          /*seed_start=*/1);
    ASSERT_TRUE(core_->regions().RegisterHostShm("lists", shm_.key(), 0, shm_.size()).ok());
  }

  // A request over [batch, vocab] inline logits (kept in logits_), seeded per row, with
  // penalties and processed top-5 logprobs.
  SampleRequest Request(int64_t batch, int64_t vocab) {
    logits_ = RandomLogitBytes(batch, vocab, 21);
    SampleRequest r;
    r.dtype = kernels::DType::kFp32;
    r.shape = {batch, vocab};
    r.inline_data = logits_;
    r.has_inline_data = true;
    ParamsSpec p;
    p.top_p = 0.9f;
    p.repetition_penalty = 1.3f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    r.params = {p};
    for (int64_t i = 0; i < batch; ++i) r.row_seeds.push_back(100 + i);
    r.logprobs = LogprobSpec{5, kernels::LogprobSource::kProcessed};
    return r;
  }

  // Writes `bytes` into the region at `offset`.
  void Write(const std::vector<uint8_t>& bytes, uint64_t offset) {
    ASSERT_LE(offset + bytes.size(), shm_.size());
    std::memcpy(shm_.data() + offset, bytes.data(), bytes.size());
  }

  // The request's logit_bias as a region slice at `offset` holding `bias`.
  void BiasAt(const LogitBiasSpec& bias, uint64_t offset, SampleRequest* r) {
    Write(Pack(bias), offset);
    r->logit_bias.emplace().region = RegionRef{"lists", offset};
  }

  absl::Status StatusOf(SampleRequest r) { return SampleAndWait(*core_, std::move(r)).status(); }

  TestShm shm_{65536};
  std::string logits_;
  std::unique_ptr<SamplerCore> core_;
};

TEST_F(ListsInShm, GiveTheInlineTokensAndLogprobsBitForBit) {
  const int64_t b = 16, v = 1000;
  std::mt19937 rng(5);
  const LogitBiasSpec bias = RandomBias(b, v, &rng);
  const TokenHistorySpec history = RandomHistory(b, v, &rng);
  ASSERT_GT(bias.token_ids.size(), 100u);
  ASSERT_GT(history.token_ids.size(), 100u);

  SampleRequest inline_request = Request(b, v);
  inline_request.logit_bias = bias;
  inline_request.token_history = history;
  absl::StatusOr<SampleResult> want = SampleAndWait(*core_, inline_request);
  ASSERT_TRUE(want.ok()) << want.status();

  SampleRequest region_request = Request(b, v);
  BiasAt(bias, 0, &region_request);
  Write(Pack(history), 32768);
  region_request.token_history.emplace().region = RegionRef{"lists", 32768};
  absl::StatusOr<SampleResult> got = SampleAndWait(*core_, region_request);
  ASSERT_TRUE(got.ok()) << got.status();

  // Without the lists the tokens differ somewhere (the lists matter in this batch).
  absl::StatusOr<SampleResult> plain = SampleAndWait(*core_, Request(b, v));
  ASSERT_TRUE(plain.ok());
  EXPECT_NE(plain->token_ids, want->token_ids);

  EXPECT_EQ(got->token_ids, want->token_ids);
  ASSERT_EQ(got->logprobs.size(), want->logprobs.size());
  for (size_t r = 0; r < want->logprobs.size(); ++r) {
    const RowLogprobs& g = got->logprobs[r];
    const RowLogprobs& w = want->logprobs[r];
    EXPECT_EQ(std::memcmp(&g.sampled_logprob, &w.sampled_logprob, 4), 0) << "row " << r;
    EXPECT_EQ(g.sampled_rank, w.sampled_rank);
    EXPECT_EQ(g.top_ids, w.top_ids);
    ASSERT_EQ(g.top_values.size(), w.top_values.size());
    EXPECT_EQ(std::memcmp(g.top_values.data(), w.top_values.data(), g.top_values.size() * 4), 0);
  }

  // One list in a region, the other inline: the same again.
  SampleRequest mixed = Request(b, v);
  BiasAt(bias, 0, &mixed);
  mixed.token_history = history;
  got = SampleAndWait(*core_, mixed);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->token_ids, want->token_ids);
}

TEST_F(ListsInShm, EmptyListsInARegionChangeNothing) {
  SampleRequest r = Request(2, 50);
  BiasAt(Bias({0, 0, 0}, {}, {}), 0, &r);
  absl::StatusOr<SampleResult> got = SampleAndWait(*core_, r);
  ASSERT_TRUE(got.ok()) << got.status();
  absl::StatusOr<SampleResult> plain = SampleAndWait(*core_, Request(2, 50));
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(got->token_ids, plain->token_ids);
}

struct BadCase {
  const char* name;
  absl::StatusCode code;
  std::string message;
};

TEST_F(ListsInShm, EveryMalformedSliceHasItsExactStatusAndTheCoreKeepsServing) {
  const int64_t b = 2, v = 50;
  const LogitBiasSpec good = Bias({0, 2, 3}, {4, 9, 7}, {1.0f, -2.0f, 0.5f});  // 36 bytes
  std::vector<std::pair<SampleRequest, BadCase>> cases;
  auto add = [&](SampleRequest r, BadCase c) { cases.emplace_back(std::move(r), std::move(c)); };

  SampleRequest both = Request(b, v);
  BiasAt(good, 0, &both);
  both.logit_bias->token_ids = {1};
  add(both, {"both sources", absl::StatusCode::kInvalidArgument,
             "logit_bias: expected one source (the repeated fields or region), got both"});

  SampleRequest history_both = Request(b, v);
  history_both.token_history.emplace().region = RegionRef{"lists", 0};
  history_both.token_history->in_prompt = {1};
  add(history_both,
      {"history both sources", absl::StatusCode::kInvalidArgument,
       "token_history: expected one source (the repeated fields or region), got both"});

  SampleRequest short_slice = Request(b, v);  // the offsets fit, the 3 entries do not
  std::vector<uint8_t> offsets_only;
  Put(good.row_offsets, &offsets_only);
  Write(offsets_only, 65536 - 32);
  short_slice.logit_bias.emplace().region = RegionRef{"lists", 65536 - 32};
  add(short_slice, {"size", absl::StatusCode::kOutOfRange,
                    "logit_bias.region: expected 36 bytes at offset 65504, got a region of "
                    "65536 bytes (B = 2, N = row_offsets[B] = 3: (B + 1 + 2N) * 4 bytes)"});

  SampleRequest no_head = Request(b, v);
  no_head.logit_bias.emplace().region = RegionRef{"lists", 65536 - 8};
  add(no_head, {"offsets past the end", absl::StatusCode::kOutOfRange,
                "logit_bias.region: expected 12 bytes at offset 65528, got a region of 65536 "
                "bytes (row_offsets: (B + 1) * 4 bytes for B = 2)"});

  SampleRequest huge_n = Request(b, v);
  BiasAt(Bias({0, 0, 101}, {}, {}), 0, &huge_n);
  add(huge_n, {"N over B * V", absl::StatusCode::kInvalidArgument,
               "logit_bias.region: expected N = row_offsets[B] <= B * V = 100 (no row holds a "
               "token twice), got 101"});

  SampleRequest decreasing = Request(b, v);
  BiasAt(Bias({0, 3, 2}, {4, 9, 7}, {1, 2, 3}), 256, &decreasing);
  add(decreasing,
      {"offsets", absl::StatusCode::kInvalidArgument,
       "logit_bias.region.row_offsets[2]: expected non-decreasing offsets, >= row_offsets[1] = "
       "3, got 2"});

  SampleRequest first = Request(b, v);
  BiasAt(Bias({1, 2, 3}, {4, 9, 7}, {1, 2, 3}), 512, &first);
  add(first, {"first offset", absl::StatusCode::kInvalidArgument,
              "logit_bias.region.row_offsets[0]: expected 0, got 1"});

  SampleRequest out_of_range = Request(b, v);
  BiasAt(Bias({0, 2, 3}, {4, 50, 7}, {1, 2, 3}), 768, &out_of_range);
  add(out_of_range,
      {"token range", absl::StatusCode::kInvalidArgument,
       "logit_bias.region.token_ids[1] (row 0): expected a token id in [0, 50), got 50"});

  SampleRequest duplicate = Request(b, v);
  BiasAt(Bias({0, 1, 3}, {4, 9, 9}, {1, 2, 3}), 1024, &duplicate);
  add(duplicate, {"duplicate", absl::StatusCode::kInvalidArgument,
                  "logit_bias.region.token_ids[2] (row 1): expected each token at most once "
                  "within a row (duplicates are rejected, not summed), got token 9 again (first "
                  "at token_ids[1])"});

  SampleRequest nan = Request(b, v);
  BiasAt(Bias({0, 1, 1}, {4}, {std::nanf("")}), 1280, &nan);
  add(nan, {"NaN bias", absl::StatusCode::kInvalidArgument,
            "logit_bias.region.biases[0] (row 0): expected a bias that is not NaN (+-inf "
            "allowed), got NaN"});

  SampleRequest prompt = Request(b, v);
  Write(Pack(History({0, 1, 2}, {3, 4}, {0, 1}, {1, 2})), 1536);
  prompt.token_history.emplace().region = RegionRef{"lists", 1536};
  add(prompt, {"in_prompt", absl::StatusCode::kInvalidArgument,
               "token_history.region.in_prompt[1] (row 1): expected 0 or 1, got 2"});

  SampleRequest history_range = Request(b, v);
  Write(Pack(History({0, 1, 2}, {3, -1}, {0, 1}, {1, 0})), 1792);
  history_range.token_history.emplace().region = RegionRef{"lists", 1792};
  add(history_range,
      {"history token range", absl::StatusCode::kInvalidArgument,
       "token_history.region.token_ids[1] (row 1): expected a token id in [0, 50), got -1"});

  SampleRequest unknown = Request(b, v);
  unknown.logit_bias.emplace().region = RegionRef{"nope", 0};
  add(unknown, {"unknown region", absl::StatusCode::kNotFound,
                "logit_bias.region: expected a registered region, got \"nope\", which is not "
                "(ListRegions lists them)"});

  SampleRequest misaligned = Request(b, v);
  misaligned.logit_bias.emplace().region = RegionRef{"lists", 2050};
  add(misaligned, {"misaligned", absl::StatusCode::kInvalidArgument,
                   "logit_bias.region: expected a slice aligned to 4 bytes (uint32 offsets), got "
                   "one at 2 bytes past a multiple of 4 (offset 2050)"});

  SampleRequest history_misaligned = Request(b, v);
  history_misaligned.token_history.emplace().region = RegionRef{"lists", 2049};
  add(history_misaligned,
      {"history misaligned", absl::StatusCode::kInvalidArgument,
       "token_history.region: expected a slice aligned to 4 bytes (uint32 offsets), got one at 1 "
       "bytes past a multiple of 4 (offset 2049)"});

  for (auto& [request, want] : cases) {
    const absl::Status got = StatusOf(request);
    EXPECT_EQ(got.code(), want.code) << want.name << ": " << got;
    EXPECT_EQ(got.message(), want.message) << want.name;
    // The core keeps serving.
    SampleRequest ok = Request(b, v);
    BiasAt(good, 4096, &ok);
    EXPECT_TRUE(StatusOf(ok).ok()) << "after " << want.name;
  }
  EXPECT_TRUE(core_->regions().Unregister("lists").ok());
}

// The packed bytes of a list are bounded by Limits::max_region_list_bytes (--max_message_bytes),
// checked on the announced N before the list is copied: without it a sparse region announcing
// N = 4e9 entries made the core allocate 36 GB (std::bad_alloc aborted the server).
TEST(ListsInShmLimit, AListPastMaxRegionListBytesIsResourceExhaustedBeforeItIsCopied) {
  EXPECT_EQ(Limits{}.max_region_list_bytes, int64_t{256} << 20);
  TestShm shm(65536);
  ASSERT_TRUE(shm.ok());
  CoreOptions options;
  options.limits.max_region_list_bytes = 44;
  SamplerCore core(options, std::make_unique<CpuSampler>(1), /*seed_start=*/1);
  ASSERT_TRUE(core.regions().RegisterHostShm("lists", shm.key(), 0, shm.size()).ok());
  // The requests' inline_data is a view: the logits outlive every call.
  const std::string logits = RandomLogitBytes(2, 50, 5);
  auto request = [&shm, &logits](uint64_t offset, const std::vector<uint8_t>& packed,
                                 bool history) {
    std::memcpy(shm.data() + offset, packed.data(), packed.size());
    SampleRequest r;
    r.dtype = kernels::DType::kFp32;
    r.shape = {2, 50};
    r.inline_data = logits;
    r.has_inline_data = true;
    r.params = {ParamsSpec{}};
    r.params[0].temperature = 0.0f;
    r.params[0].repetition_penalty = 1.5f;
    if (history) {
      r.token_history.emplace().region = RegionRef{"lists", offset};
    } else {
      r.logit_bias.emplace().region = RegionRef{"lists", offset};
    }
    return r;
  };
  // (B + 1 + 2N) * 4 = 44 bytes for N = 4: at the limit.
  EXPECT_TRUE(
      SampleAndWait(core, request(0, Pack(Bias({0, 2, 4}, {1, 2, 3, 4}, {1, 1, 1, 1})), false))
          .ok());
  const absl::Status bias_over =
      SampleAndWait(core,
                    request(0, Pack(Bias({0, 2, 5}, {1, 2, 3, 4, 5}, {1, 1, 1, 1, 1})), false))
          .status();
  EXPECT_EQ(bias_over.code(), absl::StatusCode::kResourceExhausted) << bias_over;
  EXPECT_EQ(bias_over.message(),
            "logit_bias.region: expected a list of at most 44 bytes (--max_message_bytes, as an "
            "inline list), got 52 bytes (B = 2, N = row_offsets[B] = 5: (B + 1 + 2N) * 4 bytes)");
  // (B + 1) * 4 + 9N = 39 bytes for N = 3; 48 for N = 4.
  EXPECT_TRUE(
      SampleAndWait(core,
                    request(256, Pack(History({0, 1, 3}, {1, 2, 3}, {1, 0, 2}, {0, 1, 1})), true))
          .ok());
  const absl::Status history_over =
      SampleAndWait(
          core,
          request(256, Pack(History({0, 2, 4}, {1, 2, 3, 4}, {1, 0, 2, 1}, {0, 1, 1, 0})), true))
          .status();
  EXPECT_EQ(history_over.code(), absl::StatusCode::kResourceExhausted) << history_over;
  EXPECT_EQ(history_over.message(),
            "token_history.region: expected a list of at most 44 bytes (--max_message_bytes, as "
            "an inline list), got 48 bytes (B = 2, N = row_offsets[B] = 4: (B + 1 + 2N) * 4 + N "
            "bytes)");
  EXPECT_TRUE(core.regions().Unregister("lists").ok());
}

// ---- GPU IPC slices on a fake GPU backend -------------------------------------------------------

const DeviceInfo kFakeGpu{0, "0000:3b:00.0", "GPU-0b5c6a1e", "Fake GPU", true, true};

// A fake GPU backend that keeps the merged entries it was given and answers token 0.
class AdjustRecorder : public Sampler {
 public:
  absl::Status Sample(const ValidatedBatch& batch, const SampleIo& io,
                      SampleResult* result) override {
    adjust_offsets = batch.adjust_offsets;
    adjusts = batch.adjusts;
    ready_event = io.ready_event;
    sample_thread = std::this_thread::get_id();
    result->token_ids.assign(batch.batch, 0);
    result->row_status.assign(batch.batch, kernels::RowStatus::kOk);
    return absl::OkStatus();
  }
  BackendKind kind() const override { return BackendKind::kGpu; }
  const DeviceInfo& device() const override { return kFakeGpu; }

  std::vector<uint32_t> adjust_offsets;
  std::vector<kernels::TokenAdjust> adjusts;
  void* ready_event = nullptr;
  std::thread::id sample_thread;
};

// A core over a fake GPU backend with one GPU IPC region "gpu" of 4 KiB: logits at 0 ([2, 8]
// fp32 = 64 bytes), a bias list at 1024, a token history at 2048.
class ListsInGpuIpc : public ::testing::Test {
 protected:
  void SetUp() override {
    CoreOptions options;
    options.gpu_ipc = ipc_;
    auto sampler = std::make_unique<AdjustRecorder>();
    recorder_ = sampler.get();
    core_ = std::make_unique<SamplerCore>(options, std::move(sampler), /*seed_start=*/1);
    ASSERT_TRUE(core_->regions()
                    .RegisterGpuIpc("gpu", ipc_->Export(&memory_), 0, 4096, kFakeGpu.uuid)
                    .ok());
    const std::vector<uint8_t> bias = Pack(Bias({0, 1, 2}, {3, 5}, {2.0f, -1.0f}));
    const std::vector<uint8_t> history = Pack(History({0, 0, 1}, {5}, {2}, {0}));
    std::memcpy(memory_.data() + 1024, bias.data(), bias.size());
    std::memcpy(memory_.data() + 2048, history.data(), history.size());
  }

  // A request over the region's logits with both lists in the region and a ready event.
  static SampleRequest Request() {
    SampleRequest r;
    r.dtype = kernels::DType::kFp32;
    r.shape = {2, 8};
    r.logits_region = RegionRef{"gpu", 0};
    ParamsSpec p;
    p.frequency_penalty = 0.5f;
    r.params = {p};
    r.ready_event = std::string(64, 'r');
    r.logit_bias.emplace().region = RegionRef{"gpu", 1024};
    r.token_history.emplace().region = RegionRef{"gpu", 2048};
    return r;
  }

  std::shared_ptr<FakeGpuIpc> ipc_ = std::make_shared<FakeGpuIpc>();
  std::vector<uint8_t> memory_ = std::vector<uint8_t>(4096, 0);
  AdjustRecorder* recorder_ = nullptr;
  std::unique_ptr<SamplerCore> core_;
};

TEST_F(ListsInGpuIpc, AreCopiedThroughTheGpuIpcAfterTheReadyEvent) {
  absl::StatusOr<SampleResult> got = SampleAndWait(*core_, Request());
  ASSERT_TRUE(got.ok()) << got.status();
  // Two lists, each its offsets' word and then the whole slice.
  EXPECT_EQ(ipc_->copies(), 4);
  EXPECT_NE(ipc_->last_copy_event(), nullptr);
  EXPECT_EQ(ipc_->last_copy_event(), recorder_->ready_event);
  EXPECT_EQ(recorder_->adjust_offsets, (std::vector<uint32_t>{0, 1, 2}));
  ASSERT_EQ(recorder_->adjusts.size(), 2u);
  EXPECT_EQ(recorder_->adjusts[0].token, 3);
  EXPECT_EQ(recorder_->adjusts[0].bias, 2.0f);
  EXPECT_EQ(recorder_->adjusts[1].token, 5);  // row 1: bias -1 and 2 outputs at 0.5 each
  EXPECT_EQ(recorder_->adjusts[1].bias, -1.0f);
  EXPECT_EQ(recorder_->adjusts[1].penalty, 1.0f);
}

// SampleAsync runs on a gRPC thread (a unary handler, or a stream reactor holding its lock): it
// must return while the copy still waits for the client's ready event, and the copy must run on
// the executor thread that samples the request.
TEST_F(ListsInGpuIpc, AreCopiedOnTheExecutorThreadNotTheCallersThread) {
  ipc_->HoldCopies();
  Answer answer;
  ASSERT_TRUE(core_->SampleAsync(Request(), answer.Callback()).ok());
  EXPECT_EQ(ipc_->copies(), 0) << "SampleAsync waited for the copies";
  EXPECT_FALSE(answer.done.HasBeenNotified());
  ipc_->ReleaseCopies();
  answer.done.WaitForNotification();
  ASSERT_TRUE(answer.result.ok()) << answer.result.status();
  EXPECT_EQ(ipc_->copies(), 4);
  EXPECT_NE(ipc_->last_copy_thread(), std::this_thread::get_id());
  EXPECT_EQ(ipc_->last_copy_thread(), recorder_->sample_thread);
  EXPECT_EQ(recorder_->adjusts.size(), 2u);
}

}  // namespace
}  // namespace samplerd::core
