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

}  // namespace samplerd::kernels
