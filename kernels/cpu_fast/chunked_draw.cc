// Phase 3 of FastCpuSampler for top-p-alone rows: the chunked inverse-CDF draw (chunked_draw.h).
#include "kernels/cpu_fast/chunked_draw.h"

#include <algorithm>
#include <cmath>
#include <cstring>
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

// A kept token, its exact mass and its part (level 0).
struct KeptToken {
  int64_t id;
  double mass;
  bool head;
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
  if (chosen < 0) return;  // no mass: cannot happen, the part holds a kept token of mass > 0
  *lo = start[chosen];
  *hi = start[chosen + 1];
}

// The tail's chunk weights again, each the sum of its segments' tail sums (FloatSegmentMasses:
// every term within kFloatMassError, added in double), for a row whose level 0 or level 1
// target fell within the pieces' tail sums' wider margin (kTailMassError): one more read of
// the row and one float exp a kept token, against the oracle's two double exps a kept token.
void TailChunkWeights(const SampleArgs& args, int64_t row, const RowState& r, double* weight) {
  double segment[kDrawChunk / kDrawSegment];
  for (int64_t begin = 0, c = 0; begin < args.vocab; begin += kDrawChunk, ++c) {
    const int64_t count = std::min(kDrawChunk, args.vocab - begin);
    const float* z = ScaledChunk(args, row, begin, count, r.p.temperature, Scratch().x.data());
    int64_t left_out = 0;  // the pieces' count already holds these
    FloatSegmentMasses(z, count, r, /*of_head=*/false, segment, left_out);
    double w = 0.0;
    for (int64_t s = 0; s < (count + kDrawSegment - 1) / kDrawSegment; ++s) w += segment[s];
    weight[c] = w;
  }
}

// The least float h with DrawBin(h) > DrawBin(keep_from), so that a kept z is the head's (the
// oracle's DrawBin(z) > DrawBin(z_c), DrawBin being nondecreasing) iff z >= h; +inf when no z <=
// mx is (the head is empty). (b + 1) / 8 is that float for |keep_from| < 2^21 (x 8 and / 8 are
// exact, b + 1 an integer below 2^24); beyond, where b + 1 rounds, the steps find it.
float HeadFrom(float keep_from, float mx) {
  const float b = DrawBin(keep_from);
  if (!(DrawBin(mx) > b)) return kInf;
  float h = (b + 1.0f) / kDrawBinsPerLogit;
  while (!(DrawBin(h) > b)) h = std::nextafter(h, kInf);  // ends at mx at the latest
  for (float below = std::nextafter(h, -kInf); DrawBin(below) > b;) {
    h = below;  // ends above keep_from
    below = std::nextafter(h, -kInf);
  }
  return h;
}

}  // namespace

void StartChunkedDraw(RowState& r) {
  r.top_x = r.mx;  // the masses' reference: exp(z - z_max)
  r.inv_t = 1.0;
  r.scaled = true;
  // draw_key is the key of a kept token (radix_select.cc: the last token the top-p rule keeps,
  // the one value of the boundary bin, or min_finite when the rule keeps every finite z), so
  // keep_from is K's lowest z, the definition's z_c.
  r.keep_from = ValueOf(r.draw_key);
  r.head_from = HeadFrom(r.keep_from, r.mx);
  SetSkipBelow(static_cast<double>(r.mx) - kSkipLogits, r);
  r.pieces.clear();
  r.covered = 0;
}

bool ChunkedMassPieces(const SampleArgs& args, int64_t row, int64_t t0, int64_t t1, RowState& r) {
  float* scratch = Scratch().x.data();
  return r.AddPieces(args.vocab, t0, t1, kDrawChunk, [&](MassPiece& piece) {
    const int64_t n = piece.end - piece.begin;
    const float* z = ScaledChunk(args, row, piece.begin, n, r.p.temperature, scratch);
    const PartMasses sums = FloatPieceMasses(z, n, r, piece.left_out);
    piece.mass = sums.head;
    piece.tail = sums.tail;
  });
}

