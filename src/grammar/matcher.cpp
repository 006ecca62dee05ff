#include "grammar/matcher.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <numeric>

namespace promptly::grammar {

TokenBytes::TokenBytes(std::vector<std::string> pieces, std::vector<bool> excluded, std::vector<std::int32_t> end_ids)
    : pieces_(std::move(pieces)), end_ids_(std::move(end_ids)) {
  for (std::size_t i = 0; i < pieces_.size() && i < excluded.size(); ++i)
    if (excluded[i]) pieces_[i].clear();  // never produced by a grammar (accept() refuses empty pieces)
  std::vector<std::int32_t> order;
  for (std::size_t i = 0; i < pieces_.size(); ++i)
    if (!(i < excluded.size() && excluded[i]) && !pieces_[i].empty()) order.push_back(static_cast<std::int32_t>(i));
  std::sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    return pieces_[static_cast<std::size_t>(a)] != pieces_[static_cast<std::size_t>(b)]
               ? pieces_[static_cast<std::size_t>(a)] < pieces_[static_cast<std::size_t>(b)]
               : a < b;
  });
  // Sorted strings give the trie in pre-order: each string shares its prefix with the previous one.
  std::vector<std::int32_t> path;  // node per depth - 1
  std::vector<std::int32_t> count, parent;
  const std::string* prev = nullptr;
  auto close_to = [&](std::size_t depth) {
    while (path.size() > depth) {
      trie_.subtree_end[static_cast<std::size_t>(path.back())] = static_cast<std::int32_t>(trie_.byte.size());
      path.pop_back();
    }
  };
  for (std::int32_t id : order) {
    const std::string& s = pieces_[static_cast<std::size_t>(id)];
    std::size_t common = 0;
    if (prev)
      while (common < s.size() && common < prev->size() && (*prev)[common] == s[common]) ++common;
    common = std::min(common, path.size());
    close_to(common);
    for (std::size_t k = common; k < s.size(); ++k) {
      parent.push_back(path.empty() ? -1 : path.back());
      path.push_back(static_cast<std::int32_t>(trie_.byte.size()));
      trie_.byte.push_back(static_cast<std::uint8_t>(s[k]));
      trie_.depth.push_back(static_cast<std::uint16_t>(std::min<std::size_t>(k + 1, 65535)));
      trie_.subtree_end.push_back(0);
      count.push_back(0);
    }
    ++count[static_cast<std::size_t>(path.back())];
    trie_.tokens.push_back(id);
    prev = &s;
  }
  close_to(0);
  trie_.token_begin.assign(count.size() + 1, 0);
  for (std::size_t i = 0; i < count.size(); ++i) trie_.token_begin[i + 1] = trie_.token_begin[i] + count[i];
  trie_.max_below.assign(count.size(), 0);
  for (std::size_t i = count.size(); i-- > 0;) {  // children follow their parent in pre-order
    if (count[i] > 0) trie_.max_below[i] = std::max(trie_.max_below[i], trie_.depth[i]);
    if (parent[i] >= 0) {
      auto& up = trie_.max_below[static_cast<std::size_t>(parent[i])];
      up = std::max(up, trie_.max_below[i]);
    }
  }
}

// --- StackSpace ---------------------------------------------------------------------------------

namespace {
std::uint64_t node_hash(int parent, Frame frame) {
  std::uint64_t h = frame * 0x9E3779B97F4A7C15ull ^ (static_cast<std::uint64_t>(static_cast<std::uint32_t>(parent)) + 0x632BE59BD9B4E019ull);
  return h ^ (h >> 29);
}
}  // namespace

int StackSpace::push(int parent, Frame frame) {
  auto& bucket = index_[node_hash(parent, frame)];
  for (int id : bucket)
    if (parent_[static_cast<std::size_t>(id)] == parent && frame_[static_cast<std::size_t>(id)] == frame) return id;
  int id = static_cast<int>(parent_.size());
  parent_.push_back(parent);
  frame_.push_back(frame);
  bucket.push_back(id);
  return id;
}

void StackSpace::truncate(std::size_t mark) {
  while (parent_.size() > mark) {
    int id = static_cast<int>(parent_.size()) - 1;
    auto it = index_.find(node_hash(parent_.back(), frame_.back()));
    if (it != index_.end()) {
      auto& bucket = it->second;
      bucket.erase(std::remove(bucket.begin(), bucket.end(), id), bucket.end());
      if (bucket.empty()) index_.erase(it);
    }
    parent_.pop_back();
    frame_.pop_back();
  }
}

