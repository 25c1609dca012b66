// A device session's processors, row by row (kernels/common/session_processors.h): the merged
// TokenAdjust entries of random rows equal SampleRequest's (ValidateProcessors, processors.h)
// bit for bit (no-op entries aside), each row's count is the size of its lists' union, and each
// rule of device_session.h rejects only the row that breaks it.
#include "kernels/common/session_processors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "service/core/model/request.h"
#include "service/core/model/validated_batch.h"
#include "service/core/processors.h"
#include "service/core/session/processors_snapshot.h"

namespace samplerd::core {
namespace {

constexpr uint32_t kM = 6;
constexpr uint32_t kNb = 64;
constexpr uint32_t kNh = 256;
constexpr int64_t kV = 500;

// One row as an engine writes it: sorted bias and history entries, its penalties.
struct Row {
  std::map<int32_t, float> bias;
  std::map<int32_t, std::pair<uint32_t, uint8_t>> history;  // token -> (count, in_prompt)
  float repetition = 1.0f, presence = 0.0f, frequency = 0.0f;
};

// The processors buffer of `rows` (device_session.h), rows packed one after the other.
std::vector<uint8_t> Pack(const std::vector<Row>& rows) {
  std::vector<uint8_t> buf(samplerd_processors_bytes(kM, kNb, kNh), 0);
  const auto put = [&buf](uint64_t offset, auto value) {
    std::memcpy(buf.data() + offset, &value, sizeof(value));
  };
  uint32_t b = 0, h = 0;
  for (uint32_t r = 0; r <= kM; ++r) {
    put(samplerd_processors_bias_offsets_offset(kM) + 4 * r, b);
    put(samplerd_processors_history_offsets_offset(kM, kNb) + 4 * r, h);
    if (r == kM) break;
    const Row& row = r < rows.size() ? rows[r] : Row{};
    put(samplerd_processors_repetition_offset(kM) + 4 * r, row.repetition);
    put(samplerd_processors_presence_offset(kM) + 4 * r, row.presence);
    put(samplerd_processors_frequency_offset(kM) + 4 * r, row.frequency);
    for (const auto& [token, bias] : row.bias) {
      put(samplerd_processors_bias_tokens_offset(kM) + 4 * b, token);
      put(samplerd_processors_biases_offset(kM, kNb) + 4 * b, bias);
      ++b;
    }
    for (const auto& [token, entry] : row.history) {
      put(samplerd_processors_history_tokens_offset(kM, kNb) + 4 * h, token);
      put(samplerd_processors_output_counts_offset(kM, kNb, kNh) + 4 * h, entry.first);
      buf[samplerd_processors_in_prompt_offset(kM, kNb, kNh) + h] = entry.second;
      ++h;
    }
  }
  return buf;
}

// SampleRequest's adjusts of the same rows.
std::vector<std::vector<kernels::TokenAdjust>> UnaryAdjusts(const std::vector<Row>& rows) {
  SampleRequest request;
  LogitBiasSpec bias;
  TokenHistorySpec history;
  bias.row_offsets.push_back(0);
  history.row_offsets.push_back(0);
  for (const Row& row : rows) {
    ParamsSpec p;
    p.repetition_penalty = row.repetition;
    p.presence_penalty = row.presence;
    p.frequency_penalty = row.frequency;
    request.params.push_back(p);
    for (const auto& [token, b] : row.bias) {
      bias.token_ids.push_back(token);
      bias.biases.push_back(b);
    }
    bias.row_offsets.push_back(static_cast<uint32_t>(bias.token_ids.size()));
    for (const auto& [token, entry] : row.history) {
      history.token_ids.push_back(token);
      history.output_counts.push_back(entry.first);
      history.in_prompt.push_back(entry.second);
    }
    history.row_offsets.push_back(static_cast<uint32_t>(history.token_ids.size()));
  }
  request.logit_bias = bias;
  request.token_history = history;
  ValidatedBatch batch;
  batch.batch = static_cast<int64_t>(rows.size());
  batch.vocab = kV;
  const absl::Status status = ValidateProcessors(request, &batch);
  EXPECT_TRUE(status.ok()) << status;
  std::vector<std::vector<kernels::TokenAdjust>> out(rows.size());
  if (batch.adjusts.empty()) return out;
  for (size_t r = 0; r < rows.size(); ++r) {
    out[r].assign(batch.adjusts.begin() + batch.adjust_offsets[r],
                  batch.adjusts.begin() + batch.adjust_offsets[r + 1]);
  }
  return out;
}

// The session's merged entries of `row` without those that change nothing (which the session
// keeps and SampleRequest drops: they leave every logit as it is).
std::vector<kernels::TokenAdjust> SessionAdjusts(const kernels::SessionProcessors& p,
                                                 uint32_t row) {
  std::vector<kernels::TokenAdjust> all(kernels::MergeSessionRow(p, row, nullptr));
  EXPECT_EQ(kernels::MergeSessionRow(p, row, all.data()), all.size());
  std::vector<kernels::TokenAdjust> out;
  for (const kernels::TokenAdjust& a : all) {
    if (!kernels::IsNoOpAdjust(a)) out.push_back(a);
  }
  return out;
}

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

void ExpectSameAdjusts(const std::vector<kernels::TokenAdjust>& got,
                       const std::vector<kernels::TokenAdjust>& want, int trial, uint32_t row) {
  ASSERT_EQ(got.size(), want.size()) << "trial " << trial << " row " << row;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].token, want[i].token) << "trial " << trial << " row " << row;
    EXPECT_TRUE(SameBits(got[i].bias, want[i].bias));
    EXPECT_TRUE(SameBits(got[i].repetition, want[i].repetition));
    EXPECT_TRUE(SameBits(got[i].penalty, want[i].penalty));
  }
}

