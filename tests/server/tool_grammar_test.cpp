// tool_choice required / named: whatever path a model takes through the call grammar, the text
// parses back into calls of the offered tools with arguments of the right shape, in every format.
#include "server/tool_grammar.h"

#include <gtest/gtest.h>

#include <random>

#include "grammar/compile.h"
#include "grammar/gbnf.h"
#include "grammar/matcher.h"

namespace promptly::server {
namespace {

using json = nlohmann::ordered_json;

// Whole-byte tokens plus a few multi-byte ones, so walks cross rule ends inside tokens.
std::shared_ptr<const grammar::TokenBytes> walk_vocab() {
  std::vector<std::string> pieces;
  for (int b = 0; b < 256; ++b) pieces.push_back(std::string(1, static_cast<char>(b)));
  for (const char* p : {"{\"", "\":", "\", \"", "}\n", "\"}", "<tool_call>", "[TOOL_CALLS]", "[ARGS]", "\"name\"", " {", "}}"}) pieces.push_back(p);
  pieces.push_back("<eos>");
  std::vector<bool> excluded(pieces.size(), false);
  excluded.back() = true;
  return std::make_shared<grammar::TokenBytes>(pieces, excluded, std::vector<std::int32_t>{static_cast<std::int32_t>(pieces.size() - 1)});
}

std::string walk(const std::shared_ptr<const grammar::GrammarIndex>& index, std::mt19937& rng) {
  grammar::Matcher m(index);
  std::vector<std::uint32_t> mask(index->mask_words());
  std::string text;
  for (int step = 0; step < 3000; ++step) {
    if (m.can_end() && rng() % 3 == 0) return text;
    m.fill_mask(mask.data());
    std::vector<std::int32_t> allowed;
    for (std::size_t t = 0; t < index->vocab().size(); ++t)
      if ((mask[t / 32] >> (t % 32)) & 1) allowed.push_back(static_cast<std::int32_t>(t));
    EXPECT_FALSE(allowed.empty());
    if (allowed.empty()) return text;
    const std::int32_t pick = allowed[rng() % allowed.size()];
    if (pick == static_cast<std::int32_t>(index->vocab().size() - 1)) return text;
    EXPECT_TRUE(m.accept(pick));
    text += index->vocab().piece(pick);
  }
  ADD_FAILURE() << "the walk did not end: " << text;
  return text;
}

TEST(ToolGrammar, EveryWalkParsesIntoCallsOfTheOfferedToolsInEveryFormat) {
  const json tools = json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6}, "unit": {"enum": ["C", "F"]}}, "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "ping"}}])");
  const auto vocab = walk_vocab();
  std::mt19937 rng(11);
  for (ToolCallFormat format : {ToolCallFormat::Hermes, ToolCallFormat::Llama3Json, ToolCallFormat::MistralNemo, ToolCallFormat::MistralArgs, ToolCallFormat::Fallback}) {
    for (const ToolChoice& choice : {ToolChoice{ToolChoice::Mode::Required, ""}, ToolChoice{ToolChoice::Mode::Function, "get_weather"}}) {
      for (bool parallel : {true, false}) {
        const std::string gbnf = tool_call_grammar(tool_call_syntax(format), tools, choice, parallel);
        auto index = std::make_shared<grammar::GrammarIndex>(grammar::compile(grammar::parse_gbnf(gbnf)), vocab);
        ToolCallOptions options;
        options.format = format;
        options.tool_names = {"get_weather", "ping"};
        options.parallel = parallel;
        for (int i = 0; i < 8; ++i) {
          const std::string text = walk(index, rng);
          const ParsedToolCalls parsed = parse_tool_calls(text, options);
          ASSERT_GE(parsed.calls.size(), 1u) << tool_call_format_name(format) << ": " << text;
          if (!parallel || tool_call_syntax(format).max_calls == 1) {
            EXPECT_EQ(parsed.calls.size(), 1u) << text;
          }
          for (const ToolCall& call : parsed.calls) {
            if (choice.mode == ToolChoice::Mode::Function) {
              EXPECT_EQ(call.name, "get_weather") << text;
            }
            const json args = json::parse(call.arguments);
            ASSERT_TRUE(args.is_object()) << text;
            if (call.name == "get_weather") {
              EXPECT_TRUE(args["city"].is_string()) << text;
              EXPECT_TRUE(args["unit"] == "C" || args["unit"] == "F") << text;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace promptly::server
