// The OpenAI request parser: what it accepts, and the 400s (with the parameter named) for the rest.
#include "server/api.h"

#include <gtest/gtest.h>

#include "../test_util.h"
#include "metrics/metrics.h"
#include "server/server.h"

namespace promptly::server {
namespace {

TEST(Api, ParsesAChatRequestWithEveryParameter) {
  const ApiRequest r = parse_api_request(R"({"model": "m", "messages": [{"role": "developer", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}],
      "stream": true, "stream_options": {"include_usage": true}, "max_completion_tokens": 7, "temperature": 0.5,
      "top_p": 0.9, "top_k": 20, "min_p": 0.1, "seed": 42, "stop": "END", "presence_penalty": 0.5,
      "frequency_penalty": -0.5, "logit_bias": {"15": -100, "7": 2.5}, "logprobs": true, "top_logprobs": 4,
      "n": 1, "user": "u1", "priority": 3, "timeout": 2.5, "ignore_eos": true, "unknown_field": {"ignored": 1}})",
                                         true);
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0]["role"], "system");  // developer is the system role of newer models
  EXPECT_EQ(r.messages[1]["content"], "hi there");
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.temperature, 0.5f);
  EXPECT_EQ(r.top_k, 20);
  EXPECT_EQ(r.seed, 42u);
  EXPECT_EQ(r.stop, std::vector<std::string>{"END"});
  ASSERT_EQ(r.logit_bias.size(), 2u);
  EXPECT_EQ(r.logit_bias[0].first, 15);
  EXPECT_EQ(r.top_logprobs, 4);
  EXPECT_EQ(r.priority, 3);
  EXPECT_DOUBLE_EQ(r.timeout_s, 2.5);
  EXPECT_TRUE(r.ignore_eos);
}

TEST(Api, SamplingIsWhatTheRequestAsksAndOpenAIsDefaultsElse) {
  const SamplingParams asked = parse_api_request(R"({"messages": [{"role": "user", "content": "x"}], "temperature": 0.5,
      "top_p": 0.9, "top_k": 20, "min_p": 0.1, "presence_penalty": 0.5, "frequency_penalty": -0.5})", true).sampling();
  EXPECT_FLOAT_EQ(asked.temperature, 0.5f);
  EXPECT_FLOAT_EQ(asked.top_p, 0.9f);
  EXPECT_EQ(asked.top_k, 20);
  EXPECT_FLOAT_EQ(asked.min_p, 0.1f);
  EXPECT_FLOAT_EQ(asked.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(asked.frequency_penalty, -0.5f);
  EXPECT_EQ(asked.repeat_last_n, -1);  // the penalties count the whole output
  // Nothing set: temperature 1 over the whole vocabulary, not the library's filters.
  const SamplingParams plain = parse_api_request(R"({"prompt": "a"})", false).sampling();
  EXPECT_FLOAT_EQ(plain.temperature, 1.0f);
  EXPECT_FLOAT_EQ(plain.top_p, 1.0f);
  EXPECT_EQ(plain.top_k, 0);
  EXPECT_FLOAT_EQ(plain.min_p, 0.0f);
  EXPECT_FALSE(plain.penalizes());
}

TEST(Api, CompletionsTakeAStringOrAnArrayAndDefaultTo16Tokens) {
  EXPECT_EQ(parse_api_request(R"({"prompt": "a"})", false).prompts, std::vector<std::string>{"a"});
  const ApiRequest r = parse_api_request(R"({"prompt": ["a", "b"], "logprobs": 2})", false);
  EXPECT_EQ(r.prompts, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(r.max_tokens, 16);
  EXPECT_EQ(r.top_logprobs, 2);
  EXPECT_FALSE(parse_api_request(R"({"messages": [{"role": "user", "content": "x"}]})", true).max_tokens);
}

TEST(Api, ParsesToolsToolChoiceAndAToolRoundTrip) {
  const ApiRequest r = parse_api_request(R"({"messages": [
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "18 C"}]},
      {"role": "assistant", "content": "18 C.", "tool_calls": []}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
              {"type": "function", "function": {"name": "get_time"}}],
    "tool_choice": {"type": "function", "function": {"name": "get_time"}}, "parallel_tool_calls": false})",
                                         true);
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_TRUE(r.messages[1]["content"].is_null());  // null beside calls stays null
  EXPECT_EQ(r.messages[1]["tool_calls"][0]["function"]["arguments"], "{\"city\": \"Paris\"}");  // as the client sent it
  EXPECT_EQ(r.messages[2]["content"], "18 C");
  EXPECT_EQ(r.messages[2]["tool_call_id"], "call_1");
  EXPECT_FALSE(r.messages[3].contains("tool_calls"));  // an empty list is no calls
  EXPECT_EQ(r.tool_names(), (std::vector<std::string>{"get_weather", "get_time"}));
  EXPECT_EQ(r.tool_choice.mode, ToolChoice::Mode::Function);
  EXPECT_EQ(r.tool_choice.function, "get_time");
  EXPECT_FALSE(r.parallel_tool_calls);

  const ApiRequest plain = parse_api_request(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "none"})", true);
  EXPECT_TRUE(plain.tools.empty());
  EXPECT_EQ(plain.tool_choice.mode, ToolChoice::Mode::None);
  EXPECT_TRUE(plain.parallel_tool_calls);
  EXPECT_EQ(parse_api_request(R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function",
      "function": {"name": "f"}}], "tool_choice": "required"})", true).tool_choice.mode, ToolChoice::Mode::Required);
}

