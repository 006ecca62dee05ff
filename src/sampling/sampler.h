#pragma once
// Turns logits into the next token: penalties, then top-k, top-p and min-p filtering, then
// temperature and a seeded draw (the order llama.cpp uses, so settings transfer). Temperature 0 is
// greedy argmax.
#include <cstdint>
#include <random>
#include <vector>

namespace promptly {

struct SamplingParams {
  float temperature = 0.8f;
  int top_k = 40;             // <= 0: off
  float top_p = 0.95f;        // >= 1: off
  float min_p = 0.05f;        // <= 0: off
  float repeat_penalty = 1.0f;  // 1: off
  int repeat_last_n = 64;     // how many recent tokens the penalties look at
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::uint64_t seed = 0xC0FFEE;

  // Whether any of the repetition, presence and frequency penalties is on.
  bool penalizes() const { return repeat_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f; }
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // `logits` is modified (penalties applied). `history` is the sequence so far (prompt + output).
  std::int32_t sample(float* logits, std::size_t n_vocab, const std::vector<std::int32_t>& history);

  // The distribution sample() draws from for the same logits, history and params, in `probs`
  // (resized to n_vocab): the kept tokens' normalized weights, 0 for every filtered token; at
  // temperature <= 0, 1 on the token sample() returns (the first largest logit) and 0 elsewhere.
  // Speculative decoding needs it: rejection sampling compares the target's and the draft's
  // probabilities, which must be those their tokens are really drawn with. Both go through the same
  // code (penalties, filters, weights), so they cannot drift apart. Like sample(), it applies the
  // penalties to `logits` in place: call one of the two per row of logits, not both. Uses no
  // randomness.
  void distribution(float* logits, std::size_t n_vocab, const std::vector<std::int32_t>& history, std::vector<float>& probs);

  // A token drawn with probability weights[i] / sum(weights) from non-negative weights, not
  // necessarily normalized (distribution()'s output, a residual), with this sampler's generator:
  // draw(distribution(l)) is distributed as sample(l), though for a given generator state the two
  // need not return the same token. A zero weight is never drawn; with no positive weight, 0.
  std::int32_t draw(const std::vector<float>& weights);

  // The uniform in [0, 1) that the next draw (sample() at a temperature above 0, draw()) would
  // take from the generator, leaving it as it is; skip_uniform() then moves it past that draw. For a
  // draw made elsewhere (a device's sampler, backend/device_draw.h), so that a seed gives one stream
  // of draws whichever device makes them, and a pass that never ran uses none.
  double next_uniform() const;
  void skip_uniform() { rng_.discard(1); }

  // The generator sample() and draw() use, for callers (rejection sampling) whose draws should come
  // from the same seeded stream.
  std::mt19937_64& rng() { return rng_; }

  const SamplingParams& params() const { return params_; }

 private:
  // The tokens the filters keep, weighed: weights_[i] for i < n is the i-th kept token's weight,
  // that token being candidates_[i].second when `sorted`, else token i; `total` is their sum.
  struct Kept {
    std::size_t n;
    bool sorted;
    double total;
  };
  void apply_penalties(float* logits, std::size_t n_vocab, const std::vector<std::int32_t>& history) const;
  Kept filter_and_weigh(const float* logits, std::size_t n_vocab);
  std::int32_t kept_id(const Kept& kept, std::size_t i) const { return kept.sorted ? candidates_[i].second : static_cast<std::int32_t>(i); }

  SamplingParams params_;
  std::mt19937_64 rng_;
  // Reused across calls: a vocabulary-sized allocation per token would be page-faulted each time.
  std::vector<std::pair<float, std::int32_t>> candidates_;
  std::vector<float> kept_logits_, weights_;
};

std::int32_t argmax(const float* logits, std::size_t n);
// log(sum of e^logits[i]): the log-probability of token i is logits[i] minus this.
double log_sum_exp(const float* logits, std::size_t n);

}  // namespace promptly
