#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

namespace promptly {

std::int32_t argmax(const float* logits, std::size_t n) {
  return static_cast<std::int32_t>(std::max_element(logits, logits + n) - logits);
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

std::int32_t Sampler::sample(float* logits, std::size_t n_vocab, const std::vector<std::int32_t>& history) {
  const SamplingParams& p = params_;
  const bool penalize = p.repeat_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  if (penalize && p.repeat_last_n != 0 && !history.empty()) {
    const std::size_t window = p.repeat_last_n < 0 ? history.size() : std::min<std::size_t>(history.size(), static_cast<std::size_t>(p.repeat_last_n));
    std::unordered_map<std::int32_t, int> counts;
    for (std::size_t i = history.size() - window; i < history.size(); ++i) ++counts[history[i]];
    for (const auto& [id, count] : counts) {
      if (id < 0 || static_cast<std::size_t>(id) >= n_vocab) continue;
      float& l = logits[id];
      // Dividing a negative logit would raise it, so the repeat penalty multiplies those instead.
      l = l > 0 ? l / p.repeat_penalty : l * p.repeat_penalty;
      l -= static_cast<float>(count) * p.frequency_penalty + p.presence_penalty;
    }
  }

  if (p.temperature <= 0.0f) return argmax(logits, n_vocab);

  candidates_.resize(n_vocab);
  for (std::size_t i = 0; i < n_vocab; ++i) candidates_[i] = {logits[i], static_cast<std::int32_t>(i)};
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };

  std::size_t n = n_vocab;
  if (p.top_k > 0 && static_cast<std::size_t>(p.top_k) < n) {
    std::partial_sort(candidates_.begin(), candidates_.begin() + p.top_k, candidates_.end(), by_logit);
    n = static_cast<std::size_t>(p.top_k);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }

  // Probabilities at temperature 1 for the top-p / min-p cut-offs, as llama.cpp computes them.
  std::vector<double> probs(n);
  const float mx = candidates_[0].first;
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += probs[i] = std::exp(static_cast<double>(candidates_[i].first - mx));
  for (double& pr : probs) pr /= sum;

  if (p.top_p < 1.0f) {
    double cum = 0;
    std::size_t keep = n;
    for (std::size_t i = 0; i < n; ++i) {
      cum += probs[i];
      if (cum >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = std::max<std::size_t>(1, keep);
  }
  if (p.min_p > 0.0f) {
    const double threshold = probs[0] * p.min_p;
    std::size_t keep = 1;
    while (keep < n && probs[keep] >= threshold) ++keep;
    n = keep;
  }

  // The draw is written out (not std::discrete_distribution) so a seed gives the same tokens with
  // every standard library.
  std::vector<double> weights(n);
  const float t_mx = candidates_[0].first / p.temperature;
  double total = 0;
  for (std::size_t i = 0; i < n; ++i) total += weights[i] = std::exp(static_cast<double>(candidates_[i].first / p.temperature - t_mx));
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * total;
  double cum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    cum += weights[i];
    if (u < cum) return candidates_[i].second;
  }
  return candidates_[n - 1].second;
}

}  // namespace promptly
