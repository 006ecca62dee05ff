#include "spec/verify.h"

#include <algorithm>

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

std::size_t verify_tree(float* rows, std::size_t n_vocab, const Proposal& proposal, std::vector<std::int32_t>& history, Sampler& sampler,
                        std::vector<float>& p, std::vector<std::int32_t>& out, std::vector<std::size_t>& path,
                        std::vector<std::vector<float>>* kept_logits) {
  const bool greedy = sampler.params().temperature <= 0;
  path.clear();
  std::vector<std::int32_t> child_tokens;
  std::vector<std::size_t> children;
  std::int32_t node = -1;  // the root: the context's last token
  for (;;) {
    float* row = rows + static_cast<std::size_t>(node + 1) * n_vocab;
    if (kept_logits) kept_logits->emplace_back(row, row + n_vocab);
    children.clear();
    child_tokens.clear();
    for (std::size_t i = 0; i < proposal.tokens.size(); ++i) {
      if (proposal.parents[i] == node) {
        children.push_back(i);
        child_tokens.push_back(proposal.tokens[i]);
      }
    }
    if (children.empty()) {  // a leaf accepted (or a root with no guesses): the target's own next token
      out.push_back(sampler.sample(row, n_vocab, history));
      break;
    }
    int chosen = -1;
    std::int32_t token;
    if (greedy) {
      token = sampler.sample(row, n_vocab, history);
      const auto it = std::find(child_tokens.begin(), child_tokens.end(), token);
      if (it != child_tokens.end()) chosen = static_cast<int>(it - child_tokens.begin());
    } else {
      sampler.distribution(row, n_vocab, history, p);
      const MultiVerdict v = verify_point_siblings(p, child_tokens, n_vocab, sampler.rng());
      chosen = v.accepted_index;
      token = v.token;
    }
    if (chosen < 0) {
      out.push_back(token);
      break;
    }
    const std::size_t child = children[static_cast<std::size_t>(chosen)];
    path.push_back(child);
    out.push_back(proposal.tokens[child]);
    history.push_back(proposal.tokens[child]);
    node = static_cast<std::int32_t>(child);
  }
  history.resize(history.size() - path.size());
  return path.size();
}

}  // namespace promptly::spec
