#pragma once
// Compiled grammars kept by their text, so that a schema sent again (every request of an app sends
// the same one) reuses the masks its earlier requests computed.
#include <cstddef>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "grammar/matcher.h"

namespace promptly::server {

class GrammarCache {
 public:
  explicit GrammarCache(std::size_t capacity = 64) : capacity_(capacity) {}
  // The grammar `gbnf` over `vocab`, compiled on a miss (outside the lock). Throws
  // grammar::GrammarError for grammars that do not compile.
  std::shared_ptr<const grammar::GrammarIndex> get(const std::string& gbnf, const std::shared_ptr<const grammar::TokenBytes>& vocab);
  std::size_t size() const;

 private:
  using Key = std::pair<const grammar::TokenBytes*, std::string>;
  std::size_t capacity_;
  mutable std::mutex mutex_;
  std::list<Key> recent_;  // most recent first
  std::map<Key, std::pair<std::shared_ptr<const grammar::GrammarIndex>, std::list<Key>::iterator>> entries_;
};

}  // namespace promptly::server
