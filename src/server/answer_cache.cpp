#include "server/answer_cache.h"

#include <algorithm>

namespace promptly::server {

AnswerCache::AnswerCache(const Tokenizer& tokenizer, std::size_t max_bytes) : tokenizer_(tokenizer), max_bytes_(max_bytes) {}

void AnswerCache::remember(const std::vector<std::int32_t>& prompt, const std::vector<std::int32_t>& answer, const std::string& text) {
  if (prompt.empty() || answer.empty() || text.empty()) return;
  // Control tokens the model wrote show as nothing in the text, and are put back with the rest: the
  // model gets its own history exactly (a canonical tokenization would drop them, and miss the cache
  // from there on).
  std::string pieces;
  for (std::int32_t id : answer) pieces += tokenizer_.piece(id);
  if (pieces != text) return;  // a stop string cut it, or bytes of a character never completed
  Entry e{prompt, answer, text};
  if (e.bytes() > max_bytes_) return;
  std::lock_guard lock(mutex_);
  bytes_ += e.bytes();
  entries_.push_front(std::move(e));
  while (bytes_ > max_bytes_) {
    bytes_ -= entries_.back().bytes();
    entries_.pop_back();
  }
}

std::size_t AnswerCache::spelled(const std::vector<std::int32_t>& ids, const Entry& e) const {
  const std::size_t start = e.prompt.size();
  std::string text;
  std::size_t i = start;
  while (i < ids.size() && text.size() < e.text.size()) {
    text += tokenizer_.piece(ids[i]);
    ++i;
    if (e.text.compare(0, text.size(), text) != 0) return 0;
  }
  return text == e.text ? i - start : 0;
}

std::size_t AnswerCache::restore(std::vector<std::int32_t>& ids) {
  std::lock_guard lock(mutex_);
  std::size_t restored = 0;
  std::size_t done = 0;  // ids before this are final: later answers continue longer prompts
  for (;;) {
    auto hit = entries_.end();
    std::size_t span = 0;
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->prompt.size() < done || it->prompt.size() >= ids.size()) continue;
      if (!std::equal(it->prompt.begin(), it->prompt.end(), ids.begin())) continue;
      if (hit != entries_.end() && it->prompt.size() >= hit->prompt.size()) continue;  // the earliest turn first
      if (const std::size_t n = spelled(ids, *it)) {
        hit = it;
        span = n;
      }
    }
    if (hit == entries_.end()) return restored;
    const auto at = ids.begin() + static_cast<long>(hit->prompt.size());
    ids.erase(at, at + static_cast<long>(span));
    ids.insert(ids.begin() + static_cast<long>(hit->prompt.size()), hit->answer.begin(), hit->answer.end());
    done = hit->prompt.size() + hit->answer.size();
    ++restored;
    entries_.splice(entries_.begin(), entries_, hit);  // used: most recent
  }
}

std::size_t AnswerCache::size() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

}  // namespace promptly::server
