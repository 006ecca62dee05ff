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
  if (warm_in_background_) {
    // Finished warmers are joined as new ones start: only those still working stay.
    for (auto it = warmers_.begin(); it != warmers_.end();) {
      if (it->done->load()) {
        it->thread.join();
        it = warmers_.erase(it);
      } else {
        ++it;
      }
    }
    auto done = std::make_shared<std::atomic<bool>>(false);
    warmers_.push_back({std::thread([index, done, this] {
                          index->precompute(1, &stopping_);
                          done->store(true);
                        }),
                        done});
  }
  while (entries_.size() > capacity_) {
    entries_.erase(recent_.back());
    recent_.pop_back();
  }
  return index;
}

GrammarCache::~GrammarCache() {
  stopping_ = true;
  for (auto& w : warmers_) w.thread.join();
}

std::size_t GrammarCache::size() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

}  // namespace promptly::server
