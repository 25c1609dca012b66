// Chi-square goodness of fit for the statistical tests of the samplers (docs/DESIGN.md
// "Testing": merge cells to >= 5 expected, tiny alpha, fixed seeds): critical values from the
// regularized incomplete gamma function, and Pearson's statistic with merged cells.
#ifndef SAMPLERD_TESTS_KERNELS_CHI_SQUARE_H_
#define SAMPLERD_TESTS_KERNELS_CHI_SQUARE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace samplerd::kernels::testing {

// z with P(N(0,1) > z) = alpha, by bisection on erfc (monotone decreasing).
inline double NormalUpperQuantile(double alpha) {
  double lo = 0.0, hi = 40.0;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    (0.5 * std::erfc(mid / std::sqrt(2.0)) > alpha ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

// Upper regularized incomplete gamma Q(a, x) = Gamma(a, x) / Gamma(a): the power series of
// P = 1 - Q below x = a + 1, Lentz's continued fraction for Q above (where chi-square tails are).
inline double UpperGammaQ(double a, double x) {
  if (x <= 0.0) return 1.0;
  const double prefix = std::exp(-x + a * std::log(x) - std::lgamma(a));
  if (x < a + 1.0) {
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 10000 && term > sum * 1e-17; ++n) {
      term *= x / (a + n);
      sum += term;
    }
    return 1.0 - prefix * sum;
  }
  constexpr double kTiny = 1e-300;
  double b = x + 1.0 - a, c = 1.0 / kTiny, d = 1.0 / b, h = d;
  for (int i = 1; i < 10000; ++i) {
    const double an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    c = b + an / c;
    d = 1.0 / (std::fabs(d) < kTiny ? kTiny : d);
    c = std::fabs(c) < kTiny ? kTiny : c;
    h *= d * c;
    if (std::fabs(d * c - 1.0) < 1e-16) break;
  }
  return prefix * h;
}

// x with P(chi2_df > x) = alpha, by bisection on the survival function Q(df/2, x/2).
inline double ChiSquareCritical(int df, double alpha) {
  double lo = 0.0, hi = 1e4;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    (UpperGammaQ(0.5 * df, 0.5 * mid) > alpha ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

struct ChiSquare {
  double statistic = 0.0;
  int df = 0;
};

// Pearson's statistic of `counts` against `prob` (n draws), merging the cells with the smallest
// expected counts until every merged cell expects >= 5.
inline ChiSquare Pearson(const std::vector<int64_t>& counts, const std::vector<double>& prob,
                         int n) {
  std::vector<size_t> cells;
  for (size_t j = 0; j < prob.size(); ++j) {
    if (prob[j] > 0.0) cells.push_back(j);
  }
  std::sort(cells.begin(), cells.end(), [&](size_t a, size_t b) { return prob[a] < prob[b]; });
  std::vector<double> expected, observed;
  double e = 0.0, o = 0.0;
  for (size_t j : cells) {
    e += n * prob[j];
    o += static_cast<double>(counts[j]);
    if (e >= 5.0) {
      expected.push_back(e);
      observed.push_back(o);
      e = o = 0.0;
    }
  }
  if (e > 0.0 && !expected.empty()) {  // the leftover joins the last (largest) cell
    expected.back() += e;
    observed.back() += o;
  }
  ChiSquare result;
  for (size_t i = 0; i < expected.size(); ++i) {
    result.statistic += (observed[i] - expected[i]) * (observed[i] - expected[i]) / expected[i];
  }
  result.df = static_cast<int>(expected.size()) - 1;
  return result;
}

}  // namespace samplerd::kernels::testing

#endif  // SAMPLERD_TESTS_KERNELS_CHI_SQUARE_H_
