#include "chat/tool_calls.h"

#include <algorithm>
#include <cctype>
#include <random>

namespace promptly {

using json = nlohmann::ordered_json;

namespace {

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kMistralCallId = "[CALL_ID]";
constexpr std::string_view kPythonTag = "<|python_tag|>";

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::size_t skip_space(std::string_view s, std::size_t pos) {
  while (pos < s.size() && is_space(s[pos])) ++pos;
  return pos;
}

bool only_space(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return is_space(c); });
}

// Whether `s` from `pos` is `word`, cannot be yet (NotACall), or is a proper prefix of it so far.
enum class Match { Yes, No, Partial };
Match match_at(std::string_view s, std::size_t pos, std::string_view word) {
  const std::string_view rest = s.substr(std::min(pos, s.size()));
  if (rest.size() >= word.size()) return rest.substr(0, word.size()) == word ? Match::Yes : Match::No;
  return word.substr(0, rest.size()) == rest ? Match::Partial : Match::No;
}

// Finds where the JSON value starting at `pos` ends, without judging it fully (json::parse does
// that): brackets balance outside strings, and only JSON's characters appear outside strings, so
// prose after a marker is refused at its first letter instead of being held to the end.
enum class Scan { Complete, Incomplete, Invalid };
Scan scan_json_value(std::string_view s, std::size_t pos, std::size_t& end) {
  if (pos >= s.size()) return Scan::Incomplete;
  if (s[pos] != '{' && s[pos] != '[') return Scan::Invalid;  // calls are objects or arrays of them
  std::string closers;
  bool in_string = false, escaped = false;
  for (std::size_t i = pos; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      closers.push_back(c == '{' ? '}' : ']');
    } else if (c == '}' || c == ']') {
      if (closers.empty() || closers.back() != c) return Scan::Invalid;
      closers.pop_back();
    } else if (!is_space(c) && c != ',' && c != ':' && c != '-' && c != '+' && c != '.' && !(c >= '0' && c <= '9') &&
               std::string_view("truefalsnE").find(c) == std::string_view::npos) {
      return Scan::Invalid;
    }
    if (closers.empty() && !in_string) {
      end = i + 1;
      return Scan::Complete;
    }
  }
  return Scan::Incomplete;
}

std::string random_alphanumerics(std::size_t n) {
  static constexpr char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<std::size_t> pick(0, sizeof kChars - 2);
  std::string out;
  for (std::size_t i = 0; i < n; ++i) out.push_back(kChars[pick(rng)]);
  return out;
}

std::string call_text(const json& call) {
  const json& function = call.at("function");
  std::string arguments = "{}";
  if (auto a = function.find("arguments"); a != function.end() && !a->is_null()) {
    arguments = a->is_string() ? a->get<std::string>() : a->dump(-1, ' ', false, json::error_handler_t::replace);
  }
  return std::string(kHermesOpen) + "\n{\"name\": " + json(function.at("name")).dump() + ", \"arguments\": " + arguments + "}\n" +
         std::string(kHermesClose);
}

std::string content_string(const json& message) {
  auto c = message.find("content");
  return c != message.end() && c->is_string() ? c->get<std::string>() : std::string();
}

}  // namespace

ToolCallFormat detect_tool_call_format(std::string_view source) {
  // The markers a template writes for the calls in its history are the ones its model emits.
  if (source.find(kMistralCalls) != std::string_view::npos) {
    return source.find(kMistralArgs) != std::string_view::npos ? ToolCallFormat::MistralArgs : ToolCallFormat::MistralNemo;
  }
  if (source.find(kHermesOpen) != std::string_view::npos) return ToolCallFormat::Hermes;
  if (source.find("<|start_header_id|>") != std::string_view::npos && source.find("tool_call") != std::string_view::npos) {
    return ToolCallFormat::Llama3Json;
  }
  return ToolCallFormat::Fallback;
}

