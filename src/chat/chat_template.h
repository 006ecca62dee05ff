#pragma once
// Chat formatting: a model's Jinja chat template rendered the way Hugging Face's
// apply_chat_template renders it, with a ChatML fallback for models that carry none.
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "chat/jinja.h"

namespace promptly {

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  std::string bos_token;
  std::string eos_token;
  // Extra top-level variables (tools, enable_thinking, ...), as a JSON object.
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  // The time strftime_now() reports; the current local time when unset.
  std::optional<std::time_t> now;
};

// How a template takes the tool-call parts of a conversation, which its source does not declare:
// found by rendering a probe conversation once, as llama.cpp's minja does.
struct TemplateToolCaps {
  // It writes a call's arguments with `tojson` (Qwen, Llama 3, Mistral), so OpenAI's JSON-string
  // arguments must become an object, or the prompt would show an escaped string.
  bool object_arguments = false;
  // It takes an assistant message whose content is null beside its tool calls (Qwen3 and Phi-3 fail
  // on null; DeepSeek-R1 renders the calls only when content is null).
  bool null_content = true;
  // It accepts a system message (Gemma raises on one).
  bool system_role = true;
};

class ChatTemplate {
 public:
  // Parses the template; throws jinja::TemplateError for syntax it cannot handle.
  explicit ChatTemplate(const std::string& source);

  // The ChatML format (<|im_start|>role\ncontent<|im_end|>\n), used when a model has no template.
  static const std::string& chatml_source();

  // `messages`: an OpenAI-style array of {"role", "content", ...} objects. Throws
  // jinja::RaisedException when the template rejects the conversation, TemplateError on other failures.
  std::string render(const nlohmann::ordered_json& messages, const ChatRenderOptions& options) const;

  // The messages as this template can take them (see TemplateToolCaps): apply before render().
  nlohmann::ordered_json adapt_messages(const nlohmann::ordered_json& messages) const;

  const TemplateToolCaps& tool_caps() const { return caps_; }
  const std::string& source() const { return source_; }

 private:
  TemplateToolCaps probe_tool_caps() const;

  std::string source_;
  std::shared_ptr<jinja::Template> template_;
  TemplateToolCaps caps_;
};

}  // namespace promptly
