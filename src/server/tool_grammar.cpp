#include "server/tool_grammar.h"

#include "grammar/json_schema.h"

namespace promptly::server {

namespace {
// Parallel calls stop somewhere: a grammar that always finishes (see grammar/json_schema.h).
constexpr int kMaxParallelCalls = 16;
}  // namespace

std::string tool_call_grammar(const ToolCallSyntax& syntax, const nlohmann::ordered_json& tools, const ToolChoice& choice, bool parallel) {
  using grammar::GbnfBuilder;
  GbnfBuilder b;
  auto lit = [](const std::string& text) { return text.empty() ? std::string() : GbnfBuilder::literal(text) + " "; };
  std::string calls;
  for (const auto& tool : tools) {
    const auto& fn = tool["function"];
    const std::string name = fn["name"].get<std::string>();
    if (choice.mode == ToolChoice::Mode::Function && name != choice.function) continue;
    const nlohmann::ordered_json parameters =
        fn.contains("parameters") && !fn["parameters"].is_null() ? fn["parameters"] : nlohmann::ordered_json{{"type", "object"}};
    const std::string args = b.add_schema(parameters, "args-" + name);
    std::string body;
    if (syntax.name_before_arguments) {
      body = lit(name) + lit(syntax.name_arguments_separator) + args;
    } else {
      body = "\"{\" ws " + GbnfBuilder::literal("\"name\"") + " ws \":\" ws " + GbnfBuilder::literal(nlohmann::ordered_json(name).dump()) +
             " ws \",\" ws " + GbnfBuilder::literal(nlohmann::ordered_json(syntax.arguments_key).dump()) + " ws \":\" ws " + args + " ws \"}\"";
    }
    const std::string call = b.add_rule("call-" + name, lit(syntax.call_begin) + body + " " + lit(syntax.call_end) + "\"\"");
    calls += (calls.empty() ? "" : " | ") + call;
  }
  const std::string any_call = b.add_rule("tool-call", calls);
  const bool several = parallel && syntax.max_calls != 1;
  std::string more;
  if (several) more = "( " + lit(syntax.call_separator) + any_call + " ){0," + std::to_string(kMaxParallelCalls - 1) + "}";
  std::string root = any_call + " " + more;
  if (syntax.calls_in_json_array) root = lit(syntax.array_begin) + root + " " + lit(syntax.array_end);
  return b.grammar(root);
}

}  // namespace promptly::server
