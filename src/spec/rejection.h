#pragma once
// Speculative rejection sampling (Leviathan et al. 2023; Chen et al. 2023): turns tokens a cheap
// proposer guessed into tokens distributed exactly as the target model's own draws would be.
//
// Why it is exact, for one guess x drawn from q: x is kept with probability min(1, p(x) / q(x)), so
// token y comes out this way with probability q(y) min(1, p(y)/q(y)) = min(p(y), q(y)); a rejection
// happens with probability 1 - sum min(p, q) = sum max(0, p - q) and then draws from the residual
// max(0, p - q) normalized, which adds p(y) - min(p(y), q(y)). Together: p(y). Every function here
// is that step, with q a full distribution, a point mass (a deterministic guess), or repeated over
// sibling guesses against the residual left by the ones rejected before them.
//
// Inputs are probabilities over a vocabulary of n tokens: p from Sampler::distribution() of the
// target's logits (the very distribution Sampler::sample() would draw from), q the one the guess was
// really drawn from (a draft's Sampler::distribution(), its token from Sampler::draw() of it). Both
// are taken as normalized. Float rounding, in them and in each residual entry (a float
// difference), carries over to the output distribution as errors of order 1e-7 per token, no
// more: sums run in double, and every residual is normalized by its exact sum. Uniforms come from `rng` as Sampler's do (the top 53 bits of one
// 64-bit word each): one for each acceptance test, one for each draw from a residual. The cost is
// O(1) for an accepted guess and a few passes over the vocabulary after a rejection.
#include <cstddef>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace promptly::spec {

struct Verdict {
  bool accepted;
  std::int32_t token;  // == the guess when accepted, else the replacement
};

// One guess `draft` drawn from q (q[draft] > 0): accepted with probability min(1, p[draft] /
// q[draft]); on rejection the replacement is drawn from normalize(max(0, p - q)), or from p where
// that residual is zero everywhere (p <= q in every place, which only rounding can bring about).
// A guess with q[draft] == 0 or outside [0, n) cannot have been drawn from q and is rejected.
// q may be one-hot (a deterministic guess): then this is verify_point_proposal, draw for draw.
// A replacement equal to the guess (only from the fallback to p) is reported as accepted.
Verdict verify_draft_token(const float* p, const float* q, std::size_t n, std::int32_t draft, std::mt19937_64& rng);

// A deterministic guess (n-gram lookup, a greedy draft: q is a point mass on `draft`): accepted
// with probability p[draft]; else the replacement is drawn from p without the guess, renormalized.
// The same math as verify_draft_token with q one-hot, without building q.
Verdict verify_point_proposal(const float* p, std::size_t n, std::int32_t draft, std::mt19937_64& rng);

struct MultiVerdict {
  int accepted_index;  // into the candidates; -1: none accepted and `token` is the replacement
  std::int32_t token;
};

// Several sibling guesses for the same position (a token tree, SpecInfer-style multi-draft
// recursive rejection sampling): candidates[i] = (token x_i, the distribution q_i it was drawn
// from). In order: x_i is accepted with probability min(1, p_i(x_i) / q_i(x_i)), where p_1 = p;
// on rejection p_{i+1} = normalize(max(0, p_i - q_i)) and the next candidate is tried; when every
// candidate is rejected, the replacement is drawn from the last residual. The output is distributed
// as p exactly when q_i is the distribution of x_i given the candidates before it:
//   - candidates drawn independently (with replacement) from one draft distribution q, or from one
//     draft model each: q_i = that q, the same pointer as often as needed. A repeat of a rejected
//     token is rejected again (its residual probability is 0), so duplicates cost only a test.
//   - candidates drawn without replacement from q (distinct siblings, e.g. the stochastic beam or
//     Gumbel-top-k of a draft): q_i must be q with x_1 .. x_{i-1} zeroed and renormalized (Jeon et
//     al. 2024, "Recursive Speculative Decoding"). Passing the unconditional q for every sibling
//     biases the output.
//   - candidates chosen deterministically: verify_point_siblings.
// Every q_i must sum to 1 over the n tokens. `p` (size >= n, normalized) is the workspace: on
// return it holds the residual the result came from, up to a positive factor. A replacement that
// equals a candidate (only where inputs break the contract, or from the fallback to p_i where a
// residual is zero everywhere) is reported as that candidate's acceptance, so its subtree goes on.
MultiVerdict verify_siblings(std::vector<float>& p, const std::vector<std::pair<std::int32_t, const float*>>& candidates, std::size_t n,
                             std::mt19937_64& rng);

// Deterministic sibling guesses (the top candidates of an n-gram table, the top-k of a greedy draft):
// q_i is a point mass on x_i, so x_i is accepted with probability p_i(x_i) and a rejection zeroes
// p[x_i] and renormalizes; when every candidate is rejected, the replacement is drawn from what is
// left. Candidate i is then accepted with probability p(x_i) when the candidates are distinct; a
// repeat of a rejected one is rejected again. `p` (size >= n, normalized) is the workspace, as above.
MultiVerdict verify_point_siblings(std::vector<float>& p, const std::vector<std::int32_t>& tokens, std::size_t n, std::mt19937_64& rng);

}  // namespace promptly::spec
