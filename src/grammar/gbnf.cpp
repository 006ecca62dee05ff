#include "grammar/gbnf.h"

#include <cctype>
#include <map>
#include <string>

#include "grammar/compile.h"
#include "grammar/dfa.h"

namespace promptly::grammar {

namespace {

bool name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'; }

class Parser {
 public:
  explicit Parser(std::string_view text) : s_(text) {}

  Grammar parse(std::string_view root) {
    skip_space();
    while (pos_ < s_.size()) {
      std::string name = parse_name();
      skip_space();
      if (s_.substr(pos_, 3) != "::=") fail("expected '::=' after rule name '" + name + "'");
      pos_ += 3;
      int id = rule_id(name);
      if (defined_[name]) fail("rule '" + name + "' is defined twice");
      defined_[name] = true;
      grammar_.rules[static_cast<std::size_t>(id)].body = parse_alternatives(false);
      skip_space();
    }
    for (const auto& [name, id] : ids_)
      if (!defined_[name]) throw GrammarError("grammar: rule '" + name + "' is used but never defined");
    auto it = ids_.find(std::string(root));
    if (it == ids_.end()) throw GrammarError("grammar: no '" + std::string(root) + "' rule");
    grammar_.root = it->second;
    return std::move(grammar_);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    std::size_t line = 1, col = 1;
    for (std::size_t i = 0; i < pos_ && i < s_.size(); ++i) {
      if (s_[i] == '\n') { ++line; col = 1; } else { ++col; }
    }
    throw GrammarError("grammar: " + what + " (line " + std::to_string(line) + ", column " + std::to_string(col) + ")");
  }

  void skip_space() {
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (c == '#') {
        while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else {
        break;
      }
    }
  }

  // A rule starts wherever a name is followed by '::='; newlines alone do not end a rule.
  bool at_rule_start() const {
    std::size_t p = pos_;
    if (p >= s_.size() || !name_char(s_[p])) return false;
    while (p < s_.size() && name_char(s_[p])) ++p;
    while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t' || s_[p] == '\n' || s_[p] == '\r')) ++p;
    return s_.substr(p, 3) == "::=";
  }

  std::string parse_name() {
    std::size_t start = pos_;
    while (pos_ < s_.size() && name_char(s_[pos_])) ++pos_;
    if (start == pos_) fail("expected a rule name");
    return std::string(s_.substr(start, pos_ - start));
  }

  int rule_id(const std::string& name) {
    auto [it, fresh] = ids_.emplace(name, static_cast<int>(grammar_.rules.size()));
    if (fresh) {
      grammar_.rules.push_back({name, Expr::seq({})});
      defined_[name] = false;
    }
    return it->second;
  }

  Expr parse_alternatives(bool nested) {
    std::vector<Expr> alts;
    alts.push_back(parse_sequence(nested));
    while (pos_ < s_.size() && s_[pos_] == '|') {
      ++pos_;
      alts.push_back(parse_sequence(nested));
    }
    return alts.size() == 1 ? std::move(alts.front()) : Expr::alt(std::move(alts));
  }

  Expr parse_sequence(bool nested) {
    std::vector<Expr> items;
    for (;;) {
      skip_space();
      if (pos_ >= s_.size() || s_[pos_] == '|' || s_[pos_] == ')') break;
      if (!nested && at_rule_start()) break;
      Expr item = parse_primary();
      skip_inline_space();
      item = parse_postfix(std::move(item));
      items.push_back(std::move(item));
    }
    if (nested && pos_ >= s_.size()) fail("missing ')'");
    return items.size() == 1 ? std::move(items.front()) : Expr::seq(std::move(items));
  }

  void skip_inline_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t')) ++pos_;
  }

  int parse_int() {
    std::size_t start = pos_;
    long long v = 0;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) {
      v = v * 10 + (s_[pos_++] - '0');
      if (v > 10000) fail("repetition count too large (at most 10000)");
    }
    if (start == pos_) fail("expected a number");
    return static_cast<int>(v);
  }

