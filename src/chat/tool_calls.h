#pragma once
// OpenAI tool calls in and out of a model's own syntax: which syntax a chat template teaches its
// model, the fallback for templates that teach none, and the parsers that turn generated text into
// content plus OpenAI tool_calls, whole or delta by delta while streaming.
//
// The rule for text that only looks like a call: a call is taken only when its marker stands where
// the format puts it, its JSON parses, it names one of the request's tools and its arguments are a
// JSON object; anything else (a marker in the middle of prose, invalid JSON, an object that is not a
// call, an unknown name, a call cut off by max_tokens) is returned to the client as content, byte for
// byte. With parallel_tool_calls false, text after the first call is content too (the other calls
// of a Mistral Nemo array, which share one JSON value with the first, are dropped). Whitespace
// beside calls is dropped; nothing else the model generated is dropped or rewritten.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace promptly {

enum class ToolCallFormat {
  // <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, one block per call, each at the start
  // of a line: Hermes 2/3, Qwen2.5, Qwen3.
  Hermes,
  // The whole answer is {"name": ..., "parameters": {...}} ("arguments" also taken), optionally after
  // <|python_tag|>; one call: Llama 3.1 to 3.3.
  Llama3Json,
  // [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]: Mistral Nemo (and Mistral 7B v0.3).
  MistralNemo,
  // [TOOL_CALLS]name[ARGS]{...} per call (a [CALL_ID]id before [ARGS] is skipped): Mistral Small 3.2.
  MistralArgs,
  // The template has no tool syntax (Gemma, Phi-3, DeepSeek-R1, ChatML): the tools are described in a
  // system message that asks for the Hermes form, and history calls and results are written as text
  // in that form (fallback_tool_messages), so any chat model can be asked.
  Fallback,
};

// The syntax a grammar needs to force well-formed calls (tool_choice "required" or a named
// function). One call is written as
//   call_begin + {"name": "<name>", "<arguments_key>": <arguments object>} + call_end
// or, where name_before_arguments is set, as call_begin + <name> + name_arguments_separator +
// <arguments object> + call_end. Several calls are joined by call_separator; where
// calls_in_json_array is set they form one JSON array,
// between array_begin and array_end ([TOOL_CALLS][{...}, {...}]). max_calls is 1 where the format
// carries a single call.
struct ToolCallSyntax {
  std::string array_begin;               // before the array of calls (calls_in_json_array only)
  std::string array_end;                 // after it
  std::string call_begin;                // before each call
  std::string call_end;                  // after each call
  std::string call_separator;            // between two calls
  std::string arguments_key;             // "arguments" or "parameters"; empty when name_before_arguments
  std::string name_arguments_separator;  // "[ARGS]" (MistralArgs)
  bool name_before_arguments = false;    // the name is bare text, not a JSON field
  bool calls_in_json_array = false;
  int max_calls = -1;                    // < 0: any number
};

// The format a template's source teaches its model (markers it writes for calls in the history).
ToolCallFormat detect_tool_call_format(std::string_view template_source);
const ToolCallSyntax& tool_call_syntax(ToolCallFormat format);
const char* tool_call_format_name(ToolCallFormat format);

// Marker texts of the format that a vocabulary may hold as control tokens (never shown as text):
// [TOOL_CALLS], [ARGS], [CALL_ID], <|python_tag|>, <tool_call>. A server puts the text of those that
// are control tokens in its vocabulary back into the text it parses.
std::vector<std::string> tool_call_control_markers(ToolCallFormat format);

// A fresh call id: "call_" and 24 alphanumerics, or 9 alphanumerics for the Mistral formats, whose
// templates refuse any other id when the client sends it back.
std::string new_tool_call_id(ToolCallFormat format);

// Fallback: the messages with a system message describing `tools` (appended to the first system
// message, or to the first user message where the template takes no system role), assistant tool
// calls written as <tool_call> blocks in its content and tool results as user messages of
// <tool_response> blocks (consecutive results in one message, so that roles still alternate).
nlohmann::ordered_json fallback_tool_messages(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                              bool system_role);

struct ToolCallOptions {
  ToolCallFormat format = ToolCallFormat::Hermes;
  std::vector<std::string> tool_names;  // calls to any other name are content
  bool parallel = true;                 // false: only the first call is a call, later ones stay content
};

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // the JSON object the model wrote, compact (or its string, where it wrote one)
};

// Plain text and calls as they come: text can arrive in pieces, a call arrives whole.
struct ToolCallEvent {
  std::string content;
  std::optional<ToolCall> call;
  std::size_t index = 0;  // the call's position among the answer's calls
};

// Incremental parser: text that could still turn out to be (the start of) a call is held back until
// it is decided, so the concatenated events equal the whole-output parse of the same text. A call is
// given out once complete and checked, its arguments in one fragment.
class ToolCallParser {
 public:
  explicit ToolCallParser(ToolCallOptions options);

  // `text`: what the model generated since the last call.
  std::vector<ToolCallEvent> push(std::string_view text);
  // The output has ended. `natural_end`: it ended by itself (EOS, a stop string), so a call missing
  // only its closing marker counts; false (max_tokens, cancellation): an unfinished call is content.
  std::vector<ToolCallEvent> finish(bool natural_end);

  std::size_t calls() const { return calls_; }

 private:
  enum class Attempt { Calls, NeedMore, NotACall };
  struct AttemptResult {
    Attempt outcome = Attempt::NotACall;
    std::vector<ToolCall> calls;
    std::size_t end = 0;
  };
  void advance(bool at_end, std::vector<ToolCallEvent>& out);
  AttemptResult try_calls_at(std::size_t pos, bool at_end) const;
  bool call_may_start_at(std::size_t pos) const;
  std::size_t marker_prefix_at_end() const;
  std::optional<ToolCall> checked_call(const nlohmann::ordered_json& object, const std::string& arguments_key) const;
  void emit_content(std::string_view text, std::vector<ToolCallEvent>& out);

  ToolCallOptions options_;
  std::string marker_;
  std::string text_;           // the whole output so far
  std::size_t decided_ = 0;    // text_[0, decided_) has been given out (or dropped as whitespace)
  std::string held_space_;     // whitespace given out only if more content follows it
  bool after_call_ = false;    // whitespace right after a call is dropped
  std::size_t calls_ = 0;
  bool calls_closed_ = false;  // parallel false and one call taken, or a single-call format
};

// A whole output: content (null when empty beside calls) and OpenAI tool_calls.
struct ParsedToolCalls {
  std::optional<std::string> content;
  std::vector<ToolCall> calls;
};
ParsedToolCalls parse_tool_calls(std::string_view output, const ToolCallOptions& options, bool natural_end = true);

// OpenAI shapes: message.tool_calls entries, and the chunk deltas for an event (a call gives two:
// {index, id, type, function: {name, arguments: ""}} then {index, function: {arguments}}).
nlohmann::ordered_json tool_call_json(const ToolCall& call);
std::vector<nlohmann::ordered_json> tool_call_event_deltas(const ToolCallEvent& event);

}  // namespace promptly
