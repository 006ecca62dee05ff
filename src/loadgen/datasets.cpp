#include "loadgen/datasets.h"

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <random>

#include "util/error.h"
#include "util/file_io.h"

namespace promptly::loadgen {

namespace {

constexpr std::array<std::string_view, 128> kWords = {
    "the",   "of",    "and",   "to",    "in",    "is",    "was",   "for",   "on",    "that",  "with",  "as",    "by",    "at",    "from",
    "it",    "an",    "be",    "this",  "are",   "or",    "which", "not",   "have",  "had",   "but",   "his",   "they",  "were",  "been",
    "one",   "their", "all",   "has",   "there", "more",  "when",  "will",  "would", "who",   "so",    "if",    "no",    "what",  "up",
    "out",   "about", "into",  "than",  "them",  "can",   "only",  "other", "time",  "new",   "some",  "could", "these", "two",   "may",
    "first", "then",  "do",    "any",   "like",  "my",    "now",   "over",  "such",  "our",   "man",   "me",    "even",  "most",  "made",
    "after", "also",  "did",   "many",  "before", "must", "back",  "years", "where", "much",  "your",  "way",   "well",  "down",  "should",
    "each",  "just",  "those", "people", "how",  "too",   "little", "state", "good", "very",  "make",  "world", "still", "own",   "see",
    "men",   "work",  "long",  "get",   "here",  "both",  "life",  "being", "under", "never", "day",   "same",  "know",  "while", "last",
    "might", "us",    "great", "old",   "year",  "off",   "come",  "since"};

// The conversations' speakers that ask and that answer, across ShareGPT exports and chat datasets.
bool is_user(std::string_view who) { return who == "human" || who == "user"; }
bool is_answer(std::string_view who) { return who == "gpt" || who == "assistant" || who == "chatgpt" || who == "bard" || who == "model"; }

// A message's text: a string, or the text parts of an OpenAI content array.
std::string text_of(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  std::string out;
  if (v.is_array())
    for (const auto& part : v)
      if (part.is_object() && part.contains("text") && part["text"].is_string()) out += part["text"].get<std::string>();
  return out;
}

std::size_t tokens_of_answer(std::string_view answer) { return std::max<std::size_t>(1, (answer.size() + 3) / 4); }

// One conversation record -> a session (no turns when it has no user message).
Session session_of(const nlohmann::json& record, const std::string& where, std::optional<std::size_t> output_len, std::size_t max_turns) {
  if (!record.is_object()) throw Error(where + ": expected a JSON object with \"conversations\" or \"messages\"");
  const bool sharegpt = record.contains("conversations");
  const nlohmann::json& messages = sharegpt ? record["conversations"] : record.contains("messages") ? record["messages"] : record;
  if (!messages.is_array()) throw Error(where + ": expected \"conversations\" (ShareGPT: [{\"from\", \"value\"}]) or \"messages\" ([{\"role\", \"content\"}]) as an array");
  Session s;
  bool awaiting_answer = false;
  for (const auto& m : messages) {
    if (!m.is_object()) throw Error(where + ": each message must be an object");
    const char* speaker_key = sharegpt ? "from" : "role";
    const char* text_key = sharegpt ? "value" : "content";
    if (!m.contains(speaker_key) || !m[speaker_key].is_string())
      throw Error(where + ": a message has no \"" + speaker_key + "\" string");
    const std::string who = m[speaker_key].get<std::string>();
    const std::string text = m.contains(text_key) ? text_of(m[text_key]) : std::string();
    if (who == "system") {
      if (s.turns.empty()) s.system = text;
    } else if (is_user(who)) {
      if (s.turns.size() == max_turns) break;
      s.turns.push_back({text, output_len.value_or(kDefaultOutputLen)});
      awaiting_answer = true;
    } else if (is_answer(who)) {
      // The reference answer sets how long the server may answer this turn, as vLLM's ShareGPT
      // dataset does; the server's own answer is what the next turn sends back.
      if (awaiting_answer && !output_len) s.turns.back().max_tokens = tokens_of_answer(text);
      awaiting_answer = false;
    }
  }
  return s;
}

}  // namespace

std::string random_words(std::size_t n, std::uint64_t& state) {
  std::mt19937_64 rng(state);
  std::string out;
  out.reserve(n * 6);
  for (std::size_t i = 0; i < n; ++i) {
    if (i) out += ' ';
    out += kWords[rng() % kWords.size()];
  }
  state = rng();
  return out;
}

std::vector<Session> parse_conversations(std::string_view text, const std::string& source, std::optional<std::size_t> output_len,
                                         std::size_t max_turns) {
  if (max_turns == 0) max_turns = static_cast<std::size_t>(-1);
  std::vector<Session> sessions;
  auto keep = [&](Session s) {
    if (!s.turns.empty()) sessions.push_back(std::move(s));
  };
  const std::size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && text[first] == '[') {
    // One JSON array: the shape of the original ShareGPT export.
    nlohmann::json all;
    try {
      all = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw Error(source + ": not valid JSON (" + e.what() + ")");
    }
    for (std::size_t i = 0; i < all.size(); ++i) keep(session_of(all[i], source + ": record " + std::to_string(i + 1), output_len, max_turns));
  } else {
    std::size_t line_no = 0, start = 0;
    while (start < text.size()) {
      std::size_t end = text.find('\n', start);
      if (end == std::string_view::npos) end = text.size();
      const std::string_view line = text.substr(start, end - start);
      start = end + 1;
      ++line_no;
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
      const std::string where = source + ":" + std::to_string(line_no);
      nlohmann::json record;
      try {
        record = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        throw Error(where + ": not a JSON object (" + e.what() + "); JSONL needs one conversation per line");
      }
      keep(session_of(record, where, output_len, max_turns));
    }
  }
  if (sessions.empty())
    throw Error(source + ": no conversation with a user turn (expected ShareGPT lines {\"conversations\": [{\"from\": \"human\", \"value\": ...}]} or {\"messages\": [{\"role\": \"user\", \"content\": ...}]})");
  return sessions;
}