void StackSpace::enter(int parent, int alt, int element, Heads& out) {
  const auto& els = g_.alts[static_cast<std::size_t>(alt)];
  if (element == static_cast<int>(els.size())) {
    if (parent == kRoot) {
      out.completed = true;
    } else if (parent == kOutside) {
      out.exited = true;
    } else {
      Frame pf = frame_[static_cast<std::size_t>(parent)];
      enter(parent_[static_cast<std::size_t>(parent)], frame_alt(pf), frame_element(pf) + 1, out);
    }
    return;
  }
  const Element& el = els[static_cast<std::size_t>(element)];
  if (el.kind == Element::Kind::Terminal) {
    const Dfa& d = g_.dfas[static_cast<std::size_t>(el.index)];
    if (d.has_out[static_cast<std::size_t>(d.start)]) out.heads.push_back({parent, make_frame(alt, element, d.start)});
    if (d.accepting[static_cast<std::size_t>(d.start)]) enter(parent, alt, element + 1, out);
    return;
  }
  int node = push(parent, make_frame(alt, element, 0));
  for (int a : g_.rule_alts[static_cast<std::size_t>(el.index)]) enter(node, a, 0, out);
}

void StackSpace::normalize(Heads& h) {
  if (h.heads.size() > 1) {
    std::sort(h.heads.begin(), h.heads.end());
    h.heads.erase(std::unique(h.heads.begin(), h.heads.end()), h.heads.end());
  }
}

void StackSpace::step(const Heads& in, std::uint8_t byte, Heads& out) {
  out.heads.clear();
  out.completed = out.exited = false;
  for (const Head& h : in.heads) {
    const int alt = frame_alt(h.frame), element = frame_element(h.frame);
    const Dfa& d = g_.dfa_at(alt, element);
    const int next = d.step(frame_state(h.frame), byte);
    if (next < 0) continue;
    if (d.has_out[static_cast<std::size_t>(next)]) out.heads.push_back({h.parent, make_frame(alt, element, next)});
    if (d.accepting[static_cast<std::size_t>(next)]) enter(h.parent, alt, element + 1, out);
  }
  normalize(out);
}

// --- GrammarIndex -------------------------------------------------------------------------------

namespace {

// Moore refinement of `d`'s states, recording the partition after each bucket's horizon: after r
// rounds two states share a class iff every input of up to r bytes leads both to the same outcome
// (dead, alive, accepting).
std::array<std::vector<std::int32_t>, kBuckets> horizon_classes(const Dfa& d) {
  const int n = d.size();
  std::array<std::vector<std::int32_t>, kBuckets> out;
  std::vector<std::int32_t> cls(static_cast<std::size_t>(n));
  for (int s = 0; s < n; ++s) cls[static_cast<std::size_t>(s)] = d.accepting[static_cast<std::size_t>(s)];
  int classes = 2, bucket = 0;
  bool stable = false;
  std::vector<std::int32_t> next;
  for (int round = 1; bucket < kBuckets - 1; ++round) {
    if (!stable) {
      const int fresh = refine_classes(d, cls, next);
      stable = fresh == classes;
      classes = fresh;
      std::swap(cls, next);
    }
    if (round == kBucketMax[bucket]) out[static_cast<std::size_t>(bucket++)] = cls;
  }
  // The longest tokens are keyed by state: no merging.
  auto& last = out[kBuckets - 1];
  last.resize(static_cast<std::size_t>(n));
  for (int s = 0; s < n; ++s) last[static_cast<std::size_t>(s)] = s;
  return out;
}

std::uint64_t mask_key(Frame f, int bucket, std::int32_t cls) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(frame_alt(f))) << 40) |
         (static_cast<std::uint64_t>(static_cast<std::uint32_t>(frame_element(f)) & 0xFFFF) << 24) |
         (static_cast<std::uint64_t>(bucket) << 21) | (static_cast<std::uint64_t>(static_cast<std::uint32_t>(cls)) & 0x1FFFFF);
}

}  // namespace

GrammarIndex::GrammarIndex(CompiledGrammar grammar, std::shared_ptr<const TokenBytes> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {
  horizon_class_.reserve(grammar_.dfas.size());
  for (const Dfa& d : grammar_.dfas) horizon_class_.push_back(horizon_classes(d));
}

const FrameMask& GrammarIndex::frame_mask(Frame f, int bucket) const {
  const int dfa = grammar_.alts[static_cast<std::size_t>(frame_alt(f))][static_cast<std::size_t>(frame_element(f))].index;
  const std::int32_t cls = horizon_class_[static_cast<std::size_t>(dfa)][static_cast<std::size_t>(bucket)][static_cast<std::size_t>(frame_state(f))];
  const std::uint64_t key = mask_key(f, bucket, cls);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = cache_.find(key);
    if (it != cache_.end()) return *it->second;
  }
  auto fresh = std::make_unique<FrameMask>(compute(f, bucket));
  std::lock_guard<std::mutex> lock(mutex_);
  auto [it, inserted] = cache_.emplace(key, std::move(fresh));
  return *it->second;
}

