#pragma once
// Grammar-constrained decoding: which tokens may come next, as a bit mask over the vocabulary.
//
// A matcher state is a set of stacks. The top of each stack is a position inside a DFA terminal
// (alternative, element, DFA state); below it are the return positions of the rules being
// expanded. Stacks are hash-consed, so equal stacks are one id and sets of them stay small.
//
// Speed comes from caching per position, as XGrammar does: for each top position the tokens are
// split once, by a walk of the vocabulary's byte trie, into those accepted whatever lies below the
// top frame, those rejected whatever lies below, and the few "uncertain" ones that reach the end of
// the top frame's rule with bytes left over; only those are checked against the real stack at each
// step. The byte after a rule's end must be in the rule's FOLLOW set, which keeps that list short.
//
// Bounded repetitions (a string of at most 64 characters) make many DFA states that differ only in
// how far away the bound is. A token of n bytes cannot tell apart states that agree on every input
// of up to n bytes, so the vocabulary is split into length buckets (1-2, 3-4, 5-8, 9-16, 17-32, 33+
// bytes) and each bucket's split is cached per class of states equivalent up to the bucket's longest
// token (Moore refinement stopped after that many rounds): "12 characters left" and "40 characters
// left" share their masks for every token of up to 8 bytes.
#include <array>
#include <atomic>
#include <bitset>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/compile.h"

namespace promptly::grammar {

// The vocabulary as bytes: each token's text, the tokens a grammar may never produce (control
// tokens, empty pieces) and the end-of-generation ids allowed once the grammar is complete.
class TokenBytes {
 public:
  TokenBytes(std::vector<std::string> pieces, std::vector<bool> excluded, std::vector<std::int32_t> end_ids);

  std::size_t size() const { return pieces_.size(); }
  const std::string& piece(std::int32_t id) const { return pieces_[static_cast<std::size_t>(id)]; }
  const std::vector<std::int32_t>& end_ids() const { return end_ids_; }

  // The byte trie in pre-order: node i's byte, depth, one-past its subtree, and the tokens
  // spelled exactly by the path to it (tokens_[token_begin[i] .. token_begin[i + 1])).
  struct Trie {
    std::vector<std::uint8_t> byte;
    std::vector<std::uint16_t> depth;  // root's children have depth 1
    std::vector<std::int32_t> subtree_end;
    std::vector<std::int32_t> token_begin;
    std::vector<std::int32_t> tokens;
    std::vector<std::uint16_t> max_below;  // the longest token ending in node i's subtree
  };
  const Trie& trie() const { return trie_; }

 private:
  std::vector<std::string> pieces_;
  std::vector<std::int32_t> end_ids_;
  Trie trie_;
};

// A position on top of a stack: (alternative, element, DFA state) packed in 64 bits.
using Frame = std::uint64_t;
inline Frame make_frame(int alt, int element, int state) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(alt)) << 40) |
         (static_cast<std::uint64_t>(static_cast<std::uint32_t>(element) & 0xFFFF) << 24) |
         (static_cast<std::uint64_t>(static_cast<std::uint32_t>(state)) & 0xFFFFFF);
}
inline int frame_alt(Frame f) { return static_cast<int>(f >> 40); }
inline int frame_element(Frame f) { return static_cast<int>((f >> 24) & 0xFFFF); }
inline int frame_state(Frame f) { return static_cast<int>(f & 0xFFFFFF); }

// Token length buckets: bucket b holds tokens of kBucketMin[b]..kBucketMax[b] bytes.
inline constexpr int kBuckets = 6;
inline constexpr int kBucketMin[kBuckets] = {1, 3, 5, 9, 17, 33};
inline constexpr int kBucketMax[kBuckets] = {2, 4, 8, 16, 32, 1 << 30};

// The per-position token split, shared by every request using one grammar with one vocabulary.
struct FrameMask {
  std::vector<std::uint32_t> accepted_bits;  // a full bitset, or empty when accepted_list is used
  std::vector<std::int32_t> accepted_list;
  std::vector<std::int32_t> uncertain;
};

