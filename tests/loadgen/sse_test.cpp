#include "loadgen/sse.h"

#include <gtest/gtest.h>

namespace promptly::loadgen {
namespace {

TEST(Sse, EventsSurviveAnySplitOfTheBytes) {
  const std::string stream =
      ": keep-alive comment\r\n\r\n"
      "data: {\"a\":1}\n\n"
      "event: message\r\nid: 7\r\ndata: first line\r\ndata:second line\r\n\r\n"
      "data: [DONE]\n\n"
      "data: unterminated";
  const std::vector<std::string> expected = {"{\"a\":1}", "first line\nsecond line", "[DONE]"};
  for (std::size_t piece = 1; piece <= stream.size(); ++piece) {
    SseParser parser;
    std::vector<std::string> events;
    for (std::size_t at = 0; at < stream.size(); at += piece)
      for (auto& e : parser.feed(std::string_view(stream).substr(at, piece))) events.push_back(std::move(e));
    EXPECT_EQ(events, expected) << "pieces of " << piece;
  }
}

TEST(StreamChunk, ReadsChatCompletionsUsageAndTheEnd) {
  auto role_only = parse_stream_chunk(R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]})");
  EXPECT_TRUE(role_only.text.empty());
  EXPECT_FALSE(role_only.finished);

  EXPECT_EQ(parse_stream_chunk(R"({"choices":[{"index":0,"delta":{"content":"Hel"}}]})").text, "Hel");
  EXPECT_EQ(parse_stream_chunk(R"({"choices":[{"index":0,"delta":{"reasoning_content":"hmm"}}]})").text, "hmm");
  EXPECT_EQ(parse_stream_chunk(R"({"choices":[{"index":0,"text":"lo","finish_reason":null}]})").text, "lo");

  const auto last = parse_stream_chunk(R"({"choices":[{"index":0,"delta":{},"finish_reason":"length"}]})");
  EXPECT_TRUE(last.finished);
  EXPECT_TRUE(last.text.empty());

  const auto usage = parse_stream_chunk(R"({"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":42}})");
  EXPECT_EQ(usage.prompt_tokens, 12u);
  EXPECT_EQ(usage.completion_tokens, 30u);
  EXPECT_FALSE(parse_stream_chunk(R"({"choices":[],"usage":null})").prompt_tokens.has_value());

  EXPECT_TRUE(parse_stream_chunk("[DONE]").done);
}

TEST(StreamChunk, ReportsErrorsAndGarbage) {
  EXPECT_EQ(parse_stream_chunk(R"({"error":{"message":"out of memory","type":"server_error"}})").error, "out of memory");
  EXPECT_NE(parse_stream_chunk("not json at all").error.find("not a JSON object"), std::string::npos);
  EXPECT_NE(parse_stream_chunk("[1,2]").error.find("not a JSON object"), std::string::npos);
  // Wrong types are ignored rather than trusted.
  const auto odd = parse_stream_chunk(R"({"choices":[{"delta":{"content":5}},3],"usage":{"prompt_tokens":-1}})");
  EXPECT_TRUE(odd.error.empty());
  EXPECT_TRUE(odd.text.empty());
  EXPECT_FALSE(odd.prompt_tokens.has_value());
}

}  // namespace
}  // namespace promptly::loadgen
