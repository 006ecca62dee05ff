#include "grammar/json_schema.h"

#include "grammar/dfa.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <vector>

namespace promptly::grammar {

using json = nlohmann::ordered_json;

namespace {

constexpr int kMaxDepth = 64;

const char* kBaseRules[][2] = {
    {"ws", "( \" \" | \"\\n\" [ \\t]{0,20} )?"},
    {"json-char", "[^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} )"},
    {"json-string", "\"\\\"\" json-char* \"\\\"\""},
    {"json-int", "\"-\"? ( \"0\" | [1-9] [0-9]{0,14} )"},
    {"json-number", "json-int ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?"},
    {"json-bool", "\"true\" | \"false\""},
    {"json-null", "\"null\""},
    {"json-value", "json-object | json-array | json-string | json-number | json-bool | json-null"},
    {"json-object", "\"{\" ws ( json-string ws \":\" ws json-value ws ( \",\" ws json-string ws \":\" ws json-value ws )* )? \"}\""},
    {"json-array", "\"[\" ws ( json-value ws ( \",\" ws json-value ws )* )? \"]\""},
};

const std::set<std::string> kAnnotations = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                            "deprecated", "readOnly", "writeOnly", "strict", "name", "$defs", "definitions",
                                            "contentMediaType", "contentEncoding"};

const std::set<std::string> kSupported = {"type", "properties", "required", "additionalProperties", "enum", "const",
                                          "items", "prefixItems", "minItems", "maxItems", "anyOf", "oneOf", "allOf",
                                          "$ref", "nullable", "minLength", "maxLength", "pattern", "format",
                                          "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};

std::string digits_class(char a, char b) {
  if (a == b) return std::string("\"") + a + "\"";
  return std::string("[") + a + "-" + b + "]";
}

// Same-width decimal strings a <= b (leading zeros allowed): every string between them.
std::string fixed_width_range(const std::string& a, const std::string& b) {
  if (a.size() == 1) return digits_class(a[0], b[0]);
  const std::string ra = a.substr(1), rb = b.substr(1);
  if (ra.find_first_not_of('0') == std::string::npos && rb.find_first_not_of('9') == std::string::npos)
    return digits_class(a[0], b[0]) + " [0-9]{" + std::to_string(ra.size()) + "}";
  if (a[0] == b[0]) return digits_class(a[0], a[0]) + " " + fixed_width_range(ra, rb);
  const std::string nines(ra.size(), '9'), zeros(ra.size(), '0');
  std::vector<std::string> parts;
  parts.push_back(digits_class(a[0], a[0]) + " " + fixed_width_range(ra, nines));
  if (b[0] - a[0] > 1)
    parts.push_back(digits_class(static_cast<char>(a[0] + 1), static_cast<char>(b[0] - 1)) + " [0-9]{" + std::to_string(ra.size()) + "}");
  parts.push_back(digits_class(b[0], b[0]) + " " + fixed_width_range(zeros, rb));
  std::string out = "(";
  for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? " | " : " ") + parts[i];
  return out + " )";
}

std::string nonnegative_range(unsigned long long lo, unsigned long long hi) {
  std::vector<std::string> parts;
  unsigned long long pow = 1;
  for (int width = 1; width <= 19 && lo <= hi; ++width, pow *= 10) {
    const unsigned long long first = width == 1 ? 0 : pow, last = pow * 10 - 1;
    if (hi < first) break;
    if (lo > last) continue;
    const unsigned long long a = std::max(lo, first), b = std::min(hi, last);
    parts.push_back(fixed_width_range(std::to_string(a), std::to_string(b)));
  }
  if (parts.empty()) return "";
  std::string out = "(";
  for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? " | " : " ") + parts[i];
  return out + " )";
}

// A pattern (the regex subset documented in README) as a GBNF expression over the characters of
// a JSON string's content: literal '"' and '\' are matched in their escaped forms.
class PatternTranslator {
 public:
  explicit PatternTranslator(const std::string& p) : p_(p) {}

