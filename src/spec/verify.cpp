#include "spec/verify.h"

#include "spec/rejection.h"

namespace promptly::spec {

std::size_t verify_chain(float* rows, std::size_t n_vocab, const Proposal& proposal, std::vector<std::int32_t>& history, Sampler& sampler,
                         std::vector<float>& p, std::vector<std::int32_t>& out, std::vector<std::vector<float>>* kept_logits) {
  const std::size_t k = proposal.tokens.size();
  const bool greedy = sampler.params().temperature <= 0;
  std::size_t accepted = 0;
  for (;; ++accepted) {
    float* row = rows + accepted * n_vocab;
    if (kept_logits) kept_logits->emplace_back(row, row + n_vocab);
    if (accepted == k) {  // every guess held: the last row gives one more token
      out.push_back(sampler.sample(row, n_vocab, history));
      break;
    }
    const std::int32_t guess = proposal.tokens[accepted];
    if (greedy) {
      const std::int32_t token = sampler.sample(row, n_vocab, history);
      if (token != guess) {
        out.push_back(token);
        break;
      }
    } else {
      sampler.distribution(row, n_vocab, history, p);
      const Verdict v = proposal.q.empty() ? verify_point_proposal(p.data(), n_vocab, guess, sampler.rng())
                                           : verify_draft_token(p.data(), proposal.q[accepted].data(), n_vocab, guess, sampler.rng());
      if (!v.accepted) {
        out.push_back(v.token);
        break;
      }
    }
    out.push_back(guess);
    history.push_back(guess);
  }
  history.resize(history.size() - accepted);
  return accepted;
}

}  // namespace promptly::spec