std::vector<Row> RandomRows(std::mt19937& rng) {
  std::vector<Row> rows(kM);
  std::uniform_int_distribution<int32_t> token(0, kV - 1);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (Row& row : rows) {
    const int biases = static_cast<int>(rng() % 10);
    for (int i = 0; i < biases; ++i) {
      const uint32_t kind = rng() % 8;
      const float inf = std::numeric_limits<float>::infinity();
      row.bias[token(rng)] = kind == 0 ? -inf : kind == 1 ? inf : kind == 2 ? 0.0f : 3 * unit(rng);
    }
    const int entries = static_cast<int>(rng() % 40);
    for (int i = 0; i < entries; ++i) {
      row.history[token(rng)] = {rng() % 4, static_cast<uint8_t>(rng() % 2)};
    }
    row.repetition = rng() % 3 == 0 ? 1.0f : 0.5f + 1.5f * (unit(rng) + 1.0f) / 2.0f;
    row.presence = rng() % 3 == 0 ? 0.0f : 2.0f * unit(rng);
    row.frequency = rng() % 3 == 0 ? 0.0f : 2.0f * unit(rng);
  }
  return rows;
}

TEST(SessionProcessors, MergedRowsEqualSampleRequestsAdjustsBitForBit) {
  std::mt19937 rng(5);
  size_t entries = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const std::vector<Row> rows = RandomRows(rng);
    const std::vector<uint8_t> buf = Pack(rows);
    const kernels::SessionProcessors p =
        kernels::ResolveSessionProcessors(buf.data(), kM, kNb, kNh);
    const std::vector<std::vector<kernels::TokenAdjust>> want = UnaryAdjusts(rows);
    for (uint32_t r = 0; r < kM; ++r) {
      ASSERT_TRUE(kernels::SessionRowValid(p, r, kV)) << "trial " << trial << " row " << r;
      std::map<int32_t, int> tokens;
      for (const auto& entry : rows[r].bias) ++tokens[entry.first];
      for (const auto& entry : rows[r].history) ++tokens[entry.first];
      EXPECT_EQ(kernels::MergeSessionRow(p, r, nullptr), tokens.size());
      const std::vector<kernels::TokenAdjust> got = SessionAdjusts(p, r);
      ExpectSameAdjusts(got, want[r], trial, r);
      entries += got.size();
    }
  }
  EXPECT_GT(entries, 1000u);  // the rows were not all no-ops
}

