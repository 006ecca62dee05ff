#pragma once
// Server-sent events as OpenAI-compatible servers stream them, and what one streamed chunk says.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace promptly::loadgen {

// Splits a byte stream into events and returns each event's data (its `data:` lines joined by
// newlines), however the bytes were cut into reads. Comments (`: ping`), `event:` and `id:` lines
// are skipped; CRLF and LF line ends are both accepted.
class SseParser {
 public:
  std::vector<std::string> feed(std::string_view bytes);

 private:
  std::string line_;  // the incomplete line the last read ended in
  std::string data_;  // the data lines of the event being read
  bool has_data_ = false;
};

// One `data:` payload of a chat or completions stream.
struct StreamChunk {
  bool done = false;        // the `[DONE]` sentinel
  std::string text;         // the choice's new text: delta.content (or delta.reasoning_content) / text
  bool finished = false;    // a choice carried a finish_reason
  std::optional<std::size_t> prompt_tokens, completion_tokens;  // from a usage object
  std::string error;        // an error object in the stream, or a payload that is not JSON
};

StreamChunk parse_stream_chunk(std::string_view data);

}  // namespace promptly::loadgen
