// Phase 3 of FastCpuSampler for plain-temperature rows: the inverse-CDF draw (inverse_cdf_pass.h).
#include "kernels/cpu_fast/inverse_cdf_pass.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/common/inverse_cdf.h"
#include "kernels/cpu/inverse_cdf_draw.h"
#include "kernels/cpu_fast/cpu_features.h"
#include "kernels/cpu_fast/quantised_mass.h"
#include "kernels/cpu_fast/row_chunks.h"

#if SAMPLERD_CPU_FAST_X86
#include <immintrin.h>
#endif

namespace samplerd::kernels::cpu_fast_internal {

const float* ReadX(const SampleArgs& args, int64_t row, int64_t begin, int64_t n, float* scratch) {
  const unsigned char* x = Fp32Chunk(args, row, begin);
  if (x != nullptr && reinterpret_cast<uintptr_t>(x) % alignof(float) == 0) {
    return reinterpret_cast<const float*>(x);
  }
  LoadChunk(args, row, begin, n, scratch);
  return scratch;
}

#if SAMPLERD_CPU_FAST_X86
namespace {

// PieceMass over x[0, n - n % 8), 8 tokens at a time into two 4-lane sums; returns where the
// scalar tail starts and adds the lanes to `sum`. Blocks of 8 all left out or outside the set
// are skipped.
SAMPLERD_AVX2 int64_t PieceMassAvx2(const float* x, int64_t n, const RowState& r, double& sum,
                                    int64_t& left_out) {
  const __m256d x_max = _mm256_set1_pd(r.top_x);
  const __m256d inv_t = _mm256_set1_pd(r.inv_t);
  const __m256d skip = _mm256_set1_pd(r.skip_below);
  const __m256 skip_f = _mm256_set1_ps(r.skip_below);
  const __m256 keep_f = _mm256_set1_ps(r.keep_from);
  const __m256d keep = _mm256_set1_pd(r.keep_from);
  __m256d acc0 = _mm256_setzero_pd();
  __m256d acc1 = _mm256_setzero_pd();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 v = _mm256_loadu_ps(x + j);
    const int in_set = _mm256_movemask_ps(_mm256_cmp_ps(v, keep_f, _CMP_GE_OQ));
    const int kept = _mm256_movemask_ps(_mm256_cmp_ps(v, skip_f, _CMP_GE_OQ)) & in_set;
    left_out += __builtin_popcount(static_cast<unsigned>(in_set & ~kept));
    if (kept == 0) continue;
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    // Left-out lanes (-inf included) may compute anything: the mask zeroes them.
    const __m256d m_lo = ExpNonPositive4(_mm256_mul_pd(_mm256_sub_pd(lo, x_max), inv_t));
    const __m256d m_hi = ExpNonPositive4(_mm256_mul_pd(_mm256_sub_pd(hi, x_max), inv_t));
    const __m256d in_lo =
        _mm256_and_pd(_mm256_cmp_pd(lo, skip, _CMP_GE_OQ), _mm256_cmp_pd(lo, keep, _CMP_GE_OQ));
    const __m256d in_hi =
        _mm256_and_pd(_mm256_cmp_pd(hi, skip, _CMP_GE_OQ), _mm256_cmp_pd(hi, keep, _CMP_GE_OQ));
    acc0 = _mm256_add_pd(acc0, _mm256_and_pd(m_lo, in_lo));
    acc1 = _mm256_add_pd(acc1, _mm256_and_pd(m_hi, in_hi));
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(acc0, acc1));
  sum += (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  return j;
}

SAMPLERD_AVX512_WARNINGS_OFF

// PieceMassAvx2 with AVX-512 F + DQ: 8 tokens a step into one 8-lane sum, ExpNonPositive8
// (bit-identical to ExpNonPositive) with its table in registers instead of a gather.
SAMPLERD_AVX512 int64_t PieceMassAvx512(const float* x, int64_t n, const RowState& r, double& sum,
                                        int64_t& left_out) {
  const ExpTable512 table;
  const __m512d x_max = _mm512_set1_pd(r.top_x);
  const __m512d inv_t = _mm512_set1_pd(r.inv_t);
  const __m256 skip_f = _mm256_set1_ps(r.skip_below);
  const __m256 keep_f = _mm256_set1_ps(r.keep_from);
  __m512d acc = _mm512_setzero_pd();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 v = _mm256_loadu_ps(x + j);
    const int in_set = _mm256_movemask_ps(_mm256_cmp_ps(v, keep_f, _CMP_GE_OQ));
    const int kept = _mm256_movemask_ps(_mm256_cmp_ps(v, skip_f, _CMP_GE_OQ)) & in_set;
    left_out += __builtin_popcount(static_cast<unsigned>(in_set & ~kept));
    if (kept == 0) continue;
    // Left-out lanes (-inf included) may compute anything: the mask leaves them out.
    const __m512d m =
        ExpNonPositive8(_mm512_mul_pd(_mm512_sub_pd(_mm512_cvtps_pd(v), x_max), inv_t), table);
    acc = _mm512_mask_add_pd(acc, static_cast<__mmask8>(kept), acc, m);
  }
  alignas(64) double lanes[8];
  _mm512_store_pd(lanes, acc);
  sum += ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
         ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  return j;
}

SAMPLERD_AVX512_WARNINGS_ON

}  // namespace
#endif