  std::string translate() {
    bool anchored_start = !p_.empty() && p_[0] == '^';
    if (anchored_start) ++pos_;
    std::string body = alternation();
    bool anchored_end = false;
    if (pos_ < p_.size() && p_[pos_] == '$') { anchored_end = true; ++pos_; }
    if (pos_ != p_.size()) fail("unexpected '" + std::string(1, p_[pos_]) + "'");
    return std::string(anchored_start ? "" : "json-char* ") + "( " + body + " )" + (anchored_end ? "" : " json-char*");
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw SchemaError("pattern", "pattern '" + p_ + "' is outside the supported regex subset: " + why);
  }

  std::string alternation() {
    std::vector<std::string> alts{sequence()};
    while (pos_ < p_.size() && p_[pos_] == '|') { ++pos_; alts.push_back(sequence()); }
    std::string out;
    for (std::size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
    return out;
  }

  std::string sequence() {
    std::string out;
    while (pos_ < p_.size() && p_[pos_] != '|' && p_[pos_] != ')' && p_[pos_] != '$') {
      std::string atom_text = atom();
      atom_text = quantifier(atom_text);
      out += (out.empty() ? "" : " ") + atom_text;
    }
    return out.empty() ? "\"\"" : out;
  }

  std::string quantifier(const std::string& atom_text) {
    if (pos_ >= p_.size()) return atom_text;
    char c = p_[pos_];
    std::string q;
    if (c == '*' || c == '+' || c == '?') { q = std::string(1, c); ++pos_; }
    else if (c == '{') {
      std::size_t close = p_.find('}', pos_);
      if (close == std::string::npos) fail("unclosed '{'");
      q = p_.substr(pos_, close - pos_ + 1);
      for (char d : q.substr(1, q.size() - 2))
        if (!std::isdigit(static_cast<unsigned char>(d)) && d != ',') fail("bad repetition " + q);
      pos_ = close + 1;
    } else {
      return atom_text;
    }
    if (pos_ < p_.size() && (p_[pos_] == '?' || p_[pos_] == '+')) fail("lazy or possessive quantifiers");
    return "( " + atom_text + " )" + q;
  }

  static std::string char_literal(std::uint32_t cp) {
    if (cp == '"') return "\"\\\\\\\"\"";    // the two characters \"
    if (cp == '\\') return "\"\\\\\\\\\"";   // the two characters \\ .
    if (cp < 0x20) {
      static const char* hex = "0123456789abcdef";
      std::string esc = "\\\\u00";
      esc += hex[cp >> 4];
      esc += hex[cp & 15];
      return "\"" + esc + "\"";
    }
    std::string s;
    append_utf8(s, cp);
    return GbnfBuilder::literal(s);
  }

  std::uint32_t read_cp() {
    unsigned char c = static_cast<unsigned char>(p_[pos_]);
    int len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    std::uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    ++pos_;
    for (int i = 1; i < len && pos_ < p_.size(); ++i) cp = (cp << 6) | (static_cast<unsigned char>(p_[pos_++]) & 0x3F);
    return cp;
  }

  // A class escape (\d \w \s and their negations) as a GBNF class body, or "" if not one.
  static std::string class_escape(char e) {
    switch (e) {
      case 'd': return "0-9";
      case 'w': return "a-zA-Z0-9_";
      case 's': return " \\t\\n\\r";
      default: return "";
    }
  }

  static std::string class_char(std::uint32_t cp) {
    if (cp == ']' || cp == '\\' || cp == '^' || cp == '-' || cp == '"') return std::string("\\") + static_cast<char>(cp);
    if (cp < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", cp);
      return buf;
    }
    std::string s;
    append_utf8(s, cp);
    return s;
  }

  std::string atom() {
    char c = p_[pos_];
    if (c == '(') {
      ++pos_;
      if (p_.compare(pos_, 2, "?:") == 0) pos_ += 2;
      else if (pos_ < p_.size() && p_[pos_] == '?') fail("lookaround or named groups");
      std::string inner = alternation();
      if (pos_ >= p_.size() || p_[pos_] != ')') fail("unclosed '('");
      ++pos_;
      return "( " + inner + " )";
    }
    if (c == '.') { ++pos_; return "json-char"; }
    if (c == '[') return char_class();
    if (c == '\\') {
      ++pos_;
      if (pos_ >= p_.size()) fail("trailing backslash");
      char e = p_[pos_++];
      std::string cls = class_escape(e);
      if (!cls.empty()) return "[" + cls + "]";
      if (e == 'D' || e == 'W' || e == 'S') {
        std::string neg = class_escape(static_cast<char>(std::tolower(e)));
        return "( [^" + neg + "\"\\\\\\x00-\\x1F] )";
      }
      if (e == 'n') return char_literal('\n');
      if (e == 't') return char_literal('\t');
      if (e == 'r') return char_literal('\r');
      if (std::isalnum(static_cast<unsigned char>(e))) fail(std::string("escape \\") + e);
      return char_literal(static_cast<unsigned char>(e));
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') fail("quantifier without an atom");
    return char_literal(read_cp());
  }

  std::string char_class() {
    ++pos_;  // [
    bool negated = false;
    if (pos_ < p_.size() && p_[pos_] == '^') { negated = true; ++pos_; }
    std::string body;
    bool has_quote = false, has_backslash = false;
    bool first = true;
    while (pos_ < p_.size() && (p_[pos_] != ']' || first)) {
      first = false;
      std::uint32_t lo;
      if (p_[pos_] == '\\') {
        ++pos_;
        if (pos_ >= p_.size()) fail("unclosed '['");
        char e = p_[pos_++];
        std::string cls = class_escape(e);
        if (!cls.empty()) { body += cls; continue; }
        if (std::isalnum(static_cast<unsigned char>(e)) && e != 'n' && e != 't' && e != 'r') fail(std::string("escape \\") + e + " in a class");
        lo = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : static_cast<unsigned char>(e);
      } else {
        lo = read_cp();
      }
      std::uint32_t hi = lo;
      if (pos_ + 1 < p_.size() && p_[pos_] == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        if (p_[pos_] == '\\') { ++pos_; if (pos_ >= p_.size()) fail("unclosed '['"); hi = static_cast<unsigned char>(p_[pos_++]); }
        else hi = read_cp();
        if (hi < lo) fail("range out of order");
      }
      if (lo <= '"' && '"' <= hi) has_quote = true;
      if (lo <= '\\' && '\\' <= hi) has_backslash = true;
      body += class_char(lo);
      if (hi != lo) body += "-" + class_char(hi);
    }
    if (pos_ >= p_.size()) fail("unclosed '['");
    ++pos_;
    if (negated) return "[^" + body + "\"\\\\\\x00-\\x1F]";
    // The class itself never matches raw '"', '\' or control characters; their escapes are added.
    std::string out = "( [" + body + "]";
    if (has_quote) out += " | " + char_literal('"');
    if (has_backslash) out += " | " + char_literal('\\');
    return out + " )";
  }

  const std::string& p_;
  std::size_t pos_ = 0;
};

const char* kFormats[][2] = {
    // Days by month (February to the 28th: leap days need the year, which a regular grammar can
    // only check at great length).
    {"date", "[0-9]{4} \"-\" ( ( \"0\" [13578] | \"1\" [02] ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"3\" [01] ) | ( \"0\" [469] | \"11\" ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"30\" ) | \"02-\" ( \"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8] ) )"},
    {"time", "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,9} )? ( \"Z\" | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )"},
    {"uuid", "[0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12}"},
    // A conservative subset of RFC 5321: dot-separated atoms, then labels that neither start nor end with '-'.
    {"email", "[a-zA-Z0-9_%+-]{1,32} ( \".\" [a-zA-Z0-9_%+-]{1,32} ){0,3} \"@\" ( [a-zA-Z0-9] ( [a-zA-Z0-9-]{0,30} [a-zA-Z0-9] )? \".\" ){1,4} [a-zA-Z] ( [a-zA-Z0-9-]{0,30} [a-zA-Z0-9] )?"},
};

// A non-negative count keyword (minItems, maxLength, ...), or `fallback` when absent.
long long count(const json& schema, const char* key, long long fallback) {
  auto it = schema.find(key);
  if (it == schema.end()) return fallback;
  if (!it->is_number_unsigned() && !(it->is_number_integer() && it->get<long long>() >= 0))
    throw SchemaError(key, std::string(key) + " must be a non-negative integer");
  return it->get<std::uint64_t>() > 1000000 ? 1000000 : static_cast<long long>(it->get<std::uint64_t>());
}

}  // namespace

std::string integer_range_gbnf(long long lo, long long hi) {
  std::vector<std::string> parts;
  if (lo < 0) {
    unsigned long long a = hi < 0 ? static_cast<unsigned long long>(-(hi + 1)) + 1 : 1;
    unsigned long long b = static_cast<unsigned long long>(-(lo + 1)) + 1;
    if (a <= b) parts.push_back("\"-\" " + nonnegative_range(a, b));
  }
  if (hi >= 0) parts.push_back(nonnegative_range(static_cast<unsigned long long>(std::max(lo, 0LL)), static_cast<unsigned long long>(hi)));
  if (parts.empty()) throw SchemaError("minimum", "the integer bounds leave no value");
  std::string out = "(";
  for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? " | " : " ") + parts[i];
  return out + " )";
}

