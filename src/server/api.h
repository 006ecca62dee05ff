#pragma once
// The OpenAI request bodies the server accepts (/v1/chat/completions, /v1/completions), parsed and
// validated into plain structs, and the errors in OpenAI's JSON shape. Pure functions of the body
// (no engine, no sockets), so the libFuzzer target and the unit tests drive them directly.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>
#include "sampling/sampler.h"

namespace promptly::server {

// An error the client gets as {"error": {"message", "type", "param", "code"}} with `status`.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string type = "invalid_request_error", std::string param = {},
           std::string code = {})
      : std::runtime_error(message), status_(status), type_(std::move(type)), param_(std::move(param)), code_(std::move(code)) {}
  int status() const { return status_; }
  std::string body() const;

 private:
  int status_;
  std::string type_, param_, code_;
};

// tool_choice: whether the model may, must or must not call the request's tools, or must call one.
struct ToolChoice {
  enum class Mode { Auto, None, Required, Function };
  Mode mode = Mode::Auto;
  std::string function;  // Mode::Function: the tool to call
};

struct ApiRequest {
  bool chat = true;
  std::string model;                       // empty: not given
  nlohmann::ordered_json messages;         // chat: the validated messages array
  std::vector<std::string> prompts;        // completions: one or more prompts (one choice each)
  bool stream = false;
  bool include_usage = false;              // stream_options.include_usage
  std::optional<int> max_tokens;           // max_tokens or max_completion_tokens
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = 0;
  float min_p = 0.0f;
  std::optional<std::uint64_t> seed;
  std::vector<std::string> stop;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::vector<std::pair<std::int32_t, float>> logit_bias;
  int top_logprobs = -1;                   // < 0: no logprobs
  std::string user;
  int priority = 0;
  double timeout_s = 0;
  bool ignore_eos = false;
  bool speculative = true;  // extension: false opts the request out of speculative decoding
  bool echo = false;                       // completions only
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
  // Chat: the validated OpenAI function tools (empty: none), tool_choice, parallel_tool_calls.
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  ToolChoice tool_choice;
  bool parallel_tool_calls = true;
  int n = 1;  // choices per prompt
  // Structured output: a GBNF grammar the output must match, from response_format (json_object,
  // json_schema) or the `grammar` extension; empty: unconstrained. grammar_param names where it
  // came from, for errors found when it is compiled.
  std::string grammar;
  std::string grammar_param;

  std::vector<std::string> tool_names() const;
  // The sampler's settings this request asks for; the seed is left to the caller (each choice
  // takes its own). A request that sets nothing samples at temperature 1 over the whole
  // vocabulary, as the OpenAI API does, not with the library's llama.cpp-like filters.
  SamplingParams sampling() const;
};

// Throws ApiError(400) naming the parameter for malformed JSON, wrong types, out-of-range values
// and unsupported options (n > 1, ...).
ApiRequest parse_api_request(std::string_view body, bool chat);

}  // namespace promptly::server
