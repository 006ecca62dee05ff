#include "chat/chat_template.h"

#include <optional>

namespace promptly {

ChatTemplate::ChatTemplate(const std::string& source)
    : source_(source), template_(std::make_shared<jinja::Template>(source)), caps_(probe_tool_caps()) {}

namespace {

using json = nlohmann::ordered_json;

constexpr const char* kProbeArguments = R"({"probe_key": "probe_value"})";

json probe_conversation(const json& content, const json& arguments) {
  json call = {{"id", "abc123XYZ"},  // nine alphanumerics: Mistral's templates refuse other ids
               {"type", "function"},
               {"function", {{"name", "probe_tool"}, {"arguments", arguments}}}};
  return json::array({{{"role", "user"}, {"content", "probe"}},
                      {{"role", "assistant"}, {"content", content}, {"tool_calls", json::array({call})}}});
}

}  // namespace

TemplateToolCaps ChatTemplate::probe_tool_caps() const {
  ChatRenderOptions options;
  options.add_generation_prompt = false;
  options.now = 0;
  options.extra["tools"] = json::array({{{"type", "function"},
                                         {"function", {{"name", "probe_tool"}, {"description", "probe"},
                                                       {"parameters", {{"type", "object"}, {"properties", json::object()}}}}}}});
  auto try_render = [&](const json& messages) -> std::optional<std::string> {
    try {
      return render(messages, options);
    } catch (const std::exception&) {
      return std::nullopt;
    }
  };
  // The key with its quotes unescaped: the arguments reached the prompt as JSON, not as a string literal.
  auto shows_arguments = [](const std::optional<std::string>& text) { return text && text->find("\"probe_key\"") != std::string::npos; };
  const json object_arguments = json::parse(kProbeArguments);
  TemplateToolCaps caps;
  caps.null_content = try_render(probe_conversation(nullptr, object_arguments)).has_value() ||
                      try_render(probe_conversation(nullptr, kProbeArguments)).has_value();
  const json content = caps.null_content ? json(nullptr) : json("");
  caps.object_arguments = shows_arguments(try_render(probe_conversation(content, object_arguments))) &&
                          !shows_arguments(try_render(probe_conversation(content, kProbeArguments)));
  caps.system_role = try_render(json::array({{{"role", "system"}, {"content", "probe"}}, {{"role", "user"}, {"content", "probe"}}})).has_value();
  return caps;
}

json ChatTemplate::adapt_messages(const json& messages) const {
  json out = messages;
  if (!out.is_array()) return out;
  for (json& m : out) {
    if (!m.is_object()) continue;
    if (m.contains("content") && m["content"].is_null() && !caps_.null_content) m["content"] = "";
    if (!caps_.object_arguments || !m.contains("tool_calls") || !m["tool_calls"].is_array()) continue;
    for (json& call : m["tool_calls"]) {
      if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) continue;
      const auto found = call["function"].find("arguments");
      if (found == call["function"].end() || !found->is_string()) continue;
      json& arguments = *found;
      // Arguments that are not JSON stay the string they are: the template shows what it can.
      json parsed = json::parse(arguments.get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (!parsed.is_discarded()) arguments = std::move(parsed);
    }
  }
  return out;
}

const std::string& ChatTemplate::chatml_source() {
  static const std::string kChatml =
      "{%- for message in messages %}"
      "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
      "{%- endfor %}"
      "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
  return kChatml;
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, const ChatRenderOptions& options) const {
  if (!messages.is_array()) throw jinja::TemplateError("messages must be a JSON array of {\"role\", \"content\"} objects");
  jinja::Dict globals;
  if (options.extra.is_object()) {
    for (const auto& [k, v] : options.extra.items()) globals.set(k, jinja::Value::from_json(v));
  }
  // `tools` stays undefined without tools (as in llama.cpp's server): transformers passes None, on
  // which templates that loop over tools unguarded (Hermes-3's tool_use) fail, and every template
  // that tests tools (`if tools`, `tools is not none`, `tools is defined`) reads undefined as none.
  if (!globals.find("documents")) globals.set("documents", jinja::Value::none());
  globals.set("messages", jinja::Value::from_json(messages));
  globals.set("add_generation_prompt", jinja::Value::boolean(options.add_generation_prompt));
  globals.set("bos_token", jinja::Value::string(options.bos_token));
  globals.set("eos_token", jinja::Value::string(options.eos_token));
  const std::time_t now = options.now.value_or(std::time(nullptr));
  globals.set("strftime_now", jinja::Value::function([now](const jinja::CallArgs& a) {
    const std::string fmt = a.positional.empty() ? "%Y-%m-%d" : a.positional[0].str();
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[256];
    const std::size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
    return jinja::Value::string(std::string(buf, n));
  }));
  return template_->render(globals);
}

}  // namespace promptly