std::vector<Session> make_dataset(const DatasetOptions& o) {
  if (o.num_prompts == 0) throw Error("--num-prompts must be at least 1");
  std::uint64_t state = o.seed * 0x9E3779B97F4A7C15ull + 1;
  const std::size_t output_len = o.output_len.value_or(kDefaultOutputLen);
  std::vector<Session> sessions;
  if (o.name == "random") {
    for (std::size_t i = 0; i < o.num_prompts; ++i) sessions.push_back({"", {{random_words(o.input_len, state), output_len}}});
  } else if (o.name == "multiturn") {
    const std::size_t turns = o.turns ? o.turns : 4;
    for (std::size_t i = 0; i < o.num_prompts; ++i) {
      Session s;
      for (std::size_t t = 0; t < turns; ++t) s.turns.push_back({random_words(o.input_len, state), output_len});
      sessions.push_back(std::move(s));
    }
  } else if (o.name == "shared-prefix") {
    // One system prompt for everyone, as an assistant's instructions are; each request adds a
    // short question of its own, so the server's prefix cache decides the time to first token.
    const std::string system = random_words(o.input_len, state);
    const std::size_t own_words = std::max<std::size_t>(8, o.input_len / 16);
    for (std::size_t i = 0; i < o.num_prompts; ++i) sessions.push_back({system, {{random_words(own_words, state), output_len}}});
  } else if (o.name.ends_with(".jsonl") || o.name.ends_with(".json")) {
    sessions = parse_conversations(read_file(o.name, "dataset"), o.name, o.output_len, o.turns);
    // A seeded sample, as vLLM samples ShareGPT, so the first N lines of a sorted file do not decide the mix.
    std::shuffle(sessions.begin(), sessions.end(), std::mt19937_64(o.seed));
    if (sessions.size() > o.num_prompts) sessions.resize(o.num_prompts);
  } else {
    throw Error("--dataset '" + o.name + "': expected random, multiturn, shared-prefix, or a .jsonl/.json file of ShareGPT-style conversations");
  }
  return sessions;
}

}  // namespace promptly::loadgen
