#pragma once
// The bridge from a model's tokenizer to the grammar matcher's byte view of the vocabulary.
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "grammar/matcher.h"
#include "tokenizer/tokenizer.h"

namespace promptly::grammar {

// Each token's bytes as the detokenizer shows them mid-text (SentencePiece's space marker and byte
// tokens resolved); control tokens are never produced by a grammar, except those in
// `control_as_text` (id -> the text a grammar matches them as: tool-call markers such as
// [TOOL_CALLS]); end-of-generation ids end it.
std::shared_ptr<const TokenBytes> token_bytes_of(const Tokenizer& tokenizer, const std::map<std::int32_t, std::string>& control_as_text = {});

}  // namespace promptly::grammar