class GrammarIndex {
 public:
  GrammarIndex(CompiledGrammar grammar, std::shared_ptr<const TokenBytes> vocab);

  const CompiledGrammar& grammar() const { return grammar_; }
  const TokenBytes& vocab() const { return *vocab_; }
  std::size_t mask_words() const { return (vocab_->size() + 31) / 32; }

  // The split of bucket `bucket` at position `f`: computed on first use and kept; thread-safe.
  const FrameMask& frame_mask(Frame f, int bucket) const;
  std::size_t cached_masks() const;
  // Computes every position's splits up front on `threads` threads (what a long-lived grammar
  // pays once so that no step waits for a trie walk); returns how many there are.
  // Stops early once `stop` becomes true.
  std::size_t precompute(int threads, const std::atomic<bool>* stop = nullptr) const;

 private:
  FrameMask compute(Frame f, int bucket) const;

  CompiledGrammar grammar_;
  // [dfa][bucket][state] -> class of states equivalent for inputs up to the bucket's longest token
  std::vector<std::array<std::vector<std::int32_t>, kBuckets>> horizon_class_;
  std::shared_ptr<const TokenBytes> vocab_;
  mutable std::mutex mutex_;
  mutable std::unordered_map<std::uint64_t, std::unique_ptr<FrameMask>> cache_;
};

// The hash-consed stacks of one matcher, and the steps between sets of them.
class StackSpace {
 public:
  static constexpr int kRoot = -1;     // below the root rule: popping here completes the grammar
  static constexpr int kOutside = -2;  // below a cached walk's frame: popping here leaves it

  struct Head {
    int parent;
    Frame frame;
    bool operator<(const Head& o) const { return parent != o.parent ? parent < o.parent : frame < o.frame; }
    bool operator==(const Head& o) const { return parent == o.parent && frame == o.frame; }
  };
  struct Heads {
    std::vector<Head> heads;
    bool completed = false;  // the root rule may end here
    bool exited = false;     // a kOutside frame's rule ended here
  };

  explicit StackSpace(const CompiledGrammar& g) : g_(g) {}

  // The heads reached by entering element `element` of `alt` with `parent` below.
  void enter(int parent, int alt, int element, Heads& out);
  // The heads after one more byte.
  void step(const Heads& in, std::uint8_t byte, Heads& out);
  static void normalize(Heads& h);

  std::size_t nodes() const { return parent_.size(); }
  // Forgets every node made after `mark` (they were scratch: never part of a committed state).
  void truncate(std::size_t mark);

 private:
  int push(int parent, Frame frame);

  const CompiledGrammar& g_;
  std::vector<int> parent_;
  std::vector<Frame> frame_;
  std::unordered_map<std::uint64_t, std::vector<int>> index_;  // hash(parent, frame) -> node ids
};

// One request's position in its grammar.
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const GrammarIndex> index);

  // Sets bit t of `mask` (mask_words() words) when token t may come next.
  void fill_mask(std::uint32_t* mask);
  // Advances over a token; false (and no change) if the grammar does not allow it.
  bool accept(std::int32_t token);
  // True when the output so far is a complete sentence of the grammar.
  bool can_end() const { return current().completed; }
  // True when nothing but ending is possible.
  bool must_end() const { return current().completed && current().heads.empty(); }
  // Undoes the last `n` accepted tokens (speculative decoding rejects drafted tokens).
  void rollback(std::size_t n);
  std::size_t accepted_tokens() const { return history_.size() - 1; }
  const GrammarIndex& index() const { return *index_; }

 private:
  const StackSpace::Heads& current() const { return history_.back(); }
  bool accepts_from(const StackSpace::Head& head, const std::string& bytes);

  std::shared_ptr<const GrammarIndex> index_;
  StackSpace space_;
  std::vector<StackSpace::Heads> history_;
  std::vector<std::size_t> node_marks_;
  StackSpace::Heads scratch_a_, scratch_b_;
};

}  // namespace promptly::grammar
