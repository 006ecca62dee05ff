#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

namespace promptly {

std::int32_t argmax(const float* logits, std::size_t n) {
  // The largest value first, in 8 independent lanes the compiler turns into vector max
  // instructions, then the first token that has it: the same answer as std::max_element, whose
  // index tracking keeps it scalar (24 us at 32K tokens, per stream and step, against ~6 us).
  float lane[8];
  std::fill(lane, lane + 8, -std::numeric_limits<float>::infinity());
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (std::size_t j = 0; j < 8; ++j) lane[j] = logits[i + j] > lane[j] ? logits[i + j] : lane[j];
  }
  float best = *std::max_element(lane, lane + 8);
  for (; i < n; ++i) best = logits[i] > best ? logits[i] : best;
  for (i = 0; i < n; ++i) {
    if (logits[i] == best) return static_cast<std::int32_t>(i);
  }
  return 0;  // every value NaN
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

  // The tokens the filters keep, best first, in candidates_[0, n). Why not one sort of the whole
  // vocabulary, as this once did: it cost 4 ms a token at 32K tokens and 23 ms at Qwen3's 152K
  // with the OpenAI defaults (temperature 1, no top-k), on the engine thread, for every stream in
  // every step, where the forward pass of an 8-stream TinyLlama step takes ~19 ms. Each filter
  // keeps a head of the sorted order, so only a head long enough for the cuts is selected and
  // sorted; with no filter at all nothing is sorted (the draw below then walks the vocabulary in
  // id order: the same distribution).
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  const bool top_k = p.top_k > 0 && static_cast<std::size_t>(p.top_k) < n_vocab;
  const bool cut_by_probability = p.top_p < 1.0f || p.min_p > 0.0f;
  std::size_t n = n_vocab;
  bool sorted = false;
  if (top_k || cut_by_probability) {
    candidates_.resize(n_vocab);
    for (std::size_t i = 0; i < n_vocab; ++i) candidates_[i] = {logits[i], static_cast<std::int32_t>(i)};
    sorted = true;
  }
  // Probabilities at temperature 1 for the top-p / min-p cut-offs, as llama.cpp computes them:
  // over the top-k survivors, or over the whole vocabulary without top-k.
  double z = 0;
  float mx;  // the best logit
  if (top_k) {
    n = static_cast<std::size_t>(p.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + static_cast<std::ptrdiff_t>(n), candidates_.end(), by_logit);
    mx = candidates_[0].first;
    for (std::size_t i = 0; i < n; ++i) z += std::exp(static_cast<double>(candidates_[i].first - mx));
  } else {
    mx = *std::max_element(logits, logits + n_vocab);
  }
  if (!top_k && cut_by_probability) {
    for (std::size_t i = 0; i < n_vocab; ++i) z += std::exp(static_cast<double>(logits[i] - mx));
    // Grow the sorted head until a cut ends inside it: top-p once the head's probability reaches
    // top_p, min-p once its last token falls below min_p of the best one's.
    for (std::size_t head = std::min<std::size_t>(n_vocab, 256);; head = std::min(n_vocab, 8 * head)) {
      const auto end = candidates_.begin() + static_cast<std::ptrdiff_t>(head);
      if (head < n_vocab) std::nth_element(candidates_.begin(), end, candidates_.end(), by_logit);
      std::sort(candidates_.begin(), end, by_logit);
      if (head == n_vocab) break;
      double cum = 0;
      for (std::size_t i = 0; i < head; ++i) cum += std::exp(static_cast<double>(candidates_[i].first - mx)) / z;
      const double last = std::exp(static_cast<double>(candidates_[head - 1].first - mx)) / z;
      if ((p.top_p < 1.0f && cum >= p.top_p) || (p.min_p > 0.0f && last < (1.0 / z) * p.min_p)) {
        n = head;
        break;
      }
    }
  }
  if (cut_by_probability) {
    const auto prob = [&](std::size_t i) { return std::exp(static_cast<double>(candidates_[i].first - mx)) / z; };
    std::size_t keep = n;
    if (p.top_p < 1.0f) {
      double cum = 0;
      for (std::size_t i = 0; i < n; ++i) {
        cum += prob(i);
        if (cum >= p.top_p) {
          keep = i + 1;
          break;
        }
      }
    }
    if (p.min_p > 0.0f) {
      const double threshold = prob(0) * p.min_p;
      std::size_t k = 1;
      while (k < keep && prob(k) >= threshold) ++k;
      keep = k;
    }
    n = std::max<std::size_t>(1, keep);
  }

  // The draw is written out (not std::discrete_distribution) so a seed gives the same tokens with
  // every standard library.
  const auto candidate = [&](std::size_t i) { return sorted ? candidates_[i] : std::pair{logits[i], static_cast<std::int32_t>(i)}; };
  weights_.resize(n);
  const float t_mx = mx / p.temperature;
  double total = 0;
  for (std::size_t i = 0; i < n; ++i) total += weights_[i] = std::exp(static_cast<double>(candidate(i).first / p.temperature - t_mx));
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * total;
  double cum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    cum += weights_[i];
    if (u < cum) return candidate(i).second;
  }
  return candidate(n - 1).second;
}

}  // namespace promptly
