#include "server/api.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "grammar/json_schema.h"

namespace promptly::server {

using json = nlohmann::ordered_json;

std::string ApiError::body() const {
  json e = {{"message", what()}, {"type", type_}, {"param", param_.empty() ? json(nullptr) : json(param_)},
            {"code", code_.empty() ? json(nullptr) : json(code_)}};
  return json{{"error", e}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& message) { throw ApiError(400, message, "invalid_request_error", param); }

constexpr std::int64_t kMaxChoices = 128;

// response_format and the `grammar` extension, resolved to one GBNF grammar.
void parse_structured_output(const json& body, ApiRequest& r) {
  auto it = body.find("grammar");
  if (it != body.end() && !it->is_null()) {
    if (!it->is_string() || it->get<std::string>().empty()) bad("grammar", "'grammar' must be a non-empty GBNF string");
    r.grammar = it->get<std::string>();
    r.grammar_param = "grammar";
  }
  it = body.find("response_format");
  if (it == body.end() || it->is_null()) return;
  const json& rf = *it;
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
    bad("response_format", "'response_format' must be an object with a 'type' (text, json_object or json_schema)");
  const std::string type = rf["type"].get<std::string>();
  if (type == "text") return;
  if (!r.grammar.empty()) bad("grammar", "give 'grammar' or a JSON 'response_format', not both");
  r.grammar_param = "response_format";
  try {
    if (type == "json_object") {
      r.grammar = grammar::json_object_gbnf();
    } else if (type == "json_schema") {
      const json* js = rf.contains("json_schema") ? &rf["json_schema"] : nullptr;
      if (!js || !js->is_object()) bad("response_format", "'response_format.json_schema' must be an object with a 'schema'");
      if (js->contains("name") && (!(*js)["name"].is_string() || (*js)["name"].get<std::string>().empty()))
        bad("response_format", "'response_format.json_schema.name' must be a non-empty string");
      if (js->contains("strict") && !(*js)["strict"].is_boolean() && !(*js)["strict"].is_null())
        bad("response_format", "'response_format.json_schema.strict' must be a boolean");
      // No schema: any JSON value, as OpenAI does.
      r.grammar = js->contains("schema") ? grammar::json_schema_to_gbnf((*js)["schema"]) : grammar::json_schema_to_gbnf(json::object());
    } else {
      bad("response_format", "'response_format.type' must be text, json_object or json_schema, not '" + type + "'");
    }
  } catch (const grammar::SchemaError& e) {
    throw ApiError(400, std::string("response_format: ") + e.what() + " (keyword '" + e.keyword() + "')", "invalid_request_error",
                   "response_format", "unsupported_schema");
  } catch (const nlohmann::json::exception& e) {  // a keyword of the wrong JSON type deep inside
    throw ApiError(400, std::string("response_format: malformed schema: ") + e.what(), "invalid_request_error", "response_format");
  }
}

const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

double number(const json& body, const char* name, double lo, double hi, double fallback) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_number()) bad(name, std::string("'") + name + "' must be a number");
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) {
    bad(name, std::string("'") + name + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi));
  }
  return x;
}

std::optional<std::int64_t> integer(const json& body, const char* name, std::int64_t lo, std::int64_t hi) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number_integer() && !(v->is_number_float() && std::floor(v->get<double>()) == v->get<double>())) {
    bad(name, std::string("'") + name + "' must be an integer");
  }
  const double x = v->get<double>();
  if (x < static_cast<double>(lo) || x > static_cast<double>(hi)) {
    bad(name, std::string("'") + name + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi));
  }
  return v->is_number_unsigned() ? static_cast<std::int64_t>(std::min<std::uint64_t>(v->get<std::uint64_t>(), static_cast<std::uint64_t>(hi)))
                                 : v->get<std::int64_t>();
}

bool boolean(const json& body, const char* name, bool fallback) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_boolean()) bad(name, std::string("'") + name + "' must be a boolean");
  return v->get<bool>();
}

std::string text(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return {};
  if (!v->is_string()) bad(name, std::string("'") + name + "' must be a string");
  return v->get<std::string>();
}