TEST(SessionProcessors, EachBrokenRuleRejectsOnlyItsRow) {
  std::vector<Row> rows(kM);
  for (uint32_t r = 0; r < kM; ++r) {
    rows[r].bias = {{3, 1.0f}, {7, -1.0f}};
    rows[r].history = {{2, {1, 0}}, {3, {0, 1}}, {9, {2, 1}}};
    rows[r].repetition = 1.2f;
  }
  const std::vector<uint8_t> good = Pack(rows);
  // Row r: bias entries [2r, 2r + 2), history entries [3r, 3r + 3). Offsets are shared by
  // neighbouring rows, so their breaks are at the end of the last row (kM - 1).
  const auto f32 = [](uint64_t offset, float v) {
    return [=](std::vector<uint8_t>& b) { std::memcpy(b.data() + offset, &v, 4); };
  };
  const auto i32 = [](uint64_t offset, int32_t v) {
    return [=](std::vector<uint8_t>& b) { std::memcpy(b.data() + offset, &v, 4); };
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const uint64_t rep = samplerd_processors_repetition_offset(kM);
  const uint64_t pres = samplerd_processors_presence_offset(kM);
  const uint64_t freq = samplerd_processors_frequency_offset(kM);
  const uint64_t bo = samplerd_processors_bias_offsets_offset(kM);
  const uint64_t bt = samplerd_processors_bias_tokens_offset(kM);
  const uint64_t bv = samplerd_processors_biases_offset(kM, kNb);
  const uint64_t ho = samplerd_processors_history_offsets_offset(kM, kNb);
  const uint64_t ht = samplerd_processors_history_tokens_offset(kM, kNb);
  const uint64_t ip = samplerd_processors_in_prompt_offset(kM, kNb, kNh);
  const uint32_t last = kM - 1;
  const std::vector<std::tuple<std::string, uint32_t, std::function<void(std::vector<uint8_t>&)>>>
      cases = {
          {"repetition 0", 2, f32(rep + 8, 0.0f)},
          {"repetition -1", 2, f32(rep + 8, -1.0f)},
          {"repetition inf", 2, f32(rep + 8, inf)},
          {"repetition NaN", 2, f32(rep + 8, nan)},
          {"presence 2.5", 2, f32(pres + 8, 2.5f)},
          {"presence NaN", 2, f32(pres + 8, nan)},
          {"frequency -3", 2, f32(freq + 8, -3.0f)},
          {"bias token V", 2, i32(bt + 4 * 5, kV)},
          {"bias token -1", 2, i32(bt + 4 * 4, -1)},
          {"bias tokens out of order", 2, i32(bt + 4 * 5, 1)},
          {"bias token twice", 2, i32(bt + 4 * 5, 3)},
          {"bias NaN", 2, f32(bv + 4 * 4, nan)},
          {"bias offsets decreasing", last, i32(bo + 4 * kM, 2 * last - 1)},
          {"bias offsets past the capacity", last, i32(bo + 4 * kM, kNb + 1)},
          {"history token V", 2, i32(ht + 4 * 8, kV)},
          {"history tokens out of order", 2, i32(ht + 4 * 7, 1)},
          {"history in_prompt 2", 2, [ip](std::vector<uint8_t>& b) { b[ip + 7] = 2; }},
          {"history offsets decreasing", last, i32(ho + 4 * kM, 3 * last - 1)},
          {"history offsets past the capacity", last, i32(ho + 4 * kM, kNh + 1)},
      };
  const kernels::SessionProcessors fine =
      kernels::ResolveSessionProcessors(good.data(), kM, kNb, kNh);
  for (uint32_t r = 0; r < kM; ++r) ASSERT_TRUE(kernels::SessionRowValid(fine, r, kV)) << r;
  // Bias +-inf is a valid bias, and a bias of 0 a valid (no-op) one.
  std::vector<uint8_t> infinite = good;
  f32(bv + 4 * 4, -inf)(infinite);
  f32(bv + 4 * 5, 0.0f)(infinite);
  EXPECT_TRUE(kernels::SessionRowValid(
      kernels::ResolveSessionProcessors(infinite.data(), kM, kNb, kNh), 2, kV));
  for (const auto& [name, bad_row, apply] : cases) {
    std::vector<uint8_t> buf = good;
    apply(buf);
    const kernels::SessionProcessors p =
        kernels::ResolveSessionProcessors(buf.data(), kM, kNb, kNh);
    SessionProcessorsSnapshot snapshot(p, kM);
    const kernels::SessionProcessors& copy = snapshot.Take(p, kM);
    for (uint32_t r = 0; r < kM; ++r) {
      EXPECT_EQ(kernels::SessionRowValid(p, r, kV), r != bad_row) << name << ", row " << r;
      EXPECT_EQ(kernels::SessionRowValid(copy, r, kV), r != bad_row)
          << name << ", row " << r << " of the host plane's copy";
    }
  }
}

// The host plane checks and merges its own copy of a step's rows (processors_snapshot.h): the
// copy checks and merges as the buffer did when it was taken, whatever the engine writes into
// the buffer afterwards. (Read twice from the shared memory, a token id rewritten between the
// check and the merge indexed the sampler's row buffer out of bounds.)
TEST(SessionProcessors, ASnapshotKeepsTheRowsAsTakenWhateverTheEngineWritesAfter) {
  std::mt19937 rng(11);
  size_t entries = 0;
  for (int trial = 0; trial < 50; ++trial) {
    const std::vector<Row> rows = RandomRows(rng);
    std::vector<uint8_t> buf = Pack(rows);
    const kernels::SessionProcessors shared =
        kernels::ResolveSessionProcessors(buf.data(), kM, kNb, kNh);
    const uint32_t batch = 1 + static_cast<uint32_t>(rng() % kM);
    std::vector<std::vector<kernels::TokenAdjust>> want(batch);
    for (uint32_t r = 0; r < batch; ++r) want[r] = SessionAdjusts(shared, r);
    SessionProcessorsSnapshot snapshot(shared, kM);
    const kernels::SessionProcessors& copy = snapshot.Take(shared, batch);
    for (uint8_t& byte : buf) byte = static_cast<uint8_t>(~byte);  // every bit rewritten
    ASSERT_FALSE(kernels::SessionRowValid(shared, 0, kV)) << "the rewrite broke nothing";
    for (uint32_t r = 0; r < batch; ++r) {
      ASSERT_TRUE(kernels::SessionRowValid(copy, r, kV)) << "trial " << trial << " row " << r;
      const std::vector<kernels::TokenAdjust> got = SessionAdjusts(copy, r);
      ExpectSameAdjusts(got, want[r], trial, r);
      entries += got.size();
    }
  }
  EXPECT_GT(entries, 100u);
}

// Regression (redteam25 F2): the copy holds the entries the steps use, not the capacities. It
// zero-filled NB + NH entries at open (9 bytes a history entry), while the engine's shm object
// of that size could be sparse: 100M history entries took the server from 16 to 876 MiB.
TEST(SessionProcessors, ASnapshotAllocatesTheEntriesTheStepsUseNotTheCapacities) {
  std::mt19937 rng(12);
  const std::vector<Row> rows = RandomRows(rng);
  const std::vector<uint8_t> buf = Pack(rows);
  kernels::SessionProcessors shared = kernels::ResolveSessionProcessors(buf.data(), kM, kNb, kNh);
  shared.bias_capacity = shared.history_capacity = 1u << 30;  // 17 GiB of entries announced
  SessionProcessorsSnapshot snapshot(shared, kM);
  EXPECT_EQ(snapshot.entry_bytes(), 0u);

  const uint32_t nb = shared.bias_offsets[kM], nh = shared.history_offsets[kM];
  ASSERT_GT(nb + nh, 0u);
  const kernels::SessionProcessors& copy = snapshot.Take(shared, kM);
  for (uint32_t r = 0; r < kM; ++r) {
    ASSERT_TRUE(kernels::SessionRowValid(copy, r, kV)) << r;
    ExpectSameAdjusts(SessionAdjusts(copy, r), SessionAdjusts(shared, r), 0, r);
  }
  EXPECT_GT(snapshot.entry_bytes(), 0u);
  EXPECT_LE(snapshot.entry_bytes(), 2 * (8 * nb + 9 * nh));  // grown at most to twice the use
}

}  // namespace
}  // namespace samplerd::core
