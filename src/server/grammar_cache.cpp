#include "server/grammar_cache.h"

#include "grammar/compile.h"
#include "grammar/gbnf.h"

namespace promptly::server {

std::shared_ptr<const grammar::GrammarIndex> GrammarCache::get(const std::string& gbnf, const std::shared_ptr<const grammar::TokenBytes>& vocab) {
  Key key{vocab.get(), gbnf};
  {
    std::lock_guard lock(mutex_);
    auto it = entries_.find(key);
    if (it != entries_.end()) {
      recent_.splice(recent_.begin(), recent_, it->second.second);
      return it->second.first;
    }
  }
  auto index = std::make_shared<const grammar::GrammarIndex>(grammar::compile(grammar::parse_gbnf(gbnf)), vocab);
  std::lock_guard lock(mutex_);
  auto it = entries_.find(key);
  if (it != entries_.end()) return it->second.first;  // compiled meanwhile by another request
  recent_.push_front(key);
  entries_.emplace(key, std::make_pair(index, recent_.begin()));
  while (entries_.size() > capacity_) {
    entries_.erase(recent_.back());
    recent_.pop_back();
  }
  return index;
}

std::size_t GrammarCache::size() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

}  // namespace promptly::server