std::size_t GrammarIndex::precompute(int threads, const std::atomic<bool>* stop) const {
  std::vector<std::pair<Frame, int>> work;  // one representative position per (element, bucket, class)
  for (std::size_t a = 0; a < grammar_.alts.size(); ++a)
    for (std::size_t e = 0; e < grammar_.alts[a].size(); ++e) {
      const Element& el = grammar_.alts[a][e];
      if (el.kind != Element::Kind::Terminal) continue;
      const Dfa& d = grammar_.dfas[static_cast<std::size_t>(el.index)];
      for (int b = 0; b < kBuckets; ++b) {
        std::vector<char> seen(static_cast<std::size_t>(d.size()), 0);
        const auto& cls = horizon_class_[static_cast<std::size_t>(el.index)][static_cast<std::size_t>(b)];
        for (int s = 0; s < d.size(); ++s) {
          if (!d.has_out[static_cast<std::size_t>(s)] || seen[static_cast<std::size_t>(cls[static_cast<std::size_t>(s)])]) continue;
          seen[static_cast<std::size_t>(cls[static_cast<std::size_t>(s)])] = 1;
          work.push_back({make_frame(static_cast<int>(a), static_cast<int>(e), s), b});
        }
      }
    }
  std::atomic<std::size_t> next{0};
  auto worker = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < work.size();) {
      if (stop && stop->load(std::memory_order_relaxed)) return;
      frame_mask(work[i].first, work[i].second);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::max(1, threads); ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  return work.size();
}

std::size_t GrammarIndex::cached_masks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cache_.size();
}

FrameMask GrammarIndex::compute(Frame f, int bucket) const {
  const auto& trie = vocab_->trie();
  const std::size_t nodes = trie.byte.size();
  const auto& follow = grammar_.follow[static_cast<std::size_t>(grammar_.alt_rule[static_cast<std::size_t>(frame_alt(f))])];
  StackSpace space(grammar_);
  std::vector<StackSpace::Heads> level(2);
  std::vector<std::uint8_t> uncertain_path(2, 0);
  level[0].heads.push_back({StackSpace::kOutside, f});
  std::vector<std::int32_t> accepted, uncertain;
  const std::size_t lo = static_cast<std::size_t>(kBucketMin[bucket]), hi = static_cast<std::size_t>(kBucketMax[bucket]);
  auto tokens_at = [&](std::size_t node, std::vector<std::int32_t>& into) {
    if (trie.depth[node] < lo || trie.depth[node] > hi) return;
    for (std::int32_t k = trie.token_begin[node]; k < trie.token_begin[node + 1]; ++k) into.push_back(trie.tokens[static_cast<std::size_t>(k)]);
  };
  std::size_t i = 0;
  while (i < nodes) {
    const std::size_t d = trie.depth[i];
    if (d > hi || trie.max_below[i] < lo) {  // no token of this bucket below
      i = static_cast<std::size_t>(trie.subtree_end[i]);
      continue;
    }
    if (level.size() <= d) {
      level.resize(d + 1);
      uncertain_path.resize(d + 1);
    }
    const StackSpace::Heads& parent = level[d - 1];
    StackSpace::Heads& cur = level[d];
    // Most of a walk stays inside one DFA: one head, one table lookup, no rule to leave.
    bool stepped = false;
    if (parent.heads.size() == 1) {
      const StackSpace::Head& h = parent.heads.front();
      const Dfa& dfa = grammar_.dfa_at(frame_alt(h.frame), frame_element(h.frame));
      const int next = dfa.step(frame_state(h.frame), trie.byte[i]);
      if (next < 0 || !dfa.accepting[static_cast<std::size_t>(next)]) {
        cur.heads.clear();
        if (next >= 0) cur.heads.push_back({h.parent, make_frame(frame_alt(h.frame), frame_element(h.frame), next)});
        cur.completed = cur.exited = false;
        stepped = true;
      }
    }
    if (!stepped) space.step(parent, trie.byte[i], cur);
    const bool uncertain_here = uncertain_path[d - 1] || (parent.exited && follow.test(trie.byte[i]));
    if (!cur.heads.empty() || cur.exited) {
      tokens_at(i, accepted);
    } else if (uncertain_here) {
      tokens_at(i, uncertain);
    }
    if (cur.heads.empty() && !cur.exited) {
      const std::size_t end = static_cast<std::size_t>(trie.subtree_end[i]);
      if (uncertain_here)
        for (std::size_t k = i + 1; k < end; ++k) tokens_at(k, uncertain);
      i = end;
      continue;
    }
    uncertain_path[d] = uncertain_here;
    ++i;
  }
  FrameMask m;
  if (accepted.size() * 32 > vocab_->size()) {
    m.accepted_bits.assign(mask_words(), 0);
    for (std::int32_t t : accepted) m.accepted_bits[static_cast<std::size_t>(t) / 32] |= 1u << (t % 32);
  } else {
    m.accepted_list = std::move(accepted);
  }
  m.uncertain = std::move(uncertain);
  return m;
}

