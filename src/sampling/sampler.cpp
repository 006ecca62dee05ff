#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

#include <emmintrin.h>

namespace promptly {

namespace {

// The largest value, in 8 independent lanes the compiler turns into vector max instructions
// (std::max_element's index tracking keeps it scalar: 24 us at 32K tokens, against ~6 us).
float max_value(const float* x, std::size_t n) {
  float lane[8];
  std::fill(lane, lane + 8, -std::numeric_limits<float>::infinity());
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (std::size_t j = 0; j < 8; ++j) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
  }
  float best = *std::max_element(lane, lane + 8);
  for (; i < n; ++i) best = x[i] > best ? x[i] : best;
  return best;
}

// e^x for four x <= 0 in float: range reduction to 2^n * e^f with |f| <= ln 2 / 2, Cephes'
// degree-6 polynomial for e^f, 2^n built in the exponent bits. Relative error ~1e-7, far below
// what a draw can tell apart. SSE2, which every x86-64 has: the compiler would not vectorize the
// clamp below -87 (where e^x nears the smallest normal float; results there stay ~1e-38).
inline __m128 exp_nonpositive(__m128 x) {
  x = _mm_max_ps(x, _mm_set1_ps(-87.0f));
  const __m128 round = _mm_set1_ps(12582912.0f);  // 1.5 * 2^23: adding and subtracting it rounds to an integer
  const __m128 n = _mm_sub_ps(_mm_add_ps(_mm_mul_ps(x, _mm_set1_ps(1.44269504088896341f)), round), round);
  // x - n ln 2, ln 2 in two parts
  const __m128 f = _mm_add_ps(_mm_sub_ps(x, _mm_mul_ps(n, _mm_set1_ps(0.693359375f))), _mm_mul_ps(n, _mm_set1_ps(2.12194440e-4f)));
  __m128 p = _mm_set1_ps(1.9875691500e-4f);
  for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f}) {
    p = _mm_add_ps(_mm_mul_ps(p, f), _mm_set1_ps(c));
  }
  const __m128 e_f = _mm_add_ps(_mm_add_ps(_mm_mul_ps(_mm_mul_ps(p, f), f), f), _mm_set1_ps(1.0f));
  const __m128i two_n = _mm_slli_epi32(_mm_add_epi32(_mm_cvttps_epi32(n), _mm_set1_epi32(127)), 23);
  return _mm_mul_ps(e_f, _mm_castsi128_ps(two_n));
}

// out[i] = e^(scale * x[i] - shift) for i < n (every exponent <= 0; out may be null); returns their
// sum, in double. Why not std::exp: in double, one call per token, it was 90% of a draw over a
// whole vocabulary (0.2 ms at 32K tokens).
double exp_weights(const float* x, std::size_t n, float scale, float shift, float* out) {
  const __m128 vscale = _mm_set1_ps(scale), vshift = _mm_set1_ps(shift);
  __m128d sum = _mm_setzero_pd();
  const auto four = [&](__m128 v) {
    const __m128 e = exp_nonpositive(_mm_sub_ps(_mm_mul_ps(v, vscale), vshift));
    sum = _mm_add_pd(sum, _mm_add_pd(_mm_cvtps_pd(e), _mm_cvtps_pd(_mm_movehl_ps(e, e))));
    return e;
  };
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m128 e = four(_mm_loadu_ps(x + i));
    if (out) _mm_storeu_ps(out + i, e);
  }
  if (i < n) {  // the last 1-3 through the same operations (the other lanes are computed, not used)
    alignas(16) float rest[4] = {shift / scale, shift / scale, shift / scale, shift / scale}, e[4];
    std::copy(x + i, x + n, rest);
    _mm_store_ps(e, exp_nonpositive(_mm_sub_ps(_mm_mul_ps(_mm_load_ps(rest), vscale), vshift)));
    for (std::size_t j = 0; i + j < n; ++j) {
      if (out) out[i + j] = e[j];
      sum = _mm_add_sd(sum, _mm_set_sd(e[j]));
    }
  }
  return _mm_cvtsd_f64(_mm_add_sd(sum, _mm_unpackhi_pd(sum, sum)));
}

// The index i where the running sum of w[0..i] first passes u (0 <= u < total = the sum of w),
// walked 16 weights at a time, then one by one inside the chunk where the sum passes u: a walk over
// a whole vocabulary one dependent addition at a time took longer than the weights. A zero weight is
// never returned; where rounding leaves u at the very end, the last positive weight is.
std::size_t walk(const float* w, std::size_t n, double u) {
  double cum = 0;
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    double chunk = 0;
    for (std::size_t j = 0; j < 16; ++j) chunk += w[i + j];
    if (u < cum + chunk) break;
    cum += chunk;
  }
  for (; i < n; ++i) {
    cum += w[i];
    if (u < cum) return i;
  }
  for (std::size_t k = n; k-- > 0;) {
    if (w[k] > 0) return k;
  }
  return 0;
}

