// samplerd C++ client: the logits processors of a SampleRequest (samplerd/v1/processors.proto),
// built from plain C++ values.
//
// The server applies them per row, before temperature and every filter: the logit bias, then
// the repetition / presence / frequency penalties on the row's token history, then the
// allowed-token bitmask. Each is optional:
//
//   v1::SamplingParams params;                     // the penalties are SamplingParams fields
//   params.set_repetition_penalty(1.1f);           // > 0, unset = 1 (off)
//   params.set_frequency_penalty(0.2f);            // [-2, 2], 0 = off
//   v1::SampleRequest request = MakeFp32Request(logits.data(), batch, vocab, {params});
//   SetTokenBitmask(mask.data(), batch, vocab, &request);  // batch * BitmaskWords(vocab) words
//   grpc::Status status = SetLogitBias(TokenBias{{eos, -INFINITY}}, batch, &request);
//   if (status.ok()) status = SetTokenHistory(prompts, outputs, &request);  // token ids so far,
//                                                                           // B rows each
//
// The bias lists and the token history may instead lie in a registered region (host shm, or GPU
// IPC memory on the logits' device), rewritten in place by the engine each step:
//
//   std::vector<uint8_t> bias = PackLogitBias(rows);             // processors.proto's layout
//   std::vector<uint8_t> history;
//   status = PackTokenHistory(prompts, outputs, &history);       // the same rows each
//   std::memcpy(shm->data(), bias.data(), bias.size());           // a HostShmBuffer, registered
//   std::memcpy(static_cast<char*>(shm->data()) + 1024, history.data(), history.size());
//   SetLogitBiasRegion("lists", 0, &request);                     // offsets aligned to 4
//   SetTokenHistoryRegion("lists", 1024, &request);
//
// Like MakeFp32Request these check no values: the server checks token ids against V, row counts
// and offsets, and answers INVALID_ARGUMENT "expected X, got Y". The per-row setters
// (SetLogitBias, SetTokenHistory) check their row count against the logits' B, when the request
// has it, before anything is sent: a bias for rows past B would be refused by the server only
// after a round trip, and a prompt or output vector shorter than the batch would read as rows
// without tokens, which the server cannot see.
#ifndef SAMPLERD_CLIENT_CPP_INCLUDE_SAMPLERD_PROCESSORS_H_
#define SAMPLERD_CLIENT_CPP_INCLUDE_SAMPLERD_PROCESSORS_H_

#include <grpcpp/support/status.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "samplerd/v1/sampler.pb.h"

