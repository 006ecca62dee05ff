// libFuzzer target: any template source must parse and render to a result or a TemplateError within
// the interpreter's budgets: never a crash, hang or sanitizer report.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "chat/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const auto messages = nlohmann::ordered_json::parse(
      R"([{"role":"system","content":"S"},{"role":"user","content":"Hi \"there\""},{"role":"assistant","content":"<think>x</think>ok"}])");
  try {
    promptly::ChatTemplate t(std::string(reinterpret_cast<const char*>(data), size));
    promptly::ChatRenderOptions opts;
    opts.bos_token = "<s>";
    opts.now = 0;
    (void)t.render(messages, opts);
  } catch (const promptly::jinja::TemplateError&) {
  }
  return 0;
}