// Why the part, the chunk and the segment are the oracle's: FinishInverseCdf's argument
// (inverse_cdf_pass.cc) with units for tokens. Our running weight before and after a unit, our
// total and our target are sums of the same tokens' masses as the oracle's (in another order,
// with masses within a relative d of the oracle's, some left out), so each lies within
// ProvenMargin of the oracle's; a unit whose boundaries both clear our target by more than the
// margin is the oracle's too. Our head is the oracle's: z >= head_from iff DrawBin(z) >
// DrawBin(z_c) (HeadFrom), the same compare on every path.
// Level 0: two units, the head then the tail; the oracle takes the head iff its target tau =
// u0 x (W_H + W_T) is below W_H, so only that one boundary counts (the tail needs no upper one).
// The oracle's W_H and W_T are index-order sums over the whole row and W_H + W_T one more
// addition (depth V + 1); ours add a piece's tokens (at most kDrawChunk, lane by lane then
// across lanes), the pieces, the chunks (the tail's) and W_H' + W_T' (depth kDrawChunk + pieces
// + chunks + 2). The head's terms carry d = kFloatMassError (float_mass.h: a float mass, or a
// float sum of two of the same part, 3.3 x 2^-24 proven, 2^-22 allowed), the tail's d_T =
// kTailMassError (chunk_weights.h: the dense pieces add 16 in float). In ProvenMargin's bound
// the masses' errors enter as 2.02 d E (E the exact sum of the masses, <= 1.001 (total + s), s
// the left-out mass); with the tail's terms at d_T they enter as 2.02 (d E + (d_T - d) E_T)
// instead, E_T <= 1.001 (W_T' + s): so the margin is ProvenMargin's at d plus 3 (d_T - d)(W_T'
// + s). We take the head when W_H' - u0 x W' > margin (then W_H > tau) and the tail when u0 x W'
// - W_H' > margin (then tau > W_H). Otherwise the tail's chunk weights are summed again from
// its segment sums (TailChunkWeights: d_T = d, so the margin is ProvenMargin's at d, ~3 x 2^-22
// W), and only a target within that margin sends the row to the oracle: ~2 x 7e-7 of rows. A
// row whose head is empty (head_from above z_max) takes the tail exactly: the oracle's W_H is 0.
// Levels 1-3 then weigh the chosen part's tokens only (the oracle's m_j = 0 outside it: adding
// a 0 changes no sum), so their margins are those of a row whose kept set is the part, of total
// W_part. Level 1: d = kFloatMassError for the head, kTailMassError for the tail's pieces; the
// oracle's chunk weights are index-order sums over kDrawChunk tokens and its total and running
// sums add the chunks (depth kDrawChunk + chunks); ours add a piece's tokens, the chunk's pieces
// and the chunks (or a segment's tokens, the chunk's segments and the chunks). So a row falls
// back when u1 x W_part lies within ~3 d W_part (7e-7 W_part) of one of its ~V / kDrawChunk
// boundaries: ~7e-7 x 2 x 19 ~ 3e-5 of rows at V = 151,936, whichever part was drawn (a tail
// target within the pieces' 8x wider margin first takes TailChunkWeights, ~2e-4 of the rows
// that draw the tail; measured: see TheChunkedDrawFallsBackOnFewRows). Level 2: the float
// masses first (d = kFloatMassError for either part, kDrawSegment tokens a segment and the
// chunk's segments on both sides, ours one more); its ~256 boundaries put ~4e-4 of targets
// within that margin, which then take PieceMass's double masses (d = kPieceMassError) of the
// part's tokens before the oracle's. Level 3 uses the oracle's own masses and sums. Left-out
// tokens (below skip_below) are counted in either part's margins, wherever they lie.
bool FinishChunkedDraw(const SampleArgs& args, int64_t row, double extra_margin, RowState& r) {
  std::vector<MassPiece>& pieces = r.pieces;
  std::sort(pieces.begin(), pieces.end(),
            [](const MassPiece& a, const MassPiece& b) { return a.begin < b.begin; });
  const ChunkedUniforms u = RowChunkedUniforms(r.p.seed, r.p.position);
  const auto piece_count = static_cast<int64_t>(pieces.size());
  // The tail's chunk weights: the pieces' (terms within kTailMassError), then, if a target
  // falls within that margin, its segment sums' (within kFloatMassError: TailChunkWeights).
  const int64_t chunks = (args.vocab + kDrawChunk - 1) / kDrawChunk;
  std::vector<double> tail_weight(static_cast<size_t>(chunks), 0.0);
  double w_head = 0.0;
  int64_t left_out = 0;
  for (const MassPiece& piece : pieces) {
    w_head += piece.mass;
    tail_weight[piece.begin / kDrawChunk] += piece.tail;
    left_out += piece.left_out;
  }
  double tail_error = kTailMassError;
  auto refine_tail = [&] {
    TailChunkWeights(args, row, r, tail_weight.data());
    tail_error = kFloatMassError;
  };
  // 0. The part: the head or the tail.
  bool head = false;  // an empty head (head_from > mx): the tail
  if (r.head_from <= r.mx) {
    const double left_out_mass = static_cast<double>(left_out) * r.skip_bound;
    for (;;) {
      double w_tail = 0.0;
      for (double w : tail_weight) w_tail += w;
      const double total = w_head + w_tail;
      const double margin = ProvenMargin(kFloatMassError, static_cast<double>(args.vocab + 1),
                                         static_cast<double>(kDrawChunk + piece_count + chunks + 2),
                                         total, left_out, r.skip_bound, extra_margin) +
                            3.0 * (tail_error - kFloatMassError) * (w_tail + left_out_mass);
      const double target = u.u0 * total;
      if (w_head - target > margin) {
        head = true;
        break;
      }
      if (target - w_head > margin) break;
      if (tail_error == kFloatMassError) {
        r.token = OracleDraw(args, row, r);
        return true;
      }
      refine_tail();
    }
  }
  // 1. The chunk, over the part's tokens.
  std::vector<double> weight(static_cast<size_t>(chunks), 0.0);
  const double depth1 = static_cast<double>(kDrawChunk + piece_count + chunks + 1);
  int chunk = -1;
  for (;;) {
    if (head) {
      weight.assign(static_cast<size_t>(chunks), 0.0);
      for (const MassPiece& piece : pieces) weight[piece.begin / kDrawChunk] += piece.mass;
    } else {
      weight = tail_weight;
    }
    double total = 0.0;
    for (double w : weight) total += w;
    chunk = ChooseWithMargin(
        weight.data(), static_cast<int>(chunks), total, u.u1,
        ProvenMargin(head ? kFloatMassError : tail_error, static_cast<double>(kDrawChunk + chunks),
                     depth1, total, left_out, r.skip_bound, extra_margin));
    if (chunk >= 0 || head || tail_error == kFloatMassError) break;
    refine_tail();
  }
  if (chunk < 0) {
    r.token = OracleDraw(args, row, r);
    return true;
  }
  // 2. The segment of that chunk, over the part's tokens.
  const int64_t chunk_begin = chunk * kDrawChunk;
  const int64_t count = std::min(kDrawChunk, args.vocab - chunk_begin);
  const float* z = ScaledChunk(args, row, chunk_begin, count, r.p.temperature, Scratch().x.data());
  const int segments = static_cast<int>((count + kDrawSegment - 1) / kDrawSegment);
  const double depth2 = static_cast<double>(kDrawSegment + segments);
  weight.assign(static_cast<size_t>(segments), 0.0);
  left_out = 0;
  FloatSegmentMasses(z, count, r, head, weight.data(), left_out);
  double total = 0.0;
  for (double w : weight) total += w;
  int segment = ChooseWithMargin(weight.data(), segments, total, u.u2,
                                 ProvenMargin(kFloatMassError, depth2, depth2 + 1.0, total,
                                              left_out, r.skip_bound, extra_margin));
  if (segment < 0) {  // within the float masses' margin of a boundary: the double masses
    left_out = 0;
    total = 0.0;
    for (int s = 0; s < segments; ++s) {
      const int64_t first = s * kDrawSegment;
      const int64_t n = std::min(kDrawSegment, count - first);
      float part[kDrawSegment];  // the segment's z, -inf (outside the set) outside the part
      for (int64_t k = 0; k < n; ++k) {
        const float zk = z[first + k];
        part[k] = (zk >= r.head_from) == head ? zk : -kInf;
      }
      weight[s] = PieceMass(part, n, r, left_out);
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
  // 3. The token of that segment: the oracle's masses and sums, over the part's tokens.
  const int64_t first = segment * kDrawSegment;
  const int64_t n = std::min(kDrawSegment, count - first);
  double mass[kDrawSegment];
  for (int64_t k = 0; k < n; ++k) {
    const float zk = z[first + k];
    mass[k] = zk >= r.keep_from && (zk >= r.head_from) == head
                  ? KeptMass(zk, static_cast<double>(r.mx))
                  : 0.0;
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
  // Level 0 as the oracle: z_c the lowest kept z, the head those of a higher DrawBin, W_H and
  // W_T summed in index order (the oracle's order over the kept tokens: the same bits).
  float z_low = r.mx;
  for (int64_t i = 0; i < kept; ++i) {
    if (r.candidates[i].z < z_low) z_low = r.candidates[i].z;
  }
  const float low_bin = DrawBin(z_low);
  std::vector<KeptToken> t(static_cast<size_t>(kept));
  for (int64_t i = 0; i < kept; ++i) {
    const Candidate& c = r.candidates[i];
    t[i] = {c.id, KeptMass(c.z, static_cast<double>(r.mx)), DrawBin(c.z) > low_bin};
  }
  std::sort(t.begin(), t.end(), [](const KeptToken& a, const KeptToken& b) { return a.id < b.id; });
  double w_head = 0.0, w_tail = 0.0;
  for (const KeptToken& k : t) (k.head ? w_head : w_tail) += k.mass;
  const ChunkedUniforms u = RowChunkedUniforms(r.p.seed, r.p.position);
  const bool head = HeadIsDrawn(w_head, w_tail, u.u0);
  // Levels 1-3 over the part's tokens, in id order (the oracle's other tokens weigh 0).
  t.erase(std::remove_if(t.begin(), t.end(), [&](const KeptToken& k) { return k.head != head; }),
          t.end());
  size_t lo = 0, hi = t.size();
  ChooseGathered(t, kDrawChunk, u.u1, &lo, &hi);
  ChooseGathered(t, kDrawSegment, u.u2, &lo, &hi);
  ChooseGathered(t, 1, u.u3, &lo, &hi);
  r.token = static_cast<int32_t>(t[lo].id);
  r.plan = Plan::kDone;
}

}  // namespace samplerd::kernels::cpu_fast_internal