// Uniform in [0, 1) from the top 53 bits. The draws are written out (not std::discrete_distribution
// or std::uniform_real_distribution) so a seed gives the same tokens with every standard library.
double uniform(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

}  // namespace

// The first token with the largest value: the same answer as std::max_element.
std::int32_t argmax(const float* logits, std::size_t n) {
  const float best = max_value(logits, n);
  for (std::size_t i = 0; i < n; ++i) {
    if (logits[i] == best) return static_cast<std::int32_t>(i);
  }
  return 0;  // every value NaN
}

double log_sum_exp(const float* logits, std::size_t n) {
  const float mx = max_value(logits, n);
  return static_cast<double>(mx) + std::log(exp_weights(logits, n, 1.0f, mx, nullptr));
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

void Sampler::apply_penalties(float* logits, std::size_t n_vocab, const std::vector<std::int32_t>& history) const {
  const SamplingParams& p = params_;
  if (!p.penalizes() || p.repeat_last_n == 0 || history.empty()) return;
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

Sampler::Kept Sampler::filter_and_weigh(const float* logits, std::size_t n_vocab) {
  const SamplingParams& p = params_;
  // The tokens the filters keep, best first, in candidates_[0, n). Why not one sort of the whole
  // vocabulary, as this once did: it cost 4 ms a token at 32K tokens and 23 ms at Qwen3's 152K
  // with the OpenAI defaults (temperature 1, no top-k), on the engine thread, for every stream in
  // every step, where the forward pass of an 8-stream TinyLlama step takes ~19 ms. Each filter
  // keeps a head of the sorted order, so only a head long enough for the cuts is selected and
  // sorted; with no filter at all nothing is sorted (sample() then walks the vocabulary in
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
    mx = max_value(logits, n_vocab);
  }
  if (!top_k && cut_by_probability) {
    z = exp_weights(logits, n_vocab, 1.0f, mx, nullptr);
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

  // Weights e^((logit - max) / T) of the kept tokens, in the kept order (by id when unsorted).
  const float inv_t = 1.0f / p.temperature;
  const float* kept = logits;
  if (sorted) {
    kept_logits_.resize(n);
    for (std::size_t i = 0; i < n; ++i) kept_logits_[i] = candidates_[i].first;
    kept = kept_logits_.data();
  }
  weights_.resize(n);
  const double total = exp_weights(kept, n, inv_t, mx * inv_t, weights_.data());
  return {n, sorted, total};
}

std::int32_t Sampler::sample(float* logits, std::size_t n_vocab, const std::vector<std::int32_t>& history) {
  apply_penalties(logits, n_vocab, history);
  if (params_.temperature <= 0.0f) return argmax(logits, n_vocab);
  const Kept kept = filter_and_weigh(logits, n_vocab);
  return kept_id(kept, walk(weights_.data(), kept.n, uniform(rng_) * kept.total));
}

void Sampler::distribution(float* logits, std::size_t n_vocab, const std::vector<std::int32_t>& history, std::vector<float>& probs) {
  apply_penalties(logits, n_vocab, history);
  if (n_vocab == 0) {
    probs.clear();
    return;
  }
  if (params_.temperature <= 0.0f) {
    probs.assign(n_vocab, 0.0f);
    probs[static_cast<std::size_t>(argmax(logits, n_vocab))] = 1.0f;
    return;
  }
  // sample() returns kept token i with probability weights_[i] / total (its u is uniform over
  // [0, total) and each token owns an interval of its weight's length).
  const Kept kept = filter_and_weigh(logits, n_vocab);
  const double inv_total = 1.0 / kept.total;
  if (!kept.sorted) {  // every token kept, in id order
    probs.resize(n_vocab);
    for (std::size_t i = 0; i < n_vocab; ++i) probs[i] = static_cast<float>(weights_[i] * inv_total);
    return;
  }
  probs.assign(n_vocab, 0.0f);
  for (std::size_t i = 0; i < kept.n; ++i) probs[static_cast<std::size_t>(kept_id(kept, i))] = static_cast<float>(weights_[i] * inv_total);
}

double Sampler::next_uniform() const {
  std::mt19937_64 copy = rng_;
  return uniform(copy);
}

std::int32_t Sampler::draw(const std::vector<float>& weights) {
  // Eight independent sums: one chain of dependent additions over a 150K vocabulary would take
  // several times as long as the walk.
  double lane[8] = {};
  std::size_t i = 0;
  for (; i + 8 <= weights.size(); i += 8) {
    for (std::size_t j = 0; j < 8; ++j) lane[j] += weights[i + j];
  }
  double total = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  for (; i < weights.size(); ++i) total += weights[i];
  return static_cast<std::int32_t>(walk(weights.data(), weights.size(), uniform(rng_) * total));
}

}  // namespace promptly
