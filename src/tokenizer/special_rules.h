#pragma once
// Per-family tokenizer behaviour that a GGUF file does not record. GGUF keeps no per-token
// lstrip/rstrip flags, so llama.cpp, the reference for how a GGUF prompt tokenizes, sets them from
// the model's `general.name`; we key on the same string so a rendered chat prompt becomes the same
// ids in both (a Phi-3 turn is 8 tokens there, and the model was tuned on that shape).
#include <string_view>

#include "tokenizer/vocab.h"

namespace promptly {

// Sets `vocab.special_strip` for the family that `general_name` names (case-insensitive); leaves
// other vocabularies untouched. Pieces a rule names but the vocabulary lacks are skipped.
void apply_family_special_rules(Vocab& vocab, std::string_view general_name);

}  // namespace promptly
