#pragma once
// Checks a proposed chain against the target's logits for it, keeping the target's output
// distribution exactly: greedy accepts while the target's own choice equals the guess; sampling
// uses speculative rejection sampling (spec/rejection.h). Either way the round ends with one token
// of the target's own, so every pass commits at least one token.
#include <cstdint>
#include <vector>

#include "sampling/sampler.h"
#include "spec/proposer.h"

namespace promptly::spec {

// `rows` holds proposal.tokens.size() + 1 rows of n_vocab logits: row i is the target's prediction
// after `history` and the first i guesses (rows are modified: penalties). Appends the committed
// tokens to `out` (the accepted guesses, then the target's token) and returns how many guesses were
// accepted. `history` is used as scratch and restored. `p` is scratch. With `kept_logits`, the row
// behind each committed token is appended there (before penalties), as generate's keep_logits does.
std::size_t verify_chain(float* rows, std::size_t n_vocab, const Proposal& proposal, std::vector<std::int32_t>& history, Sampler& sampler,
                         std::vector<float>& p, std::vector<std::int32_t>& out, std::vector<std::vector<float>>* kept_logits = nullptr);

// The same for a token tree (proposal.parents): row 0 predicts after `history`, row i + 1 after the
// path down to guess i. From the root, the target's choice at each node is looked for among the
// node's children: greedy, its argmax; sampling, multi-candidate rejection over the children in
// order (verify_point_siblings), which keeps the target's distribution exactly. Appends the
// committed tokens to `out` and the accepted guesses' indices, root to leaf, to `path` (cleared
// first); returns how many were accepted.
std::size_t verify_tree(float* rows, std::size_t n_vocab, const Proposal& proposal, std::vector<std::int32_t>& history, Sampler& sampler,
                        std::vector<float>& p, std::vector<std::int32_t>& out, std::vector<std::size_t>& path,
                        std::vector<std::vector<float>>* kept_logits = nullptr);

}  // namespace promptly::spec
