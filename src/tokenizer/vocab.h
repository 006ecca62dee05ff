#pragma once
// A model's vocabulary as GGUF stores it (`tokenizer.ggml.*`).
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gguf/gguf.h"

namespace promptly {

enum class TokenType : std::uint8_t {
  Undefined = 0, Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6,
};

enum class VocabKind { Spm, Bpe };

// Whitespace a special token swallows where it is found in text (Hugging Face's added-token
// lstrip/rstrip): left strips the spaces before it, right those after it.
inline constexpr std::uint8_t kStripNone = 0, kStripLeft = 1, kStripRight = 2;

struct Vocab {
  VocabKind kind = VocabKind::Spm;
  std::string model_name;  // tokenizer.ggml.model
  std::string pre;         // tokenizer.ggml.pre (or "tokenizer.json" for an imported one)
  std::vector<std::string> pre_regexes;  // BPE pre-tokenizer cascade
  bool ignore_merges = false;            // BPE: whole words found in the vocabulary skip merging
  std::unordered_map<std::string, std::int32_t> merge_ranks;  // BPE: "left right" -> rank
  std::string chat_template;             // tokenizer.chat_template, empty if none
  std::vector<std::string> warnings;     // non-fatal problems found while loading
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<TokenType> types;
  std::unordered_map<std::string, std::int32_t> piece_to_id;
  std::int32_t bos = -1, eos = -1, unk = -1, eot = -1, pad = -1;
  bool add_bos = true;
  bool add_eos = false;
  bool add_space_prefix = true;
  std::vector<std::uint8_t> special_strip;  // kStrip* flags per id; empty when no token strips
  std::int32_t byte_tokens[256];  // id of <0xXX> per byte, -1 when the vocab has none

  std::size_t size() const { return tokens.size(); }
  std::int32_t find(std::string_view piece) const;
  bool is_control(std::int32_t id) const { return types[static_cast<std::size_t>(id)] == TokenType::Control; }
  std::uint8_t strip_of(std::int32_t id) const {
    return special_strip.empty() ? kStripNone : special_strip[static_cast<std::size_t>(id)];
  }
  void set_strip(std::int32_t id, std::uint8_t flags);
  // Ids that end generation: eos, eot and any control token named like an end-of-turn marker.
  std::vector<std::int32_t> end_of_generation_ids() const;

  // Throws Error naming the key when the tokenizer metadata is missing or inconsistent.
  static Vocab from_gguf(const gguf::File& file);
  // A Hugging Face tokenizer.json (byte-level BPE); a tokenizer_config.json beside it supplies
  // bos/eos tokens and the chat template when present.
  static Vocab from_tokenizer_json(const std::string& path);

  // Builds the lookup tables once tokens and types are set.
  void finalize();
};

}  // namespace promptly