// --- Matcher ------------------------------------------------------------------------------------

Matcher::Matcher(std::shared_ptr<const GrammarIndex> index) : index_(std::move(index)), space_(index_->grammar()) {
  StackSpace::Heads start;
  for (int a : index_->grammar().rule_alts[static_cast<std::size_t>(index_->grammar().root)]) space_.enter(StackSpace::kRoot, a, 0, start);
  StackSpace::normalize(start);
  history_.push_back(std::move(start));
  node_marks_.push_back(space_.nodes());
}

bool Matcher::accepts_from(const StackSpace::Head& head, const std::string& bytes) {
  scratch_a_.heads.assign(1, head);
  scratch_a_.completed = false;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    space_.step(scratch_a_, static_cast<std::uint8_t>(bytes[i]), scratch_b_);
    std::swap(scratch_a_, scratch_b_);
    if (scratch_a_.heads.empty()) return i + 1 == bytes.size() && scratch_a_.completed;
  }
  return true;
}

void Matcher::fill_mask(std::uint32_t* mask) {
  const std::size_t words = index_->mask_words();
  std::memset(mask, 0, words * sizeof(std::uint32_t));
  const StackSpace::Heads& cur = current();
  const std::size_t mark = space_.nodes();
  const TokenBytes& vocab = index_->vocab();
  for (const StackSpace::Head& head : cur.heads) {
    for (int bucket = 0; bucket < kBuckets; ++bucket) {
      const FrameMask& fm = index_->frame_mask(head.frame, bucket);
      if (!fm.accepted_bits.empty()) {
        const std::uint32_t* bits = fm.accepted_bits.data();
        for (std::size_t w = 0; w < words; ++w) mask[w] |= bits[w];
      } else {
        for (std::int32_t t : fm.accepted_list) mask[t / 32] |= 1u << (t % 32);
      }
      for (std::int32_t t : fm.uncertain) {
        if (mask[t / 32] & (1u << (t % 32))) continue;
        if (accepts_from(head, vocab.piece(t))) mask[t / 32] |= 1u << (t % 32);
      }
    }
  }
  space_.truncate(mark);
  // A dead state cannot happen with a productive grammar; ending is the safe way out if it did.
  if (cur.completed || cur.heads.empty())
    for (std::int32_t t : vocab.end_ids())
      if (t >= 0 && static_cast<std::size_t>(t) < vocab.size()) mask[t / 32] |= 1u << (t % 32);
}

bool Matcher::accept(std::int32_t token) {
  const TokenBytes& vocab = index_->vocab();
  if (token < 0 || static_cast<std::size_t>(token) >= vocab.size()) return false;
  const auto& ends = vocab.end_ids();
  if (std::find(ends.begin(), ends.end(), token) != ends.end()) return current().completed;
  const std::string& bytes = vocab.piece(token);
  if (bytes.empty()) return false;
  const std::size_t mark = space_.nodes();
  StackSpace::Heads next = current();
  StackSpace::Heads tmp;
  for (unsigned char b : bytes) {
    space_.step(next, b, tmp);
    std::swap(next, tmp);
    if (next.heads.empty() && !next.completed) {
      space_.truncate(mark);
      return false;
    }
  }
  // A token may end exactly where the grammar completes, but must not run past it.
  history_.push_back(std::move(next));
  node_marks_.push_back(space_.nodes());
  return true;
}

void Matcher::rollback(std::size_t n) {
  n = std::min(n, history_.size() - 1);
  history_.resize(history_.size() - n);
  node_marks_.resize(node_marks_.size() - n);
  space_.truncate(node_marks_.back());
}

}  // namespace promptly::grammar