GbnfBuilder::GbnfBuilder() {
  for (const auto& r : kBaseRules) {
    rules_[r[0]] = r[1];
    order_.push_back(r[0]);
  }
}

std::string GbnfBuilder::literal(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20) { char buf[8]; std::snprintf(buf, sizeof buf, "\\x%02X", c); out += buf; }
    else out += static_cast<char>(c);
  }
  return out + "\"";
}

std::string GbnfBuilder::unique_name(const std::string& hint) {
  std::string base;
  for (char c : hint) base += (std::isalnum(static_cast<unsigned char>(c)) ? c : '-');
  if (base.empty()) base = "r";
  std::string name = base;
  for (int i = 2; rules_.count(name) || name == "root"; ++i) name = base + "-" + std::to_string(i);
  return name;
}

std::string GbnfBuilder::add_rule(const std::string& name_hint, const std::string& body) {
  std::string name = unique_name(name_hint);
  rules_[name] = body;
  order_.push_back(name);
  return name;
}

std::string GbnfBuilder::grammar(const std::string& root_body) const {
  std::string out = "root ::= " + root_body + "\n";
  for (const auto& name : order_) out += name + " ::= " + rules_.at(name) + "\n";
  return out;
}

std::string GbnfBuilder::add_schema(const json& schema, const std::string& name_hint) {
  root_schema_ = &schema;
  ref_names_.clear();
  return visit(schema, name_hint, 0);
}

