// Tool calls: each template's format, its own rendering of a call parsed back, streaming equal to the
// whole parse, near misses left as content, and conversations with tools rendered by every template.
#include "chat/tool_calls.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "chat/chat_template.h"

namespace promptly {
namespace {

using json = nlohmann::ordered_json;

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
   "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City"},
                  "days": {"type": "integer", "description": "Days"}}, "required": ["city"]}}},
  {"type": "function", "function": {"name": "get_time", "description": "Time in a city",
   "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City"}}}}}])");

std::string template_source(const std::string& name) { return test::read_file(test::shared_model("templates/" + name)); }

ToolCallOptions options_for(ToolCallFormat format) {
  ToolCallOptions o;
  o.format = format;
  o.tool_names = {"get_weather", "get_time"};
  return o;
}

json call(const std::string& name, const std::string& arguments) {
  return {{"id", "abc123XYZ"}, {"type", "function"}, {"function", {{"name", name}, {"arguments", arguments}}}};
}

// What the model generates for an assistant turn with `calls`, as the template itself writes that
// turn: the rendering with the turn minus the rendering up to the generation prompt, without the
// end-of-turn marker the model stops on.
std::string generated_turn(const std::string& template_name, const json& calls) {
  const ChatTemplate tmpl(template_source(template_name));
  ChatRenderOptions opts;
  opts.bos_token = "<s>";
  opts.eos_token = "</s>";
  opts.now = 1736942400;
  opts.extra["tools"] = kTools;
  const json user = json::array({{{"role", "user"}, {"content", "Weather in Paris?"}}});
  json with_turn = user;
  with_turn.push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", calls}});
  const std::string prompt = tmpl.render(tmpl.adapt_messages(user), opts);
  opts.add_generation_prompt = false;
  std::string full = tmpl.render(tmpl.adapt_messages(with_turn), opts);
  EXPECT_EQ(full.rfind(prompt, 0), 0u) << template_name << ": the turn does not extend the prompt";
  std::string turn = full.substr(prompt.size());
  for (const std::string end : {"<|im_end|>\n", "<|eot_id|>", "</s>"}) {
    if (turn.ends_with(end)) turn.resize(turn.size() - end.size());
  }
  return turn;
}

