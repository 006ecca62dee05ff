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

class ChatTemplate {
 public:
  // Parses the template; throws jinja::TemplateError for syntax it cannot handle.
  explicit ChatTemplate(const std::string& source);

  // The ChatML format (<|im_start|>role\ncontent<|im_end|>\n), used when a model has no template.
  static const std::string& chatml_source();

  // `messages`: an OpenAI-style array of {"role", "content", ...} objects. Throws
  // jinja::RaisedException when the template rejects the conversation, TemplateError on other failures.
  std::string render(const nlohmann::ordered_json& messages, const ChatRenderOptions& options) const;

  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::shared_ptr<jinja::Template> template_;
};

}  // namespace promptly
