#include "grammar/token_bytes_of.h"

namespace promptly::grammar {

std::shared_ptr<const TokenBytes> token_bytes_of(const Tokenizer& tokenizer, const std::map<std::int32_t, std::string>& control_as_text) {
  const Vocab& v = tokenizer.vocab();
  std::vector<std::string> pieces(v.size());
  std::vector<bool> excluded(v.size(), false);
  for (std::size_t i = 0; i < v.size(); ++i) {
    const auto id = static_cast<std::int32_t>(i);
    const TokenType t = v.types[i];
    excluded[i] = t == TokenType::Control || t == TokenType::Unused || t == TokenType::Unknown;
    if (!excluded[i]) pieces[i] = tokenizer.piece(id);
  }
  for (const auto& [id, text] : control_as_text) {
    if (id < 0 || static_cast<std::size_t>(id) >= v.size() || text.empty()) continue;
    excluded[static_cast<std::size_t>(id)] = false;
    pieces[static_cast<std::size_t>(id)] = text;
  }
  return std::make_shared<TokenBytes>(std::move(pieces), std::move(excluded), v.end_of_generation_ids());
}

}  // namespace promptly::grammar