std::string GbnfBuilder::ref_rule(const std::string& ref, int depth) {
  auto it = ref_names_.find(ref);
  if (it != ref_names_.end()) return it->second;
  const json* target = nullptr;
  if (ref == "#") {
    target = root_schema_;
  } else if (ref.rfind("#/", 0) == 0) {
    try {
      target = &root_schema_->at(json::json_pointer(ref.substr(1)));
    } catch (const std::exception&) {
      target = nullptr;
    }
  }
  if (!target) throw SchemaError("$ref", "$ref '" + ref + "' does not resolve inside the schema (only local #/... references are supported)");
  // Name first so that recursive references find it.
  std::string name = unique_name("ref-" + ref.substr(ref.rfind('/') == std::string::npos ? 0 : ref.rfind('/') + 1));
  rules_[name] = "\"\"";
  order_.push_back(name);
  ref_names_[ref] = name;
  rules_[name] = visit(*target, name, depth + 1);
  return name;
}

std::string GbnfBuilder::visit(const json& schema, const std::string& name, int depth) {
  if (depth > kMaxDepth) throw SchemaError("$ref", "schema nests deeper than " + std::to_string(kMaxDepth) + " levels");
  if (schema.is_boolean()) {
    if (schema.get<bool>()) return "json-value";
    throw SchemaError("false", "schema 'false' accepts no value");
  }
  if (!schema.is_object()) throw SchemaError("schema", "a schema must be an object or a boolean");
  for (auto it = schema.begin(); it != schema.end(); ++it)
    if (!kSupported.count(it.key()) && !kAnnotations.count(it.key()))
      throw SchemaError(it.key(), "JSON Schema keyword '" + it.key() + "' is not supported");

  if (schema.contains("nullable") && schema["nullable"].is_boolean() && schema["nullable"].get<bool>()) {
    json inner = schema;
    inner.erase("nullable");
    return "( " + visit(inner, name, depth + 1) + " | json-null )";
  }
  if (schema.contains("$ref")) {
    if (!schema["$ref"].is_string()) throw SchemaError("$ref", "$ref must be a string");
    return ref_rule(schema["$ref"].get<std::string>(), depth);
  }
  if (schema.contains("const")) return literal(schema["const"].dump());
  if (schema.contains("enum")) {
    const json& values = schema["enum"];
    if (!values.is_array() || values.empty()) throw SchemaError("enum", "enum must be a non-empty array");
    std::string out = "(";
    for (std::size_t i = 0; i < values.size(); ++i) out += (i ? " | " : " ") + literal(values[i].dump());
    return out + " )";
  }
  for (const char* key : {"anyOf", "oneOf"})
    if (schema.contains(key)) {
      const json& options = schema[key];
      if (!options.is_array() || options.empty()) throw SchemaError(key, std::string(key) + " must be a non-empty array");
      std::string out = "(";
      for (std::size_t i = 0; i < options.size(); ++i) {
        json option = options[i];
        // A sibling "type" applies to every option; other siblings would mean allOf(siblings, anyOf).
        for (auto it = schema.begin(); it != schema.end(); ++it)
          if (it.key() != key && it.key() != "type" && !kAnnotations.count(it.key()))
            throw SchemaError(it.key(), "'" + it.key() + "' beside " + key + " is not supported: move it into each option");
        if (option.is_object() && schema.contains("type") && !option.contains("type")) option["type"] = schema["type"];
        out += (i ? " | " : " ") + add_rule(name + "-" + std::to_string(i), visit(option, name + "-" + std::to_string(i), depth + 1));
      }
      return out + " )";
    }
  if (schema.contains("allOf")) {
    const json& parts = schema["allOf"];
    if (!parts.is_array() || parts.size() != 1)
      throw SchemaError("allOf", "allOf is supported with exactly one schema");
    return visit(parts[0], name, depth + 1);
  }

  std::vector<std::string> types;
  if (schema.contains("type")) {
    const json& t = schema["type"];
    if (t.is_string()) types.push_back(t.get<std::string>());
    else if (t.is_array()) for (const auto& x : t) { if (!x.is_string()) throw SchemaError("type", "type must be a string or an array of strings"); types.push_back(x.get<std::string>()); }
    else throw SchemaError("type", "type must be a string or an array of strings");
  } else {
    // Infer from the keywords present; nothing at all means any value.
    if (schema.contains("properties") || schema.contains("additionalProperties")) types.push_back("object");
    else if (schema.contains("items") || schema.contains("prefixItems")) types.push_back("array");
    else if (schema.contains("minLength") || schema.contains("maxLength") || schema.contains("pattern") || schema.contains("format")) types.push_back("string");
    else if (schema.contains("minimum") || schema.contains("maximum")) types.push_back("number");
    else return "json-value";
  }
  std::vector<std::string> alternatives;
  for (const auto& t : types) {
    if (t == "object") alternatives.push_back(object_rule(schema, name, depth));
    else if (t == "array") alternatives.push_back(array_rule(schema, name, depth));
    else if (t == "string") alternatives.push_back(string_rule(schema, name));
    else if (t == "integer") alternatives.push_back(integer_rule(schema, name));
    else if (t == "number") alternatives.push_back(number_rule(schema, name));
    else if (t == "boolean") alternatives.push_back("json-bool");
    else if (t == "null") alternatives.push_back("json-null");
    else throw SchemaError("type", "unknown type '" + t + "'");
  }
  if (alternatives.size() == 1) return alternatives.front();
  std::string out = "(";
  for (std::size_t i = 0; i < alternatives.size(); ++i) out += (i ? " | " : " ") + alternatives[i];
  return out + " )";
}

