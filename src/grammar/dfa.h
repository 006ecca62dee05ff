#pragma once
// Byte-level deterministic automata for the regular parts of a grammar. Character classes over code
// points become UTF-8 byte sequences, so a token's bytes are matched one at a time without decoding,
// and a stretch of grammar with no recursion (a JSON string, a number, a whole flat object) becomes
// one table lookup per byte.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "grammar/expr.h"

namespace promptly::grammar {

struct Dfa {
  std::array<std::uint16_t, 256> byte_class{};  // bytes that no transition tells apart share a class
  int classes = 1;
  std::vector<std::int32_t> next;               // [state * classes + class] -> state, or -1
  std::vector<std::uint8_t> accepting;
  std::vector<std::uint8_t> has_out;            // any byte leads somewhere from this state
  int start = 0;

  int size() const { return static_cast<int>(accepting.size()); }
  int step(int state, std::uint8_t byte) const {
    return next[static_cast<std::size_t>(state) * static_cast<std::size_t>(classes) + byte_class[byte]];
  }
  // Bytes with a transition out of `state`.
  std::array<bool, 256> first_bytes(int state) const;
};

// The inclusive byte ranges of each UTF-8 encoding of the code points in [lo, hi] (surrogates
// excluded), one vector of per-position ranges per sequence shape.
std::vector<std::vector<std::pair<std::uint8_t, std::uint8_t>>> utf8_sequences(std::uint32_t lo, std::uint32_t hi);

// One round of Moore refinement: `next` gets the classes of states that share their class in `cls`
// and, on every byte class, the class they move to (or both have no move). Returns how many.
int refine_classes(const Dfa& d, const std::vector<std::int32_t>& cls, std::vector<std::int32_t>& next);

// Appends the UTF-8 encoding of code point `cp` (at most U+10FFFF) to `out`.
void append_utf8(std::string& out, std::uint32_t cp);

// Builds the DFA of `e` by subset construction, inlining rule references through `g` (the caller guarantees
// they do not recurse). Returns nullopt when it would need more than `max_states` states.
std::optional<Dfa> build_dfa(const Expr& e, const Grammar& g, int max_states);

}  // namespace promptly::grammar
