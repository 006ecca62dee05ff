#pragma once
// Goodness-of-fit checks for tests of samplers and of speculative decoding's rejection sampling.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <vector>

namespace promptly::test {

// Whether this build runs under AddressSanitizer (GCC's macro; Clang's feature test). Sampling tests
// draw a quarter of their samples there: the sanitized build is for memory errors and runs each
// generation about ten times slower; the release build checks the statistics at full size.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

// Pearson's chi-square goodness of fit of `counts` to `probs`, passed while the statistic stays
// under the 0.999 quantile of the chi-square distribution (a correct implementation fails one seed
// in a thousand). Bins expected to hold fewer than 5 draws are pooled into one. A draw of a
// probability-0 token fails outright.
inline ::testing::AssertionResult FitsDistribution(const std::vector<int>& counts, const std::vector<float>& probs) {
  double n = 0, total_p = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    n += counts[i];
    total_p += probs[i];
  }
  double stat = 0, pooled_expected = 0, pooled_observed = 0;
  int bins = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    const double expected = n * probs[i] / total_p;
    if (probs[i] == 0 && counts[i] > 0) return ::testing::AssertionFailure() << "token " << i << " has probability 0 and came out " << counts[i] << " times";
    if (expected < 5) {
      pooled_expected += expected;
      pooled_observed += counts[i];
      continue;
    }
    stat += (counts[i] - expected) * (counts[i] - expected) / expected;
    ++bins;
  }
  if (pooled_expected > 0) {
    stat += (pooled_observed - pooled_expected) * (pooled_observed - pooled_expected) / pooled_expected;
    ++bins;
  }
  const int dof = bins - 1;
  if (dof < 1) return ::testing::AssertionSuccess() << "one bin";
  // The 0.999 quantiles for 1-10 degrees of freedom, then the Wilson-Hilferty approximation (within
  // 0.5% from 10 up).
  static const double table[] = {10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322, 26.124, 27.877, 29.588};
  const double h = 2.0 / (9.0 * dof);
  const double critical = dof <= 10 ? table[dof - 1] : dof * std::pow(1 - h + 3.090232 * std::sqrt(h), 3);
  std::ostringstream what;
  what << "chi-square " << stat << " with " << dof << " degrees of freedom, critical value at p=0.001: " << critical;
  return stat < critical ? ::testing::AssertionSuccess() << what.str() : ::testing::AssertionFailure() << what.str();
}

}  // namespace promptly::test