std::string GbnfBuilder::object_rule(const json& schema, const std::string& name, int depth) {
  std::vector<std::pair<std::string, std::string>> props;  // key -> value rule
  std::set<std::string> required;
  if (schema.contains("required")) {
    if (!schema["required"].is_array()) throw SchemaError("required", "required must be an array of names");
    for (const auto& r : schema["required"]) {
      if (!r.is_string()) throw SchemaError("required", "required must be an array of names");
      required.insert(r.get<std::string>());
    }
  }
  if (schema.contains("properties")) {
    if (!schema["properties"].is_object()) throw SchemaError("properties", "properties must be an object");
    for (auto it = schema["properties"].begin(); it != schema["properties"].end(); ++it) {
      std::string rule = add_rule(name + "-" + it.key(), visit(it.value(), name + "-" + it.key(), depth + 1));
      props.push_back({it.key(), rule});
    }
  }
  for (const auto& r : required)
    if (std::none_of(props.begin(), props.end(), [&](const auto& p) { return p.first == r; }))
      throw SchemaError("required", "required property '" + r + "' is not in properties");
  std::string extra;  // rule for one additional "key": value pair, or empty
  if (schema.contains("additionalProperties")) {
    const json& ap = schema["additionalProperties"];
    if (!(ap.is_boolean() && !ap.get<bool>())) {
      std::string value = ap.is_boolean() ? std::string("json-value") : add_rule(name + "-additional", visit(ap, name + "-additional", depth + 1));
      extra = add_rule(name + "-additional-kv", "json-string ws \":\" ws " + value);
    }
  } else if (props.empty()) {
    return "json-object";
  }
  // tail(k, first): the properties from k on; `first` means no property was written yet.
  std::vector<std::array<std::string, 2>> tail(props.size() + 1);
  const std::string extra_tail_first = extra.empty() ? "\"\"" : "( " + extra + " ( ws \",\" ws " + extra + " )* )?";
  const std::string extra_tail_rest = extra.empty() ? "\"\"" : "( ws \",\" ws " + extra + " )*";
  tail[props.size()] = {add_rule(name + "-end", extra_tail_rest), add_rule(name + "-end-first", extra_tail_first)};
  for (std::size_t k = props.size(); k-- > 0;) {
    const std::string kv = literal(json(props[k].first).dump()) + " ws \":\" ws " + props[k].second;
    for (int first = 0; first < 2; ++first) {
      std::string here = std::string(first ? "" : "ws \",\" ws ") + kv + " " + tail[k + 1][0];
      std::string body = required.count(props[k].first) ? here : here + " | " + tail[k + 1][static_cast<std::size_t>(first)];
      tail[k][static_cast<std::size_t>(first)] = add_rule(name + "-p" + std::to_string(k) + (first ? "-first" : ""), body);
    }
  }
  return "\"{\" ws " + tail[0][1] + " ws \"}\"";
}

