#pragma once
// A Jinja2 interpreter for the subset chat templates use. Hand-written because no C++ Jinja library
// is packaged for Debian, and because chat formatting must be byte-identical to Python's Jinja2
// under Hugging Face's settings (trim_blocks, lstrip_blocks, loop controls, no trailing newline kept):
// a single differing byte changes the tokens the model sees and defeats the prefix cache.
//
// Supported: {{ }}, {% %}, {# #} with '-' / '+' whitespace control; if/elif/else, for (with else,
// inline `if` filter, tuple unpacking, `loop`), set (names, namespace attributes, blocks), macro,
// break/continue, raw; literals, arithmetic, comparison, logic, `in`, `~`, ternaries, attribute and
// item access, slicing, calls with keyword arguments, filters and tests (see jinja.cpp for the lists).
#include <memory>
#include <string>

#include "chat/jinja_value.h"
#include "util/error.h"

namespace promptly::jinja {

// A template that does not parse, or fails while rendering (with the line it failed on).
class TemplateError : public Error {
 public:
  explicit TemplateError(const std::string& message) : Error(message) {}
};

// The template called raise_exception(message): the input is unacceptable to this model (e.g. a
// system role Gemma does not support), which a server reports as a client error.
class RaisedException : public TemplateError {
 public:
  explicit RaisedException(const std::string& message) : TemplateError(message) {}
};

struct Node;

class Template {
 public:
  // Parses `source`; throws TemplateError naming the line of the first syntax error.
  explicit Template(const std::string& source);
  ~Template();

  // Renders with `globals` as the top-level variables (plus range, namespace, dict, raise_exception).
  std::string render(const Dict& globals) const;

 private:
  std::shared_ptr<Node> root_;
};

}  // namespace promptly::jinja