const ToolCallSyntax& tool_call_syntax(ToolCallFormat format) {
  static const ToolCallSyntax kHermes = {"", "", "<tool_call>\n", "\n</tool_call>", "\n", "arguments", "", false, false, -1};
  static const ToolCallSyntax kLlama = {"", "", "", "", "", "parameters", "", false, false, 1};
  static const ToolCallSyntax kNemo = {"[TOOL_CALLS][", "]", "", "", ", ", "arguments", "", false, true, -1};
  static const ToolCallSyntax kArgs = {"", "", "[TOOL_CALLS]", "", "", "", "[ARGS]", true, false, -1};
  switch (format) {
    case ToolCallFormat::Llama3Json: return kLlama;
    case ToolCallFormat::MistralNemo: return kNemo;
    case ToolCallFormat::MistralArgs: return kArgs;
    default: return kHermes;
  }
}

const char* tool_call_format_name(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::Hermes: return "hermes";
    case ToolCallFormat::Llama3Json: return "llama3-json";
    case ToolCallFormat::MistralNemo: return "mistral-nemo";
    case ToolCallFormat::MistralArgs: return "mistral-args";
    default: return "fallback-hermes";
  }
}

std::vector<std::string> tool_call_control_markers(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::Llama3Json: return {std::string(kPythonTag)};
    case ToolCallFormat::MistralNemo: return {std::string(kMistralCalls)};
    case ToolCallFormat::MistralArgs: return {std::string(kMistralCalls), std::string(kMistralArgs), std::string(kMistralCallId)};
    // Usually plain added tokens (shown as text), but a conversion may have marked them control.
    default: return {std::string(kHermesOpen), std::string(kHermesClose)};
  }
}

std::string new_tool_call_id(ToolCallFormat format) {
  if (format == ToolCallFormat::MistralNemo || format == ToolCallFormat::MistralArgs) return random_alphanumerics(9);
  return "call_" + random_alphanumerics(24);
}

json fallback_tool_messages(const json& messages, const json& tools, bool system_role) {
  json out = json::array();
  for (const json& m : messages) {
    const std::string role = m.value("role", "");
    if (role == "tool") {
      const std::string block = "<tool_response>\n" + content_string(m) + "\n</tool_response>";
      if (!out.empty() && out.back().value("from_tool", false)) {
        out.back()["content"] = out.back()["content"].get<std::string>() + "\n" + block;
      } else {
        out.push_back({{"role", "user"}, {"content", block}, {"from_tool", true}});
      }
      continue;
    }
    if (role == "assistant" && m.contains("tool_calls") && m["tool_calls"].is_array()) {
      std::string text = content_string(m);
      for (const json& call : m["tool_calls"]) {
        if (!text.empty()) text += "\n";
        text += call_text(call);
      }
      out.push_back({{"role", "assistant"}, {"content", text}});
      continue;
    }
    out.push_back(m);
  }
  for (json& m : out) m.erase("from_tool");
  if (!tools.is_array() || tools.empty()) return out;

  std::string description =
      "# Tools\n\nYou may call one or more of these functions, described as JSON within <tools></tools>:\n<tools>";
  for (const json& tool : tools) description += "\n" + tool.dump(-1, ' ', false, json::error_handler_t::replace);
  description +=
      "\n</tools>\n\nTo call a function, answer with one block per call, each on its own lines:\n<tool_call>\n"
      "{\"name\": <function name>, \"arguments\": <arguments as a JSON object>}\n</tool_call>\n"
      "The results come back in <tool_response></tool_response> blocks.";
  auto first_with_role = [&](const char* role) {
    return std::find_if(out.begin(), out.end(), [&](const json& m) { return m.value("role", "") == role; });
  };
  if (auto sys = first_with_role("system"); sys != out.end()) {
    (*sys)["content"] = content_string(*sys) + "\n\n" + description;
  } else if (system_role) {
    out.insert(out.begin(), json{{"role", "system"}, {"content", description}});
  } else if (auto user = first_with_role("user"); user != out.end()) {
    (*user)["content"] = description + "\n\n" + content_string(*user);
  }
  return out;
}

// --- parsing ---

ToolCallParser::ToolCallParser(ToolCallOptions options) : options_(std::move(options)) {
  switch (options_.format) {
    case ToolCallFormat::MistralNemo:
    case ToolCallFormat::MistralArgs: marker_ = std::string(kMistralCalls); break;
    case ToolCallFormat::Llama3Json: marker_ = std::string(kPythonTag); break;
    default: marker_ = std::string(kHermesOpen);
  }
}

