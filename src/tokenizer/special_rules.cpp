#include "tokenizer/special_rules.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <utility>
#include <vector>

namespace promptly {
namespace {

struct FamilyStripRule {
  std::vector<std::string_view> name_contains;  // lower-case substrings of general.name that select the family
  std::uint8_t every_special;                   // flags for every control, user-defined and unknown token
  std::vector<std::pair<std::string_view, std::uint8_t>> exceptions;  // pieces whose flags differ, applied after
};

const std::vector<FamilyStripRule>& rules() {
  static const std::vector<FamilyStripRule> table = {
      // Phi-3: "<|user|>\nHi<|end|>\n<|assistant|>\n" is <|user|> ▁Hi <|end|> <|assistant|>; the newline
      // after each marker belongs to the marker. Sequence boundaries keep their whitespace. A file named
      // "Phi 3.5 ..." does not match, exactly as in llama.cpp.
      {{"phi-3", "phi3"}, kStripRight, {{"</s>", kStripRight}, {"<unk>", kStripNone}, {"<s>", kStripNone}, {"<|endoftext|>", kStripNone}}},
  };
  return table;
}

}  // namespace

void apply_family_special_rules(Vocab& vocab, std::string_view general_name) {
  std::string name(general_name);
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const FamilyStripRule& rule : rules()) {
    const bool selected = std::any_of(rule.name_contains.begin(), rule.name_contains.end(),
                                      [&](std::string_view part) { return name.find(part) != std::string::npos; });
    if (!selected) continue;
    for (std::size_t i = 0; i < vocab.size(); ++i) {
      const TokenType t = vocab.types[i];
      if (t == TokenType::Control || t == TokenType::UserDefined || t == TokenType::Unknown) {
        vocab.set_strip(static_cast<std::int32_t>(i), rule.every_special);
      }
    }
    for (const auto& [piece, flags] : rule.exceptions) {
      if (const std::int32_t id = vocab.find(piece); id >= 0) vocab.set_strip(id, flags);
    }
    return;
  }
}

}  // namespace promptly