std::string GbnfBuilder::array_rule(const json& schema, const std::string& name, int depth) {
  std::vector<std::string> prefix;
  if (schema.contains("prefixItems")) {
    if (!schema["prefixItems"].is_array()) throw SchemaError("prefixItems", "prefixItems must be an array of schemas");
    for (std::size_t i = 0; i < schema["prefixItems"].size(); ++i)
      prefix.push_back(add_rule(name + "-item" + std::to_string(i), visit(schema["prefixItems"][i], name + "-item" + std::to_string(i), depth + 1)));
  }
  std::string item = "json-value";
  bool items_allowed = true;
  if (schema.contains("items")) {
    const json& it = schema["items"];
    if (it.is_boolean() && !it.get<bool>()) items_allowed = false;
    else if (it.is_array()) throw SchemaError("items", "items as an array (draft 4 tuples) is not supported: use prefixItems");
    else item = add_rule(name + "-item", visit(it, name + "-item", depth + 1));
  } else if (!prefix.empty()) {
    items_allowed = false;  // a tuple: nothing after the prefix unless items says so
  }
  long long min_items = count(schema, "minItems", 0), max_items = count(schema, "maxItems", -1);
  if (min_items < 0 || (max_items >= 0 && max_items < min_items)) throw SchemaError("maxItems", "minItems/maxItems leave no length");
  if (max_items > 10000 || min_items > 10000) throw SchemaError("maxItems", "minItems/maxItems above 10000 are not supported");
  // Elements in order: the prefix, then `item` repeated.
  std::vector<std::string> elems;
  const long long total_cap = items_allowed ? max_items : static_cast<long long>(prefix.size());
  const long long needed = std::max<long long>(min_items, 0);
  if (!items_allowed && needed > static_cast<long long>(prefix.size())) throw SchemaError("minItems", "minItems exceeds the tuple's length");
  // Build from the end: rest(i) after i elements written (i >= 1).
  auto element_at = [&](long long i) { return i < static_cast<long long>(prefix.size()) ? prefix[static_cast<std::size_t>(i)] : item; };
  // Past the prefix and the minimum, a loop (bounded by maxItems) takes over.
  const long long fixed = std::max<long long>(static_cast<long long>(prefix.size()), needed);
  std::string after_fixed;
  if (total_cap >= 0 && total_cap <= fixed) {
    after_fixed = "\"\"";
  } else if (total_cap < 0) {
    after_fixed = "( ws \",\" ws " + item + " )*";
  } else {
    after_fixed = "( ws \",\" ws " + item + " ){0," + std::to_string(total_cap - fixed) + "}";
  }
  std::string chain = after_fixed;
  for (long long i = fixed; i-- > 0;) {
    std::string here = (i ? "ws \",\" ws " : "") + element_at(i) + " " + chain;
    // Elements beyond the minimum (prefix tuples) may be left out: the array may end here.
    if (i >= needed) here = "( " + here + " )?";
    chain = add_rule(name + "-at" + std::to_string(i), here);
  }
  if (fixed == 0) {
    if (total_cap == 0) return "\"[\" ws \"]\"";
    std::string rest = total_cap < 0 ? "( ws \",\" ws " + item + " )*" : "( ws \",\" ws " + item + " ){0," + std::to_string(total_cap - 1) + "}";
    return "\"[\" ws ( " + item + " " + rest + " )? ws \"]\"";
  }
  return "\"[\" ws " + chain + " ws \"]\"";
}