std::optional<ToolCall> ToolCallParser::checked_call(const json& object, const std::string& arguments_key) const {
  if (!object.is_object()) return std::nullopt;
  auto name = object.find("name");
  if (name == object.end() || !name->is_string()) return std::nullopt;
  if (std::find(options_.tool_names.begin(), options_.tool_names.end(), name->get<std::string>()) == options_.tool_names.end()) {
    return std::nullopt;
  }
  auto arguments = object.find(arguments_key);
  if (arguments == object.end() && arguments_key == "parameters") arguments = object.find("arguments");
  ToolCall call;
  call.id = new_tool_call_id(options_.format);
  call.name = name->get<std::string>();
  if (arguments == object.end()) {
    call.arguments = "{}";
  } else if (arguments->is_object()) {
    call.arguments = arguments->dump(-1, ' ', false, json::error_handler_t::replace);
  } else if (arguments->is_string() && json::parse(arguments->get<std::string>(), nullptr, false).is_object()) {
    call.arguments = arguments->get<std::string>();  // some models write the arguments as a JSON string
  } else {
    return std::nullopt;
  }
  return call;
}

bool ToolCallParser::call_may_start_at(std::size_t pos) const {
  switch (options_.format) {
    case ToolCallFormat::Llama3Json: return only_space(std::string_view(text_).substr(0, pos));
    case ToolCallFormat::MistralNemo:
    case ToolCallFormat::MistralArgs: return true;
    default: return pos == 0 || text_[pos - 1] == '\n';
  }
}

ToolCallParser::AttemptResult ToolCallParser::try_calls_at(std::size_t pos, bool at_end) const {
  const std::string_view s(text_);
  AttemptResult r;
  auto only = [](Attempt outcome) {
    AttemptResult result;
    result.outcome = outcome;
    return result;
  };
  // The text stops before the call does: more may come, unless the output has ended.
  auto unfinished = [&] { return only(at_end ? Attempt::NotACall : Attempt::NeedMore); };
  // A JSON value at `p`: Complete with `value`, or the outcome to report.
  auto json_at = [&](std::size_t p, json& value, std::size_t& end) -> std::optional<Attempt> {
    const Scan scan = scan_json_value(s, p, end);
    if (scan == Scan::Invalid) return Attempt::NotACall;
    if (scan == Scan::Incomplete) return at_end ? Attempt::NotACall : Attempt::NeedMore;
    value = json::parse(s.substr(p, end - p), nullptr, false);
    if (value.is_discarded()) return Attempt::NotACall;
    return std::nullopt;
  };

  std::size_t p = pos;
  switch (options_.format) {
    case ToolCallFormat::Llama3Json: {
      // The whole answer is one call: an optional <|python_tag|>, the object, then nothing.
      p = skip_space(s, p);
      if (const Match m = match_at(s, p, kPythonTag); m == Match::Partial) {
        return unfinished();
      } else if (m == Match::Yes) {
        p = skip_space(s, p + kPythonTag.size());
      }
      if (p >= s.size()) return unfinished();
      json object;
      std::size_t end = 0;
      if (auto outcome = json_at(p, object, end)) return only(*outcome);
      if (!only_space(s.substr(end))) return only(Attempt::NotACall);
      if (!at_end) return only(Attempt::NeedMore);  // text may still follow the object
      auto call = checked_call(object, "parameters");
      if (!call) return only(Attempt::NotACall);
      r.calls.push_back(std::move(*call));
      r.end = s.size();
      r.outcome = Attempt::Calls;
      return r;
    }
    case ToolCallFormat::MistralNemo: {
      p = skip_space(s, p + kMistralCalls.size());
      if (p >= s.size()) return unfinished();
      json value;
      std::size_t end = 0;
      if (auto outcome = json_at(p, value, end)) return only(*outcome);
      if (value.is_object()) value = json::array({value});
      if (!value.is_array() || value.empty()) return only(Attempt::NotACall);
      for (const json& object : value) {
        auto call = checked_call(object, "arguments");
        if (!call) return only(Attempt::NotACall);
        r.calls.push_back(std::move(*call));
      }
      r.end = end;
      r.outcome = Attempt::Calls;
      return r;
    }
    case ToolCallFormat::MistralArgs: {
      // [TOOL_CALLS]name([CALL_ID]id)?[ARGS]{...}
      p += kMistralCalls.size();
      const std::size_t name_begin = p;
      while (p < s.size() && (std::isalnum(static_cast<unsigned char>(s[p])) || s[p] == '_' || s[p] == '-' || s[p] == '.')) ++p;
      if (p >= s.size()) return unfinished();
      const std::string name(s.substr(name_begin, p - name_begin));
      if (name.empty()) return only(Attempt::NotACall);
      if (const Match m = match_at(s, p, kMistralCallId); m == Match::Partial) {
        return unfinished();
      } else if (m == Match::Yes) {
        p += kMistralCallId.size();
        while (p < s.size() && std::isalnum(static_cast<unsigned char>(s[p]))) ++p;
      }
      if (const Match m = match_at(s, p, kMistralArgs); m == Match::No) {
        return only(Attempt::NotACall);
      } else if (m == Match::Partial) {
        return unfinished();
      }
      p = skip_space(s, p + kMistralArgs.size());
      if (p >= s.size()) return unfinished();
      json arguments;
      std::size_t end = 0;
      if (auto outcome = json_at(p, arguments, end)) return only(*outcome);
      auto call = checked_call(json{{"name", name}, {"arguments", arguments}}, "arguments");
      if (!call) return only(Attempt::NotACall);
      r.calls.push_back(std::move(*call));
      r.end = end;
      r.outcome = Attempt::Calls;
      return r;
    }
    default: {
      // <tool_call> {...} </tool_call>; at a natural end the closing tag may be missing.
      p = skip_space(s, p + kHermesOpen.size());
      if (p >= s.size()) return unfinished();
      json object;
      std::size_t end = 0;
      if (auto outcome = json_at(p, object, end)) return only(*outcome);
      auto call = checked_call(object, "arguments");
      if (!call) return only(Attempt::NotACall);
      const std::size_t close = skip_space(s, end);
      const Match m = match_at(s, close, kHermesClose);
      if (m == Match::No) return only(Attempt::NotACall);
      if (m == Match::Partial && !at_end) return only(Attempt::NeedMore);
      if (m == Match::Partial && close < s.size()) return only(Attempt::NotACall);  // a cut-off closing tag
      r.calls.push_back(std::move(*call));
      r.end = m == Match::Yes ? close + kHermesClose.size() : s.size();
      r.outcome = Attempt::Calls;
      return r;
    }
  }
}

