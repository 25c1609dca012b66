// Phase 3 of FastCpuSampler for top-p-alone rows: the chunked inverse-CDF draw (chunked_draw.h).
#include "kernels/cpu_fast/chunked_draw.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "kernels/common/inverse_cdf.h"
#include "kernels/cpu/inverse_cdf_draw.h"
#include "kernels/cpu_fast/chunk_weights.h"
#include "kernels/cpu_fast/float_mass.h"
#include "kernels/cpu_fast/inverse_cdf_pass.h"
#include "kernels/cpu_fast/order_keys.h"
#include "kernels/cpu_fast/row_chunks.h"

namespace samplerd::kernels::cpu_fast_internal {
namespace {

static_assert(kChunk % kDrawChunk == 0, "a read chunk holds whole draw chunks");

// The definition's rule over units of exact weights w[0, n), in unit order: the lowest unit
// whose running weight is > u x total, else the last of weight > 0; -1 when none has weight.
// The same additions as the oracle's ChooseUnit: the same bits.
int ChooseExact(const double* w, int n, double u) {
  double total = 0.0;
  for (int i = 0; i < n; ++i) total += w[i];
  const double target = u * total;
  double running = 0.0;
  int last = -1;
  for (int i = 0; i < n; ++i) {
    if (w[i] == 0.0) continue;
    running += w[i];
    if (running > target) return i;
    last = i;
  }
  return last;
}

// The same rule over approximate weights w[0, n) whose total is `total` and whose running sums
// and target are within `margin` of the oracle's (ProvenMargin): the unit, when the target
// clears both of its boundaries by more than the margin (then the oracle's running sum is below
// its target before the unit and above it after, so it takes the same unit); else -1.
int ChooseWithMargin(const double* w, int n, double total, double u, double margin) {
  const double target = u * total;
  double before = 0.0;
  for (int i = 0; i < n; ++i) {
    const double after = before + w[i];
    if (after > target) return target - before > margin && after - target > margin ? i : -1;
    before = after;
  }
  return -1;
}

// The oracle's draw over the whole row: z and the kept set read into the thread's scratch.
int32_t OracleDraw(const SampleArgs& args, int64_t row, const RowState& r) {
  std::vector<float>& z = Scratch().row;
  z.resize(static_cast<size_t>(args.vocab));
  for (int64_t begin = 0; begin < args.vocab; begin += kChunk) {
    const int64_t n = std::min(kChunk, args.vocab - begin);
    const float* read = ScaledChunk(args, row, begin, n, r.p.temperature, z.data() + begin);
    if (read != z.data() + begin) std::memcpy(z.data() + begin, read, n * sizeof(float));
  }
  std::vector<uint8_t> keep(static_cast<size_t>(args.vocab));
  for (int64_t j = 0; j < args.vocab; ++j) keep[j] = z[j] >= r.keep_from;
  return ChunkedInverseCdfDraw(z.data(), keep.data(), args.vocab, r.mx, r.p);
}

// A kept token and its exact mass.
struct KeptToken {
  int64_t id;
  double mass;
};

// One level of the draw over t[lo, hi) (sorted by id), in units of `unit` tokens: the chosen
// unit's entries, [*lo, *hi). Units without an entry weigh 0 and add nothing.
void ChooseGathered(const std::vector<KeptToken>& t, int64_t unit, double u, size_t* lo,
                    size_t* hi) {
  std::vector<double> weight;
  std::vector<size_t> start;
  for (size_t i = *lo; i < *hi;) {
    const int64_t of = t[i].id / unit;
    double w = 0.0;
    start.push_back(i);
    for (; i < *hi && t[i].id / unit == of; ++i) w += t[i].mass;
    weight.push_back(w);
  }
  start.push_back(*hi);
  const int chosen = ChooseExact(weight.data(), static_cast<int>(weight.size()), u);
  if (chosen < 0) return;  // no mass: cannot happen, the row's max is kept with mass 1
  *lo = start[chosen];
  *hi = start[chosen + 1];
}

}  // namespace

void StartChunkedDraw(RowState& r) {
  r.top_x = r.mx;  // the masses' reference: exp(z - z_max)
  r.inv_t = 1.0;
  r.scaled = true;
  r.keep_from = ValueOf(r.draw_key);
  SetSkipBelow(static_cast<double>(r.mx) - kSkipLogits, r);
  r.pieces.clear();
  r.covered = 0;
}

bool ChunkedMassPieces(const SampleArgs& args, int64_t row, int64_t t0, int64_t t1, RowState& r) {
  float* scratch = Scratch().x.data();
  std::vector<MassPiece> pieces;
  pieces.reserve(static_cast<size_t>((t1 - t0) / kDrawChunk + 2));
  for (int64_t begin = t0; begin < t1;) {
    const int64_t end = std::min(t1, (begin / kDrawChunk + 1) * kDrawChunk);
    const float* z = ScaledChunk(args, row, begin, end - begin, r.p.temperature, scratch);
    MassPiece piece{begin, end, 0.0, 0};
    piece.mass = FloatPieceMass(z, end - begin, r, piece.left_out);
    pieces.push_back(piece);
    begin = end;
  }
  std::lock_guard<SpinMutex> lock(r.mu);
  r.pieces.insert(r.pieces.end(), pieces.begin(), pieces.end());
  r.covered += t1 - t0;
  return r.covered == args.vocab;
}

// Why the chunk and segment are the oracle's: FinishInverseCdf's argument (inverse_cdf_pass.cc)
// with units for tokens. Our running weight before and after a unit, our total and our target
// are sums of the same tokens' masses as the oracle's (in another order, with masses within a
// relative d of the oracle's, some left out), so each lies within ProvenMargin of the oracle's;
// a unit whose boundaries both clear our target by more than the margin is the oracle's too.
// Level 1: d = kFloatMassError (float_mass.h: a float mass, or a float sum of two, 3.3 x 2^-24
// proven, 2^-22 allowed); the oracle's chunk weights are index-order sums over kDrawChunk tokens
// and its total and running sums add the chunks (depth kDrawChunk + chunks); ours add a piece's
// tokens (at most kDrawChunk, lane by lane then across lanes), the chunk's pieces and the
// chunks. So a row falls back when u1 x W lies within ~3 x 2^-22 W (7e-7 W) of one of its ~V /
// kDrawChunk boundaries: ~7e-7 x 2 x 19 ~ 3e-5 of rows at V = 151,936 (measured: 15 in 600,000
// draws of flat, bf16-rounded and randn x 3 rows, TheChunkedDrawFallsBackOnFewRows with more
// seeds). Level 2: the float masses first (d = kFloatMassError, kDrawSegment tokens a segment
// and the chunk's segments on both sides, ours one more); its ~256 boundaries put ~4e-4 of
// targets within that margin, which then take PieceMass's double masses (d = kPieceMassError)
// before the oracle's. Level 3 uses the oracle's own masses and sums.
bool FinishChunkedDraw(const SampleArgs& args, int64_t row, double extra_margin, RowState& r) {
  std::vector<MassPiece>& pieces = r.pieces;
  std::sort(pieces.begin(), pieces.end(),
            [](const MassPiece& a, const MassPiece& b) { return a.begin < b.begin; });
  const ChunkedUniforms u = RowChunkedUniforms(r.p.seed, r.p.position);
  // 1. The chunk.
  const int64_t chunks = (args.vocab + kDrawChunk - 1) / kDrawChunk;
  std::vector<double> weight(static_cast<size_t>(chunks), 0.0);
  int64_t left_out = 0;
  for (const MassPiece& piece : pieces) {
    weight[piece.begin / kDrawChunk] += piece.mass;
    left_out += piece.left_out;
  }
  double total = 0.0;
  for (double w : weight) total += w;
  const double depth1 =
      static_cast<double>(kDrawChunk + static_cast<int64_t>(pieces.size()) + chunks + 1);
  const int chunk =
      ChooseWithMargin(weight.data(), static_cast<int>(chunks), total, u.u1,
                       ProvenMargin(kFloatMassError, static_cast<double>(kDrawChunk + chunks),
                                    depth1, total, left_out, r.skip_bound, extra_margin));
  if (chunk < 0) {
    r.token = OracleDraw(args, row, r);
    return true;
  }
  // 2. The segment of that chunk.
  const int64_t chunk_begin = chunk * kDrawChunk;
  const int64_t count = std::min(kDrawChunk, args.vocab - chunk_begin);
  const float* z = ScaledChunk(args, row, chunk_begin, count, r.p.temperature, Scratch().x.data());
  const int segments = static_cast<int>((count + kDrawSegment - 1) / kDrawSegment);
  const double depth2 = static_cast<double>(kDrawSegment + segments);
  weight.assign(static_cast<size_t>(segments), 0.0);
  left_out = 0;
  FloatSegmentMasses(z, count, r, weight.data(), left_out);
  total = 0.0;
  for (double w : weight) total += w;
  int segment = ChooseWithMargin(weight.data(), segments, total, u.u2,
                                 ProvenMargin(kFloatMassError, depth2, depth2 + 1.0, total,
                                              left_out, r.skip_bound, extra_margin));
  if (segment < 0) {  // within the float masses' margin of a boundary: the double masses
    left_out = 0;
    total = 0.0;
    for (int s = 0; s < segments; ++s) {
      const int64_t first = s * kDrawSegment;
      weight[s] = PieceMass(z + first, std::min(kDrawSegment, count - first), r, left_out);
      total += weight[s];
    }
    segment = ChooseWithMargin(weight.data(), segments, total, u.u2,
                               ProvenMargin(kPieceMassError, depth2, depth2 + 1.0, total, left_out,
                                            r.skip_bound, extra_margin));
  }
  if (segment < 0) {
    r.token = OracleDraw(args, row, r);
    return true;
  }
  // 3. The token of that segment: the oracle's masses and sums.
  const int64_t first = segment * kDrawSegment;
  const int64_t n = std::min(kDrawSegment, count - first);
  double mass[kDrawSegment];
  for (int64_t k = 0; k < n; ++k) {
    const float zk = z[first + k];
    mass[k] = zk >= r.keep_from ? KeptMass(zk, static_cast<double>(r.mx)) : 0.0;
  }
  const int k = ChooseExact(mass, static_cast<int>(n), u.u3);
  if (k < 0) {
    r.token = OracleDraw(args, row, r);
    return true;
  }
  r.token = static_cast<int32_t>(chunk_begin + first + k);
  return false;
}

void DrawChunkedGathered(int64_t kept, RowState& r) {
  std::vector<KeptToken> t(static_cast<size_t>(kept));
  for (int64_t i = 0; i < kept; ++i) {
    const Candidate& c = r.candidates[i];
    t[i] = {c.id, KeptMass(c.z, static_cast<double>(r.mx))};
  }
  std::sort(t.begin(), t.end(), [](const KeptToken& a, const KeptToken& b) { return a.id < b.id; });
  const ChunkedUniforms u = RowChunkedUniforms(r.p.seed, r.p.position);
  size_t lo = 0, hi = t.size();
  ChooseGathered(t, kDrawChunk, u.u1, &lo, &hi);
  ChooseGathered(t, kDrawSegment, u.u2, &lo, &hi);
  ChooseGathered(t, 1, u.u3, &lo, &hi);
  r.token = static_cast<int32_t>(t[lo].id);
  r.plan = Plan::kDone;
}

}  // namespace samplerd::kernels::cpu_fast_internal
