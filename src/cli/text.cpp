// `promptly tokenize` and `promptly template`: the text side of a model, inspectable on its own.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "chat/chat_template.h"
#include "cli/commands.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/file_io.h"

namespace promptly::cli {
namespace {

void print_warnings(const Vocab& v) {
  for (const auto& w : v.warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
}

}  // namespace

int tokenize(const TokenizeOptions& o) {
  const Tokenizer tok = Tokenizer::from_file(o.model);
  print_warnings(tok.vocab());
  const auto ids = tok.encode(o.text, !o.no_bos, o.parse_special);
  std::printf("%s\n", nlohmann::json(ids).dump().c_str());
  return 0;
}

int render_template(const TemplateOptions& o) {
  std::string source;
  std::string bos, eos;
  if (!o.model.empty()) {
    const Tokenizer tok = Tokenizer::from_file(o.model);
    print_warnings(tok.vocab());
    source = tok.vocab().chat_template;
    if (tok.vocab().bos >= 0) bos = tok.vocab().tokens[static_cast<std::size_t>(tok.vocab().bos)];
    if (tok.vocab().eos >= 0) eos = tok.vocab().tokens[static_cast<std::size_t>(tok.vocab().eos)];
  }
  if (!o.template_file.empty()) source = read_file(o.template_file, "chat template");
  if (source.empty()) {
    if (!o.model.empty()) std::fprintf(stderr, "note: the model has no chat template; using ChatML\n");
    source = ChatTemplate::chatml_source();
  }
  if (o.bos_token) bos = *o.bos_token;
  if (o.eos_token) eos = *o.eos_token;

  nlohmann::ordered_json messages;
  try {
    messages = nlohmann::ordered_json::parse(read_file(o.messages_file, "messages file"));
  } catch (const nlohmann::json::exception& e) {
    throw Error("messages file '" + o.messages_file + "' is not valid JSON: " + e.what());
  }
  ChatRenderOptions opts;
  opts.add_generation_prompt = o.add_generation_prompt;
  opts.bos_token = bos;
  opts.eos_token = eos;
  try {
    const std::string text = ChatTemplate(source).render(messages, opts);
    std::fwrite(text.data(), 1, text.size(), stdout);
  } catch (const jinja::RaisedException& e) {
    throw Error(std::string("the chat template rejected the conversation: ") + e.what());
  }
  return 0;
}

}  // namespace promptly::cli
