#include "chat/jinja_value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "chat/jinja.h"

namespace promptly::jinja {

const Value* Dict::find(const std::string& key) const {
  for (const auto& [k, v] : items_)
    if (k == key) return &v;
  return nullptr;
}

Value* Dict::find(const std::string& key) {
  for (auto& [k, v] : items_)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  if (Value* existing = find(key)) {
    *existing = std::move(v);
  } else {
    items_.emplace_back(key, std::move(v));
  }
}

const Value* CallArgs::kwarg(const std::string& name) const {
  for (const auto& [k, v] : keyword)
    if (k == name) return &v;
  return nullptr;
}

Value Value::from_dict(Dict d) {
  Value v = make(Kind::Dict);
  v.dict = std::make_shared<Dict>(std::move(d));
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return integer(j.get<std::int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: return integer(static_cast<std::int64_t>(j.get<std::uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return number(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      for (const auto& e : j) items.push_back(from_json(e));
      return from_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (const auto& [k, v] : j.items()) d.set(k, from_json(v));
      return from_dict(std::move(d));
    }
    default: return none();
  }
}

bool Value::truthy() const {
  switch (kind) {
    case Kind::Undefined: case Kind::None: return false;
    case Kind::Bool: return b;
    case Kind::Int: return i != 0;
    case Kind::Float: return f != 0.0;
    case Kind::String: return !s.empty();
    case Kind::List: return !list->empty();
    case Kind::Dict: return dict->size() > 0;
    case Kind::Function: return true;
  }
  return false;
}

double Value::as_double() const {
  switch (kind) {
    case Kind::Bool: return b ? 1 : 0;
    case Kind::Int: return static_cast<double>(i);
    case Kind::Float: return f;
    default: throw TemplateError(std::string("expected a number, got ") + type_name());
  }
}

const char* Value::type_name() const {
  switch (kind) {
    case Kind::Undefined: return "undefined";
    case Kind::None: return "none";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "string";
    case Kind::List: return "list";
    case Kind::Dict: return "dict";
    case Kind::Function: return "function";
  }
  return "?";
}

namespace {

// Python's float repr: the shortest digits that round-trip, exponent outside [1e-4, 1e16).
std::string float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[40];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
    if (std::strtod(buf, nullptr) == f) break;
  }
  // buf is d.ddde[+-]XX; rebuild in Python's layout.
  std::string sci = buf;
  const std::size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  const int exp = std::atoi(sci.c_str() + e + 1);
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exp < -4 || exp >= 16) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  } else if (exp < 0) {
    out = "0." + std::string(static_cast<std::size_t>(-exp - 1), '0') + digits;
  } else {
    const std::size_t int_len = static_cast<std::size_t>(exp) + 1;
    if (digits.size() <= int_len) {
      out = digits + std::string(int_len - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, int_len) + "." + digits.substr(int_len);
    }
  }
  return neg ? "-" + out : out;
}

std::string string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c == static_cast<unsigned char>(q)) {
          out += '\\';
          out += static_cast<char>(c);
        } else if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\x%02x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + q;
}

void json_string(const std::string& s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

void json_dump(const Value& v, int indent, bool sort_keys, int depth, std::string& out) {
  const std::string item_sep = indent >= 0 ? "," : ", ";
  auto newline = [&](int d) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<std::size_t>(indent * d), ' ');
  };
  switch (v.kind) {
    case Value::Kind::Undefined: case Value::Kind::None: out += "null"; break;
    case Value::Kind::Bool: out += v.b ? "true" : "false"; break;
    case Value::Kind::Int: out += std::to_string(v.i); break;
    case Value::Kind::Float: {
      if (std::isnan(v.f)) out += "NaN";
      else if (std::isinf(v.f)) out += v.f > 0 ? "Infinity" : "-Infinity";
      else out += float_repr(v.f);
      break;
    }
    case Value::Kind::String: json_string(v.s, out); break;
    case Value::Kind::List: {
      if (v.list->empty()) {
        out += "[]";
        break;
      }
      out += '[';
      for (std::size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += item_sep;
        newline(depth + 1);
        json_dump((*v.list)[k], indent, sort_keys, depth + 1, out);
      }
      newline(depth);
      out += ']';
      break;
    }
    case Value::Kind::Dict: {
      if (v.dict->size() == 0) {
        out += "{}";
        break;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items()) items.push_back(&kv);
      if (sort_keys) std::sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (std::size_t k = 0; k < items.size(); ++k) {
        if (k) out += item_sep;
        newline(depth + 1);
        json_string(items[k]->first, out);
        out += ": ";
        json_dump(items[k]->second, indent, sort_keys, depth + 1, out);
      }
      newline(depth);
      out += '}';
      break;
    }
    case Value::Kind::Function: throw TemplateError("Object of type function is not JSON serializable");
  }
}

}  // namespace

std::string Value::str() const {
  switch (kind) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return b ? "True" : "False";
    case Kind::Int: return std::to_string(i);
    case Kind::Float: return float_repr(f);
    case Kind::String: return s;
    default: return repr();
  }
}

std::string Value::repr() const {
  switch (kind) {
    case Kind::String: return string_repr(s);
    case Kind::List: {
      std::string out = "[";
      for (std::size_t k = 0; k < list->size(); ++k) out += (k ? ", " : "") + (*list)[k].repr();
      return out + "]";
    }
    case Kind::Dict: {
      std::string out = is_namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [key, value] : dict->items()) {
        out += (first ? "" : ", ") + string_repr(key) + ": " + value.repr();
        first = false;
      }
      return out + (is_namespace ? "}>" : "}");
    }
    case Kind::Function: return "<function>";
    default: return str();
  }
}

std::string Value::to_json(int indent, bool sort_keys) const {
  std::string out;
  json_dump(*this, indent, sort_keys, 0, out);
  return out;
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Value::Kind::Float && b.kind != Value::Kind::Float) {
      const std::int64_t x = a.kind == Value::Kind::Bool ? a.b : a.i, y = b.kind == Value::Kind::Bool ? b.b : b.i;
      return x == y;
    }
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::Undefined: case Value::Kind::None: return true;
    case Value::Kind::String: return a.s == b.s;
    case Value::Kind::List: {
      if (a.list->size() != b.list->size()) return false;
      for (std::size_t k = 0; k < a.list->size(); ++k)
        if (!equals((*a.list)[k], (*b.list)[k])) return false;
      return true;
    }
    case Value::Kind::Dict: {
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, v] : a.dict->items()) {
        const Value* other = b.dict->find(k);
        if (!other || !equals(v, *other)) return false;
      }
      return true;
    }
    case Value::Kind::Function: return a.fn == b.fn;
    default: return false;
  }
}

int compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    const double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) return a.s < b.s ? -1 : a.s > b.s ? 1 : 0;
  if (a.is_list() && b.is_list()) {
    for (std::size_t k = 0; k < std::min(a.list->size(), b.list->size()); ++k) {
      const int c = compare((*a.list)[k], (*b.list)[k]);
      if (c) return c;
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  throw TemplateError(std::string("cannot compare ") + a.type_name() + " with " + b.type_name());
}

}  // namespace promptly::jinja