// Message content: a string, or an array of {"type": "text", "text": ...} parts joined.
std::string content_text(const json& content, std::size_t index) {
  const std::string param = "messages[" + std::to_string(index) + "].content";
  if (content.is_string()) return content.get<std::string>();
  if (content.is_null()) return {};
  if (!content.is_array()) bad(param, "'" + param + "' must be a string or an array of content parts");
  std::string out;
  for (const json& part : content) {
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) bad(param, "each content part needs a string 'type'");
    if (part["type"] != "text") bad(param, "only text content parts are supported, not '" + part["type"].get<std::string>() + "'");
    if (!part.contains("text") || !part["text"].is_string()) bad(param, "a text content part needs a string 'text'");
    out += part["text"].get<std::string>();
  }
  return out;
}

bool valid_function_name(const std::string& name) {
  // OpenAI's rule: 1 to 64 of a-z, A-Z, 0-9, underscore, dash (dots too, as some clients send them).
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.'; });
}

json parse_tools(const json& tools) {
  if (!tools.is_array()) bad("tools", "'tools' must be an array of {\"type\": \"function\", \"function\": {...}} objects");
  std::vector<std::string> names;
  for (std::size_t i = 0; i < tools.size(); ++i) {
    const json& tool = tools[i];
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!tool.is_object()) bad("tools", "'" + at + "' must be an object");
    if (!tool.contains("type") || tool["type"] != "function") bad("tools", "'" + at + ".type' must be \"function\" (the only tool type supported)");
    if (!tool.contains("function") || !tool["function"].is_object()) bad("tools", "'" + at + ".function' must be an object");
    const json& function = tool["function"];
    if (!function.contains("name") || !function["name"].is_string() || !valid_function_name(function["name"].get<std::string>())) {
      bad("tools", "'" + at + ".function.name' must be a string of 1 to 64 letters, digits, '_', '-' or '.'");
    }
    const std::string name = function["name"];
    if (std::find(names.begin(), names.end(), name) != names.end()) bad("tools", "two tools are named '" + name + "'");
    names.push_back(name);
    if (function.contains("description") && !function["description"].is_string() && !function["description"].is_null()) {
      bad("tools", "'" + at + ".function.description' must be a string");
    }
    if (function.contains("parameters") && !function["parameters"].is_object() && !function["parameters"].is_null()) {
      bad("tools", "'" + at + ".function.parameters' must be a JSON Schema object");
    }
    if (function.contains("strict") && !function["strict"].is_boolean() && !function["strict"].is_null()) {
      bad("tools", "'" + at + ".function.strict' must be a boolean");
    }
  }
  return tools;
}

