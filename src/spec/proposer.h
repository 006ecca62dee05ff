#pragma once
// What a speculative decoder asks of a proposer: a guess at the next few tokens, cheap to make.
// The target model then checks the whole guess in one pass (spec/verify.h, engine/generate.cpp).
#include <cstddef>
#include <cstdint>
#include <vector>

namespace promptly::spec {

// Defaults chosen with `promptly bench spec` (README, "Speculative decoding"; the sweeps in
// docs/speculative-decoding.md): guesses a pass for a draft model and for n-gram lookup, and the
// confidence below which greedy drafting stops.
inline constexpr std::size_t kDefaultDraftTokens = 3;
inline constexpr std::size_t kDefaultNgramTokens = 4;
inline constexpr float kDefaultDraftMinP = 0.2f;

struct Proposal {
  std::vector<std::int32_t> tokens;
  // When the proposer drew tokens[i] from a distribution (a draft model sampling at temperature > 0),
  // q[i] is that distribution over the vocabulary; empty for deterministic guesses (n-gram lookup, a
  // greedy draft), which verification treats as point masses.
  std::vector<std::vector<float>> q;

  void clear() {
    tokens.clear();
    q.clear();
  }
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  // Up to `max_tokens` tokens that may follow `context` (the prompt and every committed token).
  // Fewer, or none, when it has no good guess.
  virtual void propose(const std::vector<std::int32_t>& context, std::size_t max_tokens, Proposal& out) = 0;
  virtual const char* name() const = 0;
};

}  // namespace promptly::spec
