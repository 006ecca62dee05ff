#pragma once
// A grammar compiled for matching: regular stretches become DFAs (dfa.h), the recursive skeleton
// stays a set of rules whose alternatives are sequences of DFA terminals and rule references. A
// matcher position is then (alternative, element, DFA state) on a stack of return positions.
#include <bitset>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "grammar/dfa.h"
#include "grammar/expr.h"

namespace promptly::grammar {

class GrammarError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Element {
  enum class Kind : std::uint8_t { Terminal, Ref };
  Kind kind = Kind::Terminal;
  int index = -1;  // Terminal: into dfas; Ref: into rule_alts
};

struct CompiledGrammar {
  std::vector<Dfa> dfas;
  std::vector<std::vector<Element>> alts;      // alternative -> its elements
  std::vector<int> alt_rule;                   // alternative -> the rule it belongs to
  std::vector<std::vector<int>> rule_alts;     // rule -> its alternatives
  std::vector<std::string> rule_names;
  std::vector<std::bitset<256>> follow;        // rule -> bytes that may come right after it
  int root = 0;

  const Dfa& dfa_at(int alt, int element) const {
    return dfas[static_cast<std::size_t>(alts[static_cast<std::size_t>(alt)][static_cast<std::size_t>(element)].index)];
  }
};

struct CompileLimits {
  int max_dfa_states = 20000;        // one regular stretch; larger ones are split into smaller pieces
  int max_total_states = 2000000;    // the whole grammar
  int max_rules = 20000;             // rules, counting those made for repetitions of recursive parts
};

// Throws GrammarError for left recursion, rules that can never finish and grammars over the limits.
CompiledGrammar compile(const Grammar& g, const CompileLimits& limits = {});

}  // namespace promptly::grammar
