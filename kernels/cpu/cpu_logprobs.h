// Logprob outputs of the CPU sampler: per-token log-probabilities, the sampled token's rank and
// the top-N list (docs/DESIGN.md step 7). Internal to kernels/cpu; computed in double, stored
// as float.
#ifndef SAMPLERD_KERNELS_CPU_CPU_LOGPROBS_H_
#define SAMPLERD_KERNELS_CPU_CPU_LOGPROBS_H_

#include <cstdint>

namespace samplerd::kernels {

// Where one row's logprob outputs go; a null pointer is skipped.
struct LogprobOutputs {
  float* sampled_logprob = nullptr;  // [1]
  int64_t* sampled_rank = nullptr;   // [1]
  int32_t* top_ids = nullptr;        // [top_n]
  float* top_values = nullptr;       // [top_n]
};

// out[j] = log_softmax(values)_j in double, summing exp in index order. If some value is +inf the
// distribution is its limit: log(1/n_inf) on the +inf entries, -inf elsewhere. `values` holds no
// NaN and at least one value > -inf.
void LogSoftmax(const float* values, int64_t n, double* out);

// out[j] = z_j - mx - log(sum over kept i of exp(z_i - mx)) for kept j, -inf elsewhere: the
// renormalised distribution over the survivors. `mx` is max z (finite); some kept z equals it.
void MaskedLogSoftmax(const float* z, const uint8_t* keep, float mx, int64_t n, double* out);

// out[j] = -log(number kept) for kept j, -inf elsewhere. Some j is kept.
void UniformLogprobs(const uint8_t* keep, int64_t n, double* out);

// out[token] = 0, -inf elsewhere (greedy rows' processed distribution).
void PointMassLogprobs(int32_t token, int64_t n, double* out);

// Writes the sampled token's logprob and rank (1 + number of tokens with a strictly greater
// logprob) and the top_n highest logprobs, descending, lowest id first among ties, padded with
// id -1 / -inf when top_n > n. `scratch` holds n ints.
void WriteLogprobs(const double* logprob, int64_t n, int32_t token, int32_t top_n, int32_t* scratch,
                   const LogprobOutputs& out);

// Outputs of a row with no valid distribution: logprob -inf, rank 0, ids -1, values -inf.
void WriteInvalidLogprobs(int32_t top_n, const LogprobOutputs& out);

}  // namespace samplerd::kernels

#endif  // SAMPLERD_KERNELS_CPU_CPU_LOGPROBS_H_