  Expr parse_postfix(Expr item) {
    for (;;) {
      if (pos_ >= s_.size()) return item;
      char c = s_[pos_];
      if (c == '*') { ++pos_; item = Expr::repeat(std::move(item), 0, -1); }
      else if (c == '+') { ++pos_; item = Expr::repeat(std::move(item), 1, -1); }
      else if (c == '?') { ++pos_; item = Expr::repeat(std::move(item), 0, 1); }
      else if (c == '{') {
        ++pos_;
        skip_inline_space();
        int lo = 0, hi;
        if (pos_ < s_.size() && s_[pos_] != ',') lo = parse_int();
        skip_inline_space();
        if (pos_ < s_.size() && s_[pos_] == ',') {
          ++pos_;
          skip_inline_space();
          hi = (pos_ < s_.size() && s_[pos_] == '}') ? -1 : parse_int();
        } else {
          hi = lo;
        }
        skip_inline_space();
        if (pos_ >= s_.size() || s_[pos_] != '}') fail("expected '}'");
        ++pos_;
        if (hi >= 0 && hi < lo) fail("repetition {m,n} with n < m");
        item = Expr::repeat(std::move(item), lo, hi);
      } else {
        return item;
      }
      skip_inline_space();
    }
  }

  std::uint32_t parse_hex(int digits) {
    std::uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (pos_ >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[pos_]))) fail("expected a hex digit");
      char c = s_[pos_++];
      v = v * 16 + static_cast<std::uint32_t>(std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : (std::tolower(c) - 'a' + 10));
    }
    if (v > 0x10FFFF) fail("code point out of range");
    return v;
  }

  // One character of a literal or class: an escape or a whole UTF-8 sequence.
  std::uint32_t parse_char() {
    if (pos_ >= s_.size()) fail("unexpected end of grammar");
    unsigned char c = static_cast<unsigned char>(s_[pos_]);
    if (c == '\\') {
      ++pos_;
      if (pos_ >= s_.size()) fail("unfinished escape");
      char e = s_[pos_++];
      switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case 'x': return parse_hex(2);
        case 'u': return parse_hex(4);
        case 'U': return parse_hex(8);
        case '\\': case '"': case '[': case ']': case '-': case '^': case '/': case '\'': return static_cast<std::uint8_t>(e);
        default: fail(std::string("unknown escape '\\") + e + "'");
      }
    }
    int len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    std::uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    ++pos_;
    for (int i = 1; i < len; ++i) {
      if (pos_ >= s_.size()) fail("invalid UTF-8");
      cp = (cp << 6) | (static_cast<unsigned char>(s_[pos_++]) & 0x3F);
    }
    return cp;
  }

  Expr parse_primary() {
    char c = s_[pos_];
    if (c == '"') {
      ++pos_;
      std::string bytes;
      while (pos_ < s_.size() && s_[pos_] != '"') append_utf8(bytes, parse_char());
      if (pos_ >= s_.size()) fail("unterminated string literal");
      ++pos_;
      return Expr::lit(std::move(bytes));
    }
    if (c == '[') {
      ++pos_;
      Expr e;
      e.kind = Expr::Kind::Class;
      if (pos_ < s_.size() && s_[pos_] == '^') { e.negated = true; ++pos_; }
      while (pos_ < s_.size() && s_[pos_] != ']') {
        std::uint32_t lo = parse_char(), hi = lo;
        if (pos_ + 1 < s_.size() && s_[pos_] == '-' && s_[pos_ + 1] != ']') {
          ++pos_;
          hi = parse_char();
          if (hi < lo) fail("character range out of order");
        }
        e.ranges.push_back({lo, hi});
      }
      if (pos_ >= s_.size()) fail("unterminated character class");
      ++pos_;
      return e;
    }
    if (c == '.') {
      ++pos_;
      Expr e;
      e.kind = Expr::Kind::Class;
      e.negated = true;  // every code point
      return e;
    }
    if (c == '(') {
      ++pos_;
      Expr inner = parse_alternatives(true);
      skip_space();
      if (pos_ >= s_.size() || s_[pos_] != ')') fail("missing ')'");
      ++pos_;
      return inner;
    }
    if (name_char(c)) return Expr::ref(rule_id(parse_name()));
    fail(std::string("unexpected character '") + c + "'");
  }

  std::string_view s_;
  std::size_t pos_ = 0;
  Grammar grammar_;
  std::map<std::string, int> ids_;
  std::map<std::string, bool> defined_;
};

}  // namespace

Grammar parse_gbnf(std::string_view text, std::string_view root) { return Parser(text).parse(root); }

}  // namespace promptly::grammar
