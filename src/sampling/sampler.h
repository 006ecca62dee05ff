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
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // `logits` is modified (penalties applied). `history` is the sequence so far (prompt + output).
  std::int32_t sample(float* logits, std::size_t n_vocab, const std::vector<std::int32_t>& history);

  const SamplingParams& params() const { return params_; }

 private:
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