TEST(ToolCalls, EachTemplateHasItsFormat) {
  const std::map<std::string, ToolCallFormat> expected = {
      {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", ToolCallFormat::Hermes},
      {"Qwen-Qwen2.5-7B-Instruct.jinja", ToolCallFormat::Hermes},
      {"Qwen-Qwen3-0.6B.jinja", ToolCallFormat::Hermes},
      {"meta-llama-Llama-3.1-8B-Instruct.jinja", ToolCallFormat::Llama3Json},
      {"meta-llama-Llama-3.2-3B-Instruct.jinja", ToolCallFormat::Llama3Json},
      {"mistralai-Mistral-Nemo-Instruct-2407.jinja", ToolCallFormat::MistralNemo},
      {"Mistral-Small-3.2-24B-Instruct-2506.jinja", ToolCallFormat::MistralArgs},
      {"google-gemma-2-2b-it.jinja", ToolCallFormat::Fallback},
      {"microsoft-Phi-3.5-mini-instruct.jinja", ToolCallFormat::Fallback},
      {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", ToolCallFormat::Fallback},
  };
  for (const auto& [name, format] : expected) {
    EXPECT_EQ(detect_tool_call_format(template_source(name)), format) << name;
  }
  EXPECT_EQ(detect_tool_call_format(ChatTemplate::chatml_source()), ToolCallFormat::Fallback);
  EXPECT_EQ(tool_call_syntax(ToolCallFormat::Llama3Json).arguments_key, "parameters");
  EXPECT_TRUE(tool_call_syntax(ToolCallFormat::MistralNemo).calls_in_json_array);
  EXPECT_EQ(tool_call_syntax(ToolCallFormat::MistralArgs).name_arguments_separator, "[ARGS]");
}

TEST(ToolCalls, TemplatesOwnRenderingOfACallParsesBack) {
  for (const std::string name : {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "Qwen-Qwen2.5-7B-Instruct.jinja",
                                 "Qwen-Qwen3-0.6B.jinja", "meta-llama-Llama-3.1-8B-Instruct.jinja",
                                 "meta-llama-Llama-3.2-3B-Instruct.jinja", "mistralai-Mistral-Nemo-Instruct-2407.jinja",
                                 "Mistral-Small-3.2-24B-Instruct-2506.jinja"}) {
    const ToolCallFormat format = detect_tool_call_format(template_source(name));
    const std::string turn = generated_turn(name, json::array({call("get_weather", R"({"city": "Paris", "days": 2})")}));
    const ParsedToolCalls parsed = parse_tool_calls(turn, options_for(format));
    ASSERT_EQ(parsed.calls.size(), 1u) << name << ": " << turn;
    // Qwen3 writes its (empty) reasoning before the call; it stays content.
    EXPECT_EQ(parsed.content.value_or("<null>"), name == "Qwen-Qwen3-0.6B.jinja" ? "<think>\n\n</think>" : "<null>") << name;
    EXPECT_EQ(parsed.calls[0].name, "get_weather");
    EXPECT_EQ(json::parse(parsed.calls[0].arguments), json::parse(R"({"city": "Paris", "days": 2})")) << name;
    EXPECT_EQ(parsed.calls[0].id.size(), format == ToolCallFormat::MistralNemo || format == ToolCallFormat::MistralArgs ? 9u : 29u);
  }
}

TEST(ToolCalls, SeveralCallsInTheTemplatesOwnRendering) {
  const json calls = json::array({call("get_weather", R"({"city": "Paris"})"), call("get_time", R"({"city": "Tokyo"})")});
  for (const std::string name : {"Qwen-Qwen2.5-7B-Instruct.jinja", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
                                 "mistralai-Mistral-Nemo-Instruct-2407.jinja", "Mistral-Small-3.2-24B-Instruct-2506.jinja"}) {
    const std::string turn = generated_turn(name, calls);
    ToolCallOptions options = options_for(detect_tool_call_format(template_source(name)));
    ParsedToolCalls parsed = parse_tool_calls(turn, options);
    ASSERT_EQ(parsed.calls.size(), 2u) << name << ": " << turn;
    EXPECT_EQ(parsed.calls[0].name, "get_weather");
    EXPECT_EQ(parsed.calls[1].name, "get_time");
    EXPECT_EQ(json::parse(parsed.calls[1].arguments), json::parse(R"({"city": "Tokyo"})"));
    EXPECT_NE(parsed.calls[0].id, parsed.calls[1].id);

    options.parallel = false;
    parsed = parse_tool_calls(turn, options);
    ASSERT_EQ(parsed.calls.size(), 1u) << name;
    EXPECT_EQ(parsed.calls[0].name, "get_weather");
  }
}

// Everything given out while streaming, in order: content joined, calls as they came.
struct Streamed {
  std::string content;
  std::vector<ToolCall> calls;
};

Streamed stream_in_pieces(std::string_view text, const ToolCallOptions& options, std::size_t piece, bool natural_end = true) {
  ToolCallParser parser(options);
  Streamed out;
  auto take = [&](const std::vector<ToolCallEvent>& events) {
    for (const ToolCallEvent& e : events) {
      if (e.call) {
        EXPECT_EQ(e.index, out.calls.size());
        out.calls.push_back(*e.call);
      } else {
        out.content += e.content;
      }
    }
  };
  for (std::size_t i = 0; i < text.size(); i += piece) take(parser.push(text.substr(i, piece)));
  take(parser.finish(natural_end));
  return out;
}

void expect_stream_equals_whole(std::string_view text, const ToolCallOptions& options, bool natural_end = true) {
  const ParsedToolCalls whole = parse_tool_calls(text, options, natural_end);
  for (std::size_t piece : {std::size_t{1}, std::size_t{2}, std::size_t{5}, text.size() + 1}) {
    const Streamed s = stream_in_pieces(text, options, piece, natural_end);
    EXPECT_EQ(s.content, whole.content.value_or("")) << "pieces of " << piece << ": " << text;
    ASSERT_EQ(s.calls.size(), whole.calls.size()) << "pieces of " << piece << ": " << text;
    for (std::size_t i = 0; i < s.calls.size(); ++i) {
      EXPECT_EQ(s.calls[i].name, whole.calls[i].name);
      EXPECT_EQ(s.calls[i].arguments, whole.calls[i].arguments);
    }
  }
}

TEST(ToolCalls, HermesNearMissesAreContent) {
  const ToolCallOptions o = options_for(ToolCallFormat::Hermes);
  const std::vector<std::string> near_misses = {
      "<tool_call>\n{not json}\n</tool_call>",
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}\n</tool_call>",  // unbalanced
      "<tool_call>\n{\"city\": \"Paris\"}\n</tool_call>",                                            // not a call
      "<tool_call>\n{\"name\": \"launch_rocket\", \"arguments\": {}}\n</tool_call>",                  // not a tool
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": 5}\n</tool_call>",                     // arguments not an object
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\nand then some prose",             // no closing tag
      "Wrap calls in <tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call> tags.",    // mid-line
      "The <tool_call> tag starts a call.\nA </tool_call> ends it.",
      "<tool_call> is how a call starts",
      "<tool_call",
  };
  for (const std::string& text : near_misses) {
    const ParsedToolCalls parsed = parse_tool_calls(text, o);
    EXPECT_TRUE(parsed.calls.empty()) << text;
    EXPECT_EQ(parsed.content.value_or("<null>"), text);
    expect_stream_equals_whole(text, o);
  }
}

TEST(ToolCalls, HermesContentAroundCallsAndEndings) {
  const ToolCallOptions o = options_for(ToolCallFormat::Hermes);
  const std::string valid = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  ParsedToolCalls p = parse_tool_calls("Let me check.\n" + valid + "\n", o);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.content, "Let me check.");
  EXPECT_EQ(p.calls[0].arguments, R"({"city":"Paris"})");
  expect_stream_equals_whole("Let me check.\n" + valid + "\n", o);

  // EOS right after the object: the closing tag is all that is missing.
  const std::string unclosed = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"city\": \"Oslo\"}}";
  p = parse_tool_calls(unclosed, o, /*natural_end=*/true);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "get_time");
  // max_tokens inside a call: what was generated is content.
  const std::string cut = "<tool_call>\n{\"name\": \"get_weather\", \"argu";
  p = parse_tool_calls(cut, o, /*natural_end=*/false);
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, cut);
  expect_stream_equals_whole(cut, o, false);
  p = parse_tool_calls(unclosed, o, /*natural_end=*/false);
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, unclosed);

  // Arguments written as a JSON string are taken as they are.
  p = parse_tool_calls("<tool_call>\n{\"name\": \"get_time\", \"arguments\": \"{\\\"city\\\": \\\"Rome\\\"}\"}\n</tool_call>", o);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, R"({"city": "Rome"})");

  // A named tool_choice: calls to the other tool are content.
  ToolCallOptions only_time = o;
  only_time.tool_names = {"get_time"};
  p = parse_tool_calls(valid, only_time);
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, valid);

  // parallel_tool_calls false: the second call is content.
  ToolCallOptions single = o;
  single.parallel = false;
  p = parse_tool_calls(valid + "\n" + valid, single);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.content, valid);
  expect_stream_equals_whole(valid + "\n" + valid, single);
}

