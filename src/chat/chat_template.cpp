#include "chat/chat_template.h"

namespace promptly {

ChatTemplate::ChatTemplate(const std::string& source)
    : source_(source), template_(std::make_shared<jinja::Template>(source)) {}

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