namespace samplerd {

// Int32 words per row of an allowed-token bitmask for `vocab` tokens: ceil(vocab / 32).
inline int64_t BitmaskWords(int64_t vocab) { return (vocab + 31) / 32; }

// Sets the allowed-token bitmask of `request` from `batch * BitmaskWords(vocab)` int32 words at
// `words` (row-major; bit t % 32 of word t / 32 of a row set when token t is allowed: the layout
// of xgrammar and vLLM), copied as little-endian inline bytes. A token whose bit is clear becomes
// -inf; a row left with nothing allowed gets ROW_STATUS_INVALID_NO_ALLOWED and token -1.
void SetTokenBitmask(const int32_t* words, int64_t batch, int64_t vocab,
                     v1::SampleRequest* request);

// Sets the bitmask of `request` to the words (laid out as above) at byte `offset` (aligned to
// 4) of registered region `region`: host shm, or GPU IPC memory on the logits' device.
void SetTokenBitmaskRegion(const std::string& region, uint64_t offset, v1::SampleRequest* request);

// One row's logit bias: token id -> bias added to its logit (+inf forces, -inf bans).
using TokenBias = std::map<int32_t, float>;

// Sets the logit bias of `request`: rows[i] for row i. rows.size() must be B =
// request->logits().shape(0) when the logits' shape is set (MakeFp32Request, MakeRegionRequest);
// otherwise (no shape yet) any number of rows is taken and the server checks it. Returns
// INVALID_ARGUMENT "expected logit bias for B = 3 rows, got 2" for another number of rows, and
// then leaves `request` unchanged: do not send it.
[[nodiscard]] grpc::Status SetLogitBias(const std::vector<TokenBias>& rows,
                                        v1::SampleRequest* request);

// Sets the logit bias of `request`: `bias` for each of its `batch` rows. `batch` must be >= 0,
// and B when the logits' shape is set: INVALID_ARGUMENT "expected logit bias for B = 3 rows, got
// 4" otherwise (`request` unchanged), as above.
[[nodiscard]] grpc::Status SetLogitBias(const TokenBias& bias, int64_t batch,
                                        v1::SampleRequest* request);

// Sets the token history the penalties act on: per row, the prompt's token ids and the output's
// so far. Either vector may be empty (no tokens in any row); otherwise it has B rows, B =
// request->logits().shape(0) when the logits' shape is set (MakeFp32Request, MakeRegionRequest),
// else the other vector's size when that is not empty. Each row's entries are its distinct tokens
// in increasing order, with their output count and whether the prompt has them. Returns
// INVALID_ARGUMENT "expected prompt token ids for B = 3 rows, got 2" (or "... prompt and output
// token ids for the same number of rows, got 3 and 2") for a vector with another number of
// rows, and then leaves `request` unchanged: do not send it.
[[nodiscard]] grpc::Status SetTokenHistory(const std::vector<std::vector<int32_t>>& prompt,
                                           const std::vector<std::vector<int32_t>>& output,
                                           v1::SampleRequest* request);

// ---- Lists in a registered region (LogitBias.region, TokenHistory.region) ----------------------

// Sets the logit bias of `request` to the lists packed (as PackLogitBias lays them out) at byte
// `offset` (aligned to 4) of registered region `region`: host shm, or GPU IPC memory on the
// logits' device. Replaces inline lists set earlier (and SetLogitBias replaces the region). The
// server reads B + 1 row offsets there, then the N = row_offsets[B] entries, when the request is
// queued, and checks them like inline lists; a region too small for them is OUT_OF_RANGE.
void SetLogitBiasRegion(const std::string& region, uint64_t offset, v1::SampleRequest* request);

// Sets the token history of `request` to the lists packed (as PackTokenHistory lays them out)
// at byte `offset` (aligned to 4) of registered region `region`. Read like SetLogitBiasRegion.
void SetTokenHistoryRegion(const std::string& region, uint64_t offset, v1::SampleRequest* request);

// The bytes to write into a region for SetLogitBiasRegion: the lists SetLogitBias(rows) sends
// inline, packed little-endian: uint32 row_offsets[B + 1], int32 token_ids[N], float32
// biases[N], each row's tokens in increasing order; (B + 1 + 2N) * 4 bytes, B = rows.size().
std::vector<uint8_t> PackLogitBias(const std::vector<TokenBias>& rows);

// The bytes to write into a region for SetTokenHistoryRegion, into *out: the lists
// SetTokenHistory(prompt, output) sends inline, packed little-endian: uint32 row_offsets[B + 1],
// int32 token_ids[N], uint32 output_counts[N], uint8 in_prompt[N] (0 or 1), each row's
// distinct tokens in increasing order; (B + 1 + 2N) * 4 + N bytes, B the rows of the vectors
// (either may be empty). Returns INVALID_ARGUMENT "expected prompt and output token ids for the
// same number of rows, got 3 and 2" when both are given with different numbers of rows, and
// then leaves *out unchanged.
[[nodiscard]] grpc::Status PackTokenHistory(const std::vector<std::vector<int32_t>>& prompt,
                                            const std::vector<std::vector<int32_t>>& output,
                                            std::vector<uint8_t>* out);

// The same layouts from messages' repeated fields (e.g. as SetLogitBias / SetTokenHistory
// filled them); a message's `region` is ignored.
std::vector<uint8_t> PackLists(const v1::LogitBias& bias);
std::vector<uint8_t> PackLists(const v1::TokenHistory& history);

}  // namespace samplerd

#endif  // SAMPLERD_CLIENT_CPP_INCLUDE_SAMPLERD_PROCESSORS_H_
