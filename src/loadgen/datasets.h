#pragma once
// The prompts a serving benchmark sends. Every dataset is a list of sessions: a session is one
// conversation whose user turns go out one after another, each with the whole history so far
// (system prompt, earlier turns and the server's own answers), so single-turn datasets are
// sessions of one turn.
//
// The client has no tokenizer, so lengths are asked in words (most common English words are one
// token in the usual vocabularies); the report counts tokens from the server's usage instead.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace promptly::loadgen {

struct Turn {
  std::string user;
  std::size_t max_tokens = 0;
};

struct Session {
  std::string system;  // empty: no system message
  std::vector<Turn> turns;
};

struct DatasetOptions {
  std::string name;  // random, multiturn, shared-prefix, or a .jsonl/.json file of conversations
  std::size_t num_prompts = 100;  // sessions (one request each except multiturn and files' multi-turn conversations)
  std::size_t input_len = 1024;   // words per user turn (shared-prefix: of the shared system prompt)
  std::optional<std::size_t> output_len;  // max_tokens; unset: 128, or a file's reference answer length
  std::size_t turns = 0;                  // turns per session; 0: 4 for multiturn, every turn of a file's conversation
  std::uint64_t seed = 0;
};

inline constexpr std::size_t kDefaultOutputLen = 128;

// The sessions of a named dataset, or of a file; throws Error for an unknown name, an unreadable
// file, or a file with no usable conversation.
std::vector<Session> make_dataset(const DatasetOptions& o);

// Conversations in ShareGPT's shape, one JSON object per line or one JSON array of them:
//   {"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}, ...]}
//   {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]}
// Each human/user message is a turn; its max_tokens is `output_len` when given, else the length of
// the reference answer that follows it (about 4 bytes a token). `source` names the input in errors.
std::vector<Session> parse_conversations(std::string_view text, const std::string& source, std::optional<std::size_t> output_len,
                                         std::size_t max_turns);

// `n` words drawn from a list of common English words.
std::string random_words(std::size_t n, std::uint64_t& state);

}  // namespace promptly::loadgen