TEST(Api, ResponseFormatAndGrammarBecomeOneGbnfGrammar) {
  auto parse = [](const std::string& body) { return parse_api_request(body, true); };
  const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
  EXPECT_TRUE(parse("{" + msgs + "}").grammar.empty());
  EXPECT_TRUE(parse("{" + msgs + R"(, "response_format": {"type": "text"}})").grammar.empty());
  ApiRequest obj = parse("{" + msgs + R"(, "response_format": {"type": "json_object"}})");
  EXPECT_NE(obj.grammar.find("json-object"), std::string::npos);
  EXPECT_EQ(obj.grammar_param, "response_format");
  ApiRequest schema = parse("{" + msgs + R"(, "response_format": {"type": "json_schema", "json_schema": {"name": "p", "strict": true, "schema": {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}}}})");
  EXPECT_NE(schema.grammar.find("\\\"age\\\""), std::string::npos) << schema.grammar;
  ApiRequest gbnf = parse("{" + msgs + R"(, "grammar": "root ::= \"yes\"", "n": 3})");
  EXPECT_EQ(gbnf.grammar, "root ::= \"yes\"");
  EXPECT_EQ(gbnf.grammar_param, "grammar");
  EXPECT_EQ(gbnf.n, 3);
  try {
    parse("{" + msgs + R"(, "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object", "properties": {"a": {"type": "string", "format": "ipv6"}}}}}})");
    ADD_FAILURE() << "accepted an unsupported format";
  } catch (const ApiError& e) {
    EXPECT_NE(std::string(e.what()).find("'format'"), std::string::npos) << e.what();
  }
}

TEST(Api, RejectsBadRequestsNamingTheParameter) {
  struct Case {
    const char* body;
    bool chat;
    const char* param;
  };
  const Case cases[] = {
      {"{", true, ""},
      {"{\"prompt\": 4666666663E3333333332}", false, ""},  // a number beyond double's range (found by the fuzzer)
      {"[1]", true, ""},
      {R"({"messages": []})", true, "messages"},
      {R"({})", true, "messages"},
      {R"({"messages": [{"content": "x"}]})", true, "messages[0].role"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", true, "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})", true, "max_tokens"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": "5"})", true, "max_tokens"},
      {R"({"messages": [{"role": "user", "content": "x"}], "temperature": 3})", true, "temperature"},
      {R"({"messages": [{"role": "user", "content": "x"}], "n": 0})", true, "n"},
      {R"({"messages": [{"role": "user", "content": "x"}], "n": 129})", true, "n"},
      {R"({"prompt": ["a", "b", "c"], "n": 50})", false, "n"},
      // structured output
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": "json"})", true, "response_format"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}})", true, "response_format"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema"}})", true, "response_format"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object", "unevaluatedProperties": false}}}})", true, "response_format"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"name": "a", "strict": "yes", "schema": {}}}})", true, "response_format"},
      {R"({"messages": [{"role": "user", "content": "x"}], "grammar": 5})", true, "grammar"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "array", "maxItems": "ten"}}}})", true, "response_format"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "string", "minLength": -1}}}})", true, "response_format"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"schema": {"properties": {"a": 5}}}}})", true, "response_format"},
      {R"({"messages": [{"role": "user", "content": "x"}], "grammar": "root ::= \"a\"", "response_format": {"type": "json_object"}})", true, "grammar"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stop": [1]})", true, "stop"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stop": ""})", true, "stop"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"abc": 1}})", true, "logit_bias"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": 1000}})", true, "logit_bias"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", true, "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stream": "yes"})", true, "stream"},
      {R"({"prompt": [1, 2]})", false, "prompt"},
      {R"({"prompt": "x", "echo": true})", false, "echo"},
      {R"({"prompt": "x", "logprobs": 9})", false, "logprobs"},
      // tools, tool_choice, parallel_tool_calls and the tool parts of messages
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": {"type": "function"}})", true, "tools"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "retrieval"}]})", true, "tools"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})", true, "tools"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": ""}}]})", true, "tools"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "a b"}}]})", true, "tools"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]})", true, "tools"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f", "description": 3}}]})", true, "tools"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}]})", true, "tools"},
      {R"({"prompt": "x", "tools": []})", false, "tools"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "always"})", true, "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}})", true, "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function"}})", true, "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})", true, "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": 1})", true, "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "parallel_tool_calls": "no"})", true, "parallel_tool_calls"},
      {R"({"messages": [{"role": "assistant", "content": null, "tool_calls": {"id": "1"}}]})", true, "messages[0].tool_calls"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"id": "1", "type": "function", "function": {"arguments": "{}"}}]}]})", true, "messages[0].tool_calls"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": 5}}]}]})", true, "messages[0].tool_calls"},
      {R"({"messages": [{"role": "tool", "content": "18 C"}]})", true, "messages[0].tool_call_id"},
  };
  for (const Case& c : cases) {
    try {
      parse_api_request(c.body, c.chat);
      ADD_FAILURE() << "accepted: " << c.body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400) << c.body;
      const auto j = nlohmann::json::parse(e.body());
      EXPECT_EQ(j["error"]["type"], "invalid_request_error");
      if (*c.param) {
        EXPECT_EQ(j["error"]["param"], c.param) << c.body;
      }
      EXPECT_FALSE(std::string(e.what()).empty());
    }
  }
}

