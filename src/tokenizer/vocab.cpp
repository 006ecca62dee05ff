#include "tokenizer/vocab.h"

#include <algorithm>
#include <cstdio>

#include "tokenizer/pretokenizer.h"
#include "tokenizer/special_rules.h"
#include "util/error.h"

namespace promptly {

std::int32_t Vocab::find(std::string_view piece) const {
  auto it = piece_to_id.find(std::string(piece));
  return it == piece_to_id.end() ? -1 : it->second;
}

void Vocab::set_strip(std::int32_t id, std::uint8_t flags) {
  if (special_strip.empty()) {
    if (flags == kStripNone) return;
    special_strip.assign(tokens.size(), kStripNone);
  }
  special_strip[static_cast<std::size_t>(id)] = flags;
}

std::vector<std::int32_t> Vocab::end_of_generation_ids() const {
  std::vector<std::int32_t> ids;
  for (std::int32_t id : {eos, eot}) {
    if (id >= 0) ids.push_back(id);
  }
  for (const char* name : {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>"}) {
    const std::int32_t id = find(name);
    if (id >= 0 && is_control(id)) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

Vocab Vocab::from_gguf(const gguf::File& f) {
  Vocab v;
  const std::string where = "tokenizer in '" + f.path() + "'";
  const auto model = f.get_string("tokenizer.ggml.model");
  if (!model) throw Error(where + ": missing 'tokenizer.ggml.model'");
  v.model_name = *model;
  if (v.model_name == "llama") {
    v.kind = VocabKind::Spm;
  } else if (v.model_name == "gpt2") {
    v.kind = VocabKind::Bpe;
  } else {
    throw Error(where + ": tokenizer model '" + v.model_name + "' is not supported (supported: llama, gpt2)");
  }
  v.pre = f.get_string("tokenizer.ggml.pre").value_or("default");

  const gguf::Array* tokens = f.get_array("tokenizer.ggml.tokens");
  if (!tokens || tokens->items.empty()) throw Error(where + ": missing 'tokenizer.ggml.tokens'");
  const std::size_t n = tokens->items.size();
  v.tokens.reserve(n);
  for (const auto& t : tokens->items) v.tokens.push_back(t.as_string("tokenizer.ggml.tokens"));

  v.scores.assign(n, 0.0f);
  if (const gguf::Array* scores = f.get_array("tokenizer.ggml.scores")) {
    if (scores->items.size() != n) throw Error(where + ": 'tokenizer.ggml.scores' has " + std::to_string(scores->items.size()) + " entries for " + std::to_string(n) + " tokens");
    for (std::size_t i = 0; i < n; ++i) v.scores[i] = static_cast<float>(scores->items[i].as_double("tokenizer.ggml.scores"));
  }
  v.types.assign(n, TokenType::Normal);
  if (const gguf::Array* types = f.get_array("tokenizer.ggml.token_type")) {
    if (types->items.size() != n) throw Error(where + ": 'tokenizer.ggml.token_type' has " + std::to_string(types->items.size()) + " entries for " + std::to_string(n) + " tokens");
    for (std::size_t i = 0; i < n; ++i) {
      const std::int64_t t = types->items[i].as_int("tokenizer.ggml.token_type");
      v.types[i] = (t >= 0 && t <= 6) ? static_cast<TokenType>(t) : TokenType::Normal;
    }
  }

  auto id_key = [&](const char* key, std::int32_t fallback) -> std::int32_t {
    const auto id = f.get_int(key);
    if (!id) return fallback;
    if (*id == -1 || *id == 0xffffffffLL) return -1;  // converters write "none" as -1 (often as uint32)
    if (*id < 0 || static_cast<std::size_t>(*id) >= n) {
      throw Error(where + ": '" + key + "' = " + std::to_string(*id) + " is outside the vocabulary of " + std::to_string(n));
    }
    return static_cast<std::int32_t>(*id);
  };
  const bool spm = v.kind == VocabKind::Spm;
  v.bos = id_key("tokenizer.ggml.bos_token_id", spm ? 1 : -1);
  v.eos = id_key("tokenizer.ggml.eos_token_id", spm ? 2 : -1);
  v.unk = id_key("tokenizer.ggml.unknown_token_id", spm ? 0 : -1);
  v.eot = id_key("tokenizer.ggml.eot_token_id", -1);
  v.pad = id_key("tokenizer.ggml.padding_token_id", -1);
  if (spm && static_cast<std::size_t>(std::max({v.bos, v.eos, v.unk})) >= n) throw Error(where + ": vocabulary too small for its special tokens");
  v.add_bos = f.get_bool("tokenizer.ggml.add_bos_token").value_or(spm);
  v.add_eos = f.get_bool("tokenizer.ggml.add_eos_token").value_or(false);
  v.add_space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix").value_or(spm);
  v.chat_template = f.get_string("tokenizer.chat_template").value_or("");

  if (!spm) {
    const gguf::Array* merges = f.get_array("tokenizer.ggml.merges");
    if (!merges) throw Error(where + ": BPE vocabulary without 'tokenizer.ggml.merges'");
    v.merge_ranks.reserve(merges->items.size());
    for (std::size_t i = 0; i < merges->items.size(); ++i) {
      v.merge_ranks.emplace(merges->items[i].as_string("tokenizer.ggml.merges"), static_cast<std::int32_t>(i));
    }
    std::string warning;
    PreTokenizer pt = pre_tokenizer_for(v.pre, warning);
    if (!warning.empty()) v.warnings.push_back(warning);
    v.pre_regexes = std::move(pt.regexes);
    v.ignore_merges = pt.ignore_merges;
  }
  v.finalize();
  apply_family_special_rules(v, f.get_string("general.name").value_or(""));
  return v;
}

void Vocab::finalize() {
  piece_to_id.clear();
  piece_to_id.reserve(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) piece_to_id.emplace(tokens[i], static_cast<std::int32_t>(i));
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    byte_tokens[b] = find(name);
  }
}

}  // namespace promptly
