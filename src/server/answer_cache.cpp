#include "server/answer_cache.h"

#include <algorithm>

namespace promptly::server {

namespace {

// The hash of ids[0, n) extends the hash of ids[0, n - 1) by one step, so a single pass gives every
// prefix's.
std::uint64_t extend(std::uint64_t hash, std::int32_t id) {
  return (hash ^ static_cast<std::uint32_t>(id)) * 0x100000001b3ULL + 0x9e3779b97f4a7c15ULL;
}

std::uint64_t hash_of(const std::vector<std::int32_t>& ids) {
  std::uint64_t h = 0;
  for (std::int32_t id : ids) h = extend(h, id);
  return h;
}

}  // namespace

AnswerCache::AnswerCache(const Tokenizer& tokenizer, std::size_t max_bytes) : tokenizer_(tokenizer), max_bytes_(max_bytes) {}

void AnswerCache::remember(const std::vector<std::int32_t>& prompt, const std::vector<std::int32_t>& answer, const std::string& text) {
  if (prompt.empty() || answer.empty() || text.empty()) return;
  // Control tokens the model wrote show as nothing in the text, and are put back with the rest: the
  // model gets its own history exactly (a canonical tokenization would drop them, and miss the cache
  // from there on).
  std::string pieces;
  for (std::int32_t id : answer) pieces += tokenizer_.piece(id);
  if (pieces != text) return;  // a stop string cut it, or bytes of a character never completed
  Entry e{prompt, answer, text, hash_of(prompt)};
  if (e.bytes() > max_bytes_) return;
  std::lock_guard lock(mutex_);
  bytes_ += e.bytes();
  entries_.push_front(std::move(e));
  by_prompt_.emplace(entries_.front().prompt_hash, entries_.begin());
  while (bytes_ > max_bytes_) forget(std::prev(entries_.end()));
}

void AnswerCache::forget(Entries::iterator it) {
  auto [first, last] = by_prompt_.equal_range(it->prompt_hash);
  for (auto m = first; m != last; ++m) {
    if (m->second == it) {
      by_prompt_.erase(m);
      break;
    }
  }
  bytes_ -= it->bytes();
  entries_.erase(it);
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
  // Every prefix of the ids, shortest first, is looked up as a remembered prompt; after an answer
  // goes back, the search goes on past it, over the ids as they now are.
  std::uint64_t hash = 0;  // of ids[0, n)
  std::size_t n = 0;
  while (n < ids.size() && !entries_.empty()) {
    Entries::iterator hit = entries_.end();
    std::size_t span = 0;
    auto [first, last] = n > 0 ? by_prompt_.equal_range(hash) : std::pair{by_prompt_.end(), by_prompt_.end()};
    for (auto m = first; m != last && hit == entries_.end(); ++m) {
      const Entry& e = *m->second;
      if (e.prompt.size() != n || !std::equal(e.prompt.begin(), e.prompt.end(), ids.begin())) continue;
      // Several answers to one prompt (a regenerated turn) differ in their text: the one spelled.
      if ((span = spelled(ids, e)) > 0) hit = m->second;
    }
    if (hit == entries_.end()) {
      hash = extend(hash, ids[n]);
      ++n;
      continue;
    }
    const auto at = ids.begin() + static_cast<long>(n);
    ids.erase(at, at + static_cast<long>(span));
    ids.insert(ids.begin() + static_cast<long>(n), hit->answer.begin(), hit->answer.end());
    for (std::int32_t id : hit->answer) hash = extend(hash, id);
    n += hit->answer.size();
    ++restored;
    entries_.splice(entries_.begin(), entries_, hit);  // used: most recent (iterators stay valid)
  }
  return restored;
}

std::size_t AnswerCache::size() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

}  // namespace promptly::server
