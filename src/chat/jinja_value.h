#pragma once
// Values of the Jinja interpreter, with Python's semantics where templates can observe them: truth,
// equality, str() and repr() output, and json.dumps as Hugging Face's `tojson` calls it.
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace promptly::jinja {

struct Value;
using List = std::vector<Value>;

class Dict;
struct CallArgs;
using Function = std::function<Value(const CallArgs&)>;

struct Value {
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Function };
  Kind kind = Kind::Undefined;
  bool b = false;
  std::int64_t i = 0;
  double f = 0.0;
  std::string s;
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;
  std::shared_ptr<Function> fn;
  bool is_namespace = false;  // a namespace() object: a dict whose attributes `set` may assign
  std::string undefined_name;  // for error messages about undefined values

  static Value undefined(std::string name = {}) {
    Value v;
    v.undefined_name = std::move(name);
    return v;
  }
  static Value none() { return make(Kind::None); }
  static Value boolean(bool x) {
    Value v = make(Kind::Bool);
    v.b = x;
    return v;
  }
  static Value integer(std::int64_t x) {
    Value v = make(Kind::Int);
    v.i = x;
    return v;
  }
  static Value number(double x) {
    Value v = make(Kind::Float);
    v.f = x;
    return v;
  }
  static Value string(std::string x) {
    Value v = make(Kind::String);
    v.s = std::move(x);
    return v;
  }
  static Value from_list(List items) {
    Value v = make(Kind::List);
    v.list = std::make_shared<List>(std::move(items));
    return v;
  }
  static Value from_dict(Dict d);
  static Value function(Function f) {
    Value v = make(Kind::Function);
    v.fn = std::make_shared<Function>(std::move(f));
    return v;
  }
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  bool is_list() const { return kind == Kind::List; }
  bool is_dict() const { return kind == Kind::Dict; }

  bool truthy() const;
  double as_double() const;
  // Python str(): what {{ value }} prints.
  std::string str() const;
  // Python repr(): how values print inside lists and dicts.
  std::string repr() const;
  // json.dumps(value, ensure_ascii=False, indent=indent, separators=...) as HF's tojson.
  std::string to_json(int indent = -1, bool sort_keys = false) const;
  const char* type_name() const;

 private:
  static Value make(Kind k) {
    Value v;
    v.kind = k;
    return v;
  }
};

// Insertion-ordered string-keyed map (Python dicts keep order, and tojson output depends on it).
class Dict {
 public:
  const Value* find(const std::string& key) const;
  Value* find(const std::string& key);
  void set(const std::string& key, Value v);
  const std::vector<std::pair<std::string, Value>>& items() const { return items_; }
  std::size_t size() const { return items_.size(); }

 private:
  std::vector<std::pair<std::string, Value>> items_;
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  const Value* kwarg(const std::string& name) const;
};
bool equals(const Value& a, const Value& b);
// Python ordering for numbers and strings; throws jinja::TemplateError for other mixes.
int compare(const Value& a, const Value& b);

}  // namespace promptly::jinja
