#pragma once
// Text <-> token ids for a model's vocabulary, and the streaming detokenizer that turns generated ids
// into text without ever emitting half a UTF-8 character.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/pretokenizer.h"
#include "tokenizer/vocab.h"

namespace promptly {

class Tokenizer {
 public:
  explicit Tokenizer(Vocab vocab);
  // Loads a GGUF (full model or vocab-only) or a Hugging Face tokenizer.json, by file content.
  static Tokenizer from_file(const std::string& path);

  const Vocab& vocab() const { return vocab_; }

  // add_special: BOS/EOS as the vocabulary asks. parse_special: control tokens written in the text
  // (e.g. "<|im_start|>") become their ids instead of being spelled out.
  std::vector<std::int32_t> encode(std::string_view text, bool add_special = true, bool parse_special = false) const;

  // The bytes one token stands for (space marker and byte tokens resolved). Control tokens are empty
  // unless `render_special`.
  std::string piece(std::int32_t id, bool render_special = false) const;

  // Whole-sequence decode; drops the dummy-prefix space at the very start, as SentencePiece does.
  std::string decode(const std::vector<std::int32_t>& ids, bool render_special = false) const;

 private:
  void encode_spm(std::string_view text, std::vector<std::int32_t>& out) const;
  void encode_bpe(std::string_view text, std::vector<std::int32_t>& out) const;

  Vocab vocab_;
  std::unique_ptr<RegexSplitter> splitter_;  // BPE only
  // Special pieces matched in text, longest first: user-defined always, control ones on request.
  std::vector<std::int32_t> user_specials_, all_specials_;
  bool special_first_byte_[256] = {};
};

// Incremental decode for streaming: feed ids one at a time, get text that is always valid UTF-8.
class StreamingDetokenizer {
 public:
  // `context` are ids already shown (e.g. the prompt): they set the leading-space state, emit nothing.
  StreamingDetokenizer(const Tokenizer& tokenizer, const std::vector<std::int32_t>& context = {});

  std::string push(std::int32_t id);
  // Bytes still held (an incomplete UTF-8 sequence at end of stream) as U+FFFD replacement chars.
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  std::string pending_;
  bool at_start_ = true;
};

// Appends the valid UTF-8 of `s` to `out`, replacing each invalid byte with U+FFFD, and returns how
// many bytes were consumed: all of them except an incomplete (but so far valid) final sequence.
std::size_t take_valid_utf8(std::string_view s, std::string& out);

}  // namespace promptly
