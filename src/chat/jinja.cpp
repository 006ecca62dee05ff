#include "chat/jinja.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <unordered_map>
#include <vector>

namespace promptly::jinja {

// ---------------------------------------------------------------------------------------------
// Strings: UTF-8 helpers with Python's notion of whitespace and code-point indexing.

namespace {

std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 1;
    n = std::min(n, s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

bool is_py_space(const std::string& cp) {
  if (cp.size() == 1) {
    const char c = cp[0];
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' || (c >= 0x1c && c <= 0x1f);
  }
  static const char* const kUnicodeSpaces[] = {"\xc2\x85", "\xc2\xa0", "\xe1\x9a\x80", "\xe2\x80\x80", "\xe2\x80\x81",
                                               "\xe2\x80\x82", "\xe2\x80\x83", "\xe2\x80\x84", "\xe2\x80\x85", "\xe2\x80\x86",
                                               "\xe2\x80\x87", "\xe2\x80\x88", "\xe2\x80\x89", "\xe2\x80\x8a", "\xe2\x80\xa8",
                                               "\xe2\x80\xa9", "\xe2\x80\xaf", "\xe2\x81\x9f", "\xe3\x80\x80"};
  for (const char* sp : kUnicodeSpaces)
    if (cp == sp) return true;
  return false;
}

// Python str.strip / lstrip / rstrip; chars empty-and-unset means whitespace.
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  const auto cps = code_points(s);
  const bool by_space = !chars || chars->is_none() || chars->is_undefined();
  std::vector<std::string> set;
  if (!by_space) set = code_points(chars->str());
  auto strip_it = [&](const std::string& cp) {
    return by_space ? is_py_space(cp) : std::find(set.begin(), set.end(), cp) != set.end();
  };
  std::size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b])) ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1])) --e;
  std::string out;
  for (std::size_t i = b; i < e; ++i) out += cps[i];
  return out;
}

std::vector<std::string> py_split(const std::string& s, const Value* sep, std::int64_t maxsplit) {
  std::vector<std::string> out;
  if (!sep || sep->is_none()) {  // runs of whitespace, no empty strings
    const auto cps = code_points(s);
    std::string cur;
    bool in_word = false;
    std::size_t i = 0;
    for (; i < cps.size(); ++i) {
      if (is_py_space(cps[i])) {
        if (in_word) {
          out.push_back(cur);
          cur.clear();
          in_word = false;
          if (maxsplit >= 0 && static_cast<std::int64_t>(out.size()) >= maxsplit) break;
        }
      } else {
        in_word = true;
        cur += cps[i];
      }
    }
    if (in_word) {
      out.push_back(cur);
    } else if (i < cps.size()) {
      std::size_t j = i;
      while (j < cps.size() && is_py_space(cps[j])) ++j;
      if (j < cps.size()) {
        std::string rest;
        for (; j < cps.size(); ++j) rest += cps[j];
        out.push_back(rest);
      }
    }
    return out;
  }
  const std::string d = sep->str();
  if (d.empty()) throw TemplateError("empty separator");
  std::size_t pos = 0;
  while (true) {
    if (maxsplit >= 0 && static_cast<std::int64_t>(out.size()) >= maxsplit) break;
    const std::size_t k = s.find(d, pos);
    if (k == std::string::npos) break;
    out.push_back(s.substr(pos, k - pos));
    pos = k + d.size();
  }
  out.push_back(s.substr(pos));
  return out;
}