// The engine's text never shows control tokens: the server writes tool markers held as control
// tokens back into the text it parses, and leaves markers the vocabulary shows as text alone.
TEST(ToolMarkers, ControlTokenMarkersAreWrittenBack) {
  // The shared Llama 3 tokenizer predates <|python_tag|>: <|eot_id|> stands in for a control marker.
  const Tokenizer llama3 = Tokenizer::from_file(test::shared_model("tokenizers/llama3/tokenizer.json"));
  const auto markers = tool_marker_tokens(llama3, {"<|eot_id|>", "<|python_tag|>", "[TOOL_CALLS]"});
  ASSERT_EQ(markers.size(), 1u);  // the others are no single token of this vocabulary
  EXPECT_EQ(markers.begin()->second, "<|eot_id|>");
  EXPECT_EQ(llama3.piece(markers.begin()->first), "");
  EXPECT_EQ(llama3.piece(markers.begin()->first, /*render_special=*/true), "<|eot_id|>");
  // Qwen's <tool_call> is an added token shown as text: nothing to write back.
  const Tokenizer qwen3 = Tokenizer::from_file(test::shared_model("tokenizers/qwen3/tokenizer.json"));
  EXPECT_TRUE(tool_marker_tokens(qwen3, tool_call_control_markers(ToolCallFormat::Hermes)).empty());
  const std::vector<std::int32_t> open = qwen3.encode("<tool_call>", false, true);
  ASSERT_EQ(open.size(), 1u);
  EXPECT_EQ(qwen3.piece(open[0]), "<tool_call>");
}

TEST(Metrics, PrometheusTextFormat) {
  metrics::Registry reg("promptly:");
  auto& h = reg.histogram("latency_seconds", "A latency", {0.1, 1.0});
  h.observe(0.05);
  h.observe(0.5);
  h.observe(5.0);
  reg.counter("requests_total", "Requests", "finished_reason=\"stop\"").add(2);
  reg.counter("requests_total", "Requests", "finished_reason=\"length\"").add();
  reg.gauge("running", "Running", [] { return 3.0; });
  const std::string text = reg.render();
  EXPECT_NE(text.find("# TYPE promptly:latency_seconds histogram\n"), std::string::npos);
  EXPECT_NE(text.find("promptly:latency_seconds_bucket{le=\"0.1\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("promptly:latency_seconds_bucket{le=\"1\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("promptly:latency_seconds_bucket{le=\"+Inf\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("promptly:latency_seconds_count 3\n"), std::string::npos);
  EXPECT_NE(text.find("promptly:requests_total{finished_reason=\"stop\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("promptly:requests_total{finished_reason=\"length\"} 1\n"), std::string::npos);
  EXPECT_EQ(text.find("# TYPE promptly:requests_total counter"), text.rfind("# TYPE promptly:requests_total counter"));
  EXPECT_NE(text.find("promptly:running 3\n"), std::string::npos);
}

// A GPU gauge while NVML cannot say: no sample, and no HELP/TYPE lines for a metric without one.
TEST(Metrics, AGaugeWithoutAValueIsLeftOut) {
  metrics::Registry reg("promptly:");
  std::optional<double> reading;
  reg.gauge_if_known("gpu_memory_used_bytes", "GPU memory", [&] { return reading; });
  reg.gauge("running", "Running", [] { return 1.0; });
  EXPECT_EQ(reg.render().find("gpu_memory_used_bytes"), std::string::npos) << reg.render();
  reading = 2e9;
  const std::string text = reg.render();
  EXPECT_NE(text.find("# TYPE promptly:gpu_memory_used_bytes gauge\npromptly:gpu_memory_used_bytes 2000000000\n"), std::string::npos) << text;
  EXPECT_NE(text.find("promptly:running 1\n"), std::string::npos) << text;
}

}  // namespace
}  // namespace promptly::server