std::string GbnfBuilder::string_rule(const json& schema, const std::string& name) {
  if (schema.contains("format")) {
    const std::string f = schema["format"].is_string() ? schema["format"].get<std::string>() : "";
    if (f == "date-time") return "\"\\\"\" " + add_rule("format-date", kFormats[0][1]) + " \"T\" " + add_rule("format-time", kFormats[1][1]) + " \"\\\"\"";
    for (const auto& fmt : kFormats)
      if (f == fmt[0]) return "\"\\\"\" " + add_rule(std::string("format-") + fmt[0], fmt[1]) + " \"\\\"\"";
    throw SchemaError("format", "string format '" + f + "' is not supported (date, time, date-time, uuid, email are)");
  }
  if (schema.contains("pattern")) {
    if (!schema["pattern"].is_string()) throw SchemaError("pattern", "pattern must be a string");
    if (schema.contains("minLength") || schema.contains("maxLength"))
      throw SchemaError("pattern", "pattern together with minLength/maxLength is not supported");
    return "\"\\\"\" " + add_rule(name + "-pattern", PatternTranslator(schema["pattern"].get<std::string>()).translate()) + " \"\\\"\"";
  }
  long long lo = count(schema, "minLength", 0), hi = count(schema, "maxLength", -1);
  if (lo < 0 || (hi >= 0 && hi < lo) || lo > 10000 || hi > 10000) throw SchemaError("maxLength", "minLength/maxLength must be between 0 and 10000");
  if (lo == 0 && hi < 0) return "json-string";
  return "\"\\\"\" json-char{" + std::to_string(lo) + "," + (hi < 0 ? "" : std::to_string(hi)) + "} \"\\\"\"";
}

namespace {
double bound(const json& schema, const char* key, double fallback) {
  if (!schema.contains(key)) return fallback;
  if (!schema[key].is_number()) throw SchemaError(key, std::string(key) + " must be a number");
  return schema[key].get<double>();
}
}  // namespace

std::string GbnfBuilder::integer_rule(const json& schema, const std::string&) {
  // Integers have at most 15 digits (|x| < 1e15, inside JavaScript's safe range); bounds past that
  // (zod writes +-(2^53 - 1) for z.int()) bound nothing more.
  constexpr double kLimit = 999999999999999.0;
  const double inf = std::numeric_limits<double>::infinity();
  double lo = bound(schema, "minimum", -inf), hi = bound(schema, "maximum", inf);
  if (schema.contains("exclusiveMinimum")) lo = std::max(lo, std::floor(bound(schema, "exclusiveMinimum", -inf)) + 1);
  if (schema.contains("exclusiveMaximum")) hi = std::min(hi, std::ceil(bound(schema, "exclusiveMaximum", inf)) - 1);
  lo = std::max(std::ceil(lo), -kLimit);
  hi = std::min(std::floor(hi), kLimit);
  if (lo > hi) throw SchemaError("minimum", "the integer bounds leave no value");
  if (lo == -kLimit && hi == kLimit) return "json-int";
  return integer_range_gbnf(static_cast<long long>(lo), static_cast<long long>(hi));
}