std::string ascii_upper(std::string s) {
  for (char& c : s)
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
  return s;
}
std::string ascii_lower(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
  return s;
}
bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, std::int64_t count) {
  if (from.empty()) return s;
  std::string out;
  std::size_t pos = 0;
  std::int64_t done = 0;
  while (count < 0 || done < count) {
    const std::size_t k = s.find(from, pos);
    if (k == std::string::npos) break;
    out.append(s, pos, k - pos);
    out += to;
    pos = k + from.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Expression tokens.

enum class Tok { Name, String, Int, Float, Op, End };

struct Token {
  Tok type;
  std::string text;
  std::int64_t i = 0;
  double f = 0;
};

std::vector<Token> tokenize_expr(const std::string& src, int line) {
  std::vector<Token> out;
  std::size_t i = 0;
  auto fail = [&](const std::string& what) -> void {
    throw TemplateError("template syntax error on line " + std::to_string(line) + ": " + what);
  };
  while (i < src.size()) {
    const char c = src[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      ++i;
      continue;
    }
    if (is_alpha(c) || c == '_') {
      std::size_t j = i;
      while (j < src.size() && (is_alpha(src[j]) || src[j] == '_' || (src[j] >= '0' && src[j] <= '9'))) ++j;
      out.push_back({Tok::Name, src.substr(i, j - i)});
      i = j;
      continue;
    }
    if (c >= '0' && c <= '9') {
      std::size_t j = i;
      bool is_float = false;
      while (j < src.size() && ((src[j] >= '0' && src[j] <= '9') || src[j] == '_')) ++j;
      if (j + 1 < src.size() && src[j] == '.' && src[j + 1] >= '0' && src[j + 1] <= '9') {
        is_float = true;
        ++j;
        while (j < src.size() && src[j] >= '0' && src[j] <= '9') ++j;
      }
      if (j < src.size() && (src[j] == 'e' || src[j] == 'E')) {
        std::size_t k = j + 1;
        if (k < src.size() && (src[k] == '+' || src[k] == '-')) ++k;
        if (k < src.size() && src[k] >= '0' && src[k] <= '9') {
          is_float = true;
          j = k;
          while (j < src.size() && src[j] >= '0' && src[j] <= '9') ++j;
        }
      }
      std::string num;
      for (std::size_t k = i; k < j; ++k)
        if (src[k] != '_') num += src[k];
      Token t{is_float ? Tok::Float : Tok::Int, num};
      if (is_float) t.f = std::strtod(num.c_str(), nullptr);
      else t.i = std::strtoll(num.c_str(), nullptr, 10);
      out.push_back(t);
      i = j;
      continue;
    }
    if (c == '\'' || c == '"') {
      std::string s;
      std::size_t j = i + 1;
      bool closed = false;
      while (j < src.size()) {
        const char d = src[j];
        if (d == c) {
          closed = true;
          ++j;
          break;
        }
        if (d == '\\' && j + 1 < src.size()) {
          const char e = src[j + 1];
          switch (e) {
            case 'n': s += '\n'; break;
            case 't': s += '\t'; break;
            case 'r': s += '\r'; break;
            case '\\': s += '\\'; break;
            case '\'': s += '\''; break;
            case '"': s += '"'; break;
            case '0': s += '\0'; break;
            default: s += '\\'; s += e; break;
          }
          j += 2;
          continue;
        }
        s += d;
        ++j;
      }
      if (!closed) fail("unterminated string");
      out.push_back({Tok::String, s});
      i = j;
      continue;
    }
    static const char* const kOps2[] = {"==", "!=", "<=", ">=", "//", "**"};
    bool matched = false;
    for (const char* op : kOps2) {
      if (src.compare(i, 2, op) == 0) {
        out.push_back({Tok::Op, op});
        i += 2;
        matched = true;
        break;
      }
    }
    if (matched) continue;
    if (std::string("+-*/%~<>=()[]{}.,:|").find(c) != std::string::npos) {
      out.push_back({Tok::Op, std::string(1, c)});
      ++i;
      continue;
    }
    fail(std::string("unexpected character '") + c + "'");
  }
  out.push_back({Tok::End, ""});
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// AST.

struct Expr;
using ExprPtr = std::shared_ptr<Expr>;

struct Expr {
  enum class Kind { Literal, Name, Attr, Item, Slice, Call, Filter, Test, Unary, Binary, And, Or, Not, Cond, List, Dict };
  Kind kind;
  int line = 0;
  Value literal;
  std::string name;  // Name, Attr, Filter, Test, Unary/Binary operator
  ExprPtr a, b, c;   // operands (Slice: object, start, stop; step in d)
  ExprPtr d;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;  // Test: `is not`
};

struct Node {
  enum class Kind { Block, Text, Output, If, For, Set, SetBlock, Macro, Break, Continue };
  Kind kind = Kind::Block;
  int line = 0;
  std::string text;
  ExprPtr expr;                 // Output, Set value, For iterable
  std::vector<std::shared_ptr<Node>> children;  // Block
  std::vector<std::pair<ExprPtr, std::shared_ptr<Node>>> branches;  // If
  std::shared_ptr<Node> body, else_body;
  std::vector<std::string> targets;  // For loop variables, Set target names
  std::string attr;                  // Set ns.attr
  ExprPtr filter;                    // For inline `if`
  std::vector<std::pair<std::string, ExprPtr>> params;  // Macro
};
using NodePtr = std::shared_ptr<Node>;

namespace {

// ---------------------------------------------------------------------------------------------
// Expression parser (precedence as Jinja2: ternary < or < and < not < compare < +,- < ~ < *,/,//,%
// < ** < unary; filters and tests bind to the unary operand).

class ExprParser {
 public:
  ExprParser(std::vector<Token> toks, int line) : t_(std::move(toks)), line_(line) {}

  ExprPtr parse_expression(bool allow_ternary = true) {
    ExprPtr e = parse_or();
    if (allow_ternary && is_name("if")) {
      ++p_;
      auto cond = parse_or();
      ExprPtr otherwise;
      if (is_name("else")) {
        ++p_;
        otherwise = parse_expression();
      }
      auto n = make(Expr::Kind::Cond);
      n->a = e;
      n->b = cond;
      n->c = otherwise;
      return n;
    }
    return e;
  }

  // A tuple without parentheses (for `for a, b in` and `set a, b =`) is handled by the statement parser.
  bool at_end() const { return t_[p_].type == Tok::End; }
  bool is_name(const char* n) const { return t_[p_].type == Tok::Name && t_[p_].text == n; }
  bool is_op(const char* o) const { return t_[p_].type == Tok::Op && t_[p_].text == o; }
  std::string expect_name() {
    if (t_[p_].type != Tok::Name) fail("expected a name, found '" + t_[p_].text + "'");
    return t_[p_++].text;
  }
  void expect_op(const char* o) {
    if (!is_op(o)) fail(std::string("expected '") + o + "', found '" + t_[p_].text + "'");
    ++p_;
  }
  void expect_end() {
    if (!at_end()) fail("unexpected '" + t_[p_].text + "'");
  }
  void skip() { ++p_; }
  [[noreturn]] void fail(const std::string& what) const {
    throw TemplateError("template syntax error on line " + std::to_string(line_) + ": " + what);
  }

 private:
  ExprPtr make(Expr::Kind k) {
    auto e = std::make_shared<Expr>();
    e->kind = k;
    e->line = line_;
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr l = parse_and();
    while (is_name("or")) {
      ++p_;
      auto n = make(Expr::Kind::Or);
      n->a = l;
      n->b = parse_and();
      l = n;
    }
    return l;
  }
  ExprPtr parse_and() {
    ExprPtr l = parse_not();
    while (is_name("and")) {
      ++p_;
      auto n = make(Expr::Kind::And);
      n->a = l;
      n->b = parse_not();
      l = n;
    }
    return l;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      ++p_;
      auto n = make(Expr::Kind::Not);
      n->a = parse_not();
      return n;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr l = parse_math1();
    for (;;) {
      std::string op;
      if (t_[p_].type == Tok::Op && (t_[p_].text == "==" || t_[p_].text == "!=" || t_[p_].text == "<" ||
                                     t_[p_].text == ">" || t_[p_].text == "<=" || t_[p_].text == ">=")) {
        op = t_[p_++].text;
      } else if (is_name("in")) {
        ++p_;
        op = "in";
      } else if (is_name("not") && t_[p_ + 1].type == Tok::Name && t_[p_ + 1].text == "in") {
        p_ += 2;
        op = "not in";
      } else {
        return l;
      }
      auto n = make(Expr::Kind::Binary);
      n->name = op;
      n->a = l;
      n->b = parse_math1();
      l = n;
    }
  }
  ExprPtr parse_math1() {
    ExprPtr l = parse_concat();
    while (is_op("+") || is_op("-")) {
      auto n = make(Expr::Kind::Binary);
      n->name = t_[p_++].text;
      n->a = l;
      n->b = parse_concat();
      l = n;
    }
    return l;
  }
  ExprPtr parse_concat() {
    ExprPtr l = parse_math2();
    while (is_op("~")) {
      ++p_;
      auto n = make(Expr::Kind::Binary);
      n->name = "~";
      n->a = l;
      n->b = parse_math2();
      l = n;
    }
    return l;
  }
  ExprPtr parse_math2() {
    ExprPtr l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      auto n = make(Expr::Kind::Binary);
      n->name = t_[p_++].text;
      n->a = l;
      n->b = parse_pow();
      l = n;
    }
    return l;
  }
  ExprPtr parse_pow() {
    ExprPtr l = parse_unary();
    while (is_op("**")) {
      ++p_;
      auto n = make(Expr::Kind::Binary);
      n->name = "**";
      n->a = l;
      n->b = parse_unary();
      l = n;
    }
    return l;
  }
  ExprPtr parse_unary() {
    if (is_op("-") || is_op("+")) {
      auto n = make(Expr::Kind::Unary);
      n->name = t_[p_++].text;
      n->a = parse_unary();
      return parse_filters(n);
    }
    return parse_filters(parse_postfix(parse_primary()));
  }

  void parse_call_args(Expr& call) {
    expect_op("(");
    while (!is_op(")")) {
      if (t_[p_].type == Tok::Name && t_[p_ + 1].type == Tok::Op && t_[p_ + 1].text == "=") {
        std::string key = t_[p_].text;
        p_ += 2;
        call.kwargs.emplace_back(key, parse_expression());
      } else {
        call.args.push_back(parse_expression());
      }
      if (!is_op(",")) break;
      ++p_;
    }
    expect_op(")");
  }

  ExprPtr parse_filters(ExprPtr e) {
    for (;;) {
      if (is_op("|")) {
        ++p_;
        auto n = make(Expr::Kind::Filter);
        n->name = expect_name();
        n->a = e;
        if (is_op("(")) parse_call_args(*n);
        e = n;
      } else if (is_name("is")) {
        ++p_;
        auto n = make(Expr::Kind::Test);
        if (is_name("not")) {
          ++p_;
          n->negated = true;
        }
        if (t_[p_].type == Tok::Name) {
          n->name = t_[p_++].text;
        } else if (t_[p_].type == Tok::Op && (t_[p_].text == "==" || t_[p_].text == "!=" || t_[p_].text == "<" ||
                                              t_[p_].text == ">" || t_[p_].text == "<=" || t_[p_].text == ">=")) {
          n->name = t_[p_++].text;
        } else {
          fail("expected a test name after 'is'");
        }
        n->a = e;
        if (is_op("(")) {
          parse_call_args(*n);
        } else if (t_[p_].type == Tok::String || t_[p_].type == Tok::Int || t_[p_].type == Tok::Float ||
                   (t_[p_].type == Tok::Name && !is_name("and") && !is_name("or") && !is_name("else") && !is_name("if") &&
                    !is_name("is") && !is_name("in") && !is_name("not"))) {
          n->args.push_back(parse_primary());  // `is divisibleby 3`, `is equalto 'x'`
        }
        e = n;
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      if (is_op(".")) {
        ++p_;
        auto n = make(Expr::Kind::Attr);
        if (t_[p_].type == Tok::Int) {
          n = make(Expr::Kind::Item);
          auto idx = make(Expr::Kind::Literal);
          idx->literal = Value::integer(t_[p_++].i);
          n->b = idx;
        } else {
          n->name = expect_name();
        }
        n->a = e;
        e = n;
      } else if (is_op("[")) {
        ++p_;
        ExprPtr start, stop, step;
        bool is_slice = false;
        if (!is_op(":")) start = parse_expression();
        if (is_op(":")) {
          is_slice = true;
          ++p_;
          if (!is_op("]") && !is_op(":")) stop = parse_expression();
          if (is_op(":")) {
            ++p_;
            if (!is_op("]")) step = parse_expression();
          }
        }
        expect_op("]");
        if (is_slice) {
          auto n = make(Expr::Kind::Slice);
          n->a = e;
          n->b = start;
          n->c = stop;
          n->d = step;
          e = n;
        } else {
          auto n = make(Expr::Kind::Item);
          n->a = e;
          n->b = start;
          e = n;
        }
      } else if (is_op("(")) {
        auto n = make(Expr::Kind::Call);
        n->a = e;
        parse_call_args(*n);
        e = n;
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_primary() {
    const Token& tok = t_[p_];
    auto lit = [&](Value v) {
      ++p_;
      auto n = make(Expr::Kind::Literal);
      n->literal = std::move(v);
      return n;
    };
    switch (tok.type) {
      case Tok::String: {
        std::string s = tok.text;
        ++p_;
        while (t_[p_].type == Tok::String) s += t_[p_++].text;  // adjacent literals concatenate
        auto n = make(Expr::Kind::Literal);
        n->literal = Value::string(s);
        return n;
      }
      case Tok::Int: return lit(Value::integer(tok.i));
      case Tok::Float: return lit(Value::number(tok.f));
      case Tok::Name: {
        if (tok.text == "true" || tok.text == "True") return lit(Value::boolean(true));
        if (tok.text == "false" || tok.text == "False") return lit(Value::boolean(false));
        if (tok.text == "none" || tok.text == "None") return lit(Value::none());
        auto n = make(Expr::Kind::Name);
        n->name = tok.text;
        ++p_;
        return n;
      }
      case Tok::Op: {
        if (tok.text == "(") {
          ++p_;
          if (is_op(")")) {
            ++p_;
            return make(Expr::Kind::List);
          }
          ExprPtr first = parse_expression();
          if (is_op(",")) {  // tuple: evaluated as a list
            auto n = make(Expr::Kind::List);
            n->args.push_back(first);
            while (is_op(",")) {
              ++p_;
              if (is_op(")")) break;
              n->args.push_back(parse_expression());
            }
            expect_op(")");
            return n;
          }
          expect_op(")");
          return first;
        }
        if (tok.text == "[") {
          ++p_;
          auto n = make(Expr::Kind::List);
          while (!is_op("]")) {
            n->args.push_back(parse_expression());
            if (!is_op(",")) break;
            ++p_;
          }
          expect_op("]");
          return n;
        }
        if (tok.text == "{") {
          ++p_;
          auto n = make(Expr::Kind::Dict);
          while (!is_op("}")) {
            n->args.push_back(parse_expression());
            expect_op(":");
            n->args.push_back(parse_expression());
            if (!is_op(",")) break;
            ++p_;
          }
          expect_op("}");
          return n;
        }
        break;
      }
      default: break;
    }
    fail(tok.type == Tok::End ? "unexpected end of expression" : "unexpected '" + tok.text + "'");
  }

  std::vector<Token> t_;
  std::size_t p_ = 0;
  int line_;
};

// ---------------------------------------------------------------------------------------------
// Template source -> segments (text, {{ expr }}, {% stmt %}) with whitespace control applied.

struct Segment {
  enum class Kind { Text, Expr, Stmt } kind;
  std::string text;
  int line;
};

int line_at(const std::string& src, std::size_t pos) {
  return 1 + static_cast<int>(std::count(src.begin(), src.begin() + static_cast<long>(std::min(pos, src.size())), '\n'));
}

// Finds the closing delimiter of a tag, skipping over string literals inside it.
std::size_t find_close(const std::string& src, std::size_t from, const char* close) {
  char quote = 0;
  for (std::size_t i = from; i + 1 < src.size(); ++i) {
    const char c = src[i];
    if (quote) {
      if (c == '\\') ++i;
      else if (c == quote) quote = 0;
      continue;
    }
    if (c == '\'' || c == '"') {
      quote = c;
      continue;
    }
    if (c == close[0] && src[i + 1] == close[1]) return i;
  }
  return std::string::npos;
}

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::vector<Segment> split_segments(std::string src) {
  // keep_trailing_newline=False: a single trailing newline of the template is dropped.
  if (!src.empty() && src.back() == '\n') {
    src.pop_back();
    if (!src.empty() && src.back() == '\r') src.pop_back();
  }
  std::vector<Segment> out;
  std::size_t pos = 0;
  bool strip_next_text = false;
  bool line_starting = true;  // the previous token ended a line (or this is the template's start)
  auto push_text = [&](std::string text, std::size_t at) {
    if (strip_next_text) {
      std::size_t b = 0;
      while (b < text.size() && is_ws(text[b])) ++b;
      text.erase(0, b);
      strip_next_text = false;
    }
    if (!text.empty()) out.push_back({Segment::Kind::Text, text, line_at(src, at)});
  };
  while (pos <= src.size()) {
    std::size_t k = std::string::npos;
    for (std::size_t i = pos; i + 1 < src.size(); ++i) {
      if (src[i] == '{' && (src[i + 1] == '{' || src[i + 1] == '%' || src[i + 1] == '#')) {
        k = i;
        break;
      }
    }
    if (k == std::string::npos) {
      push_text(src.substr(pos), pos);
      break;
    }
    std::string text = src.substr(pos, k - pos);
    if (strip_next_text) {
      std::size_t b = 0;
      while (b < text.size() && is_ws(text[b])) ++b;
      text.erase(0, b);
      strip_next_text = false;
    }
    const char kind = src[k + 1];
    std::size_t inner = k + 2;
    const bool strip_before = inner < src.size() && src[inner] == '-';
    const bool keep_lstrip = inner < src.size() && src[inner] == '+';
    if (strip_before || keep_lstrip) ++inner;
    const std::size_t end = kind == '#' ? src.find("#}", inner) : find_close(src, inner, kind == '{' ? "}}" : "%}");
    const int line = line_at(src, k);
    if (end == std::string::npos) {
      throw TemplateError("template syntax error on line " + std::to_string(line) + ": unclosed '{" + kind + "'");
    }
    const bool strip_after = end > inner && src[end - 1] == '-';
    const bool keep_trim = end > inner && src[end - 1] == '+';
    std::string body = src.substr(inner, end - inner - (strip_after || keep_trim ? 1 : 0));

    if (strip_before) {
      while (!text.empty() && is_ws(text.back())) text.pop_back();
    } else if ((kind == '%' || kind == '#') && !keep_lstrip) {
      // lstrip_blocks: whitespace between the start of the line and a block or comment tag goes.
      const std::size_t nl = text.rfind('\n');
      const std::size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if (l_pos > 0 || line_starting) {
        bool all_ws = l_pos < text.size();
        for (std::size_t i = l_pos; i < text.size(); ++i) all_ws = all_ws && is_ws(text[i]);
        if (all_ws) text.erase(l_pos);
      }
    }
    if (!text.empty()) out.push_back({Segment::Kind::Text, text, line_at(src, pos)});

    pos = end + 2;
    line_starting = false;
    if (kind == '%') {
      // {% raw %}...{% endraw %}: everything inside is text.
      std::size_t b = 0;
      while (b < body.size() && is_ws(body[b])) ++b;
      std::size_t e = body.size();
      while (e > b && is_ws(body[e - 1])) --e;
      if (body.substr(b, e - b) == "raw") {
        std::size_t search = pos;
        for (;;) {
          const std::size_t t = src.find("{%", search);
          if (t == std::string::npos) throw TemplateError("template syntax error on line " + std::to_string(line) + ": unclosed raw block");
          std::size_t q = t + 2;
          const bool sb = q < src.size() && src[q] == '-';
          if (sb || (q < src.size() && src[q] == '+')) ++q;
          while (q < src.size() && is_ws(src[q])) ++q;
          if (src.compare(q, 6, "endraw") == 0) {
            const std::size_t close_at = src.find("%}", q);
            if (close_at == std::string::npos) throw TemplateError("template syntax error on line " + std::to_string(line) + ": unclosed raw block");
            std::string raw = src.substr(pos, t - pos);
            if (strip_after) {
              std::size_t rb = 0;
              while (rb < raw.size() && is_ws(raw[rb])) ++rb;
              raw.erase(0, rb);
            }
            if (sb)
              while (!raw.empty() && is_ws(raw.back())) raw.pop_back();
            if (!raw.empty()) out.push_back({Segment::Kind::Text, raw, line});
            pos = close_at + 2;
            if (src[close_at - 1] == '-') {
              strip_next_text = true;
            } else if (pos < src.size() && src[pos] == '\n') {
              ++pos;
              line_starting = true;
            }
            break;
          }
          search = t + 2;
        }
        continue;
      }
    }
    if (kind == '{') out.push_back({Segment::Kind::Expr, body, line});
    if (kind == '%') out.push_back({Segment::Kind::Stmt, body, line});
    if (strip_after) {
      strip_next_text = true;
    } else if ((kind == '%' || kind == '#') && !keep_trim && pos < src.size()) {
      // trim_blocks: the first newline after a block or comment tag is removed.
      if (src[pos] == '\n') {
        ++pos;
        line_starting = true;
      } else if (src[pos] == '\r' && pos + 1 < src.size() && src[pos + 1] == '\n') {
        pos += 2;
        line_starting = true;
      }
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Statement parser.

class Parser {
 public:
  explicit Parser(std::vector<Segment> segs) : segs_(std::move(segs)) {}

  NodePtr parse() {
    std::string stop;
    NodePtr root = parse_block({}, stop);
    if (!stop.empty()) fail(last_line_, "unexpected '{% " + stop + " %}'");
    return root;
  }

 private:
  [[noreturn]] void fail(int line, const std::string& what) const {
    throw TemplateError("template syntax error on line " + std::to_string(line) + ": " + what);
  }

  static std::string first_word(const std::string& s) {
    std::size_t b = 0;
    while (b < s.size() && is_ws(s[b])) ++b;
    std::size_t e = b;
    while (e < s.size() && (is_alpha(s[e]) || s[e] == '_')) ++e;
    return s.substr(b, e - b);
  }

  // Parses nodes until a statement whose first word is in `stops`; that word is returned in `stop`
  // and the statement is left for the caller (pos_ points at it).
  NodePtr parse_block(const std::vector<std::string>& stops, std::string& stop) {
    auto block = std::make_shared<Node>();
    block->kind = Node::Kind::Block;
    while (pos_ < segs_.size()) {
      const Segment& s = segs_[pos_];
      last_line_ = s.line;
      if (s.kind == Segment::Kind::Text) {
        auto n = std::make_shared<Node>();
        n->kind = Node::Kind::Text;
        n->text = s.text;
        block->children.push_back(n);
        ++pos_;
        continue;
      }
      if (s.kind == Segment::Kind::Expr) {
        ExprParser p(tokenize_expr(s.text, s.line), s.line);
        auto n = std::make_shared<Node>();
        n->kind = Node::Kind::Output;
        n->line = s.line;
        n->expr = p.parse_expression();
        p.expect_end();
        block->children.push_back(n);
        ++pos_;
        continue;
      }
      const std::string word = first_word(s.text);
      if (std::find(stops.begin(), stops.end(), word) != stops.end()) {
        stop = word;
        return block;
      }
      block->children.push_back(parse_statement(word));
    }
    stop.clear();
    if (!stops.empty()) fail(last_line_, "missing '{% " + stops.back() + " %}' (template ended)");
    return block;
  }

  NodePtr parse_statement(const std::string& word) {
    const Segment& s = segs_[pos_];
    const int line = s.line;
    ExprParser p(tokenize_expr(s.text, line), line);
    p.skip();  // the keyword
    auto n = std::make_shared<Node>();
    n->line = line;
    std::string stop;
    if (word == "if") {
      n->kind = Node::Kind::If;
      ExprPtr cond = p.parse_expression();
      p.expect_end();
      ++pos_;
      for (;;) {
        NodePtr body = parse_block({"elif", "else", "endif"}, stop);
        n->branches.emplace_back(cond, body);
        if (stop == "elif") {
          ExprParser q(tokenize_expr(segs_[pos_].text, segs_[pos_].line), segs_[pos_].line);
          q.skip();
          cond = q.parse_expression();
          q.expect_end();
          ++pos_;
          continue;
        }
        if (stop == "else") {
          ++pos_;
          n->else_body = parse_block({"endif"}, stop);
        }
        ++pos_;  // endif
        return n;
      }
    }
    if (word == "for") {
      n->kind = Node::Kind::For;
      n->targets.push_back(p.expect_name());
      while (p.is_op(",")) {
        p.skip();
        n->targets.push_back(p.expect_name());
      }
      if (!p.is_name("in")) p.fail("expected 'in' in for loop");
      p.skip();
      n->expr = p.parse_expression(false);
      if (p.is_name("if")) {
        p.skip();
        n->filter = p.parse_expression(false);
      }
      if (p.is_name("recursive")) p.fail("recursive loops are not supported");
      p.expect_end();
      ++pos_;
      n->body = parse_block({"else", "endfor"}, stop);
      if (stop == "else") {
        ++pos_;
        n->else_body = parse_block({"endfor"}, stop);
      }
      ++pos_;
      return n;
    }
    if (word == "set") {
      const std::string first = p.expect_name();
      if (p.is_op(".")) {
        p.skip();
        n->kind = Node::Kind::Set;
        n->targets.push_back(first);
        n->attr = p.expect_name();
      } else {
        n->targets.push_back(first);
        while (p.is_op(",")) {
          p.skip();
          n->targets.push_back(p.expect_name());
        }
        if (!p.is_op("=")) {  // block set: {% set x %}...{% endset %}
          p.expect_end();
          n->kind = Node::Kind::SetBlock;
          ++pos_;
          n->body = parse_block({"endset"}, stop);
          ++pos_;
          return n;
        }
        n->kind = Node::Kind::Set;
      }
      p.expect_op("=");
      n->expr = p.parse_expression();
      p.expect_end();
      ++pos_;
      return n;
    }
    if (word == "macro") {
      n->kind = Node::Kind::Macro;
      n->targets.push_back(p.expect_name());
      p.expect_op("(");
      while (!p.is_op(")")) {
        std::string param = p.expect_name();
        ExprPtr def;
        if (p.is_op("=")) {
          p.skip();
          def = p.parse_expression();
        }
        n->params.emplace_back(param, def);
        if (!p.is_op(",")) break;
        p.skip();
      }
      p.expect_op(")");
      p.expect_end();
      ++pos_;
      n->body = parse_block({"endmacro"}, stop);
      ++pos_;
      return n;
    }
    if (word == "break" || word == "continue") {
      p.expect_end();
      n->kind = word == "break" ? Node::Kind::Break : Node::Kind::Continue;
      ++pos_;
      return n;
    }
    if (word == "generation") {  // HF's assistant-mask marker: renders its body unchanged
      ++pos_;
      NodePtr body = parse_block({"endgeneration"}, stop);
      ++pos_;
      return body;
    }
    fail(line, "unsupported statement '" + (word.empty() ? s.text : word) + "'");
  }

  std::vector<Segment> segs_;
  std::size_t pos_ = 0;
  int last_line_ = 1;
};

// ---------------------------------------------------------------------------------------------
// Interpreter.

enum class Flow { Normal, Break, Continue };

class Interpreter {
 public:
  explicit Interpreter(const Dict& globals) {
    frames_.push_back(std::make_shared<Dict>(globals));
    install_builtins(*frames_.front());
  }

  void exec(const Node& n, std::string& out) {
    const Flow f = exec_node(n, out);
    (void)f;
  }

 private:
  using Frames = std::vector<std::shared_ptr<Dict>>;

  [[noreturn]] static void fail(int line, const std::string& what) {
    throw TemplateError("template error on line " + std::to_string(line) + ": " + what);
  }

  Value lookup(const std::string& name) const {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
      if (const Value* v = (*it)->find(name)) return *v;
    }
    return Value::undefined(name);
  }

  static void install_builtins(Dict& g) {
    auto define = [&](const char* name, Function f) {
      if (!g.find(name)) g.set(name, Value::function(std::move(f)));
    };
    define("raise_exception", [](const CallArgs& a) -> Value {
      throw RaisedException(a.positional.empty() ? "raise_exception called" : a.positional[0].str());
    });
    define("range", [](const CallArgs& a) {
      std::int64_t start = 0, stop = 0, step = 1;
      auto num = [](const Value& v) { return v.kind == Value::Kind::Int ? v.i : static_cast<std::int64_t>(v.as_double()); };
      if (a.positional.size() == 1) {
        stop = num(a.positional[0]);
      } else if (a.positional.size() >= 2) {
        start = num(a.positional[0]);
        stop = num(a.positional[1]);
        if (a.positional.size() >= 3) step = num(a.positional[2]);
      }
      if (step == 0) throw TemplateError("range() step must not be zero");
      List out;
      for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        out.push_back(Value::integer(i));
        if (out.size() > 1000000) throw TemplateError("range() too large");
      }
      return Value::from_list(std::move(out));
    });
    define("namespace", [](const CallArgs& a) {
      Dict d;
      for (const auto& arg : a.positional)
        if (arg.is_dict())
          for (const auto& [k, v] : arg.dict->items()) d.set(k, v);
      for (const auto& [k, v] : a.keyword) d.set(k, v);
      Value ns = Value::from_dict(std::move(d));
      ns.is_namespace = true;
      return ns;
    });
    define("dict", [](const CallArgs& a) {
      Dict d;
      for (const auto& arg : a.positional)
        if (arg.is_dict())
          for (const auto& [k, v] : arg.dict->items()) d.set(k, v);
      for (const auto& [k, v] : a.keyword) d.set(k, v);
      return Value::from_dict(std::move(d));
    });
  }

  // Budgets that keep a hostile template (endless loops, runaway recursion, huge output) from
  // hanging or exhausting a server; real chat templates stay orders of magnitude below them.
  static constexpr std::size_t kMaxSteps = 2'000'000;
  static constexpr std::size_t kMaxOutputBytes = 64u << 20;
  static constexpr int kMaxCallDepth = 64;

  void charge(int line, const std::string& out) {
    if (++steps_ > kMaxSteps) fail(line, "template exceeded its execution budget (endless loop?)");
    if (out.size() > kMaxOutputBytes) fail(line, "template output exceeds 64 MiB");
  }

  Flow exec_node(const Node& n, std::string& out) {
    charge(n.line, out);
    switch (n.kind) {
      case Node::Kind::Block:
        for (const auto& c : n.children) {
          const Flow f = exec_node(*c, out);
          if (f != Flow::Normal) return f;
        }
        return Flow::Normal;
      case Node::Kind::Text: out += n.text; return Flow::Normal;
      case Node::Kind::Output: out += eval(*n.expr).str(); return Flow::Normal;
      case Node::Kind::If:
        for (const auto& [cond, body] : n.branches) {
          if (eval(*cond).truthy()) return exec_node(*body, out);
        }
        if (n.else_body) return exec_node(*n.else_body, out);
        return Flow::Normal;
      case Node::Kind::For: return exec_for(n, out);
      case Node::Kind::Set: {
        Value v = eval(*n.expr);
        if (!n.attr.empty()) {
          Value target = lookup(n.targets[0]);
          if (!target.is_namespace) fail(n.line, "cannot assign attribute '" + n.attr + "' on non-namespace '" + n.targets[0] + "'");
          if (contains(v, target.dict.get())) fail(n.line, "cannot store a namespace inside itself");
          target.dict->set(n.attr, std::move(v));
        } else if (n.targets.size() == 1) {
          frames_.back()->set(n.targets[0], std::move(v));
        } else {
          const List items = iterate(v, n.line);
          if (items.size() != n.targets.size()) fail(n.line, "cannot unpack " + std::to_string(items.size()) + " values");
          for (std::size_t k = 0; k < items.size(); ++k) frames_.back()->set(n.targets[k], items[k]);
        }
        return Flow::Normal;
      }
      case Node::Kind::SetBlock: {
        std::string captured;
        exec_node(*n.body, captured);
        frames_.back()->set(n.targets[0], Value::string(captured));
        return Flow::Normal;
      }
      case Node::Kind::Macro: {
        define_macro(n);
        return Flow::Normal;
      }
      case Node::Kind::Break: return Flow::Break;
      case Node::Kind::Continue: return Flow::Continue;
    }
    return Flow::Normal;
  }

  // Whether `v` holds a reference to `d` (namespaces are the only mutable values, so this is the
  // only way a template could build a reference cycle).
  static bool contains(const Value& v, const Dict* d) {
    if (v.is_dict()) {
      if (v.dict.get() == d) return true;
      for (const auto& [k, item] : v.dict->items())
        if (contains(item, d)) return true;
    } else if (v.is_list()) {
      for (const auto& item : *v.list)
        if (contains(item, d)) return true;
    }
    return false;
  }

  void define_macro(const Node& n) {
    const Node* node = &n;
    // Weak: the macro lives in a frame that the root frame may own, and a strong reference back
    // would be a cycle that is never freed.
    std::weak_ptr<Dict> weak_root = frames_.front();
    frames_.back()->set(n.targets[0], Value::function([this, node, weak_root](const CallArgs& a) {
      auto root = weak_root.lock();
      if (!root) throw TemplateError("macro called after its template finished rendering");
      auto args = std::make_shared<Dict>();
      for (std::size_t k = 0; k < node->params.size(); ++k) {
        const auto& [name, def] = node->params[k];
        if (k < a.positional.size()) {
          args->set(name, a.positional[k]);
        } else if (const Value* kw = a.kwarg(name)) {
          args->set(name, *kw);
        } else if (def) {
          args->set(name, eval(*def));
        } else {
          args->set(name, Value::undefined(name));
        }
      }
      if (depth_ >= kMaxCallDepth) fail(node->line, "macro calls nested deeper than " + std::to_string(kMaxCallDepth));
      Frames saved = std::move(frames_);
      frames_ = {root, args};
      ++depth_;
      std::string out;
      try {
        exec_node(*node->body, out);
      } catch (...) {
        --depth_;
        frames_ = std::move(saved);
        throw;
      }
      --depth_;
      frames_ = std::move(saved);
      return Value::string(out);
    }));
  }

  List iterate(const Value& v, int line) const {
    switch (v.kind) {
      case Value::Kind::List: return *v.list;
      case Value::Kind::Dict: {
        List keys;
        for (const auto& [k, val] : v.dict->items()) keys.push_back(Value::string(k));
        return keys;
      }
      case Value::Kind::String: {
        List chars;
        for (auto& cp : code_points(v.s)) chars.push_back(Value::string(cp));
        return chars;
      }
      case Value::Kind::Undefined: return {};
      default: fail(line, std::string("'") + v.type_name() + "' object is not iterable");
    }
  }

  Flow exec_for(const Node& n, std::string& out) {
    const List all = iterate(eval(*n.expr), n.line);
    frames_.push_back(std::make_shared<Dict>());
    auto bind = [&](const Value& item) {
      if (n.targets.size() == 1) {
        frames_.back()->set(n.targets[0], item);
      } else {
        const List parts = iterate(item, n.line);
        if (parts.size() != n.targets.size()) fail(n.line, "cannot unpack " + std::to_string(parts.size()) + " values into " + std::to_string(n.targets.size()));
        for (std::size_t k = 0; k < parts.size(); ++k) frames_.back()->set(n.targets[k], parts[k]);
      }
    };
    List items;
    if (n.filter) {
      for (const Value& item : all) {
        bind(item);
        if (eval(*n.filter).truthy()) items.push_back(item);
      }
    } else {
      items = all;
    }
    const std::size_t len = items.size();
    for (std::size_t k = 0; k < len; ++k) {
      bind(items[k]);
      Dict loop;
      loop.set("index", Value::integer(static_cast<std::int64_t>(k + 1)));
      loop.set("index0", Value::integer(static_cast<std::int64_t>(k)));
      loop.set("revindex", Value::integer(static_cast<std::int64_t>(len - k)));
      loop.set("revindex0", Value::integer(static_cast<std::int64_t>(len - k - 1)));
      loop.set("first", Value::boolean(k == 0));
      loop.set("last", Value::boolean(k + 1 == len));
      loop.set("length", Value::integer(static_cast<std::int64_t>(len)));
      loop.set("previtem", k > 0 ? items[k - 1] : Value::undefined("previtem"));
      loop.set("nextitem", k + 1 < len ? items[k + 1] : Value::undefined("nextitem"));
      frames_.back()->set("loop", Value::from_dict(std::move(loop)));
      const Flow f = exec_node(*n.body, out);
      if (f == Flow::Break) break;
    }
    if (len == 0 && n.else_body) exec_node(*n.else_body, out);
    frames_.pop_back();
    return Flow::Normal;
  }

  // --- expressions ---

  Value eval(const Expr& e) {
    if (++steps_ > kMaxSteps) fail(e.line, "template exceeded its execution budget (endless loop?)");
    switch (e.kind) {
      case Expr::Kind::Literal: return e.literal;
      case Expr::Kind::Name: return lookup(e.name);
      case Expr::Kind::Attr: return get_attr(eval(*e.a), e.name, e);
      case Expr::Kind::Item: return get_item(eval(*e.a), eval(*e.b), e);
      case Expr::Kind::Slice: return slice(eval(*e.a), e);
      case Expr::Kind::Call: return call(e);
      case Expr::Kind::Filter: return apply_filter(e);
      case Expr::Kind::Test: {
        const bool r = apply_test(e.name, eval(*e.a), eval_args(e), e.line);
        return Value::boolean(e.negated ? !r : r);
      }
      case Expr::Kind::Unary: {
        const Value v = eval(*e.a);
        if (v.kind == Value::Kind::Int) return Value::integer(e.name == "-" ? -v.i : v.i);
        const double d = v.as_double();
        return Value::number(e.name == "-" ? -d : d);
      }
      case Expr::Kind::Binary: return binary(e.name, eval(*e.a), eval(*e.b), e.line);
      case Expr::Kind::And: {
        Value l = eval(*e.a);
        return l.truthy() ? eval(*e.b) : l;
      }
      case Expr::Kind::Or: {
        Value l = eval(*e.a);
        return l.truthy() ? l : eval(*e.b);
      }
      case Expr::Kind::Not: return Value::boolean(!eval(*e.a).truthy());
      case Expr::Kind::Cond:
        if (eval(*e.b).truthy()) return eval(*e.a);
        return e.c ? eval(*e.c) : Value::undefined();
      case Expr::Kind::List: {
        List items;
        for (const auto& a : e.args) items.push_back(eval(*a));
        return Value::from_list(std::move(items));
      }
      case Expr::Kind::Dict: {
        Dict d;
        for (std::size_t k = 0; k + 1 < e.args.size(); k += 2) {
          const Value key = eval(*e.args[k]);
          if (!key.is_string()) fail(e.line, "only string keys are supported in dict literals");
          d.set(key.s, eval(*e.args[k + 1]));
        }
        return Value::from_dict(std::move(d));
      }
    }
    return Value::undefined();
  }

  CallArgs eval_args(const Expr& e) {
    CallArgs a;
    for (const auto& x : e.args) a.positional.push_back(eval(*x));
    for (const auto& [k, x] : e.kwargs) a.keyword.emplace_back(k, eval(*x));
    return a;
  }

  [[noreturn]] static void undefined_error(const Value& v, int line) {
    fail(line, "'" + (v.undefined_name.empty() ? std::string("value") : v.undefined_name) + "' is undefined");
  }

  static std::int64_t norm_index(std::int64_t i, std::size_t n) { return i < 0 ? i + static_cast<std::int64_t>(n) : i; }

  Value get_item(const Value& obj, const Value& key, const Expr& e) {
    if (obj.is_undefined()) undefined_error(obj, e.line);
    if (obj.is_dict()) {
      if (key.is_string()) {
        if (const Value* v = obj.dict->find(key.s)) return *v;
        return method(obj, key.s, e);
      }
      return Value::undefined();
    }
    if ((obj.is_list() || obj.is_string()) && key.kind == Value::Kind::Int) {
      if (obj.is_list()) {
        const std::int64_t i = norm_index(key.i, obj.list->size());
        if (i < 0 || i >= static_cast<std::int64_t>(obj.list->size())) return Value::undefined("item");
        return (*obj.list)[static_cast<std::size_t>(i)];
      }
      const auto cps = code_points(obj.s);
      const std::int64_t i = norm_index(key.i, cps.size());
      if (i < 0 || i >= static_cast<std::int64_t>(cps.size())) return Value::undefined("item");
      return Value::string(cps[static_cast<std::size_t>(i)]);
    }
    if (key.is_string()) return get_attr(obj, key.s, e);
    return Value::undefined();
  }

  Value get_attr(const Value& obj, const std::string& name, const Expr& e) {
    if (obj.is_undefined()) undefined_error(obj, e.line);
    if (obj.is_dict()) {
      // Python attribute lookup first: dict methods win over keys of the same name.
      static const char* const kDictMethods[] = {"items", "keys", "values", "get"};
      if (!obj.is_namespace)
        for (const char* m : kDictMethods)
          if (name == m) return method(obj, name, e);
      if (const Value* v = obj.dict->find(name)) return *v;
      return Value::undefined(name);
    }
    return method(obj, name, e);
  }

  // Bound methods of strings, dicts and lists (the ones chat templates call).
  Value method(const Value& obj, const std::string& name, const Expr& e) {
    const int line = e.line;
    if (obj.is_string()) {
      const std::string s = obj.s;
      auto str_fn = [&](std::function<Value(const CallArgs&)> f) { return Value::function(std::move(f)); };
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const bool l = name != "rstrip", r = name != "lstrip";
        return str_fn([s, l, r](const CallArgs& a) { return Value::string(py_strip(s, a.positional.empty() ? nullptr : &a.positional[0], l, r)); });
      }
      if (name == "split") {
        return str_fn([s](const CallArgs& a) {
          const Value* sep = a.positional.empty() ? a.kwarg("sep") : &a.positional[0];
          const Value* ms = a.positional.size() > 1 ? &a.positional[1] : a.kwarg("maxsplit");
          List out;
          for (auto& part : py_split(s, sep, ms ? ms->i : -1)) out.push_back(Value::string(part));
          return Value::from_list(std::move(out));
        });
      }
      if (name == "startswith" || name == "endswith") {
        const bool start = name == "startswith";
        return str_fn([s, start](const CallArgs& a) {
          if (a.positional.empty()) throw TemplateError("startswith/endswith need an argument");
          List options = a.positional[0].is_list() ? *a.positional[0].list : List{a.positional[0]};
          for (const Value& o : options) {
            const std::string p = o.str();
            if (p.size() <= s.size() && (start ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0))
              return Value::boolean(true);
          }
          return Value::boolean(false);
        });
      }
      if (name == "upper") return str_fn([s](const CallArgs&) { return Value::string(ascii_upper(s)); });
      if (name == "lower") return str_fn([s](const CallArgs&) { return Value::string(ascii_lower(s)); });
      if (name == "title") return str_fn([s](const CallArgs&) { return Value::string(title_case(s)); });
      if (name == "capitalize") {
        return str_fn([s](const CallArgs&) {
          std::string out = ascii_lower(s);
          if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = static_cast<char>(out[0] - 32);
          return Value::string(out);
        });
      }
      if (name == "replace") {
        return str_fn([s](const CallArgs& a) {
          if (a.positional.size() < 2) throw TemplateError("replace needs two arguments");
          const std::int64_t count = a.positional.size() > 2 ? a.positional[2].i : -1;
          return Value::string(replace_all(s, a.positional[0].str(), a.positional[1].str(), count));
        });
      }
      if (name == "find" || name == "count") {
        const bool find = name == "find";
        return str_fn([s, find](const CallArgs& a) {
          const std::string sub = a.positional.empty() ? "" : a.positional[0].str();
          if (find) {
            const std::size_t k = s.find(sub);
            return Value::integer(k == std::string::npos ? -1 : static_cast<std::int64_t>(code_points(s.substr(0, k)).size()));
          }
          std::int64_t n = 0;
          for (std::size_t k = 0; !sub.empty() && (k = s.find(sub, k)) != std::string::npos; k += sub.size()) ++n;
          return Value::integer(n);
        });
      }
      if (name == "join") {
        return str_fn([s](const CallArgs& a) {
          std::string out;
          if (!a.positional.empty() && a.positional[0].is_list()) {
            bool first = true;
            for (const Value& v : *a.positional[0].list) {
              if (!first) out += s;
              out += v.str();
              first = false;
            }
          }
          return Value::string(out);
        });
      }
      // Python's other str methods are missing here, which must fail loudly; any other name is no
      // attribute of a str, which Jinja2 reads as undefined (`message.content.content is defined`
      // in Mistral's templates, where content is a string).
      static const char* const kOtherStrMethods[] = {
          "casefold", "center", "encode", "expandtabs", "format", "format_map", "index", "isalnum", "isalpha",
          "isascii", "isdecimal", "isdigit", "isidentifier", "islower", "isnumeric", "isprintable", "isspace",
          "istitle", "isupper", "ljust", "maketrans", "partition", "removeprefix", "removesuffix", "rfind",
          "rindex", "rjust", "rpartition", "rsplit", "splitlines", "swapcase", "translate", "zfill"};
      for (const char* m : kOtherStrMethods)
        if (name == m) fail(line, "strings have no method '" + name + "' in this interpreter");
      return Value::undefined(name);
    }
    if (obj.is_dict()) {
      auto d = obj.dict;
      if (name == "items") {
        return Value::function([d](const CallArgs&) {
          List out;
          for (const auto& [k, v] : d->items()) out.push_back(Value::from_list({Value::string(k), v}));
          return Value::from_list(std::move(out));
        });
      }
      if (name == "keys" || name == "values") {
        const bool keys = name == "keys";
        return Value::function([d, keys](const CallArgs&) {
          List out;
          for (const auto& [k, v] : d->items()) out.push_back(keys ? Value::string(k) : v);
          return Value::from_list(std::move(out));
        });
      }
      if (name == "get") {
        return Value::function([d](const CallArgs& a) {
          if (a.positional.empty()) throw TemplateError("get needs a key");
          if (const Value* v = d->find(a.positional[0].str())) return *v;
          return a.positional.size() > 1 ? a.positional[1] : Value::none();
        });
      }
      return Value::undefined(name);
    }
    if (obj.is_none() || obj.is_list() || obj.is_number()) return Value::undefined(name);
    fail(line, std::string("'") + obj.type_name() + "' has no attribute '" + name + "'");
  }

  static std::string title_case(const std::string& s) {
    std::string out = s;
    bool prev_alpha = false;
    for (char& c : out) {
      if (is_alpha(c)) {
        c = prev_alpha ? static_cast<char>(std::tolower(static_cast<unsigned char>(c))) : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
        prev_alpha = true;
      } else {
        prev_alpha = false;
      }
    }
    return out;
  }

  Value slice(const Value& obj, const Expr& e) {
    auto opt = [&](const ExprPtr& x) -> std::optional<std::int64_t> {
      if (!x) return std::nullopt;
      const Value v = eval(*x);
      if (v.is_none()) return std::nullopt;
      if (v.kind != Value::Kind::Int) fail(e.line, "slice indices must be integers");
      return v.i;
    };
    const auto start = opt(e.b), stop = opt(e.c), step_opt = opt(e.d);
    const std::int64_t step = step_opt.value_or(1);
    if (step == 0) fail(e.line, "slice step cannot be zero");
    std::vector<Value> items;
    bool is_str = false;
    if (obj.is_list()) {
      items = *obj.list;
    } else if (obj.is_string()) {
      is_str = true;
      for (auto& cp : code_points(obj.s)) items.push_back(Value::string(cp));
    } else if (obj.is_undefined()) {
      undefined_error(obj, e.line);
    } else {
      fail(e.line, std::string("cannot slice ") + obj.type_name());
    }
    const auto n = static_cast<std::int64_t>(items.size());
    auto clamp_index = [&](std::optional<std::int64_t> v, std::int64_t def) {
      if (!v) return def;
      std::int64_t i = *v < 0 ? *v + n : *v;
      if (step > 0) return std::clamp<std::int64_t>(i, 0, n);
      return std::clamp<std::int64_t>(i, -1, n - 1);
    };
    const std::int64_t b = clamp_index(start, step > 0 ? 0 : n - 1);
    const std::int64_t en = clamp_index(stop, step > 0 ? n : -1);
    List out;
    for (std::int64_t i = b; step > 0 ? i < en : i > en; i += step) out.push_back(items[static_cast<std::size_t>(i)]);
    if (is_str) {
      std::string s;
      for (const auto& v : out) s += v.s;
      return Value::string(s);
    }
    return Value::from_list(std::move(out));
  }

  Value call(const Expr& e) {
    const Value f = eval(*e.a);
    if (f.kind != Value::Kind::Function) {
      if (f.is_undefined()) undefined_error(f, e.line);
      fail(e.line, std::string("'") + f.type_name() + "' object is not callable");
    }
    return (*f.fn)(eval_args(e));
  }

  Value binary(const std::string& op, const Value& l, const Value& r, int line) {
    if (op == "==") return Value::boolean(equals(l, r));
    if (op == "!=") return Value::boolean(!equals(l, r));
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int c;
      try {
        c = compare(l, r);
      } catch (const TemplateError& err) {
        fail(line, err.what());
      }
      return Value::boolean(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
    }
    if (op == "in" || op == "not in") {
      bool found = false;
      if (r.is_string()) {
        found = r.s.find(l.str()) != std::string::npos;
      } else if (r.is_list()) {
        for (const Value& v : *r.list)
          if (equals(v, l)) found = true;
      } else if (r.is_dict()) {
        found = l.is_string() && r.dict->find(l.s) != nullptr;
      } else if (r.is_undefined()) {
        undefined_error(r, line);
      } else {
        fail(line, std::string("argument of type '") + r.type_name() + "' is not iterable");
      }
      return Value::boolean(op == "in" ? found : !found);
    }
    if (op == "~") return Value::string(l.str() + r.str());
    if (l.is_undefined()) undefined_error(l, line);
    if (r.is_undefined()) undefined_error(r, line);
    if (op == "+") {
      if (l.is_string() && r.is_string()) return Value::string(l.s + r.s);
      if (l.is_list() && r.is_list()) {
        List out = *l.list;
        out.insert(out.end(), r.list->begin(), r.list->end());
        return Value::from_list(std::move(out));
      }
    }
    if (op == "*" && ((l.is_string() && r.kind == Value::Kind::Int) || (r.is_string() && l.kind == Value::Kind::Int))) {
      const std::string& s = l.is_string() ? l.s : r.s;
      const std::int64_t n = l.is_string() ? r.i : l.i;
      std::string out;
      for (std::int64_t k = 0; k < n && out.size() < (1u << 24); ++k) out += s;
      return Value::string(out);
    }
    if (!l.is_number() || !r.is_number()) {
      fail(line, std::string("unsupported operand types for ") + op + ": '" + l.type_name() + "' and '" + r.type_name() + "'");
    }
    const bool ints = l.kind != Value::Kind::Float && r.kind != Value::Kind::Float;
    const std::int64_t li = l.kind == Value::Kind::Bool ? l.b : l.i, ri = r.kind == Value::Kind::Bool ? r.b : r.i;
    const double ld = l.as_double(), rd = r.as_double();
    if (op == "+") return ints ? Value::integer(li + ri) : Value::number(ld + rd);
    if (op == "-") return ints ? Value::integer(li - ri) : Value::number(ld - rd);
    if (op == "*") return ints ? Value::integer(li * ri) : Value::number(ld * rd);
    if (op == "/") {
      if (rd == 0) fail(line, "division by zero");
      return Value::number(ld / rd);
    }
    if (op == "//" || op == "%") {
      if (rd == 0) fail(line, "integer division or modulo by zero");
      if (ints) {
        std::int64_t q = li / ri, m = li % ri;
        if (m != 0 && ((m < 0) != (ri < 0))) {
          --q;
          m += ri;
        }
        return Value::integer(op == "//" ? q : m);
      }
      const double q = std::floor(ld / rd);
      return Value::number(op == "//" ? q : ld - q * rd);
    }
    if (op == "**") {
      if (ints && ri >= 0) {
        std::int64_t out = 1;
        for (std::int64_t k = 0; k < ri; ++k) out *= li;
        return Value::integer(out);
      }
      return Value::number(std::pow(ld, rd));
    }
    fail(line, "unknown operator " + op);
  }

  bool apply_test(const std::string& name, const Value& v, const CallArgs& a, int line) {
    auto arg = [&](std::size_t k) -> const Value& {
      if (k >= a.positional.size()) fail(line, "test '" + name + "' needs an argument");
      return a.positional[k];
    };
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "string") return v.is_string();
    if (name == "number") return v.is_number();
    if (name == "integer") return v.kind == Value::Kind::Int;
    if (name == "float") return v.kind == Value::Kind::Float;
    if (name == "boolean") return v.kind == Value::Kind::Bool;
    if (name == "true") return v.kind == Value::Kind::Bool && v.b;
    if (name == "false") return v.kind == Value::Kind::Bool && !v.b;
    if (name == "mapping") return v.is_dict();
    if (name == "iterable") return v.is_list() || v.is_dict() || v.is_string();
    if (name == "sequence") return v.is_list() || v.is_dict() || v.is_string();
    if (name == "callable") return v.kind == Value::Kind::Function;
    if (name == "even" || name == "odd") {
      if (v.kind != Value::Kind::Int) fail(line, "test '" + name + "' needs an integer");
      return (v.i % 2 == 0) == (name == "even");
    }
    if (name == "divisibleby") {
      const Value& d = arg(0);
      if (v.kind != Value::Kind::Int || d.kind != Value::Kind::Int || d.i == 0) fail(line, "divisibleby needs non-zero integers");
      return v.i % d.i == 0;
    }
    if (name == "equalto" || name == "eq" || name == "==" || name == "sameas") return equals(v, arg(0));
    if (name == "ne" || name == "!=") return !equals(v, arg(0));
    if (name == "lt" || name == "<") return compare(v, arg(0)) < 0;
    if (name == "le" || name == "<=") return compare(v, arg(0)) <= 0;
    if (name == "gt" || name == ">") return compare(v, arg(0)) > 0;
    if (name == "ge" || name == ">=") return compare(v, arg(0)) >= 0;
    if (name == "in") return binary("in", v, arg(0), line).b;
    if (name == "lower") return v.is_string() && ascii_lower(v.s) == v.s;
    if (name == "upper") return v.is_string() && ascii_upper(v.s) == v.s;
    fail(line, "unknown test '" + name + "'");
  }

  static const Value* kw_or_pos(const CallArgs& a, const char* name, std::size_t pos) {
    if (const Value* v = a.kwarg(name)) return v;
    return pos < a.positional.size() ? &a.positional[pos] : nullptr;
  }

  // Dotted attribute lookup used by map/selectattr/sort/... (e.g. "function.name").
  Value attribute_path(const Value& v, const std::string& path, const Expr& e) {
    Value cur = v;
    for (const auto& part : split_dots(path)) {
      if (cur.is_undefined()) return cur;
      cur = get_item(cur, Value::string(part), e);
    }
    return cur;
  }
  static std::vector<std::string> split_dots(const std::string& p) {
    std::vector<std::string> out;
    std::size_t pos = 0;
    for (;;) {
      const std::size_t k = p.find('.', pos);
      out.push_back(p.substr(pos, k == std::string::npos ? std::string::npos : k - pos));
      if (k == std::string::npos) break;
      pos = k + 1;
    }
    return out;
  }

  Value apply_filter(const Expr& e) {
    const Value v = eval(*e.a);
    const CallArgs a = eval_args(e);
    return filter(e.name, v, a, e);
  }

  Value filter(const std::string& name, const Value& v, const CallArgs& a, const Expr& e) {
    const int line = e.line;
    auto need_list = [&]() -> List {
      if (v.is_undefined()) return {};
      return iterate(v, line);
    };
    if (name == "trim" || name == "strip") {
      return Value::string(py_strip(v.str(), kw_or_pos(a, "chars", 0), true, true));
    }
    if (name == "length" || name == "count") {
      if (v.is_string()) return Value::integer(static_cast<std::int64_t>(code_points(v.s).size()));
      if (v.is_list()) return Value::integer(static_cast<std::int64_t>(v.list->size()));
      if (v.is_dict()) return Value::integer(static_cast<std::int64_t>(v.dict->size()));
      if (v.is_undefined()) return Value::integer(0);
      fail(line, std::string("object of type '") + v.type_name() + "' has no len()");
    }
    if (name == "tojson") {
      const Value* ind = kw_or_pos(a, "indent", 0);
      const Value* sk = a.kwarg("sort_keys");
      return Value::string(v.to_json(ind && ind->kind == Value::Kind::Int ? static_cast<int>(ind->i) : -1, sk && sk->truthy()));
    }
    if (name == "string") return Value::string(v.str());
    if (name == "upper") return Value::string(ascii_upper(v.str()));
    if (name == "lower") return Value::string(ascii_lower(v.str()));
    if (name == "title") return Value::string(title_case(v.str()));
    if (name == "capitalize") return method(Value::string(v.str()), "capitalize", e).fn->operator()({});
    if (name == "replace") {
      CallArgs ra;
      ra.positional = a.positional;
      return method(Value::string(v.str()), "replace", e).fn->operator()(ra);
    }
    if (name == "default" || name == "d") {
      const Value* def = kw_or_pos(a, "default_value", 0);
      const Value* boolean = kw_or_pos(a, "boolean", 1);
      const bool use_default = v.is_undefined() || (boolean && boolean->truthy() && !v.truthy());
      return use_default ? (def ? *def : Value::string("")) : v;
    }
    if (name == "join") {
      const Value* sep = kw_or_pos(a, "d", 0);
      const Value* attr = a.kwarg("attribute");
      std::string out;
      bool first = true;
      for (const Value& item : need_list()) {
        if (!first && sep) out += sep->str();
        out += (attr ? attribute_path(item, attr->str(), e) : item).str();
        first = false;
      }
      return Value::string(out);
    }
    if (name == "items") {
      if (v.is_undefined()) return Value::from_list({});
      if (!v.is_dict()) fail(line, "items filter needs a mapping");
      return method(v, "items", e).fn->operator()({});
    }
    if (name == "list") return Value::from_list(need_list());
    if (name == "first" || name == "last") {
      const List items = need_list();
      if (items.empty()) return Value::undefined(name);
      return name == "first" ? items.front() : items.back();
    }
    if (name == "reverse") {
      if (v.is_string()) {
        auto cps = code_points(v.s);
        std::string out;
        for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
        return Value::string(out);
      }
      List items = need_list();
      std::reverse(items.begin(), items.end());
      return Value::from_list(std::move(items));
    }
    if (name == "unique") {
      List out;
      for (const Value& item : need_list()) {
        bool seen = false;
        for (const Value& o : out)
          if (equals(o, item)) seen = true;
        if (!seen) out.push_back(item);
      }
      return Value::from_list(std::move(out));
    }
    if (name == "sort") {
      List items = need_list();
      const Value* rev = kw_or_pos(a, "reverse", 0);
      const Value* attr = a.kwarg("attribute");
      std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
        const Value kx = attr ? attribute_path(x, attr->str(), e) : x, ky = attr ? attribute_path(y, attr->str(), e) : y;
        return compare(kx, ky) < 0;
      });
      if (rev && rev->truthy()) std::reverse(items.begin(), items.end());
      return Value::from_list(std::move(items));
    }
    if (name == "dictsort") {
      if (!v.is_dict()) fail(line, "dictsort needs a mapping");
      List items = *method(v, "items", e).fn->operator()({}).list;
      std::stable_sort(items.begin(), items.end(), [](const Value& x, const Value& y) { return (*x.list)[0].s < (*y.list)[0].s; });
      return Value::from_list(std::move(items));
    }
    if (name == "map") {
      List out;
      const Value* attr = a.kwarg("attribute");
      if (attr) {
        const Value* def = a.kwarg("default");
        for (const Value& item : need_list()) {
          Value r = attribute_path(item, attr->str(), e);
          out.push_back(r.is_undefined() && def ? *def : r);
        }
      } else {
        if (a.positional.empty()) fail(line, "map needs a filter name or attribute=");
        CallArgs rest;
        rest.positional.assign(a.positional.begin() + 1, a.positional.end());
        rest.keyword = a.keyword;
        for (const Value& item : need_list()) out.push_back(filter(a.positional[0].str(), item, rest, e));
      }
      return Value::from_list(std::move(out));
    }
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
      const bool by_attr = name == "selectattr" || name == "rejectattr";
      const bool keep_if = name == "select" || name == "selectattr";
      List out;
      std::size_t first_arg = 0;
      std::string attr;
      if (by_attr) {
        if (a.positional.empty()) fail(line, name + " needs an attribute name");
        attr = a.positional[0].str();
        first_arg = 1;
      }
      std::string test;
      CallArgs test_args;
      if (a.positional.size() > first_arg) {
        test = a.positional[first_arg].str();
        test_args.positional.assign(a.positional.begin() + static_cast<long>(first_arg) + 1, a.positional.end());
      }
      for (const Value& item : need_list()) {
        const Value subject = by_attr ? attribute_path(item, attr, e) : item;
        const bool r = test.empty() ? subject.truthy() : apply_test(test, subject, test_args, line);
        if (r == keep_if) out.push_back(item);
      }
      return Value::from_list(std::move(out));
    }
    if (name == "int") {
      if (v.kind == Value::Kind::Int) return v;
      if (v.kind == Value::Kind::Float) return Value::integer(static_cast<std::int64_t>(v.f));
      if (v.kind == Value::Kind::Bool) return Value::integer(v.b);
      if (v.is_string()) {
        char* end = nullptr;
        const long long r = std::strtoll(v.s.c_str(), &end, 10);
        if (end && *end == '\0' && !v.s.empty()) return Value::integer(r);
      }
      const Value* def = kw_or_pos(a, "default", 0);
      return def ? *def : Value::integer(0);
    }
    if (name == "float") {
      if (v.is_number()) return Value::number(v.as_double());
      if (v.is_string()) {
        char* end = nullptr;
        const double r = std::strtod(v.s.c_str(), &end);
        if (end && *end == '\0' && !v.s.empty()) return Value::number(r);
      }
      const Value* def = kw_or_pos(a, "default", 0);
      return def ? *def : Value::number(0.0);
    }
    if (name == "abs") {
      if (v.kind == Value::Kind::Int) return Value::integer(v.i < 0 ? -v.i : v.i);
      return Value::number(std::fabs(v.as_double()));
    }
    if (name == "round") {
      const Value* prec = kw_or_pos(a, "precision", 0);
      const double p = std::pow(10.0, prec ? prec->as_double() : 0.0);
      return Value::number(std::round(v.as_double() * p) / p);
    }
    if (name == "sum" || name == "min" || name == "max") {
      const List items = need_list();
      const Value* attr = a.kwarg("attribute");
      if (name == "sum") {
        Value total = a.kwarg("start") ? *a.kwarg("start") : Value::integer(0);
        for (const Value& item : items) total = binary("+", total, attr ? attribute_path(item, attr->str(), e) : item, line);
        return total;
      }
      if (items.empty()) return Value::undefined(name);
      Value best = items[0];
      for (const Value& item : items) {
        const int c = compare(item, best);
        if ((name == "min" && c < 0) || (name == "max" && c > 0)) best = item;
      }
      return best;
    }
    if (name == "safe") return v;
    if (name == "e" || name == "escape") {
      std::string out;
      for (char c : v.str()) {
        switch (c) {
          case '&': out += "&amp;"; break;
          case '<': out += "&lt;"; break;
          case '>': out += "&gt;"; break;
          case '"': out += "&#34;"; break;
          case '\'': out += "&#39;"; break;
          default: out += c;
        }
      }
      return Value::string(out);
    }
    if (name == "indent") {
      const Value* width = kw_or_pos(a, "width", 0);
      const Value* first = kw_or_pos(a, "first", 1);
      const Value* blank = kw_or_pos(a, "blank", 2);
      const std::string pad = width && width->is_string() ? width->s : std::string(static_cast<std::size_t>(width ? width->i : 4), ' ');
      const std::string s = v.str();
      std::string out;
      std::size_t pos = 0;
      bool first_line = true;
      while (pos <= s.size()) {
        const std::size_t k = s.find('\n', pos);
        const std::string ln = s.substr(pos, k == std::string::npos ? std::string::npos : k - pos);
        const bool indent_it = first_line ? (first && first->truthy()) : (!ln.empty() || (blank && blank->truthy()));
        if (indent_it) out += pad;
        out += ln;
        if (k == std::string::npos) break;
        out += '\n';
        pos = k + 1;
        first_line = false;
      }
      return Value::string(out);
    }
    if (name == "wordcount") return Value::integer(static_cast<std::int64_t>(py_split(v.str(), nullptr, -1).size()));
    fail(line, "unknown filter '" + name + "'");
  }

  Frames frames_;
  std::size_t steps_ = 0;
  int depth_ = 0;
};

}  // namespace

Template::Template(const std::string& source) : root_(Parser(split_segments(source)).parse()) {}

Template::~Template() = default;

std::string Template::render(const Dict& globals) const {
  Interpreter interp(globals);
  std::string out;
  interp.exec(*root_, out);
  return out;
}

}  // namespace promptly::jinja
