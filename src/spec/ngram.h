#pragma once
// Prompt lookup: code, quotes and edits repeat what the context already holds. Find the latest
// earlier place where the context's last n tokens occurred (n from max_n down to 1) and propose what
// followed there. No model, no memory beyond the context itself.
#include "spec/proposer.h"

namespace promptly::spec {

class NgramProposer final : public Proposer {
 public:
  explicit NgramProposer(std::size_t max_n);
  void propose(const std::vector<std::int32_t>& context, std::size_t max_tokens, Proposal& out) override;
  const char* name() const override { return "ngram"; }

 private:
  std::size_t max_n_;
};

}  // namespace promptly::spec
