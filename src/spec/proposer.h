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
// Token trees from a draft model: children per node, most nodes a pass verifies, deepest level, and
// the cumulative draft probability below which a branch is not proposed. Small: on the F16 code
// pair a verified row costs a quarter of a decode pass (F16 arithmetic, not memory, bounds it), so
// every node must earn its row (README, Speculative decoding).
inline constexpr std::size_t kDefaultTreeWidth = 2;
inline constexpr std::size_t kDefaultTreeNodes = 6;
inline constexpr std::size_t kDefaultTreeDepth = 4;
inline constexpr float kDefaultTreeMinP = 0.1f;

struct Proposal {
  std::vector<std::int32_t> tokens;
  // When the proposer drew tokens[i] from a distribution (a draft model sampling at temperature > 0),
  // q[i] is that distribution over the vocabulary; empty for deterministic guesses (n-gram lookup, a
  // greedy draft), which verification treats as point masses.
  std::vector<std::vector<float>> q;
  // A token tree instead of a chain: parents[i] is the index in `tokens` of the guess tokens[i]
  // follows (always an earlier one), or -1 for a guess at the first position after the context.
  // Empty: a chain. A tree's guesses are deterministic (no q): siblings are verified as point
  // guesses (spec/rejection.h, verify_point_siblings).
  std::vector<std::int32_t> parents;

  bool is_tree() const { return !parents.empty(); }
  void clear() {
    tokens.clear();
    q.clear();
    parents.clear();
  }
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  // Up to `max_tokens` tokens that may follow `context` (the prompt and every committed token), as a
  // chain or a tree. Fewer, or none, when it has no good guess.
  virtual void propose(const std::vector<std::int32_t>& context, std::size_t max_tokens, Proposal& out) = 0;
  virtual const char* name() const = 0;
};

}  // namespace promptly::spec
