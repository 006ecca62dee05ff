#pragma once
// JSON Schema -> GBNF (gbnf.h), for response_format json_schema and constrained tool calls.
//
// Supported: type (and unions), properties, required, additionalProperties, enum, const, items,
// prefixItems, minItems, maxItems, anyOf, oneOf (as anyOf), allOf with one schema, $ref to #,
// #/$defs/... and #/definitions/..., nullable, string minLength/maxLength/pattern/format
// (date, time, date-time, uuid, email), integer minimum/maximum/exclusive*, number bounds at the
// integer part (see README). Annotations (title, description, default, examples, ...) are ignored;
// any other keyword is refused with SchemaError naming it.
//
// Objects are generated with their properties in schema order; optional ones may be left out;
// additionalProperties absent or false allows no others. Whitespace between JSON tokens is bounded
// (nothing, one space, or a newline and up to 20 spaces/tabs), so a schema whose strings and arrays
// are bounded always finishes whatever the weights. Numbers stay within what a double holds and
// integers within JavaScript's safe range: at most 15 integer digits, exponents of two digits.
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace promptly::grammar {

class SchemaError : public std::runtime_error {
 public:
  SchemaError(const std::string& keyword, const std::string& message)
      : std::runtime_error(message), keyword_(keyword) {}
  const std::string& keyword() const { return keyword_; }

 private:
  std::string keyword_;
};

// Accumulates rules for several schemas in one grammar (a tool-call grammar embeds one per tool).
class GbnfBuilder {
 public:
  GbnfBuilder();
  // Adds rules for values matching `schema`; returns the name of the rule matching one value.
  std::string add_schema(const nlohmann::ordered_json& schema, const std::string& name_hint);
  // The whitespace rule used between JSON tokens.
  static const char* ws() { return "ws"; }
  // Adds a rule verbatim (`body` in GBNF); returns its (unique) name.
  std::string add_rule(const std::string& name_hint, const std::string& body);
  // A GBNF string literal for `text`.
  static std::string literal(const std::string& text);
  // All rules, with `root ::= <root_body>` first.
  std::string grammar(const std::string& root_body) const;

 private:
  std::string visit(const nlohmann::ordered_json& schema, const std::string& name, int depth);
  std::string object_rule(const nlohmann::ordered_json& schema, const std::string& name, int depth);
  std::string array_rule(const nlohmann::ordered_json& schema, const std::string& name, int depth);
  std::string string_rule(const nlohmann::ordered_json& schema, const std::string& name);
  std::string integer_rule(const nlohmann::ordered_json& schema, const std::string& name);
  std::string number_rule(const nlohmann::ordered_json& schema, const std::string& name);
  std::string ref_rule(const std::string& ref, int depth);
  std::string unique_name(const std::string& hint);

  std::map<std::string, std::string> rules_;  // name -> body
  std::vector<std::string> order_;
  std::map<std::string, std::string> ref_names_;
  const nlohmann::ordered_json* root_schema_ = nullptr;
};

// A whole grammar whose root matches one value of `schema`.
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema);
// A whole grammar whose root matches any JSON object (response_format json_object).
std::string json_object_gbnf();

// The decimal integers in [lo, hi] as a GBNF expression (no leading zeros, "-0" excluded).
std::string integer_range_gbnf(long long lo, long long hi);

}  // namespace promptly::grammar