TEST(ToolCalls, StreamingHoldsBackOnlyWhatMayBeAMarker) {
  ToolCallParser parser(options_for(ToolCallFormat::Hermes));
  auto text_of = [](const std::vector<ToolCallEvent>& events) {
    std::string s;
    for (const auto& e : events) s += e.call ? "<CALL " + e.call->name + ">" : e.content;
    return s;
  };
  EXPECT_EQ(text_of(parser.push("It is")), "It is");
  EXPECT_EQ(text_of(parser.push(" sunny <tool")), " sunny <tool");  // mid-line: no call can start here
  EXPECT_EQ(text_of(parser.push(".\n<tool_")), ".");                 // line start: held
  EXPECT_EQ(text_of(parser.push("call>\n{\"name\": \"get_time\", ")), "");
  EXPECT_EQ(text_of(parser.push("\"arguments\": {}}\n</tool_call")), "");
  EXPECT_EQ(text_of(parser.push(">")), "<CALL get_time>");
  EXPECT_EQ(text_of(parser.finish(true)), "");
  EXPECT_EQ(parser.calls(), 1u);
}

TEST(ToolCalls, StreamedDeltasHaveOpenAIsShape) {
  ToolCallEvent e;
  e.index = 1;
  e.call = ToolCall{"call_x", "get_time", R"({"city":"Oslo"})"};
  const auto deltas = tool_call_event_deltas(e);
  ASSERT_EQ(deltas.size(), 2u);
  EXPECT_EQ(deltas[0], json::parse(R"({"tool_calls": [{"index": 1, "id": "call_x", "type": "function",
                                       "function": {"name": "get_time", "arguments": ""}}]})"));
  EXPECT_EQ(deltas[1], json::parse(R"({"tool_calls": [{"index": 1, "function": {"arguments": "{\"city\":\"Oslo\"}"}}]})"));
  ToolCallEvent text;
  text.content = "hi";
  EXPECT_EQ(tool_call_event_deltas(text), std::vector<json>{json::parse(R"({"content": "hi"})")});
  EXPECT_EQ(tool_call_json(*e.call), json::parse(R"({"id": "call_x", "type": "function",
                                                     "function": {"name": "get_time", "arguments": "{\"city\":\"Oslo\"}"}})"));
}

