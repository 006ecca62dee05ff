#pragma once
// The grammar of a valid tool call in a template's own syntax, for tool_choice "required" or a named
// function: output is constrained to one call (or several, where parallel calls are allowed) of
// the offered tools, each with arguments matching that tool's parameter schema.
#include <nlohmann/json.hpp>
#include <string>

#include "chat/tool_calls.h"
#include "server/api.h"

namespace promptly::server {

// Throws grammar::SchemaError when a tool's parameters use JSON Schema we cannot enforce.
std::string tool_call_grammar(const ToolCallSyntax& syntax, const nlohmann::ordered_json& tools, const ToolChoice& choice, bool parallel);

}  // namespace promptly::server
