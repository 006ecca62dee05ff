#include "engine/step_cost.h"

#include <algorithm>
#include <cmath>

namespace promptly {

namespace {

// Prior standard deviation of each coefficient, relative to its prior value: the calibration is two
// passes on an idle machine, the attention term a FLOP-ratio guess.
constexpr std::array<double, 3> kPriorSpread = {1.0, 0.5, 2.0};
// How far each coefficient may drift per step (random walk), relative to its prior: the host's
// memory and compute phases move a step's time by tens of percent over a few hundred steps.
constexpr double kDriftPerStep = 0.02;
// A step's measured time scatters around its expectation by about this fraction (thread wake-ups,
// the other tenants of a shared host).
constexpr double kMeasurementSpread = 0.1;
// Residuals beyond this many standard deviations (a stall of the machine, not the model) count as
// this many: one outlier must not undo hundreds of steps of evidence.
constexpr double kOutlierClip = 3.0;

using Vec = std::array<double, 3>;

Vec features(double tokens, double attended) { return {1.0, tokens, attended}; }

}  // namespace

StepCostModel::StepCostModel(double fixed_s, double per_token_s, double per_attended_s) {
  // Every coefficient is kept positive and given a nonzero prior scale, so that the relative
  // uncertainties below are meaningful even for a degenerate calibration.
  prior_ = {std::max(fixed_s, 1e-7), std::max(per_token_s, 1e-8), std::max(per_attended_s, 1e-12)};
  theta_ = prior_;
  for (std::size_t i = 0; i < 3; ++i) cov_[i][i] = std::pow(kPriorSpread[i] * prior_[i], 2);
}

double StepCostModel::predict(double tokens, double attended) const {
  const Vec x = features(tokens, attended);
  return theta_[0] * x[0] + theta_[1] * x[1] + theta_[2] * x[2];
}

void StepCostModel::observe(double tokens, double attended, double seconds) {
  if (!(seconds > 0) || !std::isfinite(seconds)) return;
  const Vec x = features(tokens, attended);
  for (std::size_t i = 0; i < 3; ++i) cov_[i][i] += std::pow(kDriftPerStep * prior_[i], 2);
  Vec px{};  // P x
  for (std::size_t i = 0; i < 3; ++i) {
    for (std::size_t j = 0; j < 3; ++j) px[i] += cov_[i][j] * x[j];
  }
  const double predicted = predict(tokens, attended);
  const double noise = std::pow(kMeasurementSpread * std::max(predicted, seconds * 0.5), 2);
  const double innovation_var = x[0] * px[0] + x[1] * px[1] + x[2] * px[2] + noise;
  const double limit = kOutlierClip * std::sqrt(innovation_var);
  const double residual = std::clamp(seconds - predicted, -limit, limit);
  Vec gain{};
  for (std::size_t i = 0; i < 3; ++i) gain[i] = px[i] / innovation_var;
  for (std::size_t i = 0; i < 3; ++i) {
    theta_[i] = std::max(theta_[i] + gain[i] * residual, 1e-3 * prior_[i]);
    for (std::size_t j = 0; j < 3; ++j) cov_[i][j] -= gain[i] * px[j];
  }
  // Keep the covariance symmetric and its diagonal positive against rounding.
  for (std::size_t i = 0; i < 3; ++i) {
    cov_[i][i] = std::max(cov_[i][i], 1e-6 * prior_[i] * prior_[i]);
    for (std::size_t j = 0; j < i; ++j) cov_[i][j] = cov_[j][i] = 0.5 * (cov_[i][j] + cov_[j][i]);
  }
}

double StepCostModel::attended_by(std::size_t start, std::size_t n) {
  // Positions start+1 .. start+n (a token attends to itself too).
  const double a = static_cast<double>(start), k = static_cast<double>(n);
  return k * a + k * (k + 1) / 2;
}

double StepCostModel::attended_by(const std::vector<std::int32_t>& positions) {
  double sum = 0;
  for (std::int32_t p : positions) sum += static_cast<double>(p) + 1;
  return sum;
}

std::size_t StepCostModel::tokens_within(double seconds, double tokens, double attended, std::size_t start,
                                         std::size_t max_tokens) const {
  auto fits = [&](std::size_t k) {
    return predict(tokens + static_cast<double>(k), attended + attended_by(start, k)) <= seconds;
  };
  if (max_tokens == 0 || !fits(1)) return 0;
  // The prediction grows with k: the largest k that fits, by bisection.
  std::size_t lo = 1, hi = max_tokens;
  while (lo < hi) {
    const std::size_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

void StepOverrun::observe(double predicted_s, double actual_s) {
  if (!(predicted_s > 0) || !(actual_s > 0)) return;
  const auto ratio = static_cast<float>(actual_s / predicted_s);
  if (ratios_.size() < kWindow) {
    ratios_.push_back(ratio);
  } else {
    ratios_[next_] = ratio;
    next_ = (next_ + 1) % kWindow;
  }
  if (ratios_.size() < kMinSamples) return;
  scratch_.assign(ratios_.begin(), ratios_.end());
  const std::size_t k = scratch_.size() - 1 - scratch_.size() / 100;
  std::nth_element(scratch_.begin(), scratch_.begin() + static_cast<long>(k), scratch_.end());
  // Never below 1: a run of fast steps must not size the next ones past the limit; never above 3:
  // past that the machine is stalling, not running slow, and smaller steps would not help.
  p99_ = std::clamp(static_cast<double>(scratch_[k]), 1.0, 3.0);
}

}  // namespace promptly
