#pragma once
// Compiled grammars kept by their text, so that a schema sent again (every request of an app sends
// the same one) reuses the masks its earlier requests computed.
#include <cstddef>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <atomic>

#include "grammar/matcher.h"

namespace promptly::server {

class GrammarCache {
 public:
  // `warm_in_background`: a newly compiled grammar's every position mask is computed on a thread
  // of its own (so that no later token waits for a trie walk); only where a core is spare.
  explicit GrammarCache(std::size_t capacity = 64, bool warm_in_background = false)
      : capacity_(capacity), warm_in_background_(warm_in_background) {}
  ~GrammarCache();
  GrammarCache(const GrammarCache&) = delete;
  GrammarCache& operator=(const GrammarCache&) = delete;
  void set_warm_in_background(bool on) { warm_in_background_ = on; }
  // The grammar `gbnf` over `vocab`, compiled on a miss (outside the lock). Throws
  // grammar::GrammarError for grammars that do not compile.
  std::shared_ptr<const grammar::GrammarIndex> get(const std::string& gbnf, const std::shared_ptr<const grammar::TokenBytes>& vocab);
  std::size_t size() const;

 private:
  using Key = std::pair<const grammar::TokenBytes*, std::string>;
  std::size_t capacity_;
  bool warm_in_background_;
  std::atomic<bool> stopping_{false};
  struct Warmer {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<Warmer> warmers_;  // under mutex_
  mutable std::mutex mutex_;
  std::list<Key> recent_;  // most recent first
  std::map<Key, std::pair<std::shared_ptr<const grammar::GrammarIndex>, std::list<Key>::iterator>> entries_;
};

}  // namespace promptly::server