double PieceMass(const float* x, int64_t n, const RowState& r, int64_t& left_out) {
  double sum = 0.0;
  int64_t j = 0;
#if SAMPLERD_CPU_FAST_X86
  if (UseAvx512()) {
    j = PieceMassAvx512(x, n, r, sum, left_out);
  } else if (UseAvx2()) {
    j = PieceMassAvx2(x, n, r, sum, left_out);
  }
#endif
  for (; j < n; ++j) {
    if (!(x[j] >= r.keep_from)) continue;  // not in the set (-inf on a chunked row)
    if (x[j] < r.skip_below) {             // -inf too
      ++left_out;
      continue;
    }
    sum += ExpNonPositive((static_cast<double>(x[j]) - r.top_x) * r.inv_t);
  }
  return sum;
}

double ProvenMargin(double mass_error, double oracle_depth, double our_depth, double total,
                    int64_t left_out_tokens, double skip_bound, double extra_margin) {
  const double left_out = static_cast<double>(left_out_tokens) * skip_bound;
  return ((3.0 * oracle_depth + 3.0 * our_depth + 4.0) * 0x1.0p-53 + 3.0 * mass_error) *
             (total + left_out) +
         2.0 * left_out + extra_margin * total;
}

void SetSkipBelow(double threshold, RowState& r) {
  if (threshold < -std::numeric_limits<float>::max()) {
    r.skip_below = -kInf;
  } else {
    r.skip_below = static_cast<float>(threshold);
    if (static_cast<double>(r.skip_below) < threshold) {
      r.skip_below = std::nextafter(r.skip_below, kInf);
    }
  }
  const float below = std::nextafter(r.skip_below, -kInf);
  r.skip_bound = InverseCdfMass(below, r.top_x, r.inv_t) * (1.0 + 0x1.0p-40);
}

namespace {

// The oracle's draw over the whole row, read into the thread's scratch.
int32_t OracleDraw(const SampleArgs& args, int64_t row, const RowParams& p) {
  std::vector<float>& x = Scratch().row;
  x.resize(static_cast<size_t>(args.vocab));
  for (int64_t begin = 0; begin < args.vocab; begin += kChunk) {
    LoadChunk(args, row, begin, std::min(kChunk, args.vocab - begin), x.data() + begin);
  }
  return InverseCdfDraw(x.data(), args.vocab, p);
}

}  // namespace

void StartInverseCdf(RowState& r) {
  r.inv_t = InverseTemperature(r.p.temperature);
  r.keep_from = -kInf;
  r.scaled = false;
  // Left out: x < skip_below, i.e. x <= the float just below it, whose mass bounds theirs (the
  // mass is monotone in x; the factor covers exp's rounding, well under an ulp). skip_below is
  // the threshold rounded up, so every token kept has (x - x_max) / T >= -36 (a little less
  // after rounding), inside ExpNonPositive's domain [-44, 0].
  SetSkipBelow(static_cast<double>(r.top_x) - kSkipLogits * r.p.temperature, r);
  r.pieces.clear();
  r.covered = 0;
}

bool MassPieces(const SampleArgs& args, int64_t row, int64_t t0, int64_t t1, RowState& r) {
  float* scratch = Scratch().x.data();
  return r.AddPieces(args.vocab, t0, t1, kPiece, [&](MassPiece& piece) {
    const int64_t n = piece.end - piece.begin;
    const float* x = r.scaled ? ScaledChunk(args, row, piece.begin, n, r.p.temperature, scratch)
                              : ReadX(args, row, piece.begin, n, scratch);
    piece.mass = PieceMass(x, n, r, piece.left_out);
  });
}

