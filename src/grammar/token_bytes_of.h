#pragma once
// The bridge from a model's tokenizer to the grammar matcher's byte view of the vocabulary.
#include <memory>

#include "grammar/matcher.h"
#include "tokenizer/tokenizer.h"

namespace promptly::grammar {

// Each token's bytes as the detokenizer shows them mid-text (SentencePiece's space marker and byte
// tokens resolved); control tokens are never produced by a grammar, end-of-generation ids end it.
std::shared_ptr<const TokenBytes> token_bytes_of(const Tokenizer& tokenizer);

}  // namespace promptly::grammar
