#include "loadgen/sse.h"

#include <nlohmann/json.hpp>

namespace promptly::loadgen {

std::vector<std::string> SseParser::feed(std::string_view bytes) {
  std::vector<std::string> events;
  for (char c : bytes) {
    if (c != '\n') {
      line_ += c;
      continue;
    }
    if (!line_.empty() && line_.back() == '\r') line_.pop_back();
    if (line_.empty()) {
      // A blank line ends the event.
      if (has_data_) events.push_back(std::move(data_));
      data_.clear();
      has_data_ = false;
    } else if (line_.starts_with("data:")) {
      std::string_view value = std::string_view(line_).substr(5);
      if (value.starts_with(' ')) value.remove_prefix(1);
      if (has_data_) data_ += '\n';
      data_ += value;
      has_data_ = true;
    }
    line_.clear();
  }
  return events;
}

StreamChunk parse_stream_chunk(std::string_view data) {
  StreamChunk chunk;
  if (data == "[DONE]") {
    chunk.done = true;
    return chunk;
  }
  const nlohmann::json j = nlohmann::json::parse(data, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    chunk.error = "a streamed event is not a JSON object: " + std::string(data.substr(0, 200));
    return chunk;
  }
  if (j.contains("error")) {
    const auto& e = j["error"];
    chunk.error = e.is_object() && e.contains("message") && e["message"].is_string() ? e["message"].get<std::string>() : e.dump();
    return chunk;
  }
  if (j.contains("choices") && j["choices"].is_array()) {
    for (const auto& choice : j["choices"]) {
      if (!choice.is_object()) continue;
      if (choice.contains("delta") && choice["delta"].is_object()) {
        const auto& delta = choice["delta"];
        for (const char* key : {"content", "reasoning_content"})
          if (delta.contains(key) && delta[key].is_string()) chunk.text += delta[key].get<std::string>();
      } else if (choice.contains("text") && choice["text"].is_string()) {
        chunk.text += choice["text"].get<std::string>();
      }
      if (choice.contains("finish_reason") && !choice["finish_reason"].is_null()) chunk.finished = true;
    }
  }
  if (j.contains("usage") && j["usage"].is_object()) {
    const auto& u = j["usage"];
    if (u.contains("prompt_tokens") && u["prompt_tokens"].is_number_unsigned()) chunk.prompt_tokens = u["prompt_tokens"].get<std::size_t>();
    if (u.contains("completion_tokens") && u["completion_tokens"].is_number_unsigned())
      chunk.completion_tokens = u["completion_tokens"].get<std::size_t>();
  }
  return chunk;
}

}  // namespace promptly::loadgen