// Why the token is the oracle's (notation: m_j = InverseCdfMass of token j, the oracle's mass;
// n = V; eps = 2^-53; gamma_k = k eps / (1 - k eps); a "sum" is a double sum, rounded at every
// addition):
//
// The oracle's prefix P_j is a sum of m_0 .. m_j in index order, its target tau = u * P_{n-1}
// rounded. Every sum formed here (a piece's sum; C_k, the sum of the sums of the pieces before
// piece k; q, C_k plus the masses of piece k up to some token; T', ours over the row) is a sum,
// in another order, of the masses of the tokens up to some j, except that
//   - tokens with x < skip_below are left out, each of mass <= skip_bound, so s = (the number
//     left out) * skip_bound bounds the mass missing from any of our sums;
//   - the pieces' sums use m'_j = ExpNonPositive(...) (vectorised), not m_j. For arguments in
//     [-44, 0]: kd = round(x 64 / ln 2) has |kd| < 2^12 and kLn2HiN 36 significant bits, so
//     kd * kLn2HiN is exact and x - kd * kLn2HiN is exact (Sterbenz), r carries two roundings
//     of < 2^-60 and |r| <= ln 2 / 128 + 2^-59; the Taylor series to r^6 errs by < r^7 / 5040
//     < 2^-64; the polynomial's roundings, the table's exp2 (< 1 ulp) and the final product
//     add < 10 ulp; the exponent addition is exact (results > 2^-1022). So m'_j is within
//     2^-48 of exp, hence within 2^-47 of m_j (glibc's exp: < 1 ulp). The margin allows
//     d = kPieceMassError = 2^-40 (tests/kernels/fast_cpu_sampler_test.cc checks 2^-47 on a
//     million arguments).
// A sum of nonnegative terms is within gamma_D of their exact sum when no term passes through
// more than D additions (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed.,
// section 4.2). The oracle's terms pass through up to n; ours through at most D = 2 kPiece +
// (number of pieces) + 1 (inside a piece, along C, inside the scanned piece). With E the exact
// sum of all m_j (E <= 1.001 (T' + s) for D, n < 2^40):
//   |P_j - Q_j| <= gamma_n E + gamma_D E + 1.01 d E + s                (Q_j: ours up to token j)
//   |tau - tau'| <= |P_{n-1} - T'| + 2.01 eps E                        (tau' = u * T' rounded)
// so both together stay below (2.01 (n + D) + 3) eps E + 2.02 d E + 2 s, within
//   margin = ((3 n + 3 D + 4) eps + 3 d) (T' + s) + 2 s.
// The token j taken here has q_before + margin < tau' and q_after - margin > tau', where
// q_before / q_after are our sums before and after m_j. Then the oracle's P_{j-1} < tau (so, P
// being nondecreasing, no earlier token crosses) and P_j > tau: its token is j as well. If
// either distance is within the margin, or nothing crosses, the oracle's draw decides.
//
// How often: a row falls back when its target lies within the margin of a boundary, so with
// probability about (twice the margin) x (the number of tokens with mass above it) / T':
// ~6 n^2 eps when the mass is spread over the row (1.5e-5 at V = 151,936, 7e-7 at 32,000),
// less on peaked rows.
bool FinishInverseCdf(const SampleArgs& args, int64_t row, double extra_margin, RowState& r) {
  std::vector<MassPiece>& pieces = r.pieces;
  std::sort(pieces.begin(), pieces.end(),
            [](const MassPiece& a, const MassPiece& b) { return a.begin < b.begin; });
  double total = 0.0;
  for (const MassPiece& piece : pieces) total += piece.mass;
  int64_t left_out_tokens = 0;
  for (const MassPiece& piece : pieces) left_out_tokens += piece.left_out;
  const double depth = static_cast<double>(2 * kPiece + static_cast<int64_t>(pieces.size()) + 1);
  const double margin = ProvenMargin(kPieceMassError, static_cast<double>(args.vocab), depth, total,
                                     left_out_tokens, r.skip_bound, extra_margin);
  const double target = RowUniform(r.p.seed, r.p.position) * total;

  double before = 0.0;  // C_k
  for (const MassPiece& piece : pieces) {
    const double after = before + piece.mass;
    if (!(after > target)) {
      before = after;
      continue;
    }
    // The crossing piece: scan it in index order from C_k.
    const int64_t count = piece.end - piece.begin;
    const float* x = ReadX(args, row, piece.begin, count, Scratch().x.data());
    double q = before;
    for (int64_t j = 0; j < count; ++j) {
      if (x[j] < r.skip_below) continue;
      const double q_after = q + InverseCdfMass(x[j], r.top_x, r.inv_t);
      if (q_after > target) {
        if (target - q > margin && q_after - target > margin) {
          r.token = static_cast<int32_t>(piece.begin + j);
          return false;
        }
        break;
      }
      q = q_after;
    }
    break;
  }
  r.token = OracleDraw(args, row, r.p);
  return true;
}

}  // namespace samplerd::kernels::cpu_fast_internal