std::string GbnfBuilder::number_rule(const json& schema, const std::string& name) {
  if (!schema.contains("minimum") && !schema.contains("maximum") && !schema.contains("exclusiveMinimum") && !schema.contains("exclusiveMaximum"))
    return "json-number";
  // Bounds are enforced exactly when they are integers: the integer part ranges over [lo, hi - 1]
  // with any fraction, or equals an inclusive bound with a zero fraction.
  const double inf = std::numeric_limits<double>::infinity();
  double lo = bound(schema, "minimum", -inf), hi = bound(schema, "maximum", inf);
  bool lo_open = false, hi_open = false;
  if (schema.contains("exclusiveMinimum")) { lo = bound(schema, "exclusiveMinimum", -inf); lo_open = true; }
  if (schema.contains("exclusiveMaximum")) { hi = bound(schema, "exclusiveMaximum", inf); hi_open = true; }
  if (std::fabs(lo) >= 1e15) lo = -inf;  // beyond what 15 integer digits reach: no bound
  if (std::fabs(hi) >= 1e15) hi = inf;
  for (double v : {lo, hi})
    if (std::isfinite(v) && v != std::floor(v))
      throw SchemaError(v == lo ? "minimum" : "maximum", "number bounds must be integers to be enforced");
  if (!std::isfinite(lo) && !std::isfinite(hi)) return "json-number";
  const long long big = 999999999999999LL;
  long long ilo = std::isfinite(lo) ? static_cast<long long>(lo) : -big, ihi = std::isfinite(hi) ? static_cast<long long>(hi) : big;
  std::vector<std::string> parts;
  const std::string frac = "( \".\" [0-9]{1,16} )?";
  const std::string zero_frac = "( \".\" \"0\"{1,16} )?";
  // Non-negative side: integer parts in [max(ilo,0), ihi) take any fraction (exclusive lo: fraction > 0 at ilo).
  if (ihi >= 0) {
    long long a = std::max(ilo, 0LL);
    if (a < ihi) {
      if (lo_open && ilo >= 0) {
        parts.push_back(integer_range_gbnf(a, a) + " \".\" [0-9]{0,15} [1-9]");
        if (a + 1 <= ihi - 1) parts.push_back(integer_range_gbnf(a + 1, ihi - 1) + " " + frac);
      } else {
        parts.push_back(integer_range_gbnf(a, ihi - 1) + " " + frac);
      }
    }
    if (!hi_open && ihi >= a && !(lo_open && ilo == ihi)) parts.push_back(integer_range_gbnf(ihi, ihi) + " " + zero_frac);
  }
  if (ilo < 0) {  // negative side mirrors: -x with x in (max(-ihi,0)... -ilo]
    long long top = -ilo;                               // the most negative magnitude
    long long bottom = ihi < 0 ? -ihi : 0;              // the least negative magnitude
    std::vector<std::string> neg;
    if (bottom < top) {
      if (hi_open && ihi < 0) {
        neg.push_back(integer_range_gbnf(bottom, bottom) + " \".\" [0-9]{0,15} [1-9]");
        if (bottom + 1 <= top - 1) neg.push_back(integer_range_gbnf(bottom + 1, top - 1) + " " + frac);
      } else if (bottom == 0) {
        neg.push_back("\"0\" \".\" [0-9]{0,15} [1-9]");
        if (top - 1 >= 1) neg.push_back(integer_range_gbnf(1, top - 1) + " " + frac);
      } else {
        neg.push_back(integer_range_gbnf(bottom, top - 1) + " " + frac);
      }
    }
    if (!lo_open) neg.push_back(integer_range_gbnf(top, top) + " " + zero_frac);
    for (const auto& n : neg) parts.push_back("\"-\" " + n);
  }
  if (parts.empty()) throw SchemaError("minimum", "the number bounds leave no value");
  std::string out = "(";
  for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? " | " : " ") + parts[i];
  return add_rule(name + "-number", out + " )");
}

std::string json_schema_to_gbnf(const json& schema) {
  GbnfBuilder b;
  std::string value = b.add_schema(schema, "value");
  return b.grammar(value);
}

std::string json_object_gbnf() {
  GbnfBuilder b;
  return b.grammar("json-object");
}

}  // namespace promptly::grammar