TEST(ToolCalls, Llama3CallIsTheWholeAnswer) {
  const ToolCallOptions o = options_for(ToolCallFormat::Llama3Json);
  const std::string call_text = R"({"name": "get_weather", "parameters": {"city": "Paris"}})";
  ParsedToolCalls p = parse_tool_calls(call_text, o);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_FALSE(p.content);
  p = parse_tool_calls("<|python_tag|>" + std::string(R"({"name": "get_time", "arguments": {"city": "Oslo"}})"), o);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "get_time");
  for (const std::string& text : {std::string(R"({"answer": 42})"), call_text + " is how I would call it.",
                                  "Here it is: " + call_text, std::string("{\"name\": \"get_weather\", \"parameters\": {\"ci"),
                                  std::string("  plain words")}) {
    p = parse_tool_calls(text, o);
    EXPECT_TRUE(p.calls.empty()) << text;
    EXPECT_EQ(p.content, text);
    expect_stream_equals_whole(text, o);
  }
  expect_stream_equals_whole(call_text, o);
  // max_tokens right after the object: whether more was coming is unknown, so it is content.
  EXPECT_TRUE(parse_tool_calls(call_text, o, /*natural_end=*/false).calls.empty());
}

TEST(ToolCalls, MistralNearMisses) {
  const ToolCallOptions nemo = options_for(ToolCallFormat::MistralNemo);
  for (const std::string& text : {std::string("[TOOL_CALLS] are how I call tools"), std::string("[TOOL_CALLS][{\"name\": \"nope\", \"arguments\": {}}]"),
                                  std::string("[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {}}, 7]")}) {
    const ParsedToolCalls p = parse_tool_calls(text, nemo);
    EXPECT_TRUE(p.calls.empty()) << text;
    EXPECT_EQ(p.content, text);
    expect_stream_equals_whole(text, nemo);
  }
  const ToolCallOptions args = options_for(ToolCallFormat::MistralArgs);
  for (const std::string& text : {std::string("[TOOL_CALLS]get_time then more"), std::string("[TOOL_CALLS]get_time[ARGS]nope"),
                                  std::string("[TOOL_CALLS]unknown[ARGS]{}")}) {
    const ParsedToolCalls p = parse_tool_calls(text, args);
    EXPECT_TRUE(p.calls.empty()) << text;
    EXPECT_EQ(p.content, text);
    expect_stream_equals_whole(text, args);
  }
  const std::string two = "[TOOL_CALLS]get_time[ARGS]{\"city\": \"Oslo\"}[TOOL_CALLS]get_weather[ARGS]{}";
  const ParsedToolCalls p = parse_tool_calls(two, args);
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[1].arguments, "{}");
  expect_stream_equals_whole(two, args);
}