ToolChoice parse_tool_choice(const json& choice, const std::vector<std::string>& names) {
  ToolChoice out;
  if (choice.is_string()) {
    const std::string mode = choice;
    if (mode == "auto") out.mode = ToolChoice::Mode::Auto;
    else if (mode == "none") out.mode = ToolChoice::Mode::None;
    else if (mode == "required") out.mode = ToolChoice::Mode::Required;
    else bad("tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}, not '" + mode + "'");
  } else if (choice.is_object()) {
    if (!choice.contains("type") || choice["type"] != "function" || !choice.contains("function") || !choice["function"].is_object() ||
        !choice["function"].contains("name") || !choice["function"]["name"].is_string()) {
      bad("tool_choice", "'tool_choice' as an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    out.mode = ToolChoice::Mode::Function;
    out.function = choice["function"]["name"];
    if (std::find(names.begin(), names.end(), out.function) == names.end()) {
      bad("tool_choice", "'tool_choice' names the function '" + out.function + "', which is not among 'tools'");
    }
  } else {
    bad("tool_choice", "'tool_choice' must be a string or an object");
  }
  if ((out.mode == ToolChoice::Mode::Required) && names.empty()) bad("tool_choice", "'tool_choice' \"required\" needs 'tools'");
  return out;
}

// An assistant message's tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}],
// arguments as OpenAI sends them (a JSON string) or as an object (Hugging Face's form).
void check_tool_calls(const json& calls, const std::string& param) {
  if (!calls.is_array()) bad(param, "'" + param + "' must be an array");
  for (std::size_t k = 0; k < calls.size(); ++k) {
    const json& call = calls[k];
    const std::string at = param + "[" + std::to_string(k) + "]";
    if (!call.is_object()) bad(param, "'" + at + "' must be an object");
    if (call.contains("id") && !call["id"].is_string()) bad(param, "'" + at + ".id' must be a string");
    if (call.contains("type") && call["type"] != "function") bad(param, "'" + at + ".type' must be \"function\"");
    if (!call.contains("function") || !call["function"].is_object()) bad(param, "'" + at + ".function' must be an object");
    const json& function = call["function"];
    if (!function.contains("name") || !function["name"].is_string()) bad(param, "'" + at + ".function.name' must be a string");
    if (function.contains("arguments") && !function["arguments"].is_string() && !function["arguments"].is_object()) {
      bad(param, "'" + at + ".function.arguments' must be a JSON string (or an object)");
    }
  }
}

}  // namespace

std::vector<std::string> ApiRequest::tool_names() const {
  std::vector<std::string> names;
  for (const json& tool : tools) names.push_back(tool["function"]["name"]);
  return names;
}

SamplingParams ApiRequest::sampling() const {
  SamplingParams s;
  s.temperature = temperature;
  s.top_k = top_k;
  s.top_p = top_p;
  s.min_p = min_p;
  s.presence_penalty = presence_penalty;
  s.frequency_penalty = frequency_penalty;
  s.repeat_last_n = -1;  // OpenAI's penalties count the whole output
  return s;
}

ApiRequest parse_api_request(std::string_view body, bool chat) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {  // syntax errors, and numbers beyond double's range
    bad("", std::string("the request body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) bad("", "the request body must be a JSON object");

  ApiRequest r;
  r.chat = chat;
  r.model = text(j, "model");
  if (chat) {
    const json* messages = field(j, "messages");
    if (!messages) bad("messages", "'messages' is required");
    if (!messages->is_array() || messages->empty()) bad("messages", "'messages' must be a non-empty array");
    r.messages = json::array();
    for (std::size_t i = 0; i < messages->size(); ++i) {
      const json& m = (*messages)[i];
      const std::string param = "messages[" + std::to_string(i) + "]";
      if (!m.is_object()) bad(param, "'" + param + "' must be an object");
      if (!m.contains("role") || !m["role"].is_string()) bad(param + ".role", "'" + param + ".role' must be a string");
      const std::string role = m["role"];
      if (role != "system" && role != "user" && role != "assistant" && role != "tool" && role != "developer") {
        bad(param + ".role", "unknown role '" + role + "'; use system, developer, user, assistant or tool");
      }
      json out = m;
      out["role"] = role == "developer" ? "system" : role;
      const json content = m.contains("content") ? m["content"] : json(nullptr);
      const bool has_calls = role == "assistant" && m.contains("tool_calls") && !m["tool_calls"].is_null();
      if (has_calls) {
        check_tool_calls(m["tool_calls"], param + ".tool_calls");
        if (m["tool_calls"].empty()) out.erase("tool_calls");  // templates test `if message.tool_calls` or `is defined`
      } else {
        out.erase("tool_calls");
      }
      // Null content beside tool calls stays null, as OpenAI sends it and as Hugging Face passes it
      // on (ChatTemplate::adapt_messages gives "" to templates that cannot take null).
      out["content"] = has_calls && content.is_null() ? json(nullptr) : json(content_text(content, i));
      if (role == "tool") {
        if (!m.contains("tool_call_id") || !m["tool_call_id"].is_string()) {
          bad(param + ".tool_call_id", "'" + param + ".tool_call_id' must be the string id of the call this message answers");
        }
      }
      r.messages.push_back(std::move(out));
    }
  } else {
    const json* prompt = field(j, "prompt");
    if (!prompt) bad("prompt", "'prompt' is required");
    if (prompt->is_string()) {
      r.prompts.push_back(prompt->get<std::string>());
    } else if (prompt->is_array() && !prompt->empty()) {
      for (const json& p : *prompt) {
        if (!p.is_string()) bad("prompt", "'prompt' must be a string or an array of strings (token-id prompts are not supported)");
        r.prompts.push_back(p.get<std::string>());
      }
    } else {
      bad("prompt", "'prompt' must be a string or a non-empty array of strings");
    }
    r.echo = boolean(j, "echo", false);
    if (r.echo) bad("echo", "'echo' is not supported");
  }

  r.stream = boolean(j, "stream", false);
  if (const json* so = field(j, "stream_options")) {
    if (!so->is_object()) bad("stream_options", "'stream_options' must be an object");
    r.include_usage = boolean(*so, "include_usage", false);
  }
  constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();
  if (auto v = integer(j, "max_completion_tokens", 1, kIntMax)) r.max_tokens = static_cast<int>(*v);
  if (auto v = integer(j, "max_tokens", 1, kIntMax)) r.max_tokens = static_cast<int>(*v);
  if (!chat && !r.max_tokens) r.max_tokens = 16;  // the completions API's documented default
  // Absent fields keep ApiRequest's defaults.
  r.temperature = static_cast<float>(number(j, "temperature", 0.0, 2.0, r.temperature));
  r.top_p = static_cast<float>(number(j, "top_p", 0.0, 1.0, r.top_p));
  r.top_k = static_cast<int>(integer(j, "top_k", 0, kIntMax).value_or(r.top_k));
  r.min_p = static_cast<float>(number(j, "min_p", 0.0, 1.0, r.min_p));
  if (const json* s = field(j, "seed")) {
    if (!s->is_number_integer()) bad("seed", "'seed' must be an integer");
    r.seed = s->is_number_unsigned() ? s->get<std::uint64_t>() : static_cast<std::uint64_t>(s->get<std::int64_t>());
  }
  if (const json* s = field(j, "stop")) {
    if (s->is_string()) {
      r.stop.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      for (const json& x : *s) {
        if (!x.is_string()) bad("stop", "'stop' must be a string or an array of strings");
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      bad("stop", "'stop' must be a string or an array of strings");
    }
    if (r.stop.size() > 16) bad("stop", "at most 16 stop sequences are supported");
    for (const auto& x : r.stop) {
      if (x.empty()) bad("stop", "stop sequences must not be empty");
    }
  }
  r.presence_penalty = static_cast<float>(number(j, "presence_penalty", -2.0, 2.0, r.presence_penalty));
  r.frequency_penalty = static_cast<float>(number(j, "frequency_penalty", -2.0, 2.0, r.frequency_penalty));
  if (const json* lb = field(j, "logit_bias")) {
    if (!lb->is_object()) bad("logit_bias", "'logit_bias' must be an object of token id -> bias");
    for (const auto& [key, value] : lb->items()) {
      std::size_t used = 0;
      long id = -1;
      try {
        id = std::stol(key, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != key.size() || id < 0 || id > std::numeric_limits<std::int32_t>::max()) {
        bad("logit_bias", "logit_bias keys must be token ids, not '" + key + "'");
      }
      if (!value.is_number() || !std::isfinite(value.get<double>()) || std::fabs(value.get<double>()) > 100) {
        bad("logit_bias", "logit_bias values must be numbers between -100 and 100");
      }
      r.logit_bias.emplace_back(static_cast<std::int32_t>(id), value.get<float>());
    }
  }
  if (chat) {
    const bool logprobs = boolean(j, "logprobs", false);
    const auto top = integer(j, "top_logprobs", 0, 20);
    if (top && !logprobs) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    if (logprobs) r.top_logprobs = static_cast<int>(top.value_or(0));
  } else if (auto lp = integer(j, "logprobs", 0, 5)) {
    r.top_logprobs = static_cast<int>(*lp);
  }
  r.n = static_cast<int>(integer(j, "n", 1, kMaxChoices).value_or(1));
  if (static_cast<std::size_t>(r.n) * std::max<std::size_t>(1, r.prompts.size()) > kMaxChoices)
    bad("n", "at most " + std::to_string(kMaxChoices) + " choices per request (prompts x n)");
  parse_structured_output(j, r);
  r.user = text(j, "user");
  r.priority = static_cast<int>(integer(j, "priority", -1000000, 1000000).value_or(0));
  r.timeout_s = number(j, "timeout", 0.0, 86400.0 * 365, 0.0);
  r.ignore_eos = boolean(j, "ignore_eos", false);
  r.speculative = boolean(j, "speculative", true);
  if (const json* tools = field(j, "tools")) {
    if (!chat) bad("tools", "'tools' is only for /v1/chat/completions");
    r.tools = parse_tools(*tools);
  }
  if (const json* choice = field(j, "tool_choice")) {
    if (!chat) bad("tool_choice", "'tool_choice' is only for /v1/chat/completions");
    r.tool_choice = parse_tool_choice(*choice, r.tool_names());
  }
  r.parallel_tool_calls = boolean(j, "parallel_tool_calls", true);
  if (const json* kw = field(j, "chat_template_kwargs")) {
    if (!kw->is_object()) bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    r.chat_template_kwargs = *kw;
  }
  return r;
}

}  // namespace promptly::server
