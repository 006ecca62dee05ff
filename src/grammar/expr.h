#pragma once
// A grammar as parsed, before compilation: named rules whose bodies are expressions over code points
// (literals, character classes, rule references) combined by sequence, alternation and bounded or
// unbounded repetition. GBNF text parses into this (gbnf.h); compile.h turns it into automata.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace promptly::grammar {

struct Expr {
  enum class Kind { Literal, Class, Ref, Seq, Alt, Repeat };
  Kind kind = Kind::Seq;
  std::string literal;                                      // Literal: UTF-8 bytes to match exactly
  std::vector<std::pair<std::uint32_t, std::uint32_t>> ranges;  // Class: inclusive code point ranges
  bool negated = false;                                     // Class: matches code points outside `ranges`
  int rule = -1;                                            // Ref: index into Grammar::rules
  std::vector<Expr> children;                               // Seq, Alt; Repeat: exactly one
  int min = 0, max = -1;                                    // Repeat: max < 0 is unbounded

  static Expr lit(std::string bytes) { Expr e; e.kind = Kind::Literal; e.literal = std::move(bytes); return e; }
  static Expr ref(int r) { Expr e; e.kind = Kind::Ref; e.rule = r; return e; }
  static Expr seq(std::vector<Expr> c) { Expr e; e.kind = Kind::Seq; e.children = std::move(c); return e; }
  static Expr alt(std::vector<Expr> c) { Expr e; e.kind = Kind::Alt; e.children = std::move(c); return e; }
  static Expr repeat(Expr c, int lo, int hi) {
    Expr e; e.kind = Kind::Repeat; e.children.push_back(std::move(c)); e.min = lo; e.max = hi; return e;
  }
};

struct Rule {
  std::string name;
  Expr body;
};

struct Grammar {
  std::vector<Rule> rules;
  int root = -1;
  int find(const std::string& name) const {
    for (std::size_t i = 0; i < rules.size(); ++i)
      if (rules[i].name == name) return static_cast<int>(i);
    return -1;
  }
};

}  // namespace promptly::grammar
