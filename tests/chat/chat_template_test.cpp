#include "chat/chat_template.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "gguf/gguf.h"

namespace promptly {
namespace {

using nlohmann::ordered_json;

// Goldens come from tools/render_chat_goldens.py: Python Jinja2 3.1 configured as Hugging Face's
// apply_chat_template (trim_blocks, lstrip_blocks, loopcontrols, HF's tojson, documents=None, tools only when given).
TEST(ChatTemplate, EveryTemplateMatchesPythonJinja2ByteForByte) {
  const auto doc = ordered_json::parse(test::read_file(std::string(PROMPTLY_SOURCE_DIR) + "/tests/data/chat_templates/goldens.json"));
  int checked = 0;
  for (const auto& c : doc.at("cases")) {
    const std::string name = c.at("template");
    std::string source;
    if (name.ends_with(".gguf")) {
      source = *gguf::File::open(test::shared_model("vocab/" + name))->get_string("tokenizer.chat_template");
    } else {
      source = test::read_file(test::shared_model("templates/" + name));
    }
    const auto& conv = doc.at("conversations").at(c.at("conversation").get<std::string>());
    ChatRenderOptions opts;
    opts.add_generation_prompt = c.at("add_generation_prompt");
    opts.bos_token = doc.at("bos_token");
    opts.eos_token = doc.at("eos_token");
    opts.now = doc.at("now_utc").get<std::time_t>();
    if (conv.contains("tools")) opts.extra["tools"] = conv.at("tools");
    const std::string label = name + " / " + c.at("conversation").get<std::string>() + (opts.add_generation_prompt ? " +gen" : "");
    const ChatTemplate tmpl(source);
    if (c.contains("output")) {
      std::string got;
      EXPECT_NO_THROW(got = tmpl.render(conv.at("messages"), opts)) << label;
      EXPECT_EQ(got, c.at("output").get<std::string>()) << label;
    } else {
      const std::string err = c.at("error");
      if (err.rfind("TemplateError: ", 0) == 0) {  // the template's own raise_exception
        try {
          tmpl.render(conv.at("messages"), opts);
          ADD_FAILURE() << label << ": expected the template to raise '" << err << "'";
        } catch (const jinja::RaisedException& e) {
          EXPECT_EQ(std::string("TemplateError: ") + e.what(), err) << label;
        }
      } else {
        EXPECT_THROW(tmpl.render(conv.at("messages"), opts), jinja::TemplateError) << label << " (Python: " << err << ")";
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, 176);
}

TEST(ChatTemplate, ChatmlFallback) {
  const ChatTemplate t(ChatTemplate::chatml_source());
  ChatRenderOptions opts;
  const auto msgs = ordered_json::parse(R"([{"role":"system","content":"S"},{"role":"user","content":"hi"}])");
  EXPECT_EQ(t.render(msgs, opts), "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  opts.add_generation_prompt = false;
  EXPECT_EQ(t.render(msgs, opts), "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n");
  EXPECT_THROW(t.render(ordered_json::object(), opts), jinja::TemplateError);
}

}  // namespace
}  // namespace promptly
