// InverseCdfDraw: the definition of kernels/common/inverse_cdf.h, step by step.
#include "kernels/cpu/inverse_cdf_draw.h"

#include <algorithm>
#include <cstdint>

#include "kernels/common/inverse_cdf.h"

namespace samplerd::kernels {

int32_t InverseCdfDraw(const float* x, int64_t n, const RowParams& p) {
  const double x_max = *std::max_element(x, x + n);
  const double inv_t = InverseTemperature(p.temperature);
  double total = 0.0;
  for (int64_t j = 0; j < n; ++j) total += InverseCdfMass(x[j], x_max, inv_t);
  const double target = RowUniform(p.seed, p.position) * total;
  double prefix = 0.0;
  int64_t last_with_mass = -1;
  for (int64_t j = 0; j < n; ++j) {
    const double mass = InverseCdfMass(x[j], x_max, inv_t);
    if (mass == 0.0) continue;  // adds nothing: the prefix cannot cross here
    prefix += mass;
    if (prefix > target) return static_cast<int32_t>(j);
    last_with_mass = j;
  }
  // Rounding left the target at or above the last prefix (u * total may round up to total).
  return static_cast<int32_t>(last_with_mass);
}

namespace {

// One level of the chunked draw over tokens [begin, end) in units of `unit` tokens: the first
// token of the chosen unit.
template <class Mass>
int64_t ChooseUnit(int64_t begin, int64_t end, int64_t unit, double u, const Mass& mass) {
  auto weight = [&](int64_t first) {
    double w = 0.0;
    for (int64_t j = first; j < end && j < first + unit; ++j) w += mass(j);
    return w;
  };
  double total = 0.0;
  for (int64_t first = begin; first < end; first += unit) total += weight(first);
  const double target = u * total;
  double running = 0.0;
  int64_t last_with_weight = -1;
  for (int64_t first = begin; first < end; first += unit) {
    const double w = weight(first);
    if (w == 0.0) continue;  // adds nothing: the running weight cannot cross here
    running += w;
    if (running > target) return first;
    last_with_weight = first;
  }
  return last_with_weight;  // rounding left the target at or above the total
}

}  // namespace

int32_t ChunkedInverseCdfDraw(const float* z, const uint8_t* keep, int64_t n, float z_max,
                              const RowParams& p) {
  const double reference = z_max;
  const ChunkedUniforms u = RowChunkedUniforms(p.seed, p.position);
  // Level 0: the head (K's tokens above the bin of its lowest z) or the tail.
  float z_low = z_max;
  for (int64_t j = 0; j < n; ++j) {
    if (keep[j] && z[j] < z_low) z_low = z[j];
  }
  const float low_bin = DrawBin(z_low);
  double w_head = 0.0, w_tail = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    if (!keep[j]) continue;
    (DrawBin(z[j]) > low_bin ? w_head : w_tail) += KeptMass(z[j], reference);
  }
  const bool head = HeadIsDrawn(w_head, w_tail, u.u0);
  auto mass = [&](int64_t j) {
    return keep[j] && (DrawBin(z[j]) > low_bin) == head ? KeptMass(z[j], reference) : 0.0;
  };
  const int64_t chunk = ChooseUnit(0, n, kDrawChunk, u.u1, mass);
  const int64_t chunk_end = std::min(n, chunk + kDrawChunk);
  const int64_t segment = ChooseUnit(chunk, chunk_end, kDrawSegment, u.u2, mass);
  const int64_t segment_end = std::min(chunk_end, segment + kDrawSegment);
  return static_cast<int32_t>(ChooseUnit(segment, segment_end, 1, u.u3, mass));
}

}  // namespace samplerd::kernels
