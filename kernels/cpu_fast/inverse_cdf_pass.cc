// Phase 3 of FastCpuSampler for plain-temperature rows: the inverse-CDF draw (inverse_cdf_pass.h).
#include "kernels/cpu_fast/inverse_cdf_pass.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <vector>

#include "kernels/common/inverse_cdf.h"
#include "kernels/cpu/inverse_cdf_draw.h"
#include "kernels/cpu_fast/row_chunks.h"

namespace samplerd::kernels::cpu_fast_internal {
namespace {

// Tokens [begin, begin + n) of row `row` as fp32 (n <= kChunk, inside one chunk): the logits
// themselves when they are fp32 and 4-byte aligned, else a copy in `scratch`.
const float* ReadX(const SampleArgs& args, int64_t row, int64_t begin, int64_t n, float* scratch) {
  const unsigned char* x = Fp32Chunk(args, row, begin);
  if (x != nullptr && reinterpret_cast<uintptr_t>(x) % alignof(float) == 0) {
    return reinterpret_cast<const float*>(x);
  }
  LoadChunk(args, row, begin, n, scratch);
  return scratch;
}

// The sum, in index order, of the masses of x[0, n) not left out (x >= r.skip_below).
double PieceMass(const float* x, int64_t n, const RowState& r) {
  const double x_max = r.top_x;
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    if (x[j] < r.skip_below) continue;  // -inf too
    sum += InverseCdfMass(x[j], x_max, r.inv_t);
  }
  return sum;
}

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
  // Left out: x < skip_below, i.e. x <= the float just below it, whose mass bounds theirs (the
  // mass is monotone in x; the factor covers exp's rounding, well under an ulp).
  const double threshold = static_cast<double>(r.top_x) - kSkipLogits * r.p.temperature;
  r.skip_below =
      threshold < -std::numeric_limits<float>::max() ? -kInf : static_cast<float>(threshold);
  const float below = std::nextafter(r.skip_below, -kInf);
  r.skip_bound = InverseCdfMass(below, r.top_x, r.inv_t) * (1.0 + 0x1.0p-40);
  r.pieces.clear();
}

void MassPieces(const SampleArgs& args, int64_t row, int64_t t0, int64_t t1, RowState& r) {
  float* scratch = Scratch().x.data();
  std::vector<MassPiece> pieces;
  pieces.reserve(static_cast<size_t>((t1 - t0) / kPiece + 2));
  for (int64_t begin = t0; begin < t1;) {
    const int64_t end = std::min(t1, (begin / kPiece + 1) * kPiece);
    const float* x = ReadX(args, row, begin, end - begin, scratch);
    pieces.push_back(MassPiece{begin, end, PieceMass(x, end - begin, r)});
    begin = end;
  }
  std::lock_guard<std::mutex> lock(r.mu);
  r.pieces.insert(r.pieces.end(), pieces.begin(), pieces.end());
}

// Why the token is the oracle's (notation: m_j = InverseCdfMass of token j, the same double in
// both; n = V; eps = 2^-53; a "sum" is a double sum, rounded at every addition):
//
// The oracle's prefix P_j is a sum of m_0 .. m_j in index order, its target tau = u * P_{n-1}
// rounded. Every sum formed here (a piece's sum; C_k, the sum of the sums of the pieces before
// piece k; q, C_k plus the masses of piece k up to some token) is a sum, in another order, of
// the same masses with some left out: those of tokens with x < skip_below, each <= skip_bound,
// so s = n * skip_bound bounds the mass left out of any of them. A sum of N >= 1 nonnegative
// terms in any order is within gamma_{N-1} = (N-1) eps / (1 - (N-1) eps) of their exact sum
// (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., section 4.2), and none of
// these sums has more than 2n terms (masses and piece sums). With E the exact mass of the row:
//   |P_j - Q_j| <= gamma_n E + gamma_2n E + s <= 2 gamma_2n E + s     (Q_j: ours up to token j)
//   |tau - tau'| <= |P_{n-1} - T'| + 2 eps E(1 + ...)                     (tau' = u * T' rounded)
// so both together stay below 4 gamma_2n E + 2 s + 2^-51 E, and with E <= 2 (T' + s) and
// gamma_2n <= 2.02 n eps (n < 2^45):
//   margin = (17 n + 8) eps (T' + s) + 2 s.
// The token j taken here has q_before + margin < tau' and q_after - margin > tau', where
// q_before / q_after are our sums before and after m_j. Then the oracle's P_{j-1} < tau (so, P
// being nondecreasing, no earlier token crosses) and P_j > tau: its token is j as well. If
// either distance is within the margin, or nothing crosses, the oracle's draw decides.
bool FinishInverseCdf(const SampleArgs& args, int64_t row, double extra_margin, RowState& r) {
  std::vector<MassPiece>& pieces = r.pieces;
  std::sort(pieces.begin(), pieces.end(),
            [](const MassPiece& a, const MassPiece& b) { return a.begin < b.begin; });
  double total = 0.0;
  for (const MassPiece& piece : pieces) total += piece.mass;
  const double n = static_cast<double>(args.vocab);
  const double left_out = n * r.skip_bound;
  const double margin =
      (17.0 * n + 8.0) * 0x1.0p-53 * (total + left_out) + 2.0 * left_out + extra_margin * total;
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