// The length of the longest tail of the undecided text that could begin a call marker.
std::size_t ToolCallParser::marker_prefix_at_end() const {
  const std::string_view s(text_);
  for (std::size_t n = std::min(marker_.size() - 1, s.size() - decided_); n > 0; --n) {
    const std::size_t pos = s.size() - n;
    if (s.substr(pos) == std::string_view(marker_).substr(0, n) && call_may_start_at(pos)) return n;
  }
  return 0;
}

void ToolCallParser::emit_content(std::string_view text, std::vector<ToolCallEvent>& out) {
  // Whitespace waits: beside a call it is dropped, before more content it is given out.
  if (after_call_) {
    const std::size_t first = skip_space(text, 0);
    text.remove_prefix(first);
    if (!text.empty()) after_call_ = false;
  }
  if (text.empty()) return;
  std::size_t last = text.size();
  while (last > 0 && is_space(text[last - 1])) --last;
  if (last == 0) {
    held_space_ += text;
    return;
  }
  ToolCallEvent e;
  e.content = held_space_ + std::string(text.substr(0, last));
  held_space_ = std::string(text.substr(last));
  if (!out.empty() && !out.back().call) {
    out.back().content += e.content;
  } else {
    out.push_back(std::move(e));
  }
}

void ToolCallParser::advance(bool at_end, std::vector<ToolCallEvent>& out) {
  const std::string_view s(text_);
  while (decided_ < s.size()) {
    if (calls_closed_) {
      emit_content(s.substr(decided_), out);
      decided_ = s.size();
      break;
    }
    if (options_.format == ToolCallFormat::Llama3Json) {
      // Only an answer that starts with the call is one; hold it until the end decides.
      const std::size_t first = skip_space(s, decided_);
      if (first == s.size() && !at_end) return;
      const bool may_be_call = decided_ == 0 && first < s.size() && (s[first] == '{' || match_at(s, first, kPythonTag) != Match::No);
      if (may_be_call) {
        const AttemptResult r = try_calls_at(0, at_end);
        if (r.outcome == Attempt::NeedMore) return;
        if (r.outcome == Attempt::Calls) {
          for (const ToolCall& call : r.calls) out.push_back({"", call, calls_++});
          held_space_.clear();
          after_call_ = true;
          decided_ = r.end;
          calls_closed_ = true;
          continue;
        }
      }
      calls_closed_ = true;  // plain text: nothing later is a call
      continue;
    }
    // Marker formats: give out text up to the next place a call may start.
    std::size_t pos = decided_;
    std::size_t found = std::string_view::npos;
    while ((pos = s.find(marker_, pos)) != std::string_view::npos) {
      if (call_may_start_at(pos)) {
        found = pos;
        break;
      }
      ++pos;
    }
    if (found == std::string_view::npos) {
      const std::size_t hold = at_end ? 0 : marker_prefix_at_end();
      emit_content(s.substr(decided_, s.size() - hold - decided_), out);
      decided_ = s.size() - hold;
      return;
    }
    emit_content(s.substr(decided_, found - decided_), out);
    decided_ = found;
    const AttemptResult r = try_calls_at(found, at_end);
    if (r.outcome == Attempt::NeedMore) return;
    if (r.outcome == Attempt::NotACall) {
      emit_content(s.substr(found, marker_.size()), out);
      decided_ = found + marker_.size();
      continue;
    }
    held_space_.clear();
    after_call_ = true;
    for (const ToolCall& call : r.calls) {
      out.push_back({"", call, calls_++});
      // parallel_tool_calls false: the first call only (the rest of a Nemo array goes with it).
      if (!options_.parallel) {
        calls_closed_ = true;
        break;
      }
    }
    decided_ = r.end;
  }
}