// Outputs stitched at random from call fragments and near misses, in every format: streamed in
// random pieces they parse as the whole text does, a text without calls comes back unchanged, and
// every call's arguments are a JSON object.
TEST(ToolCalls, RandomFragmentsStreamAsTheyParseWhole) {
  const std::vector<std::string> fragments = {
      "<tool_call>", "</tool_call>", "\n", " ", "{", "}", "[", "]", ",", ":", "\"name\"", "\"arguments\"",
      "\"parameters\"", "\"get_time\"", "\"nope\"", "\"city\"", "\"Oslo\"", "{\"city\": \"Oslo\"}", "5", "\\",
      "\"", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "get_time", "<|python_tag|>", "<tool", "_call>", "prose ",
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
      "[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {}}]", "[TOOL_CALLS]get_time[ARGS]{\"city\": \"Oslo\"}",
      "{\"name\": \"get_time\", \"parameters\": {}}"};
  const std::map<ToolCallFormat, std::string> valid_call = {
      {ToolCallFormat::Hermes, fragments[29]}, {ToolCallFormat::MistralNemo, fragments[30]},
      {ToolCallFormat::MistralArgs, fragments[31]}, {ToolCallFormat::Llama3Json, fragments[32]}};
  std::mt19937 rng(1234);
  for (ToolCallFormat format : {ToolCallFormat::Hermes, ToolCallFormat::Llama3Json, ToolCallFormat::MistralNemo,
                                ToolCallFormat::MistralArgs}) {
    int with_calls = 0;
    for (int round = 0; round < 400; ++round) {
      std::string text;
      const int n = 1 + static_cast<int>(rng() % 12);
      for (int k = 0; k < n; ++k) text += fragments[rng() % fragments.size()];
      if (round % 5 == 0) text = (rng() % 2 ? "" : "\n") + valid_call.at(format) + (rng() % 2 ? "" : "\n");  // a call alone
      ToolCallOptions options = options_for(format);
      options.parallel = rng() % 3 != 0;
      const bool natural_end = rng() % 4 != 0;
      const ParsedToolCalls whole = parse_tool_calls(text, options, natural_end);
      with_calls += !whole.calls.empty();
      if (whole.calls.empty()) {
        EXPECT_EQ(whole.content.value_or("<null>"), text) << tool_call_format_name(format);
      }
      if (!options.parallel) {
        EXPECT_LE(whole.calls.size(), 1u) << text;
      }
      for (const ToolCall& c : whole.calls) {
        EXPECT_TRUE(json::parse(c.arguments, nullptr, false).is_object()) << text;
        EXPECT_EQ(c.name, "get_time") << text;
      }
      const Streamed streamed = stream_in_pieces(text, options, 1 + rng() % 7, natural_end);
      EXPECT_EQ(streamed.content, whole.content.value_or("")) << tool_call_format_name(format) << ": " << text;
      EXPECT_EQ(streamed.calls.size(), whole.calls.size()) << tool_call_format_name(format) << ": " << text;
    }
    // Both kinds of output were tried.
    EXPECT_GT(with_calls, 50) << tool_call_format_name(format);
    EXPECT_LT(with_calls, 380) << tool_call_format_name(format);
  }
}

