#pragma once
// Mixture-of-experts routing: a token's router logits -> the experts it runs and their weights.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "model/arch/arch.h"

namespace promptly {

struct ExpertChoice {
  std::uint32_t expert = 0;
  float weight = 0.0f;
};

// Chooses the k experts with the largest logits (equal logits: the lower index first, so that the
// choice is deterministic) and weighs them as `router` says: TopKThenSoftmax, a softmax over the
// chosen logits; SoftmaxThenTopK, their softmax probabilities over all experts, divided by their sum
// when `renormalize`. Writes k choices to `out`, largest weight first.
inline void route_experts(const float* logits, std::uint32_t n_expert, std::uint32_t k, arch::Router router, bool renormalize,
                          ExpertChoice* out) {
  thread_local std::vector<std::uint32_t> order;
  order.resize(n_expert);
  std::iota(order.begin(), order.end(), 0u);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](std::uint32_t a, std::uint32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  const float max = logits[order[0]];
  double chosen = 0.0;
  for (std::uint32_t i = 0; i < k; ++i) {
    out[i] = {order[i], std::exp(logits[order[i]] - max)};
    chosen += out[i].weight;
  }
  double denominator = chosen;
  if (router == arch::Router::SoftmaxThenTopK && !renormalize) {
    denominator = 0.0;
    for (std::uint32_t e = 0; e < n_expert; ++e) denominator += std::exp(logits[e] - max);
  }
  for (std::uint32_t i = 0; i < k; ++i) out[i].weight = static_cast<float>(out[i].weight / denominator);
}

}  // namespace promptly
