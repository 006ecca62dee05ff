#pragma once
// The token ids of recent answers, so that a conversation's next turn, which sends an answer back as
// text, is given the ids the model produced for it instead of a re-tokenization of that text.
//
// Why: the KV cache holds the previous turn as prompt ids + generated ids. A client sends the whole
// conversation again as text; tokenizing it from scratch gives the canonical tokenization of the
// answer, which often differs from what the model generated (a model may emit "▁th" "e" where the
// tokenizer would write "▁the"; sampling makes such answers common, random-weight models produce
// nothing else). From the first differing token on, the prefix cache misses, and the rest of the
// answer plus the new message are computed again: measured with tools/loadgen.py on the TinyLlama
// shape, ~40 of a follow-up's ~135 new tokens. With the generated ids put back, the prompt is the
// same text, tokenized as the model itself wrote it, and only the new message is computed.
//
// An answer is remembered only when its text is exactly its ids' pieces (no stop string cut off, no
// half character; control tokens show as nothing and come back too), and put back only where a
// prompt continues, token for token,
// the prompt the answer was generated for, and the following tokens spell exactly the answer's text
// and end on a token boundary; everything after it stays as tokenized.
#include <cstdint>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace promptly::server {

class AnswerCache {
 public:
  // Holds answers (with their prompts) up to about `max_bytes`, least recently used dropped first.
  AnswerCache(const Tokenizer& tokenizer, std::size_t max_bytes);

  // A finished answer: the ids of the prompt it continued, the ids generated, the text shown.
  void remember(const std::vector<std::int32_t>& prompt, const std::vector<std::int32_t>& answer, const std::string& text);
  // Puts remembered answers' ids back into `ids` (a prompt as tokenized), earliest turn first; returns
  // how many answers it put back.
  std::size_t restore(std::vector<std::int32_t>& ids);

  std::size_t size() const;

 private:
  struct Entry {
    std::vector<std::int32_t> prompt, answer;
    std::string text;
    std::uint64_t prompt_hash;
    std::size_t bytes() const { return (prompt.size() + answer.size()) * sizeof(std::int32_t) + text.size(); }
  };
  using Entries = std::list<Entry>;
  // How many of the ids after e.prompt (which `ids` starts with) spell exactly e.text, ending on a
  // token boundary (0: they do not).
  std::size_t spelled(const std::vector<std::int32_t>& ids, const Entry& e) const;
  void forget(Entries::iterator it);

  const Tokenizer& tokenizer_;
  const std::size_t max_bytes_;
  mutable std::mutex mutex_;
  Entries entries_;  // most recently used first
  // By the hash of their prompt (a prefix hash of the ids: one pass over a prompt finds every
  // entry whose prompt it starts with, however many conversations there are).
  std::unordered_multimap<std::uint64_t, Entries::iterator> by_prompt_;
  std::size_t bytes_ = 0;
};

}  // namespace promptly::server