// How each template takes OpenAI's form of a call (arguments as a JSON string, content null).
TEST(ToolCalls, TemplateCapsFoundByProbing) {
  struct Expected {
    bool object_arguments, null_content, system_role;
  };
  const std::map<std::string, Expected> expected = {
      {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", {false, true, true}},
      {"Qwen-Qwen2.5-7B-Instruct.jinja", {true, true, true}},
      {"Qwen-Qwen3-0.6B.jinja", {false, false, true}},
      {"meta-llama-Llama-3.1-8B-Instruct.jinja", {true, true, true}},
      {"meta-llama-Llama-3.2-3B-Instruct.jinja", {true, true, true}},
      {"mistralai-Mistral-Nemo-Instruct-2407.jinja", {true, true, true}},
      {"Mistral-Small-3.2-24B-Instruct-2506.jinja", {true, true, true}},
      {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", {false, true, true}},
      {"google-gemma-2-2b-it.jinja", {false, true, false}},
      {"microsoft-Phi-3.5-mini-instruct.jinja", {false, false, true}},
  };
  for (const auto& [name, want] : expected) {
    const TemplateToolCaps caps = ChatTemplate(template_source(name)).tool_caps();
    EXPECT_EQ(caps.object_arguments, want.object_arguments) << name;
    EXPECT_EQ(caps.null_content, want.null_content) << name;
    EXPECT_EQ(caps.system_role, want.system_role) << name;
  }
}

// A client's round trip (string arguments, null content) adapted to each template renders exactly
// as Python Jinja2 renders the form that template takes (goldens from tools/render_chat_goldens.py).
TEST(ToolCalls, OpenAIRoundTripRendersAsTheTemplatesOwnForm) {
  const auto doc = json::parse(test::read_file(std::string(PROMPTLY_SOURCE_DIR) + "/tests/data/chat_templates/goldens.json"));
  const json& client_form = doc.at("conversations").at("tool_round_trip_string_arguments");
  auto golden = [&](const std::string& name, const std::string& conversation) -> std::string {
    for (const auto& c : doc.at("cases")) {
      if (c.at("template") == name && c.at("conversation") == conversation && c.at("add_generation_prompt") == true) {
        return c.value("output", "<error>");
      }
    }
    return "<missing>";
  };
  for (const auto& entry : std::filesystem::directory_iterator(test::shared_model("templates"))) {
    const std::string name = entry.path().filename().string();
    const ChatTemplate tmpl(template_source(name));
    ChatRenderOptions opts;
    opts.bos_token = doc.at("bos_token");
    opts.eos_token = doc.at("eos_token");
    opts.now = doc.at("now_utc").get<std::time_t>();
    opts.extra["tools"] = client_form.at("tools");
    const json messages = tmpl.adapt_messages(client_form.at("messages"));
    const TemplateToolCaps& caps = tmpl.tool_caps();
    const std::string expected_form = caps.object_arguments ? "tool_round_trip"
                                      : !caps.null_content  ? "tool_round_trip_empty_content"
                                                            : "tool_round_trip_string_arguments";
    const std::string want = golden(name, expected_form);
    if (want == "<error>") {  // Gemma: its template refuses a tool role, and says so
      EXPECT_THROW(tmpl.render(messages, opts), jinja::RaisedException) << name;
      continue;
    }
    std::string got;
    EXPECT_NO_THROW(got = tmpl.render(messages, opts)) << name;
    EXPECT_EQ(got, want) << name << " (as " << expected_form << ")";
  }
}

TEST(ToolCalls, FallbackDescribesToolsToTemplatesWithoutToolSyntax) {
  const json client_form = json::parse(R"([
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "clear"},
    {"role": "assistant", "content": "18 C and clear."},
    {"role": "user", "content": "Thanks"}])");
  for (const std::string name : {"google-gemma-2-2b-it.jinja", "microsoft-Phi-3.5-mini-instruct.jinja",
                                 "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"}) {
    const ChatTemplate tmpl(template_source(name));
    const json messages = tmpl.adapt_messages(fallback_tool_messages(client_form, kTools, tmpl.tool_caps().system_role));
    ChatRenderOptions opts;
    std::string text;
    EXPECT_NO_THROW(text = tmpl.render(messages, opts)) << name;
    EXPECT_NE(text.find("\"name\":\"get_weather\""), std::string::npos) << name << ": tools not described\n" << text;
    EXPECT_NE(text.find("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"), std::string::npos)
        << name << "\n" << text;
    EXPECT_NE(text.find("<tool_response>\n18 C\n</tool_response>\n<tool_response>\nclear\n</tool_response>"), std::string::npos)
        << name << "\n" << text;
  }
  // The system message a template takes gets the description appended.
  const json with_system = fallback_tool_messages(json::parse(R"([{"role": "system", "content": "Be brief."},
      {"role": "user", "content": "hi"}])"), kTools, true);
  ASSERT_EQ(with_system.size(), 2u);
  EXPECT_EQ(with_system[0]["content"].get<std::string>().rfind("Be brief.\n\n# Tools", 0), 0u);
}

}  // namespace
}  // namespace promptly