std::vector<ToolCallEvent> ToolCallParser::push(std::string_view text) {
  std::vector<ToolCallEvent> out;
  text_.append(text);
  advance(false, out);
  return out;
}

std::vector<ToolCallEvent> ToolCallParser::finish(bool natural_end) {
  std::vector<ToolCallEvent> out;
  advance(natural_end, out);
  // Whatever is still undecided was an unfinished call: it is content.
  if (decided_ < text_.size()) {
    calls_closed_ = true;
    advance(true, out);
  }
  if (calls_ == 0 && !held_space_.empty()) {
    const std::string space = std::move(held_space_);
    held_space_.clear();
    if (!out.empty() && !out.back().call) out.back().content += space;
    else out.push_back({space, std::nullopt, 0});
  }
  return out;
}

ParsedToolCalls parse_tool_calls(std::string_view output, const ToolCallOptions& options, bool natural_end) {
  ToolCallParser parser(options);
  std::vector<ToolCallEvent> events = parser.push(output);
  for (ToolCallEvent& e : parser.finish(natural_end)) events.push_back(std::move(e));
  ParsedToolCalls parsed;
  std::string content;
  for (ToolCallEvent& e : events) {
    if (e.call) parsed.calls.push_back(std::move(*e.call));
    else content += e.content;
  }
  if (!content.empty() || parsed.calls.empty()) parsed.content = std::move(content);
  return parsed;
}

json tool_call_json(const ToolCall& call) {
  return {{"id", call.id}, {"type", "function"}, {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
}

std::vector<json> tool_call_event_deltas(const ToolCallEvent& event) {
  if (!event.call) return {json{{"content", event.content}}};
  const ToolCall& call = *event.call;
  json head = {{"index", event.index}, {"id", call.id}, {"type", "function"}, {"function", {{"name", call.name}, {"arguments", ""}}}};
  json arguments = {{"index", event.index}, {"function", {{"arguments", call.arguments}}}};
  return {json{{"tool_calls", json::array({head})}}, json{{"tool_calls", json::array({arguments})}}};
}

}  // namespace promptly
